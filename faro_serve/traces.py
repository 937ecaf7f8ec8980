"""Workload traces: per-minute request counts per job, loaded and validated in one place.

Two file formats are read:

* tidy CSV (``../shared/traces/``): columns ``minute, job, requests`` and optionally
  ``day`` and ``sample``. Selected days are joined in day order into one series per job.
  Every job needs a row for every whole minute from a day's first minute to its last.
* JSON lines (the Faro release's format): one line per minute,
  ``{"ts": i, "counts": {"<job>": {"<deployment>": n}}}``; deployments are summed per job, a
  job absent from a line counts 0. Lines are ordered by ``ts`` (whole minutes, no gaps).

The minute numbers are checked, not trusted: a replay runs one point per minute, so a gap
or a fraction would silently shift every later minute. A count above
:data:`MAX_REQUESTS_PER_MINUTE` is refused at load: the simulator draws every request.

Every problem with a file raises :class:`TraceError` with one line naming the file and
what is wrong, so command-line tools can print it and exit 2.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace file or selection is unusable; the message says which and why."""


MAX_REQUESTS_PER_MINUTE = 10_000_000  # per job: far above any real trace (Faro's peak is 1,600)


def _runs(values) -> list[tuple[int, int]]:
    """Sorted whole numbers as runs of consecutive ones: 1, 2, 3, 6 -> (1, 3), (6, 6)."""
    runs: list[list[int]] = []
    for v in sorted(set(int(x) for x in values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return [(lo, hi) for lo, hi in runs]


def _gaps(values) -> list[tuple[int, int]]:
    """The runs missing between the smallest and the largest of ``values`` (never the whole
    span materialised: a stray minute 10**12 costs nothing)."""
    runs = _runs(values)
    return [(a[1] + 1, b[0] - 1) for a, b in zip(runs, runs[1:])]


def _minute_list(runs: list[tuple[int, int]], word: str = "minute") -> str:
    """``"minute 3"`` or ``"minutes 1-4, 6-8"``: the first few runs, for a message."""
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:3]) + (", ..." if len(runs) > 3 else "")
    plural = word == "minute" and (len(runs) > 1 or runs[0][0] != runs[0][1])
    return f"{word}{'s' if plural else ''} {text}"


@dataclass
class Trace:
    """Per-minute request counts: ``counts[j, t]`` is job ``names[j]`` in minute ``t``."""

    names: list[str]
    counts: np.ndarray  # (jobs, minutes), requests per minute, float

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    def rates(self) -> np.ndarray:
        """Requests per second, same shape as ``counts``."""
        return self.counts / 60.0

    def history(self) -> dict[str, np.ndarray]:
        return {n: self.counts[i] for i, n in enumerate(self.names)}

    def window(self, start: int, stop: int | None = None) -> "Trace":
        return Trace(list(self.names), self.counts[:, start:stop].copy())

    def select(self, jobs: list[str]) -> "Trace":
        missing = [j for j in jobs if j not in self.names]
        if missing:
            raise TraceError(f"jobs not in trace: {', '.join(missing)} (has {', '.join(self.names)})")
        idx = [self.names.index(j) for j in jobs]
        return Trace(list(jobs), self.counts[idx].copy())

    def rescale(self, low: float, high: float, fit: np.ndarray | None = None) -> "Trace":
        """Map all counts linearly onto ``[low, high]`` requests per minute (shape kept);
        with ``fit``, the map that takes ``fit``'s range there (e.g. the replayed day's, applied
        to its warm-up history too), never below 0. HIGH is held to the loader's limit: the
        file's counts were checked against it, the rescaled ones would not be."""
        if not 0 <= low <= high <= MAX_REQUESTS_PER_MINUTE:  # nan too
            raise TraceError(
                f"--rescale {low:g},{high:g}: needs 0 <= LOW <= HIGH <= "
                f"{MAX_REQUESTS_PER_MINUTE:,} (the limit of requests per minute per job)"
            )
        c = self.counts
        ref = c if fit is None else np.asarray(fit, float)
        lo, hi = float(ref.min()), float(ref.max())
        scaled = np.full_like(c, low) if hi <= lo else low + (c - lo) * (high - low) / (hi - lo)
        return Trace(list(self.names), np.maximum(scaled, 0.0))

    def scale(self, factor: float) -> "Trace":
        """Multiply every count by ``factor`` (e.g. to fit a smaller machine)."""
        if factor < 0:
            raise TraceError(f"scale factor must be >= 0 (got {factor})")
        return Trace(list(self.names), self.counts * factor)


