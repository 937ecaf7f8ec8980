"""Matched validation (paper 6.5): the comparison maths, the calibration fits, the whole
re-simulation pipeline on saved runs, and the command's input errors. The live side is
exercised by tests/test_compare_live.py (compare and validate share their live runs)."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from faro_serve.distributions import PAPER_ROUTER_OVERHEAD
from faro_serve.replay.client import ReplayRecords
from faro_serve.replay.loadgen import build_schedule
from faro_serve.validation.calibration import Calibration
from faro_serve.validation.comparison import (
    Workload,
    fit_overhead,
    kendall_distance,
    kendall_tau,
    relative_difference,
    scale_up_lags,
)
from faro_serve.validation.matched import load_state, resimulate


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory):
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("traces") / "mini.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["day", "sample", "minute", "job", "requests"])
        for j, base in enumerate((300, 120, 600)):
            for m in range(12):
                w.writerow([1, 0, m, f"job{j}", int(base * rng.uniform(0.7, 1.3))])
    return path


def test_kendall_distance_is_the_fraction_of_discordant_pairs():
    assert kendall_distance([3, 2, 1], [30, 20, 10]) == 0.0
    assert kendall_distance([3, 2, 1], [10, 20, 30]) == 1.0
    assert kendall_distance([3, 2, 1], [20, 30, 10]) == pytest.approx(1 / 3)
    assert kendall_distance([1, 1], [1, 2]) == 0.5  # a tie on one side is half a disagreement
    assert kendall_tau([3, 2, 1], [30, 20, 10]) == pytest.approx(1.0)
    assert math.isnan(kendall_tau([1.0], [2.0]))


def test_relative_difference_uses_the_live_run_as_reference():
    assert relative_difference(2.0, 2.2) == pytest.approx(0.1)
    assert relative_difference(2.0, 1.8) == pytest.approx(0.1)
    assert relative_difference(0.0, 0.0) == 0.0
    assert relative_difference(0.0, 1.0) == math.inf


def test_overhead_fit_recovers_a_lognormal():
    x = PAPER_ROUTER_OVERHEAD.sample(np.random.default_rng(0), 5000)
    fit = fit_overhead(x)
    assert fit.kind == "lognorm"
    assert fit.mean == pytest.approx(x.mean(), rel=0.05)
    with pytest.raises(ValueError, match="at least 20"):
        fit_overhead(np.array([0.01, 0.02]))


def test_scale_up_lags_from_status_polls():
    def st(target, replicas):
        return {"models": {"a": {"target": target, "replicas": replicas}}}

    polls = [(0, st(1, 1)), (2, st(3, 1)), (4, st(3, 2)), (7, st(3, 3)), (9, st(2, 3)), (11, st(2, 2))]
    assert scale_up_lags(polls, ["a"]) == [5]  # up at t=2, serving at t=7; downs are no lag


def test_workload_slice_and_errors(trace_csv):
    wl = Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0", "job2"), start=2, minutes=5, rate_scale=0.5)
    tr = wl.load()
    assert tr.names == ["job0", "job2"] and tr.counts.shape == (2, 5)
    with pytest.raises(ValueError, match="beyond the 12 minutes"):
        Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0",), start=10, minutes=5).load()
    with pytest.raises(ValueError, match="rate-scale"):
        Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0",), rate_scale=0).load()


def _fake_live(wl: Workload, latency_s: float):
    """A "live" run whose every request took ``latency_s``: the pipeline, not Ray, under test."""
    tr = wl.load()
    sched = build_schedule(tr, tr.names, 1.0, 1.0, wl.seed)
    n = sched.size
    rec = ReplayRecords(
        model=sched.model.copy(),
        trace_s=sched.trace_s.copy(),
        send_s=sched.send_s.copy(),
        status=["200"] * n,
        latency_s=np.full(n, latency_s),
        reason=[""] * n,
    )
    return sched, rec


def test_resimulate_compares_saved_runs_and_writes_the_report(trace_csv, tmp_path):
    wl = Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0", "job1", "job2"), start=0, minutes=8)
    cal = Calibration(
        overhead_s=list(PAPER_ROUTER_OVERHEAD.sample(np.random.default_rng(0), 200)),
        cold_start_s=3.0,
        hold_s=[0.010, 0.014, 0.012],
    )
    # live runs: one meeting every SLO (0.2 s), one missing them all (2 s)
    state = {
        "workload": wl,
        "capacity": 9,
        "processing": "lognorm:0.4225,0.0793,0.0686",
        "forecaster_dir": None,
        "calibration": cal,
        "runs": {"faro-fairsum": _fake_live(wl, 0.2), "fairshare": _fake_live(wl, 2.0)},
    }
    doc = resimulate(state, tmp_path, draws=3)
    rows = {r["policy"]: r for r in doc["comparison"]["rows"]}
    for r in rows.values():  # the simulated side is the mean of 3 draws, inside their range
        assert r["sim_draws"] == 3
        assert r["sim_cluster_utility_min"] <= r["sim_cluster_utility"] <= r["sim_cluster_utility_max"]
    assert any(r["sim_cluster_utility_min"] < r["sim_cluster_utility_max"] for r in rows.values())
    assert rows["faro-fairsum"]["live_cluster_utility"] == pytest.approx(3.0)
    assert rows["fairshare"]["live_cluster_utility"] == pytest.approx(3 * 0.72 / 2.0)  # U = SLO / latency
    for r in rows.values():  # the simulator ran the same per-minute counts
        assert r["sim_requests"] == r["live_requests"]
        assert 0 < r["sim_cluster_utility"] <= 3.0
    assert rows["fairshare"]["utility_rel_diff"] > 1.0  # a live miss the simulator does not predict
    assert doc["simulator"]["cold_start_s"] == 3.0
    assert doc["simulator"]["replica_hold_s"] == pytest.approx(0.012)  # the calibration's median
    assert doc["calibration"]["hold_ms"] == {"n": 3, "p50": 12.0, "p90": 13.6}
    text = (tmp_path / "validation.md").read_text()
    assert "replica hold 12.0 ms" in text
    assert "| faro-fairsum |" in text and "Kendall-tau distance" in text
    assert "sim (mean of 3 draws) | range" in text
    assert (tmp_path / "validation.png").stat().st_size > 1000
    # an override replaces the calibration
    assert resimulate(state, tmp_path, hold_s=0.0, draws=1)["simulator"]["replica_hold_s"] == 0.0
    with pytest.raises(ValueError, match="draws must be >= 1"):
        resimulate(state, tmp_path, draws=0)
    with pytest.raises(FileNotFoundError, match="no saved live runs"):
        load_state(tmp_path)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--policies", "nope"], "unknown nope"),
        (["--capacity", "0.5"], "--capacity must be a finite number >= 1 (got 0.5)"),
        (["--capacity", "inf"], "--capacity must be a finite number >= 1 (got inf)"),
        (["--capacity", "nan"], "--capacity must be a finite number >= 1 (got nan)"),
        (["--jobs", "job0,job1,job2", "--capacity", "2", "--minutes", "5"], "3 jobs need at least 3 replicas"),
        (["--minutes", "50"], "beyond the 12 minutes"),
        (["--hold-ms", "-1"], "--hold-ms must be in [0, 60000)"),
        (["--sim-draws", "0"], "--sim-draws must be in [1, 100]"),
    ],
)
def test_validate_bad_input_is_one_line_exit_2(cli, trace_csv, tmp_path, args, message):
    code, out, err = cli(
        "validate",
        "--trace",
        str(trace_csv),
        "--day",
        "1",
        "--start",
        "0",
        "--jobs",
        "job0,job1",
        "--out",
        str(tmp_path),
        *args,
    )
    assert code == 2 and message in err and err.count("\n") == 1


def test_validate_resimulate_without_saved_runs_is_an_error(cli, tmp_path):
    code, _, err = cli("validate", "--resimulate", "--out", str(tmp_path))
    assert code == 2 and "no saved live runs" in err


def test_validate_resimulate_names_a_saved_file_it_cannot_use(cli, tmp_path):
    import pickle

    saved = tmp_path / "live.pkl"
    for content, why in (
        (b"garbage\n", "not a saved validate run ("),
        (
            pickle.dumps({"x": 1}),
            "not a saved validate run (no workload, capacity, runs); run validate without --resimulate",
        ),
    ):
        saved.write_bytes(content)
        code, _, err = cli("validate", "--resimulate", "--out", str(tmp_path))
        assert code == 2 and err.count("\n") == 1 and err.startswith(f"faro-serve: error: {saved}: {why}"), err


def test_validate_again_refuses_saved_runs_of_another_workload(cli, trace_csv, tmp_path):
    import pickle

    wl = Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0", "job1"), start=0, minutes=4)
    with (tmp_path / "live.pkl").open("wb") as f:
        pickle.dump({"workload": wl, "capacity": 4, "runs": {}, "data_path": "direct"}, f)
    code, _, err = cli(
        "validate",
        "--trace",
        str(trace_csv),
        "--day",
        "1",
        "--start",
        "0",
        "--jobs",
        "job0,job1",
        "--minutes",
        "5",
        "--capacity",
        "4",
        "--again",
        "--policies",
        "fairshare",
        "--out",
        str(tmp_path),
    )
    assert code == 2 and "another workload;" in err


def test_validate_again_refuses_saved_runs_of_another_data_path(cli, trace_csv, tmp_path):
    import pickle

    wl = Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0", "job1"), start=0, minutes=5)
    with (tmp_path / "live.pkl").open("wb") as f:
        pickle.dump({"workload": wl, "capacity": 4.0, "runs": {}, "data_path": "front"}, f)
    code, _, err = cli(
        "validate",
        "--trace",
        str(trace_csv),
        "--day",
        "1",
        "--start",
        "0",
        "--jobs",
        "job0,job1",
        "--minutes",
        "5",
        "--capacity",
        "4",
        "--again",
        "--policies",
        "fairshare",
        "--out",
        str(tmp_path),
    )
    assert code == 2 and "another data path;" in err  # the same workload and capacity
    code, _, err = cli("validate", "--trace", str(trace_csv), "--data-path", "sideways", "--out", str(tmp_path))
    assert code == 2 and "--data-path" in err


def test_head_to_head_report_against_ray_native(trace_csv, tmp_path):
    """compare's report from saved runs: ray-native is simulated as Ray's rule (ray-serve),
    the loss ratio, the accounting and the machine's load are written, the plot drawn."""
    from faro_serve.validation.headtohead import contention, plot, report

    wl = Workload(trace=str(trace_csv), day=1, sample=0, jobs=("job0", "job1", "job2"), start=0, minutes=8)
    cal = Calibration(
        overhead_s=list(PAPER_ROUTER_OVERHEAD.sample(np.random.default_rng(0), 200)),
        cold_start_s=3.0,
        hold_s=[0.010, 0.014, 0.012],
    )
    native = _fake_live(wl, 2.0)
    native[1].status_polls = [
        (2.0 * k, {"models": {n: {"target": 2, "replicas": 1 + k % 2} for n in ("job0", "job1", "job2")}})
        for k in range(10)
    ]
    state = {
        "workload": wl,
        "capacity": 9,
        "processing": "lognorm:0.4225,0.0793,0.0686",
        "forecaster_dir": None,
        "calibration": cal,
        "load_average": {"ray-native": (0.5, 1.2)},
        "runs": {"faro-fairsum": _fake_live(wl, 0.2), "ray-native": native},
    }
    doc = resimulate(state, tmp_path)
    assert doc["sim"]["ray-native"]["policy"] == "ray-serve"
    text = report(state, doc)
    n = native[1].counts()["sent"]
    assert f"| ray-native | {3 - 3 * 0.72 / 2.0:.3f} |" in text  # U = SLO / latency per job-minute
    assert "faro-fairsum loses 0.00x the utility ray-native loses" in text
    # where the Ray run lost nothing there is no ratio, and the line says so
    from dataclasses import replace

    from faro_serve.validation.headtohead import live_results, loss_verdict

    s = live_results(state)["ray-native"].summary  # 2 s a request: it loses utility
    assert s.lost_cluster_utility > 0
    none = replace(s, lost_cluster_utility=0.0)
    assert loss_verdict("f", s, "r", none).startswith(
        f"f loses {s.lost_cluster_utility:.3f} of utility where r loses none"
    )
    assert loss_verdict("f", none, "r", none).startswith("f loses no utility, nor does r; SLO violations")
    assert "inf" not in loss_verdict("f", s, "r", none)
    assert f"| {n:,} |" in text and "0.5 / 1.2" in text
    c = contention(wl, 9)
    assert c["sum_of_peaks"] == sum(c["peak_need"].values()) and c["max_minute_need"] <= c["sum_of_peaks"]
    plot(state, tmp_path / "compare.png")
    assert (tmp_path / "compare.png").stat().st_size > 1000


def test_the_default_compare_slice_is_contended():
    """Issue 18's scenario: at least 6 jobs and 30 trace minutes whose busiest minutes
    together need more replicas than the cluster has."""
    from conftest import SHARED_TRACES

    from faro_serve.commands.compare import DEFAULT_JOBS
    from faro_serve.validation.headtohead import contention

    path = SHARED_TRACES / "faro10_days1-10.csv"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    wl = Workload(
        trace=str(path),
        day=9,
        sample=0,
        jobs=tuple(DEFAULT_JOBS.split(",")),
        start=310,
        minutes=30,
        rate_scale=1 / 3,
        slowdown=3.0,
    )
    c = contention(wl, 16)
    assert len(wl.jobs) >= 6 and wl.minutes >= 30
    # the cluster holds the mean minute's need but not every job's peak at once
    assert c["mean_need"] <= 16 < c["sum_of_peaks"]
