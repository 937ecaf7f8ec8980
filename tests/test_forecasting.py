"""Probabilistic workload forecasting (paper section 3.5): metrics, baselines, the Gaussian
N-HiTS on small synthetic series (real neuralforecast training, a few seconds), save/load,
and the ``faro-serve forecast`` command line.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from faro_serve.cli import main
from forecasting import forecast_metrics as metrics
from forecasting.base import FallbackForecaster, Forecaster
from forecasting.baseline_forecasters import (
    LastValueForecaster,
    MovingMaxForecaster,
    MovingMeanForecaster,
    make_baseline,
)
from forecasting.evaluate import forecast_origins, rolling_evaluation
from forecasting.io import META_FILE, ForecasterLoadError, load_forecaster, read_meta, save_forecaster
from forecasting.nhits import DEFAULT_SHORT_RULE, neuralforecast_predict
from forecasting.train import TrainConfig, train_forecaster

LEVELS = (30.0, 120.0, 400.0, 900.0)  # requests per minute: very different magnitudes
PERIOD = 60


def synthetic(minutes: int, seed: int, levels=LEVELS) -> dict[str, np.ndarray]:
    """Seasonal (period 60 min) Poisson counts per minute, one series per level."""
    rng = np.random.default_rng(seed)
    t = np.arange(minutes)
    out = {}
    for i, lvl in enumerate(levels):
        lam = lvl * (1 + 0.3 * np.sin(2 * np.pi * t / PERIOD + i))
        out[f"job{i}"] = rng.poisson(lam).astype(float)
    return out


def write_csv(path, history: dict[str, np.ndarray]) -> str:
    rows = [(m, job, c) for job, h in history.items() for m, c in enumerate(h)]
    pd.DataFrame(rows, columns=["minute", "job", "requests"]).to_csv(path, index=False)
    return str(path)


SMALL = dict(
    max_steps=300,
    mlp_width=64,
    windows_batch_size=128,
    val_check_steps=50,
    learning_rate=3e-3,
    scaler_type="standard",
    seed=7,
    members=1,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One small Gaussian N-HiTS trained once for the module and saved to a directory."""
    fc = train_forecaster(synthetic(720, seed=1), TrainConfig(**SMALL))
    d = tmp_path_factory.mktemp("nhits")
    save_forecaster(fc, d)
    return fc, d


@pytest.fixture(scope="module")
def point_model():
    return train_forecaster(synthetic(400, seed=2), TrainConfig(**{**SMALL, "max_steps": 60, "loss": "mae"}))


# -- metrics: pure functions ------------------------------------------------------------


def test_interval_coverage_counts_points_inside_central_interval():
    samples = np.tile(np.arange(1.0, 101.0)[:, None], (1, 4))  # 1..100 at each of 4 steps
    actual = np.array([50.0, 3.0, 97.0, 200.0])  # inside, below 5%, above 95%, far above
    assert metrics.interval_coverage(samples, actual, 0.9) == pytest.approx(0.25)
    assert metrics.interval_coverage(samples, actual, 0.98) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        metrics.interval_coverage(samples, actual[:3], 0.9)


def test_max_window_coverage_uses_quantile_of_per_sample_maximum():
    # per-sample max over the horizon is 10*k for k = 1..10 -> 90th percentile 91
    samples = np.array([[10.0 * k, 0.0, 1.0] for k in range(1, 11)])
    assert metrics.window_max_quantile(samples, 0.9) == pytest.approx(91.0)
    assert metrics.max_window_coverage(samples[None], np.array([[5.0, 90.0, 1.0]]), 0.9) == 1.0
    assert metrics.max_window_coverage(samples[None], np.array([[5.0, 92.0, 1.0]]), 0.9) == 0.0


def test_point_errors_and_summary():
    assert metrics.rmse(np.array([1.0, 3.0]), np.array([1.0, 1.0])) == pytest.approx(np.sqrt(2))
    assert metrics.mae(np.array([1.0, 3.0]), np.array([1.0, 1.0])) == pytest.approx(1.0)
    s = metrics.summarise(np.full((2, 5, 3), 4.0), np.full((2, 3), 4.0))
    assert s["rmse"] == 0 and s["coverage_90"] == 1.0 and s["max_window_coverage_90"] == 1.0