def parse_days(spec) -> list[int] | None:
    """``None``, an int, ``"3"``, ``"1-8"`` or ``"1,3,5-6"`` -> sorted list of days."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, int):
        return [spec]
    days: set[int] = set()
    for part in str(spec).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise TraceError(f"cannot read days {spec!r}: use a day (3), a range (1-8) or a list (1,3-5)")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        if b < a:
            raise TraceError(f"day range {part.strip()!r} runs backwards")
        days.update(range(a, b + 1))
    return sorted(days)


def _load_csv(path: Path, days, sample) -> Trace:
    import pandas as pd

    try:
        df = pd.read_csv(path, skipinitialspace=True)  # "minute, job, requests" reads as written
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise TraceError(f"{path}: cannot read CSV ({err})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in ("minute", "job", "requests") if c not in df.columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {', '.join(missing)} (need minute, job, requests; optional day, sample)"
        )
    if df.empty:
        raise TraceError(f"{path}: no rows")
    if days is not None:
        if "day" not in df.columns:
            raise TraceError(f"{path}: --days given but the file has no 'day' column")
        have = set(df["day"].unique().tolist())
        absent = [d for d in days if d not in have]
        if absent:
            raise TraceError(f"{path}: day(s) {absent} not in file (has {sorted(have)})")
        df = df[df["day"].isin(days)]
    if sample is not None:
        if "sample" not in df.columns:
            raise TraceError(f"{path}: --sample given but the file has no 'sample' column")
        if sample not in set(df["sample"].unique().tolist()):
            raise TraceError(f"{path}: sample {sample} not in file (has {sorted(df['sample'].unique().tolist())})")
        df = df[df["sample"] == sample]
    elif "sample" in df.columns and df["sample"].nunique() > 1:
        raise TraceError(
            f"{path}: the file has several samples {sorted(df['sample'].unique().tolist())}; choose one with --sample"
        )

    def row(bad: pd.Series) -> int:
        """The first flagged data row as numbered in the file (1: the line after the header)."""
        return int(bad[bad].index[0]) + 1

    req = pd.to_numeric(df["requests"], errors="coerce")
    if req.isna().any():
        raise TraceError(f"{path}: 'requests' has a missing or non-numeric value (data row {row(req.isna())})")
    if np.isinf(req).any():
        raise TraceError(f"{path}: 'requests' has an infinite value (data row {row(np.isinf(req))})")
    if (req < 0).any():
        raise TraceError(f"{path}: 'requests' has negative counts (data row {row(req < 0)})")
    if (req > MAX_REQUESTS_PER_MINUTE).any():
        r = row(req > MAX_REQUESTS_PER_MINUTE)
        raise TraceError(
            f"{path}: 'requests' is {req.loc[r - 1]:g} in data row {r}, above the limit of "
            f"{MAX_REQUESTS_PER_MINUTE:,} requests per minute per job"
        )
    minute = pd.to_numeric(df["minute"], errors="coerce")
    if minute.isna().any():
        raise TraceError(f"{path}: 'minute' has a missing or non-numeric value (data row {row(minute.isna())})")
    if (minute % 1 != 0).any():  # inf % 1 is NaN: refused too
        r = row(minute % 1 != 0)
        raise TraceError(f"{path}: 'minute' must be a whole number (data row {r} has {minute.loc[r - 1]:g})")
    df = df.assign(requests=req.astype(float), minute=minute.astype(int))
    keys = (["day"] if "day" in df.columns else []) + ["minute"]
    if df.duplicated(keys + ["job"]).any():
        raise TraceError(f"{path}: duplicate rows for the same job and minute")
    wide = df.pivot_table(index=keys, columns="job", values="requests", aggfunc="first", sort=True)
    index = wide.index.to_frame(index=False)
    for day, m in index.groupby("day")["minute"] if "day" in index else [(None, index["minute"])]:
        gaps = _gaps(m)
        if gaps:
            where = "" if day is None else f"day {day}: "
            raise TraceError(
                f"{path}: {where}{_minute_list(gaps)} missing: the trace needs a row for "
                f"every minute from the first to the last; write 0 for minutes without requests"
            )
    if wide.isna().any().any():
        job = wide.columns[wide.isna().any().to_numpy()][0]
        holes = wide.index[wide[job].isna().to_numpy()]
        if "day" in index:
            day = holes[0][0]
            where, holes = f"day {day}: ", [m for d, m in holes if d == day]
        else:
            where = ""
        raise TraceError(
            f"{path}: {where}job {job} lacks {_minute_list(_runs(holes))}: "
            f"every job needs a row for every minute; write 0 for minutes without requests"
        )
    names = [str(c) for c in wide.columns]
    return Trace(names, wide.to_numpy(dtype=float).T.copy())


def _json_count(where: str, job: str, value) -> float:
    """One job's count in a line: a number (or deployments' numbers) within the limits.
    ``true`` is refused: Python would read it as 1 request."""
    values = list(value.values()) if isinstance(value, dict) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TraceError(f"{where}: job {job}: counts must be numbers (got {json.dumps(v)})")
        if not np.isfinite(v) or v < 0:
            raise TraceError(f"{where}: job {job}: counts must be finite and >= 0 (got {json.dumps(v)})")
    n = float(sum(values))
    if n > MAX_REQUESTS_PER_MINUTE:
        raise TraceError(
            f"{where}: job {job}: {n:g} requests, above the limit of "
            f"{MAX_REQUESTS_PER_MINUTE:,} requests per minute per job"
        )
    return n


def _load_jsonl(path: Path) -> Trace:
    by_ts: dict[int, tuple[int, dict[str, float]]] = {}  # ts -> (line number, counts per job)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(f"{path}: cannot read ({err})") from None
    for k, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            ts, counts = rec["ts"], rec["counts"]
            jobs = list(counts.items())
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise TraceError(f'{path}:{k}: expected {{"ts": i, "counts": {{job: {{deployment: n}}}}}}') from None
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not float(ts).is_integer():
            raise TraceError(f"{path}:{k}: 'ts' must be a whole minute number (got {json.dumps(ts)})")
        if int(ts) in by_ts:
            raise TraceError(f"{path}:{k}: ts {int(ts)} repeats line {by_ts[int(ts)][0]}")
        by_ts[int(ts)] = (k, {str(job): _json_count(f"{path}:{k}", job, v) for job, v in jobs})
    if not by_ts:
        raise TraceError(f"{path}: no records")
    gaps = _gaps(by_ts)
    if gaps:
        raise TraceError(
            f"{path}: no line has {_minute_list(gaps, 'ts')}: the trace needs a line for "
            f"every minute from the first ts to the last; write "
            f'{{"ts": t, "counts": {{}}}} for minutes without requests'
        )
    per_min = [by_ts[t][1] for t in sorted(by_ts)]
    names = sorted({j for m in per_min for j in m})
    if not names:
        raise TraceError(f"{path}: no jobs in any line")
    counts = np.array([[m.get(j, 0.0) for m in per_min] for j in names], dtype=float)
    return Trace(names, counts)


def load_trace(path: str | Path, days=None, sample: int | None = None, jobs: list[str] | None = None) -> Trace:
    """Load a trace file (CSV or JSON lines), optionally filtering days, sample and jobs."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such trace file")
    day_list = parse_days(days)
    if p.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        if day_list is not None or sample is not None:
            raise TraceError(f"{p}: JSON-lines traces have no days or samples to select")
        trace = _load_jsonl(p)
    else:
        trace = _load_csv(p, day_list, sample)
    return trace.select(jobs) if jobs else trace


