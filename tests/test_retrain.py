"""Issue 32 item 4: retraining on the cluster's own traffic (forecasting/retrain.py) and
swapping the better forecaster in off the control loop (autoscaler/driving/retrainer.py): the judge's
figures, a real retrain that forecasts better swapped in and a worse one not, and the live
loop's swap from a real arrival store, saved and loadable, shown in the status."""

import json

import numpy as np
import pytest
from meter_reports import FakeCluster

from autoscaler.driving.loop import AutoscalerLoop
from autoscaler.driving.retrainer import RETRAINED_DIR, Retrainer
from faro_serve.commands.status import retrain_lines
from faro_serve.serving.schema import parse_autoscaler_config
from forecasting.base import FallbackForecaster
from forecasting.io import load_forecaster, save_forecaster
from forecasting.retrain import Score, candidate_config, held_back, judge, planner_loss, retrain
from forecasting.store import ArrivalStore
from forecasting.train import TrainConfig

SMALL = dict(mlp_width=64, windows_batch_size=64, val_check_steps=50, threads=1, members=1)


def traffic(minutes: int = 600, seed: int = 0) -> dict[str, np.ndarray]:
    """Two models with a 30-minute cycle: what the fallback (recent mean to max) misses."""
    rng = np.random.default_rng(seed)
    t = np.arange(minutes)
    return {
        "a": rng.poisson(300 + 220 * np.sin(2 * np.pi * t / 30)).astype(float),
        "b": rng.poisson(120 + 90 * np.sin(2 * np.pi * (t + 7) / 30)).astype(float),
    }


@pytest.fixture(scope="module")
def trained():
    """A candidate trained on the cycle, and its verdict against the fallback."""
    return retrain(traffic(), FallbackForecaster(), holdout=120, config=TrainConfig(max_steps=150, seed=1, **SMALL))


def test_a_candidate_has_the_serving_forecasters_input_horizon_and_ensemble_size(trained):
    """The live retrainer, retrain() and bench/retrain_eval build their default candidate
    here: an ensemble is replaced by an ensemble of as many networks, a plug-in without
    members by one network."""
    from forecasting.nhits import NHitsForecaster

    net = trained[0].model
    two = NHitsForecaster(net, "normal", {}, members=[net])
    cfg = candidate_config(two, seed=4, threads=1)
    assert (cfg.input_size, cfg.horizon, cfg.members, cfg.max_steps, cfg.seed, cfg.threads) == (15, 7, 2, 400, 5, 1)
    plug = candidate_config(FallbackForecaster(20, 5))
    assert (plug.input_size, plug.horizon, plug.members) == (20, 5, 1)


def test_the_planner_loss_charges_too_little_more_than_too_much():
    actual = np.full((4, 1, 7), 100.0)
    exact = np.full((4, 1, 50, 7), 100.0)
    assert planner_loss(exact, actual) == 0.0
    low, high = planner_loss(exact - 20, actual), planner_loss(exact + 20, actual)
    assert low == pytest.approx(0.9 * 20 / 100) and high == pytest.approx(0.1 * 20 / 100)
    with pytest.raises(ValueError, match="do not match"):
        planner_loss(exact, actual[:, :, :3])


def test_the_judge_swaps_only_for_a_lower_loss_at_a_calibration_as_good():
    now = Score(0.10, 0.90, 20, 2)
    assert judge(now, Score(0.08, 0.88, 20, 2))[0]
    swap, why = judge(now, Score(0.099, 0.90, 20, 2))
    assert not swap and why.startswith("not better") and "0.0990 against 0.1000" in why
    swap, why = judge(now, Score(0.05, 0.60, 20, 2))
    assert not swap and why.startswith("less calibrated")


def test_held_back_minutes_keep_their_context_and_a_short_history_is_refused():
    hist = {"a": np.arange(200.0), "b": np.arange(50.0)}
    train, names, counts = held_back(hist, holdout=100, input_size=15)
    assert train["a"].size == 100 and "b" not in train and names == ["a"]
    assert counts.shape == (1, 115) and counts[0, 0] == 85 and counts[0, -1] == 199
    with pytest.raises(ValueError, match="135 minutes of history"):
        retrain({"b": np.arange(50.0)}, FallbackForecaster(), holdout=120)


def test_a_retrain_that_forecasts_better_is_swapped_in(trained, report):
    candidate, verdict = trained
    report(f"retrain on a 30-minute cycle (480 min x 2 models, 150 steps): {verdict.reason}")
    assert verdict.swap, verdict.reason
    assert verdict.candidate.planner_loss < 0.98 * verdict.current.planner_loss
    assert verdict.holdout_minutes == 120 and verdict.trained_minutes == 2 * 480
    assert verdict.current.origins == verdict.candidate.origins == 23  # 120 - 7 + 1, every 5th


