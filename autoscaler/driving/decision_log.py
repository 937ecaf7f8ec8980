"""The autoscaler's decision records as the log, ``GET /faro/decisions`` and the status show
them: one JSON object per tick, a line each in the decision log (``decision_log`` in the
``faro`` application's args), read back by ``faro-serve status`` and the tools."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from autoscaler.contract.policy import Decision, Observation, Policy
from autoscaler.contract.setting import FIELDS, Setting
from autoscaler.driving.driver import MeterSnapshot
from autoscaler.driving.loop_config import AutoscalerConfig
from autoscaler.driving.pipeline_meters import pipeline_records
from faro_serve.config import ModelSLO
from faro_serve.metrics import utility_from_latency

Doc = dict[str, Any]  # a JSON object: a decision record, the loop's state or status


def decision_record(decision: Decision) -> Doc:
    """A decision as the log and the status show it: its kind, replicas and drop rates per
    model (always), each other field a policy set (``batch_sizes``, ``threads``,
    ``variants``, and any later one by its field name), and its details."""
    out: Doc = {
        "kind": decision.kind,
        "replicas": dict(decision.replicas),
        "drop_rates": dict(decision.field("drop_rate")),
        "info": decision.info,
    }
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
    return round(float(utility_from_latency(np.asarray(latency_ms), slo_ms)), 4)


def json_default(o: object) -> int | float | str | None:
    """numpy numbers as JSON (a non-finite float as null); anything else as its text."""
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return None if not math.isfinite(float(o)) else float(o)
    return str(o)


def write_record(record: Doc, path: str | None) -> str:
    """``record`` as one JSON line, appended to the decision log at ``path`` (if any)."""
    line = json.dumps(record, default=json_default)
    if path:
        p = Path(path).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("a") as f:
            f.write(line + "\n")
    return line


class LoopView(Protocol):
    """What a tick record reads of the live loop (``loop.AutoscalerLoop``), named here so
    that the record reads without the loop that writes it."""

    @property
    def cfg(self) -> AutoscalerConfig: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def slo(self) -> Mapping[str, ModelSLO]: ...
    @property
    def settings(self) -> Mapping[str, Setting]: ...  # in force
    @property
    def advice(self) -> Mapping[str, Setting]: ...  # shadow mode: what it would set
    @property
    def last_plan(self) -> Mapping[str, Mapping[str, Any]]: ...  # model -> what the plan predicted
    @property
    def shadow(self) -> bool: ...


def tick_record(
    loop: LoopView,
    now: float,
    obs: Observation,
    decision: Decision | None,
    meters: Mapping[str, MeterSnapshot] | None = None,
) -> Doc:
    """One tick as the log and the status show it: per model what was observed, the setting
    in force (in shadow mode also the advice), what the last plan predicted; the decision."""
    models = {}
    for n, o in obs.models.items():
        meter = (meters or {}).get(n)
        planned, held = loop.last_plan.get(n, {}), loop.settings[n]
        models[n] = {
            "slo_ms": loop.slo[n].slo_ms,
            "percentile": loop.slo[n].percentile,
            "arrival_rate": round(o.arrival_rate, 4),
            "latency_ms": None if o.latency_ms is None else round(o.latency_ms, 2),
            "processing_ms": None if o.processing_ms is None else round(o.processing_ms, 2),
            "queue_length": o.queue_length,
            "replicas": o.replicas,
            "target": held.replicas,
            "drop_rate": held.drop_rate or 0.0,
            # measured: min(SLO / p99 over the look-back, 1), the paper's utility (alpha 1);
            # predicted: what the last plan expected over its window
            "observed_utility": observed_utility(o.latency_ms, loop.slo[n].slo_ms),
            "predicted_utility": planned.get("utility"),
            "predictor": planned.get("predictor"),
            "predicted_latency_ms": planned.get("latency_ms"),
        }
        # the fields a policy set beyond replicas and drops (batch size, threads, variant)
        models[n].update(
            {k: v for k, v in held.to_json().items() if k not in models[n] and k not in ("replicas", "drop_rate")}
        )
        models[n]["setting"] = held.to_json()  # the whole record in force
        if loop.shadow:  # what it would set, beside what runs ("replicas", "target")
            advised = loop.advice.get(n)
            models[n]["advised"] = None if advised is None else advised.to_json()
        if meter is not None and meter.device is not None:  # where the model runs
            models[n]["device"] = meter.device
        if loop.slo[n].batching is not None:  # the batches its replicas served
            models[n]["mean_batch"] = round(float(o.mean_batch), 2)
    rec = {
        "time": round(now, 3),
        "t": round(obs.now, 3),
        "policy": loop.policy.name,
        "mode": loop.cfg.mode,
        "capacity_cpus": obs.capacity_cpus,
        "capacity": obs.capacity.to_json(),
        "models": models,
        **(
            {"pipelines": pipeline_records(loop.cfg.pipelines, obs.pipelines, observed_utility)}
            if loop.cfg.pipelines
            else {}
        ),
        "decision": None if decision is None else decision_record(decision),
    }
    return rec