def duplicate_jobs(trace: Trace, n_jobs: int, jitter: float = 0.1, max_shift: int = 30, seed: int = 0) -> Trace:
    """An ``n_jobs`` workload from a trace's jobs, for large-scale runs (paper Table 8).

    Job ``k`` copies source job ``k mod J``. The first copy of each is the original; later
    copies are shifted in time by a random whole number of minutes in ``[-max_shift,
    max_shift]`` (the ends padded with the edge value) and multiplied point by point by
    ``max(0, 1 + jitter * N(0, 1))``, so duplicates are alike but not in lockstep. Names are
    ``<job>`` for the original and ``<job>-<copy>`` for copies.
    """
    if n_jobs < 1:
        raise TraceError(f"the number of jobs must be >= 1 (got {n_jobs})")
    if jitter < 0 or max_shift < 0:
        raise TraceError("jitter and max_shift must be >= 0")
    rng = np.random.default_rng(seed)
    n_src, minutes = trace.counts.shape
    names, rows = [], []
    for k in range(n_jobs):
        src, copy = k % n_src, k // n_src
        row = trace.counts[src]
        if copy == 0:
            names.append(trace.names[src])
            rows.append(row.copy())
            continue
        shift = int(rng.integers(-max_shift, max_shift + 1)) if max_shift else 0
        idx = np.clip(np.arange(minutes) - shift, 0, minutes - 1)
        noise = np.maximum(0.0, 1.0 + jitter * rng.standard_normal(minutes))
        names.append(f"{trace.names[src]}-{copy}")
        rows.append(row[idx] * noise)
    return Trace(names, np.vstack(rows))