def test_forecast_origins_every_five_minutes_from_input_size():
    assert forecast_origins(40, 15, 7) == [15, 20, 25, 30]
    with pytest.raises(ValueError, match="too little history"):
        forecast_origins(20, 15, 7)


# -- baselines ------------------------------------------------------------------------------


def test_baselines_shapes_and_values():
    hist = {"a": np.array([120.0, 180.0, 120.0, 60.0]), "b": np.array([600.0])}
    expect = {LastValueForecaster: (1.0, 10.0), MovingMeanForecaster: (2.0, 10.0), MovingMaxForecaster: (3.0, 10.0)}
    for cls, (a, b) in expect.items():
        f = cls(input_size=15, horizon=5).predict(hist, n_samples=20)
        assert isinstance(cls(), Forecaster)
        assert f.samples.shape == (2, 20, 5)
        np.testing.assert_allclose(f.samples[0], a)  # requests/s, degenerate interval
        np.testing.assert_allclose(f.samples[1], b)
        assert f.predictor == {"a": cls.name, "b": cls.name}
    assert make_baseline("max", 2, 3).predict({"a": np.array([600.0, 60.0, 120.0])}).samples.max() == 2.0
    with pytest.raises(ValueError):
        make_baseline("median")
    with pytest.raises(ValueError, match="finite"):
        LastValueForecaster().predict({"a": np.array([1.0, np.nan])})


# -- the Gaussian N-HiTS -----------------------------------------------------------------


def test_predict_shapes_units_and_non_negative(trained):
    fc, _ = trained
    assert isinstance(fc, Forecaster) and (fc.input_size, fc.horizon) == (15, 7)
    hist = synthetic(200, seed=3)
    hist["zero"] = np.zeros(30)  # a silent model: rates must not go negative
    f = fc.predict(hist, seed=0)
    assert f.samples.shape == (5, 100, 7) and f.names == list(hist)
    assert (f.samples >= 0).all()
    assert f.quantiles().shape == (3, 5, 7)
    # the network's label; the seasonal series' own hourly cycle is named (forecasting/recurrence.py)
    assert f.predictor["zero"] == "nhits-normal"
    for name in synthetic(1, 0):
        assert f.predictor[name] in {"nhits-normal"} | {
            f"nhits-normal + recurrence ({p} min)" for p in range(57, 64)
        }, f.predictor[name]
    # per-minute counts in, requests per SECOND out: the mean follows the true Poisson rate
    t = np.arange(200, 207)
    true_rate = np.array([lvl * (1 + 0.3 * np.sin(2 * np.pi * t / PERIOD + i)) / 60 for i, lvl in enumerate(LEVELS)])
    np.testing.assert_allclose(f.samples[:4].mean(axis=(1, 2)), true_rate.mean(axis=1), rtol=0.25)
    assert f.samples[3].std(axis=0).mean() > 0.1  # a real spread, not a point forecast
    np.testing.assert_array_equal(fc.predict(hist, seed=0).samples, f.samples)
    assert not np.array_equal(fc.predict(hist, seed=1).samples, f.samples)
    assert fc.predict(hist, n_samples=10, seed=0).samples.shape == (5, 10, 7)


def test_direct_torch_path_matches_neuralforecast_predict(trained):
    fc, _ = trained
    hist = synthetic(300, seed=4)
    mu, sigma = fc.predict_params(np.stack([h[-15:] for h in hist.values()]))
    ref = neuralforecast_predict(fc, hist)
    sigma_ref = (ref["hi-90"] - ref["lo-90"]) / (2 * 1.6449)
    # neuralforecast's mean is the average of 1000 samples: allow ~5 standard errors
    assert np.all(np.abs(mu - ref["mean"]) <= 5 * sigma / np.sqrt(1000) + 1e-3)
    np.testing.assert_allclose(sigma, sigma_ref, rtol=0.15)


