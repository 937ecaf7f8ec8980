"""The Faro decision engine: pure Python + numpy/scipy/numba, no Ray (paper sections 3-4)."""

from .latency import (
    erlang_b,
    erlang_c,
    latency_mdc,
    latency_relaxed,
    latency_upper,
    max_rate_for_slo,
    min_replicas_for_slo,
    mmc_wait_quantile,
)
from .planner import Allocation, ModelDecision, make_problem, normalise_rates, plan
from .utility import (
    OBJECTIVES,
    cluster_objective,
    effective_utility,
    penalty_relaxed,
    penalty_step,
    phi,
    utility_relaxed,
    utility_step,
)

__all__ = [
    "Allocation",
    "ModelDecision",
    "OBJECTIVES",
    "cluster_objective",
    "effective_utility",
    "erlang_b",
    "erlang_c",
    "latency_mdc",
    "latency_relaxed",
    "latency_upper",
    "make_problem",
    "max_rate_for_slo",
    "min_replicas_for_slo",
    "mmc_wait_quantile",
    "normalise_rates",
    "penalty_relaxed",
    "penalty_step",
    "phi",
    "plan",
    "utility_relaxed",
    "utility_step",
]
