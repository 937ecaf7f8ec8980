"""The meter's report to the autoscaler: a typed, versioned schema (paper section 5).

Every model's meter (``faro_serve.serving.control.MeterControl.metrics``, on both data
paths) builds a :class:`MeterReport` once per autoscaler tick and sends its JSON form; the
autoscaler reads it with :func:`decode_meter_report`, which requires every field and names
the first one missing or ill-typed, so that a key renamed on one side raises instead of
silently becoming a default. Both sides import it, so it sits at the bottom with the
config: imports run serving -> autoscaler -> config, and it imports nothing of the project
at run time (the model replicas import the meter's module, and importing the ``autoscaler``
package there would load numba and the policies into every replica). Other readers of the
JSON (``faro-serve status``, the demo, validation) read it as a dict; it keeps every key it
had.

The report also says what CPUs each of the model's replicas reserves (the model
application's ``cpus``), so the autoscaler can check it against the SLO's (which it plans
with): :func:`resources_mismatch`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from .wire import check_version, integer, number, numbers, optional, read_fields, text

if TYPE_CHECKING:
    from faro_serve.config import ModelSLO

VERSION = 4  # 2: the setting the meter was told, as one record (issue 33); 3: batch times, device (47); 4: retried (50)

log = logging.getLogger("faro_serve.autoscaler")


class MeterReportError(ValueError):
    """A meter's report that breaks the schema; the text names the model and the field."""


@dataclass(frozen=True, slots=True)
class Processing:
    """The replicas' processing time over the look-back (ms; None: nothing measured)."""

    mean_ms: float | None
    p50_ms: float | None
    p99_ms: float | None
    n: int


@dataclass(frozen=True, slots=True)
class MeterReport:
    """What a model's meter measured and enforces, as of one autoscaler read."""

    model: str
    now: float
    # arrivals: per completed minute since the meter started (the forecaster's input), the
    # open minute so far, and the rate over the last tick (measures.ARRIVAL_RATE_S)
    arrival_rate: float
    arrivals_per_min: tuple[float, ...]
    current_minute_count: float
    current_minute_elapsed_s: float
    # end-to-end latency over the look-back (measures.LOOK_BACK_S): the SLO percentile
    latency_ms: float | None
    latency_p50_ms: float | None
    latency_mean_ms: float | None
    processing: Processing
    in_flight: int
    mean_in_flight: float  # averaged since the last autoscaler read
    queue_length: float
    arrivals_total: int
    completed_total: int
    dropped: dict[str, int]  # by reason
    # what the meter enforces now
    drop_rate: float
    replicas: int
    percentile: float
    # the setting the autoscaler told it (``autoscaler.contract.setting.Setting``'s fields by name;
    # empty until told): the loop compares it with its own and resends what differs
    setting: dict[str, float | int | str]
    # the data path's queue
    waiting: int
    dispatched: int
    dispatch_capacity: int
    # the resources each replica reserves (None: not known to the meter)
    replica_cpus: float | None
    replica_memory_gb: float | None
    # a batching model (issue 20; None otherwise): the clients' recent network time, how
    # long ago each queued request left its client, the batch size and threads in force,
    # the request-weighted mean batch
    network_ms: float | None = None
    queued_ages_s: tuple[float, ...] | None = None
    batch_size: int | None = None
    threads: int | None = None
    mean_batch: float | None = None
    # a batching model (issue 47): its recent batches by size, rows of (batch, batches,
    # median seconds), what a batch curve measured live is fitted to
    batch_times: tuple[tuple[float, float, float], ...] | None = None
    device: str | None = None  # where its replicas run the model ("cuda:0", "cpu"), if they say
    variant: str | None = None  # a task with variants: the one(s) its replicas serve
    # the direct path: proxies whose routers report (one per node with EveryNode), and the
    # most requests one replica held at once since the meter started (the bound: docs/multinode.md)
    routers: int | None = None
    replica_held_max: int | None = None
    # the router front: requests sent once more because their replica died (issue 50; None:
    # a data path that does not retry)
    retried: int | None = None

    def wire(self) -> dict:
        """The JSON form: every field, ``v`` first, sequences as lists."""
        return {"v": VERSION, **{k: _listed(v) for k, v in asdict(self).items()}}


def _listed(v):
    return [_listed(x) for x in v] if isinstance(v, (tuple, list)) else v


def _rows(v) -> tuple:
    if not isinstance(v, (list, tuple)) or not all(isinstance(r, (list, tuple)) and len(r) == 3 for r in v):
        raise TypeError("a list of [batch, batches, seconds] rows")
    return tuple(numbers(r) for r in v)


def _counts(v) -> dict:
    if not isinstance(v, Mapping):
        raise TypeError("a mapping of reason to count")
    return {text(k): integer(c) for k, c in v.items()}