def test_interval_covers_stationary_series(trained):
    fc, _ = trained
    hist = synthetic(400, seed=11)  # unseen data from the same seasonal Poisson process
    names = list(hist)
    ev = rolling_evaluation(fc, names, np.stack([hist[n] for n in names]), n_samples=200, seed=5)
    s = ev.summary()
    assert s["coverage_90"] >= 0.8
    assert s["max_window_coverage_90"] >= 0.8
    assert s["coverage_80"] < s["coverage_90"]
    # better than the naive forecast on the mean
    base = rolling_evaluation(LastValueForecaster(), names, np.stack([hist[n] for n in names]))
    assert s["rmse"] < base.summary()["rmse"]


def test_short_history_falls_back_per_model(trained):
    """With the ``fallback`` rule a model with less than the input window is served by the
    fallback predictor; with the default (issue 32) by the network on a padded window."""
    fc, _ = trained
    hist = {
        "long": synthetic(100, seed=5)["job1"],
        "short": np.array([60.0, 120.0, 90.0]),
        "never-seen-in-training": synthetic(50, seed=6)["job2"],
        "empty": np.array([]),
    }
    fc.short_history = "fallback"
    try:
        f = fc.predict(hist, seed=2)
    finally:
        fc.short_history = DEFAULT_SHORT_RULE
    assert f.predictor == {
        "long": "nhits-normal",
        "short": "fallback: short history (3 of 15 minutes)",
        "never-seen-in-training": "nhits-normal",
        "empty": "fallback: no history",
    }
    short = f.by_model()["short"]
    assert short.min() >= 1.5 - 1e-9 and short.max() <= 2.0 + 1e-9  # between mean and max rate
    assert (f.by_model()["empty"] == 0).all()
    padded = fc.predict(hist, seed=2)
    assert padded.predictor["short"] == "nhits-normal (short history: 3 of 15 minutes)"
    assert padded.predictor["empty"] == "fallback: no history"
    with pytest.raises(ValueError, match="counts must be >= 0"):
        fc.predict({"bad": -np.ones(20)})


def test_save_load_round_trip(trained):
    fc, d = trained
    meta = read_meta(d)
    assert meta["input_size"] == 15 and meta["horizon"] == 7 and meta["loss"] == "normal"
    assert meta["scaler_type"] == "standard" and meta["train_series"] == list(synthetic(1, 0))
    state = np.random.get_state()[1].copy()
    loaded = load_forecaster(d)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # caller's RNG untouched
    hist = synthetic(120, seed=8)
    assert loaded.model is None and (d / "nhits.pt").is_file()  # the traced forward, torch alone
    np.testing.assert_allclose(
        loaded.predict(hist, seed=42).samples, fc.predict(hist, seed=42).samples, rtol=1e-5, atol=1e-6
    )
    full = load_forecaster(d, script=False)  # the weights, through neuralforecast
    np.testing.assert_array_equal(full.predict(hist, seed=42).samples, fc.predict(hist, seed=42).samples)


def test_a_corrupt_traced_forward_loads_the_weights_and_says_so(trained, tmp_path, caplog):
    import shutil

    fc, d = trained
    copy = tmp_path / "fc"
    shutil.copytree(d, copy)
    (copy / "nhits.pt").write_bytes(b"not a TorchScript archive")
    loaded = load_forecaster(copy)
    assert loaded.model is not None and "cannot load the traced forward" in caplog.text
    hist = synthetic(60, seed=8)
    np.testing.assert_array_equal(loaded.predict(hist, seed=1).samples, fc.predict(hist, seed=1).samples)


