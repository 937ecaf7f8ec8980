"""``faro-serve simulate`` and ``faro-serve suite`` end to end, trace tools, bad input."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from faro_serve.traces import Trace, duplicate_jobs, load_trace, previous_day_tail


@pytest.fixture(scope="module")
def trace_csv(tmp_path_factory):
    """A small tidy CSV like ../shared/traces: 3 jobs, days 1-3, samples 0-1, 20 minutes."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("traces") / "mini.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["day", "sample", "minute", "job", "requests"])
        for day in (1, 2, 3):
            for sample in (0, 1):
                for j, base in enumerate((600, 300, 900)):
                    for m in range(20):
                        w.writerow([day, sample, m, f"job{j}", int(base * rng.uniform(0.7, 1.3))])
    return path


def test_simulate_prints_and_writes_json(cli, trace_csv, tmp_path):
    out = tmp_path / "r.json"
    code, stdout, err = cli(
        "simulate",
        "--trace",
        str(trace_csv),
        "--day",
        "3",
        "--sample",
        "0",
        "--capacity",
        "8",
        "--policy",
        "aiad",
        "--json",
        str(out),
    )
    assert code == 0, err
    assert "lost cluster utility" in stdout and "job2" in stdout
    d = json.loads(out.read_text())
    for key in ("policy", "capacity", "seed", "lost_cluster_utility", "cluster_slo_violation_rate", "wall_s"):
        assert key in d
    assert set(d["jobs"]) == {"job0", "job1", "job2"}
    assert set(d["jobs"]["job0"]) >= {"requests", "dropped", "slo_violation_rate", "lost_utility"}
    assert d["minutes"] == 20 and d["policy"] == "aiad"


def test_simulate_step_at_reports_recovery_and_damage(cli, trace_csv, tmp_path):
    out = tmp_path / "r.json"
    code, stdout, err = cli(
        "simulate",
        "--trace",
        str(trace_csv),
        "--day",
        "3",
        "--sample",
        "0",
        "--capacity",
        "8",
        "--policy",
        "faro-fairsum",
        "--step-at",
        "300",
        "--forecaster",
        "fallback",
        "--json",
        str(out),
    )
    assert code == 0, err
    surge = json.loads(out.read_text())["surge"]
    assert surge["step_s"] == 300 and surge["span_s"] == 120 and set(surge["models"]) == {"job0", "job1", "job2"}
    for m in surge["models"].values():
        assert m["requests"] > 0 and m["bad"] == m["dropped"] + m["over_slo"] <= m["requests"]
        assert m["recovery_s"] is None or 0 <= m["recovery_s"] <= 110
    assert "step at 300 s" in stdout
    code, _, err = cli(
        "simulate", "--trace", str(trace_csv), "--day", "3", "--sample", "0", "--capacity", "8", "--step-at", "5000"
    )
    assert code == 2 and "--step-at 5000 s is outside" in err


def test_replica_hold_slows_a_saturated_cluster(cli, trace_csv, tmp_path):
    """--replica-hold-ms reaches the simulator: with one replica per job near saturation, an
    idle gap of 40 ms per request (about a quarter of the 154 ms processing) raises the lost
    utility and the SLO violations."""
    lost = {}
    for hold in ("0", "40"):
        out = tmp_path / f"h{hold}.json"
        code, _, err = cli(
            "simulate",
            "--trace",
            str(trace_csv),
            "--day",
            "3",
            "--sample",
            "0",
            "--capacity",
            "3",
            "--policy",
            "fairshare",
            "--replica-hold-ms",
            hold,
            "--json",
            str(out),
        )
        assert code == 0, err
        d = json.loads(out.read_text())
        lost[hold] = (d["lost_cluster_utility"], d["cluster_slo_violation_rate"])
    assert lost["40"][0] > lost["0"][0] and lost["40"][1] > lost["0"][1]


def test_simulate_forecasting_policy_opted_out_says_fallback(cli, trace_csv):
    # the default, the shipped N-HiTS: tests/test_shipped_forecaster.py
    code, stdout, err = cli(
        "simulate",
        "--trace",
        str(trace_csv),
        "--day",
        "3",
        "--sample",
        "0",
        "--capacity",
        "8",
        "--policy",
        "faro-sum",
        "--minutes",
        "10",
        "--forecaster",
        "fallback",
        "--json",
        "-",
    )
    assert code == 0, err
    assert json.loads(stdout)["forecaster"] == "fallback: chosen"


