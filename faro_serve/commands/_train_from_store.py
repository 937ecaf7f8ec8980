"""``faro-serve forecast train --from``: the live retrainer's work by hand. Train on a live
autoscaler's recorded arrivals (its history_dir, the arrival store, or the Prometheus that
scrapes the cluster) and save the network only if it forecasts the held-back minutes better
than the current forecaster. Only ``forecast`` uses it (issue 49: modules under 400 lines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import UsageError


def _first_on(arrivals):
    """A deployment's minutes from its first request on (zeros before it appeared are no history)."""
    import numpy as np

    a = np.asarray(arrivals, float)
    seen = np.flatnonzero(a > 0)
    return a[seen[0] :] if seen.size else a[:0]


def train_from_store(args, cfg, out: Path) -> int:
    """``forecast train --from``: what the live retrainer does (``autoscaler.driving.retrainer``), by
    hand: train on the store's history without its last minutes, judge against the current
    forecaster on them, save only a better one (or with ``--force``)."""
    import sqlite3

    from autoscaler.driving.forecasters import choose_forecaster
    from autoscaler.driving.retrainer import RETRAINED_DIR, recent_history
    from forecasting.retrain import retrain
    from forecasting.store import FILE_NAME, ArrivalStore, StoreRefused

    if args.days or args.sample:
        raise UsageError("--days and --sample go with --trace, not --from")
    mine = None  # where a live autoscaler saved what it retrained (a history_dir only)
    if args.from_store.startswith(("http://", "https://")):
        from forecasting.prometheus import MAX_POINTS, PrometheusError, prometheus_history

        file = args.from_store
        if not 1 <= args.prometheus_minutes < MAX_POINTS:
            raise UsageError(
                f"--prometheus-minutes {args.prometheus_minutes}: give 1 to {MAX_POINTS - 1:,} (Prometheus "
                f"answers at most {MAX_POINTS:,} points a series)"
            )
        try:
            history = prometheus_history(file, args.prometheus_minutes)
        except PrometheusError as err:
            raise UsageError(f"--from {err}") from None
        if not history:  # a cluster without faro-serve: Ray Serve's own counters (issue 48)
            from forecasting.prometheus import contiguous_tail
            from forecasting.rayserve import read_serve_history
            from forecasting.serve_history import ServeHistoryError

            try:
                served = read_serve_history(file, args.prometheus_minutes)
            except ServeHistoryError as err:
                raise UsageError(
                    f"--from {file}: Prometheus has no faro arrivals (ray_faro_requests_total) and {err}"
                ) from None
            except PrometheusError as err:
                raise UsageError(f"--from {err}") from None
            # one series per deployment (application/deployment), from its first minute on
            history = {
                k: tail for k, d in served.deployments.items() if (tail := contiguous_tail(_first_on(d.arrivals))).size
            }
    else:
        src = Path(args.from_store).expanduser()
        file = src / FILE_NAME if src.is_dir() else src
        if not file.is_file():
            raise UsageError(f"--from {args.from_store}: no arrival store there (expected {file})")
        try:  # read only: a file that is not a store is named and left as it is
            store = ArrivalStore(file, read_only=True)
            history = recent_history(store)
            store.close()
        except (StoreRefused, sqlite3.Error) as err:
            hint = (
                " (a trace file? train on it with --trace)"
                if file.suffix.lower() in (".csv", ".jsonl", ".json")
                else ""
            )
            raise UsageError(f"--from {file}: refused: {err}{hint}") from None
        if not history:
            raise UsageError(f"--from {file}: the store holds no arrivals")
        mine = file.parent / RETRAINED_DIR
    current_spec = args.current
    if current_spec is None:
        current_spec = str(mine) if mine is not None and (mine / "meta.json").is_file() else "shipped"
    try:
        if Path(current_spec).is_dir():
            current, why = choose_forecaster(None, current_spec)
        else:
            current, why = choose_forecaster(current_spec)
    except Exception as err:
        raise UsageError(f"--current {current_spec}: {err}") from None
    if (cfg.input_size, cfg.horizon) != (current.input_size, current.horizon):
        cfg.input_size, cfg.horizon = current.input_size, current.horizon
    try:
        candidate, verdict = retrain(history, current, args.holdout_minutes, cfg)
    except ValueError as err:
        raise UsageError(f"--from {file}: {err}") from None
    doc = {"from": str(file), "models": sorted(history), "against": why, **verdict.as_dict()}
    saved = verdict.swap or args.force
    if saved:
        from forecasting.io import save_forecaster

        doc["saved_to"] = str(save_forecaster(candidate, out))
    print(json.dumps(doc, indent=2))
    print(
        f"{verdict.reason}; " + (f"saved to {out}" if saved else "not saved (--force saves it anyway)"), file=sys.stderr
    )
    return 0 if saved else 1