def test_a_training_that_ends_between_validations_saves(tmp_path):
    """60 steps, validated every 50: the loss's last batch mean was still in the autograd
    graph and saving failed with a RuntimeError (deepcopy of a non-leaf tensor)."""
    fc = train_forecaster(synthetic(400, seed=1), TrainConfig(**{**SMALL, "max_steps": 60}))
    assert fc.meta["training"]["steps"] == 60 and fc.meta["training"]["best_step"] == 50
    save_forecaster(fc, tmp_path / "fc")
    assert load_forecaster(tmp_path / "fc").n_members == 1


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    """Three small networks of seeds 7, 8, 9 trained as one forecaster and saved."""
    steps = []
    fc = train_forecaster(
        synthetic(400, seed=1),
        TrainConfig(**{**SMALL, "max_steps": 60, "members": 3}),
        progress=lambda s, total, loss: steps.append((s, total)),
    )
    d = tmp_path_factory.mktemp("ensemble")
    save_forecaster(fc, d)
    return fc, d, steps


def test_an_ensemble_trains_its_networks_from_successive_seeds_and_mixes_them(ensemble):
    fc, _, steps = ensemble
    assert fc.n_members == 3 and len(fc.meta["training"]["members"]) == 3
    assert steps[-1] == (steps[-1][1], 180) and [s for s, _ in steps] == sorted(s for s, _ in steps)
    hist = synthetic(60, seed=8)
    windows = np.stack([h[-15:] for h in hist.values()])
    means = [fc.predict_params(windows, member=i)[0] for i in range(3)]
    assert not np.allclose(means[0], means[1]) and not np.allclose(means[1], means[2])  # other seeds
    # the same network as a forecaster of its own: trained alone from that seed, it forecasts alike
    alone = train_forecaster(synthetic(400, seed=1), TrainConfig(**{**SMALL, "max_steps": 60, "seed": 8}))
    np.testing.assert_allclose(alone.predict_params(windows)[0], means[1], rtol=1e-5)
    # 3,001 samples: 1,001 from the first network, 1,000 from each other, about its own mean
    # (the recurring peaks, which raise a share of the samples, off for this count)
    fc.recurrence_share = 0.0
    f = fc.predict(hist, n_samples=3001, seed=3)
    assert f.samples.shape == (4, 3001, 7)
    for i, (lo, hi) in enumerate(((0, 1001), (1001, 2001), (2001, 3001))):
        block = f.samples[:, lo:hi, :].mean(axis=1) * 60
        err = [np.abs(block - m).mean() for m in means]
        assert int(np.argmin(err)) == i, err
    np.testing.assert_array_equal(f.samples, fc.predict(hist, n_samples=3001, seed=3).samples)  # seeded


def test_an_ensemble_saves_each_network_and_loads_all_of_them(ensemble, trained, tmp_path):
    import shutil

    fc, d, _ = ensemble
    assert read_meta(d)["members"] == 3
    assert {"nhits.pt", "nhits-1.pt", "nhits-2.pt", "nhits-1.safetensors", "nhits-2.safetensors"} <= {
        p.name for p in d.iterdir()
    }
    hist = synthetic(60, seed=8)
    want = fc.predict(hist, seed=5).samples
    traced = load_forecaster(d)
    assert traced.model is None and traced.n_members == 3
    np.testing.assert_allclose(traced.predict(hist, seed=5).samples, want, rtol=1e-5, atol=1e-6)
    full = load_forecaster(d, script=False)
    assert full.n_members == 3
    np.testing.assert_array_equal(full.predict(hist, seed=5).samples, want)
    # one network saved over the ensemble's directory leaves none of the others behind
    single, _ = trained
    over = tmp_path / "over"
    shutil.copytree(d, over)
    save_forecaster(single, over)
    assert not list(over.glob("nhits-*")) and load_forecaster(over).n_members == 1
    broken = tmp_path / "broken"
    shutil.copytree(d, broken)
    (broken / "nhits-2.safetensors").unlink()
    (broken / "nhits-2.pt").unlink()
    with pytest.raises(ForecasterLoadError, match="weights file nhits-2.safetensors is missing"):
        load_forecaster(broken)


