"""Faro's parts as the composition sees them (``composition.py``, ``moves.py``): what they
read and call of the policy, named here so that the order of the parts reads without the
class that holds them (``hybrid.FaroPolicy`` is one; the oracle another). A protocol, not
a base class: nothing here runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from autoscaler.contract.policy import Decision, ModelObservation, Observation
from autoscaler.policies.common import Timers
from autoscaler.policies.service import Service
from faro_serve.config import ClusterSpec, ModelSLO


class FaroParts(Protocol):
    """The state and the steps of one Faro policy (composition.py says in which order)."""

    models: list[ModelSLO]
    cluster: ClusterSpec
    slo: dict[str, ModelSLO]
    reactive: bool  # the short-term step runs
    last_long_term: float  # when the last long-term plan was made
    violating: Timers  # models over their SLO since (the reactive trigger)
    surge_hold: dict[str, float]  # model -> until when its reactive step waits
    band: dict[str, tuple[float, float, float]]  # model -> the last plan's forecast p10, p50, p90 (req/s)
    moved: dict[str, str]  # model -> "in" / "out": moved since the last plan

    @property
    def demand(self) -> dict[str, dict[str, float]]: ...  # model -> what one replica takes

    def _remember_rates(self, obs: Observation) -> None: ...
    def long_term(self, obs: Observation) -> Decision: ...
    def short_term(self, obs: Observation) -> Decision | None: ...
    def judged(self, obs: Observation) -> Iterable[tuple[str, ModelObservation]]: ...
    def watch_pipelines(self, obs: Observation) -> None: ...
    def resolve_due(self, obs: Observation, due: list[str]) -> list[str]: ...
    def replan(self, obs: Observation, due: list[str]) -> Decision | None: ...
    def with_larger_batches(self, obs: Observation, due: list[str], d: Decision | None) -> Decision | None: ...
    def with_surge(self, obs: Observation, decision: Decision | None) -> Decision | None: ...
    def services(self, obs: Observation) -> dict[str, Service]: ...
    def fresh_rate(self, n: str) -> float | None: ...