def previous_day_tail(
    path: str | Path, day: int, sample: int | None, minutes: int, jobs: list[str] | None = None
) -> np.ndarray | None:
    """The last ``minutes`` counts before day ``day`` (same sample): day ``day - 1``, and the
    days before it when ``minutes`` is longer than a day, as far back as the file goes; None
    when it has no such day: the arrival history a long-running system would have at the
    day's start."""
    if minutes <= 0 or day <= 1:
        return None
    parts, have, d = [], 0, day - 1
    while have < minutes and d >= 1:
        try:
            prev = load_trace(path, days=d, sample=sample, jobs=jobs).counts
        except TraceError:
            break
        if parts and prev.shape[0] != parts[0].shape[0]:
            break
        parts.insert(0, prev)
        have += prev.shape[1]
        d -= 1
    if not parts:
        return None
    return np.concatenate(parts, axis=1)[:, -minutes:].copy()


WARMUP_BEYOND_DAY = 60  # minutes of warm-up past a day: the daily context's level window and more


def default_warmup(path: str | Path, day: int | None, sample: int | None, given: int | None) -> int:
    """The simulator's warm-up history before ``day``: ``given``, else a day and an hour of
    the trace's own day length (the daily context's input, forecasting/daily.py)."""
    return given if given is not None else day_minutes(str(path), day, sample) + WARMUP_BEYOND_DAY


@functools.lru_cache(maxsize=64)
def day_minutes(path: str, day: int | None, sample: int | None = None) -> int:
    """Minutes (points) in day ``day`` of a trace file: a replayed day's length, the period
    of its daily pattern (360 for the Faro workload, 1440 for Azure's); 1440 without a day
    (JSON lines record wall-clock minutes)."""
    if day is None:
        return 1440
    return int(load_trace(path, days=day, sample=sample).counts.shape[1])