def test_a_forecaster_saved_before_ensembles_loads_as_one_network(trained, tmp_path):
    import shutil

    fc, d = trained
    old = tmp_path / "old"
    shutil.copytree(d, old)
    meta = json.loads((old / META_FILE).read_text())
    del meta["members"]
    (old / META_FILE).write_text(json.dumps(meta))
    loaded = load_forecaster(old)
    assert loaded.n_members == 1
    hist = synthetic(60, seed=8)
    np.testing.assert_allclose(
        loaded.predict(hist, seed=2).samples, fc.predict(hist, seed=2).samples, rtol=1e-5, atol=1e-6
    )
    for bad in (0, "4"):
        (old / META_FILE).write_text(json.dumps({**meta, "members": bad}))
        with pytest.raises(ForecasterLoadError, match="'members' must be a positive integer"):
            load_forecaster(old)


def test_predict_is_fast_for_ten_jobs(trained):
    fc, _ = trained
    hist = synthetic(60, seed=9, levels=np.linspace(10, 1000, 10))
    fc.predict(hist)
    times = []
    for k in range(15):
        t0 = time.perf_counter()
        fc.predict(hist, seed=k)
        times.append(time.perf_counter() - t0)
    assert np.median(times) < 0.1


def test_point_nhits_is_degenerate_and_matches_neuralforecast(point_model):
    hist = synthetic(100, seed=10)
    f = point_model.predict(hist, seed=0)
    assert f.samples.shape == (4, 100, 7) and set(f.predictor.values()) == {"nhits-point"}
    assert np.ptp(f.samples, axis=1).max() == 0  # every "sample" is the point forecast
    mu, sigma = point_model.predict_params(np.stack([h[-15:] for h in hist.values()]))
    assert (sigma == 0).all()
    np.testing.assert_allclose(mu, neuralforecast_predict(point_model, hist)["mean"], rtol=1e-4, atol=1e-2)


def test_load_rejects_unknown_or_invalid_dirs(tmp_path):
    with pytest.raises(ForecasterLoadError, match="no such forecaster directory"):
        load_forecaster(tmp_path / "missing")
    (tmp_path / "meta.json").write_text("{}")  # a file given for the directory holding it
    with pytest.raises(ForecasterLoadError, match=r"meta.json: a file, not a forecaster directory"):
        load_forecaster(tmp_path / "meta.json")
    (tmp_path / "meta.json").unlink()
    with pytest.raises(ForecasterLoadError, match="no meta.json"):
        load_forecaster(tmp_path)
    (tmp_path / META_FILE).write_text("{not json")
    with pytest.raises(ForecasterLoadError, match="unreadable"):
        load_forecaster(tmp_path)
    (tmp_path / META_FILE).write_text(
        json.dumps({"format": "faro-serve-forecaster", "version": 1, "loss": "normal", "input_size": 15, "horizon": 7})
    )
    with pytest.raises(ForecasterLoadError, match="weights file"):
        load_forecaster(tmp_path)
    (tmp_path / "nhits.safetensors").write_bytes(b"garbage")
    with pytest.raises(ForecasterLoadError, match="cannot load"):
        load_forecaster(tmp_path)


def test_training_rejects_too_short_series():
    with pytest.raises(ValueError, match="too short"):
        train_forecaster({"a": np.ones(25)}, TrainConfig(max_steps=5))


def test_fallback_forecaster_still_satisfies_protocol():
    assert isinstance(FallbackForecaster(), Forecaster)


# -- command line ----------------------------------------------------------------------


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("faro-serve: error: ")
    return err[0]


