"""The live loop's view of pipelines (issue 35): each pipeline's ingress meter, read as a
:class:`~autoscaler.contract.policy.PipelineObservation` and shown in the status.

A pipeline's stages are models of the cluster and are observed as models; what only the
pipeline has is its entry traffic and end-to-end latency, measured where its queries arrive
(the ingress deployment's router, ``faro_serve.scaled(Ingress, pipeline)``). Kept apart from
``loop.py`` so the loop stays one screenful per concern.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autoscaler.contract.policy import PipelineObservation
from autoscaler.contract.setting import Setting
from autoscaler.driving.cluster_adapter import ClusterAdapter
from autoscaler.driving.driver import MeterSnapshot
from faro_serve.pipelines import PipelineSLO

log = logging.getLogger(__name__)


def observe_pipelines(
    cluster: ClusterAdapter, pipelines: Sequence[PipelineSLO], running: Mapping[str, int]
) -> tuple[dict[str, PipelineObservation], dict[str, MeterSnapshot], dict[str, str]]:
    """Each measured pipeline's observation, its ingress meter's snapshot, and the error of
    each whose report was refused (a malformed report leaves that pipeline out, as a model's)."""
    names = [p.name for p in pipelines if p.ingress is not None and p.name in running]
    raw = cluster.meter_reports(names) if names else {}
    obs, snaps, errors = {}, {}, {}
    for n, doc in raw.items():
        try:
            s = MeterSnapshot.from_meter(doc, model=n)
        except ValueError as err:
            errors[n] = str(err)
            log.error("pipeline %s left out this tick: %s", n, err)
            continue
        snaps[n] = s
        obs[n] = PipelineObservation(
            name=n, arrivals_per_min=s.arrivals_per_min, arrival_rate=s.arrival_rate, latency_ms=s.latency_ms
        )
    return obs, snaps, errors


def sync_pipeline_meters(
    cluster: ClusterAdapter, pipelines: Sequence[PipelineSLO], snaps: Mapping[str, MeterSnapshot]
) -> None:
    """Tell each ingress meter the pipeline's SLO percentile, where it measures another."""
    for p in pipelines:
        s = snaps.get(p.name)
        if s is None or s.percentile == p.percentile:
            continue
        try:
            cluster.control(p.name, Setting(), p.percentile)
        except Exception as err:  # the ingress may be restarting
            log.warning("cannot reach the ingress meter of pipeline %s: %s", p.name, err)


def pipeline_records(
    pipelines: Sequence[PipelineSLO],
    observed: Mapping[str, PipelineObservation],
    utility: Callable[[float | None, float], float | None],
) -> dict[str, dict[str, Any]]:
    """What the status and the decision log show per pipeline: its SLO, stages, entry rate
    and measured end-to-end latency (None: not measured: no ingress meter, or no query
    completed in the look-back) with the utility of that latency (``utility(ms, slo_ms)``)."""
    out = {}
    for p in pipelines:
        o = observed.get(p.name)
        lat = None if o is None or o.latency_ms is None else round(o.latency_ms, 2)
        out[p.name] = {
            "slo_ms": p.slo_ms,
            "percentile": p.percentile,
            "stages": p.order(),
            "ingress": p.ingress,
            "measured": o is not None,
            "arrival_rate": None if o is None else round(o.arrival_rate, 4),
            "latency_ms": lat,
            "observed_utility": utility(lat, p.slo_ms),
        }
    return out
