"""Faro-FairSum with issue 31's re-plan and moves switched on, as policies the suite takes by
import path (``--policies bench.replan_variants:replan,bench.replan_variants:both``), to
measure them against today's faro-fairsum before a default changes.

``FARO_VARIANT`` (JSON, optional) overrides further ClusterSpec fields in every variant,
e.g. ``FARO_VARIANT='{"replan_margin": 0.5}'``, for tuning on days 1-8.
"""

from __future__ import annotations

import json
import os

from autoscaler.faro.hybrid import FaroPolicy


def _variant(name: str, **opts):
    def build(models, cluster, forecaster=None):
        extra = json.loads(os.environ.get("FARO_VARIANT") or "{}")
        spec = cluster.model_copy(update={"objective": "fair_sum", **opts, **extra})
        type(cluster).model_validate(spec.model_dump())  # the overrides are valid fields
        return FaroPolicy(models, spec, forecaster, name=name)

    return build


plain = _variant("faro-fairsum-plain", replan=False, moves=False)
replan = _variant("faro-fairsum-replan", replan=True, moves=False)
moves = _variant("faro-fairsum-moves", replan=False, moves=True)
both = _variant("faro-fairsum-both", replan=True, moves=True)
# issue 48: a re-plan of the triggering models' groups (the default) against the whole cluster
groups = _variant("faro-fairsum-replan-groups", replan_scope="groups")
cluster = _variant("faro-fairsum-replan-cluster", replan_scope="cluster")