def test_cli_eval_model_and_baseline(trained, tmp_path, capsys):
    _, d = trained
    csv = write_csv(tmp_path / "t.csv", synthetic(120, seed=12))
    out = tmp_path / "eval.json"
    assert main(["forecast", "eval", "--model", str(d), "--trace", csv, "--json", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    assert printed == written and written["forecaster"] == "nhits-normal"
    for key in ("rmse", "mae", "coverage_80", "coverage_90", "max_window_coverage_90", "predict_ms"):
        assert isinstance(written[key], float)
    assert written["origins"] == len(range(15, 120 - 7 + 1, 5))
    assert main(["forecast", "eval", "--baseline", "max", "--trace", csv]) == 0
    assert json.loads(capsys.readouterr().out)["forecaster"] == "max"


def test_cli_train_saves_a_loadable_model(tmp_path, capsys):
    csv = write_csv(tmp_path / "t.csv", synthetic(300, seed=13, levels=(50.0, 500.0)))
    out = tmp_path / "model"
    assert (
        main(
            [
                "forecast",
                "train",
                "--trace",
                csv,
                "--out",
                str(out),
                "--max-steps",
                "10",
                "--baseline",
                "nhits-point",
                "--seed",
                "3",
                "--members",
                "2",
            ]
        )
        == 0
    )
    assert "trained nhits-point on 2 jobs x 300 minutes" in capsys.readouterr().out
    assert read_meta(out)["loss"] == "mae" and load_forecaster(out).name == "nhits-point"
    assert read_meta(out)["members"] == 2 and load_forecaster(out).n_members == 2
    assert main(["forecast", "train", "--trace", csv, "--out", str(tmp_path / "m0"), "--members", "0"]) == 2
    assert "members must be >= 1 (got 0)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rows, message",
    [
        ("minute,job\n0,a\n", "missing column"),
        ("minute,job,requests\n0,a,1\n1,a,\n", "missing or non-numeric"),
        ("minute,job,requests\n0,a,1\n1,a,-4\n", "negative"),
        ("minute,job,requests\n" + "".join(f"{m},a,5\n" for m in range(12)), "too little history"),
    ],
)
def test_cli_eval_bad_trace_is_one_line_exit_2(tmp_path, capsys, rows, message):
    csv = tmp_path / "bad.csv"
    csv.write_text(rows)
    assert main(["forecast", "eval", "--baseline", "last", "--trace", str(csv)]) == 2
    assert message in _one_error_line(capsys)


def test_cli_bad_model_dir_and_usage_errors(trained, tmp_path, capsys):
    _, d = trained
    csv = write_csv(tmp_path / "t.csv", synthetic(25, seed=14))
    assert main(["forecast", "eval", "--model", str(tmp_path / "nope"), "--trace", csv]) == 2
    assert "no such forecaster directory" in _one_error_line(capsys)
    assert main(["forecast", "eval", "--trace", csv]) == 2
    assert "--model DIR is required" in _one_error_line(capsys)
    assert main(["forecast", "eval", "--baseline", "nhits-point", "--model", str(d), "--trace", csv]) == 2
    assert "holds a nhits-normal model" in _one_error_line(capsys)
    assert main(["forecast", "train", "--trace", csv, "--out", str(tmp_path / "m")]) == 2
    assert "too short" in _one_error_line(capsys)
    assert main(["forecast", "train", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path / "m")]) == 2
    assert "no such trace file" in _one_error_line(capsys)


def test_cli_eval_of_days_gives_the_daily_context_the_traces_day(trained, tmp_path, capsys, monkeypatch):
    """`forecast eval --days` scores the network as the simulator runs it: its daily context's
    period is the trace's day (90 points here), not a wall-clock day of 1,440 minutes."""
    import forecasting.io

    _, d = trained
    seen = []

    def load(directory):
        fc = load_forecaster(directory)
        seen.append(fc)
        return fc

    monkeypatch.setattr(forecasting.io, "load_forecaster", load)  # the command imports it when run
    hist = synthetic(180, seed=14)
    rows = [(1 + m // 90, m % 90, job, c) for job, h in hist.items() for m, c in enumerate(h)]
    path = tmp_path / "days.csv"
    pd.DataFrame(rows, columns=["day", "minute", "job", "requests"]).to_csv(path, index=False)
    assert main(["forecast", "eval", "--model", str(d), "--trace", str(path), "--days", "1-2"]) == 0
    assert json.loads(capsys.readouterr().out)["forecaster"] == "nhits-normal"
    assert len(seen) == 1 and seen[0].daily_period == 90 and seen[0].daily_weight == 0.25
    assert main(["forecast", "eval", "--model", str(d), "--trace", write_csv(tmp_path / "t.csv", hist)]) == 0
    assert seen[1].daily_period == 1440  # no days: the live default stands