def test_simulate_reads_json_lines(cli, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        "\n".join(json.dumps({"ts": i, "counts": {"a": {"d1": 200 + i, "d2": 100}, "b": {"d": 50}}}) for i in range(8))
        + "\n"
    )
    code, stdout, err = cli(
        "simulate",
        "--trace",
        str(path),
        "--capacity",
        "4",
        "--policy",
        "fairshare",
        "--json",
        "-",
        "--processing-dist",
        "const:0.1",
        "--slo-ms",
        "400",
    )
    assert code == 0, err
    d = json.loads(stdout)
    assert d["minutes"] == 8 and d["jobs"]["a"]["requests"] > d["jobs"]["b"]["requests"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trace", "nope.csv", "--capacity", "4"], "no such trace file"),
        (["--capacity", "8", "--policy", "nope"], "unknown policy"),
        (["--capacity", "2"], "3 jobs need at least 3 replicas"),
        (["--capacity", "8", "--processing-dist", "gamma:1"], "cannot read distribution"),
        (["--capacity", "8", "--slo-ms", "100"], "must exceed the processing time"),
        (["--capacity", "8", "--minutes", "99"], "exceeds the 20 minutes"),
        (["--capacity", "8", "--rescale", "5"], "--rescale takes LOW,HIGH"),
        (["--capacity", "8", "--replica-hold-ms", "-3"], "--replica-hold-ms must be in [0, 60000)"),
        (
            ["--capacity", "8", "--batch-profile", "nope.json"],
            "--batch-profile/--max-batch: batching profile nope.json: not a saved profile",
        ),
    ],
)
def test_simulate_bad_input_is_one_line_exit_2(cli, trace_csv, args, message):
    base = ["--trace", str(trace_csv), "--day", "3", "--sample", "0"]
    if args[0] == "--trace":
        base = []
    code, _, err = cli("simulate", *base, *args)
    assert code == 2
    assert message in err and err.strip().count("\n") == 0 and "Traceback" not in err


def test_suite_writes_csv_markdown_and_plots(cli, trace_csv, tmp_path):
    out = tmp_path / "suite"
    code, stdout, err = cli(
        "suite",
        "--trace",
        str(trace_csv),
        "--day",
        "3",
        "--sample",
        "0",
        "--policies",
        "aiad,oracle",
        "--capacities",
        "8,5",
        "--seeds",
        "2",
        "--minutes",
        "6",
        "--workers",
        "2",
        "--out",
        str(out),
    )
    assert code == 0, err
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 * 2 * 2
    assert {(r["policy"], float(r["capacity"]), int(r["seed"])) for r in rows} == {
        (p, c, s) for p in ("aiad", "oracle") for c in (8.0, 5.0) for s in (0, 1)
    }
    md = (out / "summary.md").read_text()
    assert "Capacity 8 replicas" in md and "oracle" in md
    for png in ("lost_utility.png", "timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    timeline = list(csv.DictReader(open(out / "timeline.csv")))
    assert len(timeline) == 8 * 6


def test_suite_rejects_bad_seeds_and_policies(cli, trace_csv):
    base = ["suite", "--trace", str(trace_csv), "--day", "3", "--sample", "0"]
    assert cli(*base, "--policies", "aiad,zzz")[0] == 2
    assert cli(*base, "--seeds", "x")[0] == 2
    assert cli(*base, "--capacities", "0")[0] == 2
    code, _, err = cli(*base, "--policies", "sponge", "--capacities", "8")
    assert code == 2 and "sponge needs --batch-profile" in err


def test_duplicate_jobs_and_previous_day(trace_csv):
    tr = load_trace(trace_csv, days=3, sample=0)
    big = duplicate_jobs(tr, 7, jitter=0.1, max_shift=3, seed=1)
    assert big.names[:3] == tr.names and big.names[3:] == ["job0-1", "job1-1", "job2-1", "job0-2"]
    assert np.array_equal(big.counts[:3], tr.counts)
    assert not np.array_equal(big.counts[3], tr.counts[0])
    assert big.counts[3].mean() == pytest.approx(tr.counts[0].mean(), rel=0.25)
    assert np.array_equal(duplicate_jobs(tr, 7, seed=1).counts, duplicate_jobs(tr, 7, seed=1).counts)
    prev = previous_day_tail(trace_csv, 3, 0, 5)
    assert np.array_equal(prev, load_trace(trace_csv, days=2, sample=0).counts[:, -5:])
    assert previous_day_tail(trace_csv, 1, 0, 5) is None
    rescaled = Trace(tr.names, tr.counts).rescale(1, 1600)
    assert rescaled.counts.min() == 1 and rescaled.counts.max() == 1600


def test_simulate_with_history_trains_once_then_loads(cli, trace_csv, tmp_path):
    cache = tmp_path / "fc"
    args = [
        "simulate",
        "--trace",
        str(trace_csv),
        "--day",
        "3",
        "--sample",
        "0",
        "--capacity",
        "8",
        "--policy",
        "faro-fairsum",
        "--minutes",
        "5",
        "--json",
        "-",
        "--history",
        str(trace_csv),
        "--forecaster-cache",
        str(cache),
        "--history-max-steps",
        "3",
    ]
    code, stdout, err = cli(*args)
    assert code == 0, err
    assert "training N-HiTS" in err and "days [1, 2]" in err
    assert json.loads(stdout)["forecaster"] == "nhits"
    code, stdout, err = cli(*args)
    assert code == 0, err
    assert "cached in" in err and "training" not in err
