"""``faro-serve validate`` end to end on a real local Ray cluster: one policy, one trace
minute, real HTTP; the live and simulated runs see the same per-minute counts and the
report is written (paper 6.5)."""

from __future__ import annotations

import json

import pytest
from live_helpers import day_trace

pytestmark = pytest.mark.slow


# The front path only: the direct path (the default) is validated by the compare test
# (tests/test_compare_live.py), whose first run is this command's run plus its checks.
@pytest.mark.parametrize("data_path", ["front"])
def test_validate_one_policy_live_and_simulated(cli, tmp_path, report, data_path):
    trace = day_trace(tmp_path / "t.csv", {"a": [240] * 3, "b": [60] * 3})
    out = tmp_path / "val"
    code, stdout, err = cli(
        "validate",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--jobs",
        "a,b",
        "--start",
        "1",
        "--minutes",
        "1",
        "--capacity",
        "4",
        "--policies",
        "fairshare",
        "--data-path",
        data_path,
        "--out",
        str(out),
        "--forecaster",
        "fallback",
    )  # fairshare does not forecast: nothing to load
    assert code == 0, err
    doc = json.loads((out / "validation.json").read_text())
    row = doc["comparison"]["rows"][0]
    assert row["policy"] == "fairshare" and doc["data_path"] == data_path
    assert row["live_requests"] == row["sim_requests"] > 200  # one seed, the same counts
    live = json.loads((out / "fairshare" / "result.json").read_text())
    acc = live["accounting"]
    assert acc["sent"] == acc["answered"] == acc["scheduled"] and acc["errors"] == 0
    assert doc["calibration"]["cold_start_s"] > 0 and doc["calibration"]["overhead_ms"]["n"] == 200
    # the burst: 30 queued requests on one replica, the last 27 gaps between completions
    assert doc["calibration"]["hold_ms"]["n"] == 27 and 0 < doc["calibration"]["hold_ms"]["p50"] < 1000
    assert doc["simulator"]["replica_hold_s"] == pytest.approx(doc["calibration"]["hold_ms"]["p50"] / 1e3, abs=1e-6)
    assert "| fairshare |" in stdout and (out / "validation.png").exists()
    report(
        f"validate (1 min, fairshare, 2 jobs, capacity 4, {data_path} path): cluster utility live "
        f"{row['live_cluster_utility']:.3f} sim {row['sim_cluster_utility']:.3f}; overhead p50 "
        f"{doc['calibration']['overhead_ms']['p50']} ms, replica hold p50 "
        f"{doc['calibration']['hold_ms']['p50']} ms, cold start {doc['calibration']['cold_start_s']} s"
    )
