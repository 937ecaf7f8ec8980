"""A user's mistakes on the command line are one ``faro-serve: error: ...`` line and exit
code 2, found before the work when they can be, and work already done is kept: a user's
policy that fails (tests/user_plugins/mistakes.py), output paths that cannot be written, a
capacity that is not a number, a Ray Serve config given to ``simulate --config``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from live_helpers import day_trace

ROOT = Path(__file__).resolve().parents[1]
USER = "tests.user_plugins.mistakes"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Two jobs, 4 minutes on day 1."""
    return day_trace(tmp_path_factory.mktemp("t") / "t.csv", {"a": [300] * 4, "b": [200] * 4})


def sim(cli, trace, *args):
    return cli("simulate", "--trace", str(trace), "--day", "1", "--sample", "0", "--warmup-minutes", "0", *args)


def suite(cli, trace, out, *args):
    return cli(
        "suite",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--warmup-minutes",
        "0",
        "--seeds",
        "1",
        "--out",
        str(out),
        *args,
    )


def error(err: str) -> str:
    """The one error line (a suite also draws its progress bar on stderr)."""
    lines = [x for x in err.splitlines() if x.startswith("faro-serve:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "policy, message",
    [
        ("Boom", "policy '{p}' failed at t=60s: KeyError: 'x'"),
        (
            "ReturnsDict",
            "policy '{p}' returned a dict at t=0s, not a Decision (autoscaler.contract.policy.Decision) or None",
        ),
        ("Negative", "policy '{p}' asked for -3 replicas of 'a' at t=0s (a number >= 0)"),
        ("TooMany", "policy '{p}' asked for 200 CPUs (the cluster has 8) at t=0s (targets {{'a': 100, 'b': 100}})"),
    ],
)
def test_a_failing_user_policy_is_one_line_naming_it(cli, trace, policy, message):
    p = f"{USER}:{policy}"
    code, out, err = sim(cli, trace, "--capacity", "8", "--policy", p)
    assert (code, err, out) == (2, f"faro-serve: error: {message.format(p=p)}\n", "")


def test_the_driver_gives_a_failing_tick_its_time():
    """The time the one line names is carried on the exception by the driver, not looked up
    in the traceback's frames; an exception without one is named without a time."""
    import pickle
    from types import SimpleNamespace

    from autoscaler.driving.driver import DecisionRefused, apply_decision, decide
    from faro_serve.sim.policy_suite import RunFailed, policy_failures

    class Boom:
        def decide(self, _):
            return {}["x"]

    with pytest.raises(KeyError) as caught:  # the policy's own exception, its type kept
        decide(Boom(), SimpleNamespace(now=60.0))
    assert caught.value.now == 60.0
    with pytest.raises(DecisionRefused) as refused:
        apply_decision({}, {"a": 1}, [], 8, policy="p", now=30.0)
    assert refused.value.now == pickle.loads(pickle.dumps(refused.value)).now == 30.0
    for err, at in ((caught.value, " at t=60s"), (KeyError("x"), "")):
        with pytest.raises(RunFailed) as failed, policy_failures("my.policies:P"):
            raise err
        assert str(failed.value) == f"policy 'my.policies:P' failed{at}: KeyError: 'x'"


def test_the_live_loop_drives_a_policy_as_the_simulator_does():
    """The live loop decides through the same driver call as the simulator's runners, so a
    user's policy failing live carries the tick's time too (the actor logs it)."""
    from meter_reports import FakeCluster

    from autoscaler.driving.loop import AutoscalerLoop
    from faro_serve.serving.schema import parse_autoscaler_config

    cfg = parse_autoscaler_config(
        {
            "cluster": {"cpus": 2},
            "policy": f"{USER}:Boom",
            "forecaster": "fallback",
            "models": [{"name": "a", "slo_ms": 720, "processing_ms": 50, "cpus": 0.5}],
        }
    )
    clock = {"t": 1000.0}
    loop = AutoscalerLoop(cfg, FakeCluster({"a": 1}), clock=lambda: clock["t"])
    loop.step()  # Boom fails from its second minute on, counted from the loop's start
    clock["t"] += 120
    with pytest.raises(KeyError) as caught:
        loop.step()
    assert caught.value.now == 120.0


def test_a_suite_keeps_the_runs_that_finished_when_a_policy_fails(cli, trace, tmp_path):
    out = tmp_path / "suite"
    code, _, err = suite(
        cli, trace, out, "--capacities", "8", "--seeds", "0,1", "--workers", "2", "--policies", f"aiad,{USER}:Boom"
    )
    assert code == 2
    assert error(err) == (
        f"faro-serve: error: policy '{USER}:Boom' failed at t=60s: KeyError: 'x'; "
        f"the suite stopped; the 2 of 4 runs that finished are in "
        f"{out / 'results.csv'} (summary.md names the others)"
    )
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [(r["policy"], r["seed"]) for r in rows] == [("aiad", "0"), ("aiad", "1")]
    assert (
        f"**Incomplete**: 2 of 4 runs finished; the suite stopped at: policy '{USER}:Boom' "
        f"failed at t=60s" in (out / "summary.md").read_text()
    )


def test_a_dead_suite_worker_is_one_line_naming_its_run(cli, trace, tmp_path):
    code, _, err = suite(
        cli, trace, tmp_path / "s", "--capacities", "8", "--workers", "2", "--policies", f"{USER}:Dies"
    )
    assert code == 2
    assert error(err) == (
        f"faro-serve: error: a suite worker process died while running "
        f"{USER}:Dies at 8 (seed 0) (out of memory or the policy exited); the "
        f"suite stopped before any run finished (of 1)"
    )


@pytest.mark.parametrize(
    "make, args, message",
    [
        ("file", ("suite", "--out", "{x}"), "--out {x}: is a file, not a directory"),
        ("none", ("suite", "--out", "/proc/x"), "--out /proc/x: cannot be written (No such file or directory)"),
        ("dir", ("simulate", "--json", "{x}"), "--json {x}: is a directory"),
        (
            "none",
            ("simulate", "--json", "/proc/x/y.json"),
            "--json /proc/x/y.json: cannot be written (No such file or directory)",
        ),
    ],
)
def test_an_output_path_is_checked_before_the_runs(cli, trace, tmp_path, make, args, message):
    x = tmp_path / "x"
    if make == "file":
        x.write_text("mine\n")
    elif make == "dir":
        x.mkdir()
    cmd, flag, where = args
    # the user's policy would fail its first tick: the path is refused before any run
    if cmd == "suite":
        code, _, err = suite(cli, trace, where.format(x=x), "--capacities", "8", "--policies", f"{USER}:ReturnsDict")
    else:
        code, _, err = sim(cli, trace, "--capacity", "8", "--policy", f"{USER}:ReturnsDict", flag, where.format(x=x))
    assert (code, err) == (2, f"faro-serve: error: {message.format(x=x)}\n")
    assert make != "file" or x.read_text() == "mine\n"


@pytest.mark.parametrize(
    "where, message",
    [("{x}", "-o {x}: is a directory"), ("/proc/x", "-o /proc/x: cannot be written (No such file or directory)")],
)
def test_init_checks_its_output_before_importing_the_deployment(cli, tmp_path, where, message):
    (tmp_path / "x").mkdir()
    code, _, err = cli("init", "tests.user_plugins.mistakes:NoSuchDeployment", "-o", where.format(x=tmp_path / "x"))
    assert (code, err) == (2, f"faro-serve: error: {message.format(x=tmp_path / 'x')}\n")


def _trained_anyway(*args, **kwargs):
    raise ValueError("trained before the output was checked")


@pytest.mark.parametrize(
    "where, message",
    [
        ("{f}", "--out {f}: is a file, not a directory"),
        ("{f}/net", "--out {f}/net: cannot be written (Not a directory)"),
        ("/proc/x", "--out /proc/x: cannot be written (No such file or directory)"),
    ],
)
def test_forecast_train_checks_its_output_before_training(cli, trace, tmp_path, monkeypatch, where, message):
    import forecasting.train

    monkeypatch.setattr(forecasting.train, "train_forecaster", _trained_anyway)
    f = tmp_path / "f"
    f.write_text("mine\n")
    code, _, err = cli("forecast", "train", "--trace", str(trace), "--out", where.format(f=f))
    assert (code, err) == (2, f"faro-serve: error: {message.format(f=f)}\n")
    assert f.read_text() == "mine\n"


def test_forecast_train_makes_its_output_only_to_save(cli, trace, tmp_path, monkeypatch):
    """A training that fails leaves no empty directory behind."""
    import forecasting.train

    monkeypatch.setattr(forecasting.train, "train_forecaster", _trained_anyway)
    code, _, err = cli("forecast", "train", "--trace", str(trace), "--out", str(tmp_path / "new" / "net"))
    assert code == 2 and error(err) == "faro-serve: error: trained before the output was checked"
    assert not (tmp_path / "new").exists()


def test_a_timeline_capacity_must_be_one_of_the_capacities(cli, trace, tmp_path):
    code, _, err = suite(
        cli, trace, tmp_path / "s", "--capacities", "8,4", "--policies", "aiad", "--timeline-capacity", "7"
    )
    assert (code, err) == (2, "faro-serve: error: --timeline-capacity 7 is not one of --capacities 8,4\n")


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_capacity_must_be_a_finite_number(cli, trace, tmp_path, value):
    code, _, err = sim(cli, trace, "--capacity", value, "--policy", "aiad")
    assert (code, err) == (2, f"faro-serve: error: --capacity must be a finite number > 0 (got {value})\n")
    code, _, err = suite(cli, trace, tmp_path / "s", "--capacities", f"8,{value}", "--policies", "aiad")
    assert (code, err) == (2, f"faro-serve: error: each of --capacities must be a finite number > 0 (got {value})\n")


@pytest.mark.parametrize("command", ["simulate", "suite"])
def test_a_rescale_past_the_trace_limit_is_refused(cli, trace, tmp_path, command):
    """The file's counts are held to MAX_REQUESTS_PER_MINUTE; a rescale may not lift them past it."""
    import numpy as np

    from faro_serve.traces import MAX_REQUESTS_PER_MINUTE as MAX
    from faro_serve.traces import Trace

    high = 2 * MAX
    if command == "simulate":
        code, _, err = sim(cli, trace, "--capacity", "8", "--policy", "aiad", "--rescale", f"1,{high}")
    else:
        code, _, err = suite(
            cli, trace, tmp_path / "s", "--capacities", "8", "--policies", "aiad", "--rescale", f"1,{high}"
        )
    assert code == 2 and error(err) == (
        f"faro-serve: error: --rescale 1,{high:g}: needs 0 <= LOW "
        f"<= HIGH <= {MAX:,} (the limit of requests per minute per job)"
    )
    assert Trace(["a"], np.array([[3.0, 5.0]])).rescale(1, MAX).counts.max() == MAX


def test_simulate_reads_the_faro_application_of_a_serve_config(cli, tmp_path):
    """The project's own serve_config.yaml: its faro application's models are simulated."""
    names = ["resnet18", "resnet34", "synth-a", "synth-b"]
    tr = day_trace(tmp_path / "t.csv", {n: [60] * 3 for n in names})
    code, out, err = sim(cli, tr, "--config", str(ROOT / "serve_config.yaml"), "--policy", "aiad", "--json", "-")
    assert code == 0, err
    import json

    assert sorted(json.loads(out)["jobs"]) == names


def test_a_forecaster_trained_on_the_replayed_day_is_noted(tmp_path):
    """--history-days that hold the day replayed (same file, same sample) get a note; the
    days before it, another sample or another file do not."""
    from argparse import Namespace

    from faro_serve.commands._scenario import warn_if_trained_on_the_day

    f = tmp_path / "t.csv"
    f.write_text("day,sample,minute,job,requests\n")
    notes = []

    def args(**kw):
        base = dict(trace=str(f), history=str(f), day=8, sample=0, history_days="1-8", history_sample=0)
        return Namespace(**(base | kw))

    warn_if_trained_on_the_day(args(), notes.append)
    assert notes == [
        "note: --history-days 1-8 includes day 8, the day replayed: the forecaster "
        "is trained on the minutes it forecasts (use the days before it)"
    ]
    for kw in (
        {"history_days": "1-7"},
        {"history_sample": 1},
        {"history": str(tmp_path / "other.csv")},
        {"history_days": None},
    ):
        warn_if_trained_on_the_day(args(**kw), notes.append)
    assert len(notes) == 1


@pytest.mark.parametrize("command", ["simulate", "replay"])
def test_a_jobs_list_of_commas_is_named_not_read_as_every_job(cli, trace, command):
    extra = ["--capacity", "8"] if command == "simulate" else ["--slo-ms", "500"]
    code, _, err = cli(command, "--trace", str(trace), "--day", "1", "--sample", "0", "--jobs", " , ", *extra)
    assert code == 2 and error(err) == (
        "faro-serve: error: --jobs ' , ' names no job (write job names separated by commas)"
    )


@pytest.mark.parametrize("command", ["simulate", "replay", "validate"])
def test_a_negative_seed_is_named_with_its_flag(cli, trace, command):
    code, _, err = cli(command, "--trace", str(trace), "--seed", "-1")
    assert code == 2 and err.splitlines()[-1].endswith("error: argument --seed: must be >= 0 (got -1)")


def test_a_forecaster_that_renames_its_models_is_refused_at_start(cli, trace):
    code, _, err = sim(cli, trace, "--capacity", "8", "--forecaster", f"{USER}:RenamesModels")
    assert code == 2 and error(err) == (
        f"faro-serve: error: forecaster '{USER}:RenamesModels': RenamesModels.predict must "
        "forecast the models it is given, in their order (['check-a', 'check-b']); got "
        "['m0', 'm1']"
    )


def test_run_and_drain_name_bad_input_before_starting_anything(cli, tmp_path):
    """Issue 50's commands: a Ray address where nothing listens is one line at once (Ray
    itself would wait a minute or more), and a config that cannot be served is named."""
    from faro_serve.ports import free_port

    code, _, err = cli("drain", "--address", f"127.0.0.1:{free_port()}")
    assert code == 2 and "nothing answers at 127.0.0.1:" in err and "Traceback" not in err
    code, _, err = cli("drain", "--timeout", "0")
    assert code == 2 and "--timeout must be > 0 seconds" in err
    code, _, err = cli("run", str(tmp_path / "none.yaml"))
    assert code == 2 and "no such file" in err
    (tmp_path / "c.yaml").write_text("applications: []\n")
    code, _, err = cli("run", str(tmp_path / "c.yaml"))
    assert code == 2 and "needs exactly one application" in err
    code, _, err = cli("run", str(tmp_path / "c.yaml"), "--drain-timeout", "-1")
    assert code == 2 and "--drain-timeout must be > 0" in err