def test_a_retrain_that_forecasts_worse_is_not_swapped_in(trained):
    good, _ = trained
    _, verdict = retrain(
        traffic(), good, holdout=120, config=TrainConfig(max_steps=1, seed=2, **SMALL)
    )  # one step: untrained
    assert not verdict.swap and verdict.reason.startswith(("not better", "less calibrated")), verdict


def test_a_candidate_is_judged_and_served_with_the_current_forecasters_settings(trained, tmp_path):
    """What the deployment set on its forecaster (short-history rule, daily context, recurring
    peaks) is the candidate's too: judged as it would serve, not with the package defaults."""
    good, _ = trained
    save_forecaster(good, tmp_path / "net")
    current = load_forecaster(tmp_path / "net")
    current.short_history, current.daily_period = "fallback", 1440
    current.daily_weight, current.recurrence_share = 0.0, 0.0
    fresh = []

    def train(part, config):  # a network with the package defaults, as training returns one
        fresh.append(load_forecaster(tmp_path / "net"))
        return fresh[-1]

    candidate, verdict = retrain(traffic(), current, holdout=120, train=train, config=TrainConfig(max_steps=1, **SMALL))
    assert candidate is fresh[0]
    assert (candidate.short_history, candidate.daily_period) == ("fallback", 1440)
    assert (candidate.daily_weight, candidate.recurrence_share) == (0.0, 0.0)
    assert verdict.candidate.planner_loss == pytest.approx(verdict.current.planner_loss)
    assert load_forecaster(tmp_path / "net").recurrence_share > 0  # the defaults differ


def test_the_live_loop_swaps_in_a_retrained_forecaster_from_its_store(tmp_path):
    store = ArrivalStore(tmp_path)
    end = 29_000_000  # wall-clock minutes (epoch)
    for name, counts in traffic().items():
        store.append_many(name, [(60.0 * (end - counts.size + k), c) for k, c in enumerate(counts)])
    cfg = parse_autoscaler_config(
        {
            "cluster": {"cpus": 2, "objective": "fair_sum"},
            "history_dir": str(tmp_path),
            "retrain_every_h": 1 / 3600,
            "retrain_holdout_h": 2,
            "models": [{"name": n, "slo_ms": 720, "processing_ms": 50, "cpus": 0.5} for n in ("a", "b")],
        }
    )
    clock = {"t": 60.0 * end + 5}
    loop = AutoscalerLoop(cfg, FakeCluster({"a": 1, "b": 1}), clock=lambda: clock["t"], history=store)
    loop.retrainer.config = TrainConfig(max_steps=150, seed=1, **SMALL)
    before = loop.policy.forecaster
    assert isinstance(before, FallbackForecaster)
    loop.step()  # not due yet
    assert loop.status()["retrain"]["runs"] == 0
    clock["t"] += 2
    loop.step()  # due: the retrain runs in its own thread, the tick goes on
    loop.retrainer.wait(300)
    loop.step()
    assert loop.policy.forecaster is not before and loop.policy.forecaster.name.startswith("nhits")
    st = loop.status()["retrain"]
    assert st["runs"] == 1 and st["last"]["swap"] and len(st["swaps"]) == 1
    assert st["swaps"][0]["saved_to"] == str(tmp_path / RETRAINED_DIR)
    assert load_forecaster(tmp_path / RETRAINED_DIR).input_size == 15
    lines = retrain_lines(st)  # what faro-serve status prints of it
    assert lines[0].startswith("retraining every 1 s: 1 run(s), 1 swap(s)")
    assert lines[1].startswith("last retrain: swapped in: better: planner loss")


def test_a_retrain_without_enough_history_is_logged_and_the_loop_keeps_its_forecaster(tmp_path):
    store = ArrivalStore(tmp_path)
    store.append_many("a", [(60.0 * (1000 + k), 5.0) for k in range(30)])
    clock = {"t": 60.0 * 1030}
    r = Retrainer(store, ["a"], every_s=1, holdout=120, clock=lambda: clock["t"])
    fb = FallbackForecaster()
    assert r.poll(fb) is None
    clock["t"] += 2
    assert r.poll(fb) is None
    r.wait(60)
    assert r.poll(fb) is None
    st = r.status()
    assert st["runs"] == 1 and not st["last"]["swap"] and "135 minutes" in st["last"]["error"]
    assert st["swaps"] == []
    assert retrain_lines(st)[1].startswith("last retrain: kept the current forecaster: ValueError: no model")


def stored(tmp_path, minutes: int = 600) -> ArrivalStore:
    store = ArrivalStore(tmp_path)
    end = 29_000_000
    for name, counts in traffic(minutes).items():
        store.append_many(name, [(60.0 * (end - counts.size + k), c) for k, c in enumerate(counts)])
    return store


