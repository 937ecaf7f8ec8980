"""Trace files the loader must refuse (or read as written): minute numbers are checked, not
trusted, counts are numbers within a limit, and every refusal names the file and the row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from faro_serve.traces import MAX_REQUESTS_PER_MINUTE, TraceError, load_trace

FILL = "write 0 for minutes without requests"


def _csv(tmp_path, rows, header="minute,job,requests"):
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "".join(f"{r}\n" for r in rows))
    return path


def _jsonl(tmp_path, records):
    path = tmp_path / "t.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _refused(path, message, **kw):
    with pytest.raises(TraceError) as err:
        load_trace(path, **kw)
    assert str(err.value) == f"{path}: {message}"


def test_csv_gap_in_every_job_is_refused_not_closed_up(tmp_path):
    path = _csv(tmp_path, [f"{m},{j},100" for m in (0, 5, 9) for j in "ab"])
    _refused(
        path, f"minutes 1-4, 6-8 missing: the trace needs a row for every minute from the first to the last; {FILL}"
    )


def test_csv_gap_of_one_job_names_the_job_and_day(tmp_path):
    rows = [
        f"{d},{m},{j},5" for d in (1, 2) for m in range(6) for j in "ab" if not (d == 2 and j == "b" and m in (2, 3, 5))
    ]
    path = _csv(tmp_path, rows, header="day,minute,job,requests")
    _refused(path, f"day 2: job b lacks minutes 2-3, 5: every job needs a row for every minute; {FILL}")
    assert load_trace(path, days=1).counts.shape == (2, 6)  # the complete day still loads


def test_csv_day_gap_is_checked_per_day(tmp_path):
    rows = [f"{d},{m},a,5" for d in (1, 2) for m in range(6) if not (d == 2 and m == 4)]
    path = _csv(tmp_path, rows, header="day,minute,job,requests")
    _refused(
        path, f"day 2: minute 4 missing: the trace needs a row for every minute from the first to the last; {FILL}"
    )


def test_csv_fractional_and_missing_minutes_name_the_row(tmp_path):
    _refused(_csv(tmp_path, ["0,a,1", "0.5,a,1", "1.7,a,1"]), "'minute' must be a whole number (data row 2 has 0.5)")
    _refused(_csv(tmp_path, ["0,a,1", ",a,1"]), "'minute' has a missing or non-numeric value (data row 2)")


def test_csv_slice_not_starting_at_zero_and_shuffled_rows_load_in_minute_order(tmp_path):
    path = _csv(tmp_path, ["70,a,3", "68,a,1", "69,a,2", "69,b,5", "68,b,4", "70,b,6"])
    t = load_trace(path)
    assert t.names == ["a", "b"] and t.counts.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_csv_absurd_infinite_and_nan_counts_name_the_row(tmp_path):
    rows = ["0,a,1", "0,b,1", "1,a,1", "1,b,{}"]
    _refused(
        _csv(tmp_path, [r.format("1e12") for r in rows]),
        f"'requests' is 1e+12 in data row 4, above the limit of {MAX_REQUESTS_PER_MINUTE:,} "
        "requests per minute per job",
    )
    _refused(_csv(tmp_path, [r.format("inf") for r in rows]), "'requests' has an infinite value (data row 4)")
    _refused(_csv(tmp_path, [r.format("") for r in rows]), "'requests' has a missing or non-numeric value (data row 4)")
    _refused(_csv(tmp_path, [r.format("-1") for r in rows]), "'requests' has negative counts (data row 4)")
    assert (
        load_trace(_csv(tmp_path, [r.format(MAX_REQUESTS_PER_MINUTE) for r in rows])).counts.max()
        == MAX_REQUESTS_PER_MINUTE
    )


def test_csv_row_numbers_count_the_whole_file_when_days_are_selected(tmp_path):
    rows = [f"{d},{m},a,{'' if (d, m) == (2, 1) else 5}" for d in (1, 2) for m in range(3)]
    _refused(
        _csv(tmp_path, rows, header="day,minute,job,requests"),
        "'requests' has a missing or non-numeric value (data row 5)",
        days=2,
    )


def test_csv_header_and_fields_with_spaces_read_as_written(tmp_path):
    path = _csv(
        tmp_path,
        [f"{m}, {j}, {10 * m + i}" for m in range(3) for i, j in enumerate("ab")],
        header="minute, job, requests ",
    )
    t = load_trace(path)
    assert t.names == ["a", "b"] and t.counts.tolist() == [[0, 10, 20], [1, 11, 21]]


def test_jsonl_lines_are_ordered_by_ts_and_absent_jobs_count_zero(tmp_path):
    path = _jsonl(
        tmp_path,
        [{"ts": 3, "counts": {"a": {"d1": 5, "d2": 3}}}, {"ts": 1, "counts": {"b": 2}}, {"ts": 2, "counts": {}}],
    )
    t = load_trace(path)
    assert t.names == ["a", "b"] and t.counts.tolist() == [[0, 0, 8], [2, 0, 0]]


def test_jsonl_gaps_duplicates_and_fractional_ts_are_refused(tmp_path):
    rec = lambda ts: {"ts": ts, "counts": {"a": {"d": 100}}}  # noqa: E731
    _refused(
        _jsonl(tmp_path, [rec(5), rec(0), rec(100)]),
        "no line has ts 1-4, 6-99: the trace needs a line for every minute from the first ts "
        'to the last; write {"ts": t, "counts": {}} for minutes without requests',
    )
    _refused(
        _jsonl(tmp_path, [rec(0), rec(1_700_000_000)]),  # seconds, not minutes: no huge allocation
        "no line has ts 1-1699999999: the trace needs a line for every minute from the first ts "
        'to the last; write {"ts": t, "counts": {}} for minutes without requests',
    )
    p = _jsonl(tmp_path, [rec(0), rec(1), rec(1)])
    with pytest.raises(TraceError, match=r"^.*t\.jsonl:3: ts 1 repeats line 2$"):
        load_trace(p)
    p = _jsonl(tmp_path, [rec(0), rec(0.5)])
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert str(err.value) == f"{p}:2: 'ts' must be a whole minute number (got 0.5)"
    p = _jsonl(tmp_path, [{"counts": {"a": 1}}])
    with pytest.raises(TraceError) as err:
        load_trace(p)
    assert str(err.value) == f'{p}:1: expected {{"ts": i, "counts": {{job: {{deployment: n}}}}}}'


@pytest.mark.parametrize(
    "count, message",
    [
        ("true", "job a: counts must be numbers (got true)"),
        ('{"d": false}', "job a: counts must be numbers (got false)"),
        ('"7"', 'job a: counts must be numbers (got "7")'),
        ("Infinity", "job a: counts must be finite and >= 0 (got Infinity)"),
        ("NaN", "job a: counts must be finite and >= 0 (got NaN)"),
        ('{"d1": 5, "d2": -3}', "job a: counts must be finite and >= 0 (got -3)"),
        ("1e12", f"job a: 1e+12 requests, above the limit of {MAX_REQUESTS_PER_MINUTE:,} requests per minute per job"),
    ],
)
def test_jsonl_bad_counts_name_the_line_and_job(tmp_path, count, message):
    path = _jsonl(tmp_path, ['{"ts": 0, "counts": {"a": 1}}', '{"ts": 1, "counts": {"a": %s}}' % count])
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == f"{path}:2: {message}"


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda p: _csv(p, [f"{m},{j},100" for m in (0, 5, 9) for j in "ab"]),
            f"minutes 1-4, 6-8 missing: the trace needs a row for every minute from the first to the last; {FILL}",
        ),
        (
            lambda p: _csv(p, ["0,a,1", "1,a,1e12"]),
            f"'requests' is 1e+12 in data row 2, above the limit of {MAX_REQUESTS_PER_MINUTE:,} requests per "
            "minute per job",
        ),
        (lambda p: _jsonl(p, ['{"ts": 0, "counts": {"a": true}}']), None),
    ],
)
def test_cli_refuses_in_one_line_exit_2(cli, tmp_path, make, message):
    path = make(tmp_path)
    code, out, err = cli(
        "simulate", "--trace", str(path), "--capacity", "8", "--policy", "aiad", "--forecaster", "fallback"
    )
    expected = f"{path}: {message}" if message else f"{path}:1: job a: counts must be numbers (got true)"
    assert code == 2 and err == f"faro-serve: error: {expected}\n" and "Traceback" not in err


def test_real_traces_still_load():
    from conftest import SHARED_TRACES

    demo = load_trace(Path(__file__).resolve().parents[1] / "faro_serve" / "data" / "demo_trace.csv")
    assert demo.counts.shape == (4, 6)  # minutes 68-73: a slice need not start at minute 0
    if not (SHARED_TRACES / "faro10_days1-10.csv").exists():
        pytest.skip("../shared/traces is not here")
    faro = load_trace(SHARED_TRACES / "faro10_days1-10.csv", days="8", sample=0)
    azure = load_trace(SHARED_TRACES / "azure12_days8-12.csv", days="11")
    assert faro.counts.shape == (10, 360) and azure.counts.shape == (12, 1440)
    assert np.isfinite(faro.counts).all() and np.isfinite(azure.counts).all()
