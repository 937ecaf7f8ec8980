"""What the live loop needs of a cluster, and nothing more (paper section 5): the Ray Serve
adapter (``faro_serve.serving.autoscaler_deployment``), the scale benchmark's fake and the
tests' fakes implement :class:`ClusterAdapter` and :class:`StateStore`, so the loop itself
stays Ray-free and runs under a fake clock."""

from __future__ import annotations

import math
from typing import Any, Protocol

from autoscaler.contract.setting import Setting
from faro_serve.config import ClusterSpec
from faro_serve.resources import MEMORY, Capacity, as_capacity


class ClusterAdapter(Protocol):
    def capacity(self) -> Capacity | tuple[float, float | None]:
        """What the cluster has for models now, read every tick (nodes join and leave): a
        :class:`~faro_serve.resources.Capacity` of every resource, or (CPUs, GiB) alone."""

    def running_replicas(self) -> dict[str, int]:
        """Serving replicas per deployed model (models not deployed are absent)."""

    def meter_reports(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """Meter snapshots per model (models that did not answer are absent)."""

    def scale(self, name: str, replicas: int) -> None: ...

    def control(self, name: str, setting: Setting, percentile: float) -> None:
        """Tell a model's meter the setting to enforce (the fields that are set: a batch
        size, threads or variant only where a policy set them) and the SLO percentile."""


def capped_capacity(spec: ClusterSpec, reported: Capacity | tuple[float, float | None]) -> Capacity:
    """What the policy plans with: each resource at the smaller of the config's cap (where
    it gives one) and what the cluster reports. Memory binds only where the config caps it:
    Ray reserves no memory for a replica, so Ray's figure alone would bind nothing real."""
    live = as_capacity(reported)
    if spec.memory_gb is None:
        live = live.replaced(**{MEMORY: math.inf})
    return Capacity.of_cluster(spec).capped_by(live)


class StateStore(Protocol):
    """Where the loop keeps its state between restarts (live: a named Ray actor)."""

    def load(self) -> dict[str, Any] | None: ...

    def save(self, state: dict[str, Any]) -> None: ...