def _setting(v) -> dict:
    if not isinstance(v, Mapping):
        raise TypeError("a mapping of setting field to value")
    out = {}
    for k, x in v.items():
        out[text(k)] = x if isinstance(x, str) else number(x)
    return out


def _processing(v) -> Processing:
    if not isinstance(v, Mapping):
        raise TypeError("a mapping with mean_ms, p50_ms, p99_ms and n")
    missing = [f.name for f in fields(Processing) if f.name not in v]
    if missing:
        raise TypeError(f"a mapping with {missing[0]!r}, which is missing")
    opt = optional(number)
    return Processing(opt(v["mean_ms"]), opt(v["p50_ms"]), opt(v["p99_ms"]), integer(v["n"]))


_CHECKS = {
    "model": text,
    "now": number,
    "arrival_rate": number,
    "arrivals_per_min": numbers,
    "current_minute_count": number,
    "current_minute_elapsed_s": number,
    "latency_ms": optional(number),
    "latency_p50_ms": optional(number),
    "latency_mean_ms": optional(number),
    "processing": _processing,
    "in_flight": integer,
    "mean_in_flight": number,
    "queue_length": number,
    "arrivals_total": integer,
    "completed_total": integer,
    "dropped": _counts,
    "drop_rate": number,
    "replicas": integer,
    "percentile": number,
    "setting": _setting,
    "waiting": integer,
    "dispatched": integer,
    "dispatch_capacity": integer,
    "replica_cpus": optional(number),
    "replica_memory_gb": optional(number),
    "network_ms": optional(number),
    "queued_ages_s": optional(numbers),
    "batch_size": optional(integer),
    "threads": optional(integer),
    "mean_batch": optional(number),
    "batch_times": optional(_rows),
    "device": optional(text),
    "variant": optional(text),
    "routers": optional(integer),
    "replica_held_max": optional(integer),
    "retried": optional(integer),
}
assert set(_CHECKS) == {f.name for f in fields(MeterReport)}, "a field of MeterReport lacks its check"


def decode_meter_report(raw, model: str | None = None) -> MeterReport:
    """``raw`` (a meter's JSON) as a :class:`MeterReport`. Every field must be present (an
    optional one as null); :class:`MeterReportError` names the model and the first field
    missing, ill-typed or unknown, or a version this side does not speak."""
    label = f"front report of {model!r}" if model else "front report"
    if not isinstance(raw, Mapping):
        raise MeterReportError(f"{label}: expected a mapping, got {type(raw).__name__}")
    check_version(
        raw, VERSION, label, MeterReportError, f"this autoscaler reads v{VERSION}; redeploy the model applications"
    )
    vals = read_fields(raw, _CHECKS, f"{label} v{VERSION}", MeterReportError)
    return MeterReport(**vals)


def resources_mismatch(report: MeterReport, slo: ModelSLO) -> str | None:
    """Why the replicas' reserved resources disagree with the SLO's (which the planner
    counts against the capacity), or None when they agree or the meter does not know."""
    for what, deployed, planned in (
        ("CPUs", report.replica_cpus, slo.cpus),
        ("GiB of memory", report.replica_memory_gb, slo.memory_gb),
    ):
        if deployed is not None and not math.isclose(deployed, planned, rel_tol=1e-9, abs_tol=1e-9):
            return (
                f"model {slo.name!r}: each replica reserves {deployed:g} {what} (the model "
                f"application's args) but its SLO entry says {planned:g} (the faro "
                f"application's models); make them agree"
            )
    return None


def batching_mismatch(report: MeterReport, slo: ModelSLO) -> str | None:
    """Why a model whose replicas serve batches cannot be planned as its SLO says: it
    declares no batching, so each batch's time would count as one request's."""
    if report.batch_size is not None and slo.batching is None:
        return (
            f"model {slo.name!r}: its replicas serve batches (batch size "
            f"{report.batch_size}, e.g. @serve.batch) but its SLO entry declares no "
            f"batching; add 'batching: {{max_batch_size: {report.batch_size}}}' to it "
            "(faro-serve init writes it)"
        )
    return None


def read_reports(
    raw: Mapping[str, object], slos: Mapping[str, ModelSLO]
) -> tuple[dict[str, MeterReport], dict[str, str]]:
    """Every model's report decoded and checked against its SLO's resources: (the good
    reports, the error of each model left out). A model left out is planned as one whose
    meter did not answer; the error is logged, naming the model and the field or both
    figures, and the service carries on with the other models."""
    reports, errors = {}, {}
    for name, front in raw.items():
        try:
            report = decode_meter_report(front, name)
        except MeterReportError as err:
            errors[name] = str(err)
        else:
            bad = (
                resources_mismatch(report, slos[name]) or batching_mismatch(report, slos[name])
                if name in slos
                else None
            )
            if bad is None:
                reports[name] = report
            else:
                errors[name] = bad
    for name, err in errors.items():
        log.error("left out this tick: %s", err)
    return reports, errors
