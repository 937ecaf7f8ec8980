"""The forecaster a simulated run plans with: N-HiTS trained on a history file, cached.

``--history FILE`` trains Faro's N-HiTS (``forecasting.train``) on sample 0 of every day of
FILE before the evaluated day (no look-ahead), or on the days asked for, and keeps it in a
cache directory named by a hash of the file's bytes, the days, the sample and the training
configuration, so later runs (and every suite worker) load it instead of training again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from faro_serve.traces import TraceError, load_trace, parse_days

DEFAULT_CACHE = Path("runs") / "forecasters"


def history_days(path: str | Path, days=None, before_day: int | None = None) -> list[int] | None:
    """The days to train on: ``days`` if given, else every day of the file before
    ``before_day``; None for a file without days (JSON lines, or a CSV without 'day')."""
    import pandas as pd

    chosen = parse_days(days)
    if chosen is not None:
        return chosen
    if Path(path).suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return None
    try:
        cols = pd.read_csv(path, nrows=0).columns
        if "day" not in cols:
            return None
        have = sorted(int(d) for d in pd.read_csv(path, usecols=["day"])["day"].unique())
    except (OSError, ValueError, KeyError, pd.errors.ParserError) as err:
        raise TraceError(f"{path}: cannot read the days of the history file ({err})") from None
    out = [d for d in have if before_day is None or d < before_day]
    if not out:
        raise TraceError(f"{path}: no day before day {before_day} to train the forecaster on")
    return out


def _days(day_list: list[int] | None) -> str:
    return "all" if day_list is None else str(day_list)


def cache_key(path: str | Path, days: list[int] | None, sample: int | None, config) -> str:
    h = hashlib.sha256(Path(path).read_bytes())
    h.update(
        json.dumps({"days": days, "sample": sample, "config": asdict(config)}, sort_keys=True, default=str).encode()
    )
    return h.hexdigest()[:16]


def ensure_forecaster(
    path: str | Path,
    days=None,
    sample: int | None = 0,
    before_day: int | None = None,
    cache_dir: str | Path = DEFAULT_CACHE,
    max_steps: int | None = None,
    log=print,
    config=None,
) -> Path:
    """The cache directory of the N-HiTS forecaster for this history, trained first if needed;
    ``config``: its :class:`forecasting.train.TrainConfig` (default: the defaults, with
    ``max_steps`` when given)."""
    import pandas as pd

    try:
        from forecasting.io import ForecasterLoadError, read_meta, save_forecaster
        from forecasting.train import TrainConfig, train_forecaster
    except ImportError as err:  # the forecasting package is not installed or incomplete
        raise ValueError(f"--history needs the N-HiTS forecaster (forecasting.train): {err}") from None
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such history file")
    day_list = history_days(p, days, before_day)
    if sample is not None and (day_list is None or "sample" not in pd.read_csv(p, nrows=0).columns):
        sample = None  # a file without samples: every row is the one sample
    cfg = config or (TrainConfig() if max_steps is None else TrainConfig(max_steps=max_steps))
    where = Path(cache_dir) / f"nhits-{cache_key(p, day_list, sample, cfg)}"
    if where.is_dir():
        try:
            read_meta(where)
            log(f"forecaster: N-HiTS cached in {where} (days {_days(day_list)}, sample {sample})")
            return where
        except ForecasterLoadError as err:
            log(f"forecaster: cache unusable ({err}); training again")
    hist = load_trace(p, days=None if day_list is None else ",".join(map(str, day_list)), sample=sample)
    log(
        f"forecaster: training N-HiTS on {p} days {_days(day_list)} sample {sample} "
        f"({len(hist.names)} series x {hist.minutes} minutes); cached in {where}"
    )
    save_forecaster(train_forecaster(hist.history(), cfg), where)
    return where


def history_forecaster(
    path: str | Path,
    days=None,
    sample: int | None = 0,
    before_day: int | None = None,
    cache_dir: str | Path = DEFAULT_CACHE,
    max_steps: int | None = None,
    log=print,
):
    """Load the cached N-HiTS forecaster for this history, training it first if needed."""
    from forecasting.io import load_forecaster

    return load_forecaster(ensure_forecaster(path, days, sample, before_day, cache_dir, max_steps, log))
