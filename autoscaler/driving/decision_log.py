"""The autoscaler's decision records as the log, ``GET /faro/decisions`` and the status show
them: one JSON object per tick, a line each in the decision log (``decision_log`` in the
``faro`` application's args), read back by ``faro-serve status`` and the tools."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from autoscaler.contract.policy import Decision
from autoscaler.contract.setting import FIELDS
from faro_serve.metrics import utility_from_latency


def decision_record(decision: Decision) -> dict:
    """A decision as the log and the status show it: its kind, replicas and drop rates per
    model (always), each other field a policy set (``batch_sizes``, ``threads``,
    ``variants``, and any later one by its field name), and its details."""
    out = {"kind": decision.kind, "replicas": dict(decision.replicas),
           "drop_rates": dict(decision.field("drop_rate")), "info": decision.info}
    for f in FIELDS:
        if f not in ("replicas", "drop_rate") and (values := dict(decision.field(f))):
            out[_PLURAL.get(f, f)] = values
    return out


_PLURAL = {"batch_size": "batch_sizes", "variant": "variants"}  # the log's names since issue 20


def observed_utility(latency_ms: float | None, slo_ms: float) -> float | None:
    """The paper's utility of a measured SLO-percentile latency (the metrics' own formula);
    None when nothing completed in the look-back."""
    if latency_ms is None:
        return None
    return round(float(utility_from_latency(latency_ms, slo_ms)), 4)


def json_default(o):
    """numpy numbers as JSON (a non-finite float as null); anything else as its text."""
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return None if not math.isfinite(float(o)) else float(o)
    return str(o)


def write_record(record: dict, path: str | None) -> str:
    """``record`` as one JSON line, appended to the decision log at ``path`` (if any)."""
    line = json.dumps(record, default=json_default)
    if path:
        p = Path(path).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a") as f:
            f.write(line + "\n")
    return line