def test_forecast_train_from_a_history_store_saves_only_a_better_network(tmp_path, cli):
    stored(tmp_path / "hist").close()
    out = tmp_path / "fc"
    code, stdout, err = cli(
        "forecast",
        "train",
        "--from",
        str(tmp_path / "hist"),
        "--current",
        "fallback",
        "--max-steps",
        "150",
        "--mlp-width",
        "64",
        "--out",
        str(out),
    )
    doc = json.loads(stdout)
    assert code == 0 and doc["swap"] and doc["saved_to"] == str(out), err
    assert doc["models"] == ["a", "b"] and doc["against"] == "fallback: chosen"
    assert load_forecaster(out).input_size == 15
    # against the network it just saved, one step of training does not win: nothing saved
    code, stdout, err = cli(
        "forecast",
        "train",
        "--from",
        str(tmp_path / "hist" / "arrivals.sqlite3"),
        "--current",
        str(out),
        "--max-steps",
        "1",
        "--mlp-width",
        "64",
        "--out",
        str(tmp_path / "worse"),
    )
    assert code == 1 and not json.loads(stdout)["swap"] and "not saved" in err
    assert not (tmp_path / "worse").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from", "NOPE"], "no arrival store there"),
        (["--from", "http://127.0.0.1:9"], "cannot read Prometheus (ConnectError"),
        (["--from", "http://127.0.0.1:9", "--prometheus-minutes", "11000"], "--prometheus-minutes 11000: give 1 to"),
        (["--trace", "x.csv", "--force"], "--force goes with --from"),
        (["--from", "HIST", "--days", "1"], "--days and --sample go with --trace"),
    ],
)
def test_forecast_train_from_refuses_what_it_cannot_use(tmp_path, cli, args, message):
    stored(tmp_path / "hist", minutes=60).close()
    args = [a.replace("NOPE", str(tmp_path / "nope")).replace("HIST", str(tmp_path / "hist")) for a in args]
    code, _, err = cli("forecast", "train", *args, "--out", str(tmp_path / "fc"))
    assert code == 2 and message in err, err


def test_forecast_train_from_a_file_that_is_no_store_names_it_and_leaves_it_as_it_was(tmp_path, cli):
    """A trace CSV given to --from by mistake (or an empty or foreign file) is refused with a
    hint, never moved aside nor turned into a store: the reader writes nothing."""
    import sqlite3

    csv_ = tmp_path / "mytrace.csv"
    csv_.write_text("minute,job,requests\n0,a,5\n")
    bare = tmp_path / "mytrace"  # no suffix: still the file given, not a directory beneath it
    bare.write_text("minute,job,requests\n0,a,5\n")
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    for f, why in (
        (csv_, "not an SQLite database (a trace file? train on it with --trace)"),
        (empty, "not an SQLite database"),
        (bare, "not an SQLite database"),
        (foreign, "a foreign SQLite database (application id 0, tables users), not a faro-serve history store"),
    ):
        before = f.read_bytes()
        code, _, err = cli("forecast", "train", "--from", str(f), "--out", str(tmp_path / "fc"))
        assert code == 2 and err == f"faro-serve: error: --from {f}: refused: {why}\n", err
        assert f.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "empty.db", "mytrace", "mytrace.csv"]


def test_a_read_only_store_reads_what_the_autoscaler_wrote_and_writes_nothing(tmp_path):
    from forecasting.store import ArrivalStore

    stored(tmp_path / "hist", minutes=60).close()
    file = tmp_path / "hist" / "arrivals.sqlite3"
    before = file.read_bytes()
    ro = ArrivalStore(file, read_only=True)
    assert ro.models() == ["a", "b"] and ro.rows("a") == 60
    ro.append("a", 1e9, 5.0)  # refused by SQLite itself, logged, not raised
    ro.close()
    assert file.read_bytes() == before and not ro.refused


def test_a_restarted_autoscaler_loads_what_it_retrained_unless_told_otherwise(tmp_path, trained):
    from autoscaler.driving.loop_retraining import forecaster_of

    save_forecaster(trained[0], tmp_path / RETRAINED_DIR)

    def cfg(**kw):
        return parse_autoscaler_config(
            {
                "cluster": {"cpus": 2},
                "history_dir": str(tmp_path),
                **kw,
                "models": [{"name": "a", "slo_ms": 720, "processing_ms": 50, "cpus": 0.5}],
            }
        )

    fc, why = forecaster_of(cfg())
    assert fc.name.startswith("nhits") and "retrained on this cluster's traffic" in why
    assert fc.meta["train_series"] == ["a", "b"]
    assert forecaster_of(cfg(forecaster="fallback"))[1] == "fallback: chosen"
    assert "retrained" not in forecaster_of(cfg(retrain_every_h=0))[1]
