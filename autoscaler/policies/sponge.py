"""Sponge (EuroMLSys '24) as a policy, and the static allocation it is compared with.

Every second (section 4: the adaptation period), per model with a batch profile: the
fewest cores, then the smallest batch, such that the queued requests, in EDF order in
batches of ``b``, all finish within their remaining budgets, and ``h(b, c)`` keeps up with
the arrival rate (Algorithm 1 with the rate constraint of its program (3);
:func:`faro_serve.engine.batching.sponge_choice`). The meter reports the queued budgets
(``ModelObservation.queued_budgets_s``).

Where the cores go, live: Ray cannot resize a running replica's CPUs, so a Sponge model is
one replica that reserves ``c_max`` CPUs (its ``cpus``) and Sponge's "cores" are the torch
threads it runs inside them (the setting's ``threads``), set in place through the replica's
``reconfigure``. What the cluster saves is CPU time, not the reservation; the simulator
accounts the cores Sponge chose, as the paper does with in-place vertical scaling.

[gap] With no feasible pair the paper says nothing: here the most cores and, there, the
batch with the highest throughput (seed-notes: "use c_max").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from autoscaler.contract.policy import Decision, Observation, Policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.batching import B_MAX, C_MAX, BatchProfile, CurveProfile, SpongeProfile, sponge_choice

if TYPE_CHECKING:
    from forecasting.base import Forecaster


class SpongePolicy(Policy):
    name = "sponge"

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        profiles: dict[str, SpongeProfile] | None = None,
        c_min: int = 1,
        c_max: int = C_MAX,
        b_max: int = B_MAX,
        name: str | None = None,
    ):
        super().__init__(models, cluster)
        self.tick_s = 1.0
        self.profiles = dict(profiles or {})
        missing = sorted(set(self.slo) - set(self.profiles))
        if missing:
            raise ValueError(f"{self.name}: no batch profile for {', '.join(missing)} (faro-serve profile makes one)")
        if not 1 <= c_min <= c_max:
            raise ValueError(f"need 1 <= c_min <= c_max (got {c_min}, {c_max})")
        self.c_min, self.c_max, self.b_max = c_min, c_max, b_max
        if name:
            self.name = name

    def decide(self, obs: Observation) -> Decision | None:
        threads, batches, info = {}, {}, {}
        for n, m in obs.models.items():
            if n not in self.profiles:
                continue
            budgets: np.ndarray | list[float] = m.queued_budgets_s if m.queued_budgets_s is not None else []
            ch = sponge_choice(
                self.profiles[n], budgets, m.arrival_rate, c_max=self.c_max, b_max=self.b_max, c_min=self.c_min
            )
            threads[n], batches[n] = ch.cores, ch.batch
            info[n] = {
                "cores": ch.cores,
                "batch": ch.batch,
                "feasible": ch.feasible,
                "queued": len(budgets),
                "rate": round(m.arrival_rate, 3),
                "min_budget_s": round(float(min(budgets)), 3) if len(budgets) else None,
            }
        if not threads:
            return None
        return Decision(replicas={}, threads=threads, batch_sizes=batches, kind="vertical", info=info)


def from_config(models: Sequence[ModelSLO], cluster: ClusterSpec, forecaster: Forecaster | None = None) -> SpongePolicy:
    """Sponge for models whose config declares ``batching`` (their saved profile and largest
    batch); the cores go up to each replica's whole CPUs (threads within them, live)."""
    missing = [m.name for m in models if m.batching is None or m.batching.measured]
    if missing:
        raise ValueError(
            f"sponge: {', '.join(missing)} declare no batching profile (a profile "
            "from faro-serve profile, or latency_ms, and max_batch_size in the "
            "model's SLO config)"
        )
    profiles = {m.name: _profile(m) for m in models}
    c_max = max(1, min(int(m.cpus) for m in models))
    b_max = min(m.batching.max_batch_size for m in models if m.batching is not None)  # all: checked above
    return SpongePolicy(models, cluster, profiles, c_max=c_max, b_max=b_max)


def _profile(m: ModelSLO) -> SpongeProfile:
    """Sponge's l(b, c): its own four parameters, or a batch curve with no cores in it (a
    GPU's: Sponge's cores then change nothing, and it chooses the batch alone)."""
    b = m.batching
    if b is None:
        raise ValueError(f"sponge: {m.name} declares no batching")
    if b.gamma is not None or b.eps is not None:
        return BatchProfile(b.gamma or 0.0, b.eps or 0.0, b.delta or 0.0, b.eta or 0.0)
    curve = b.curve(m.cpus)
    if curve is None:  # from_config refuses a curve to be measured live
        raise ValueError(f"sponge: {m.name}'s batch curve is to be measured live; Sponge needs a profile")
    return CurveProfile(curve)


# This module's built-in policies as data, (name, factory, summary, needs_batching,
# forecasts), which autoscaler/catalogue/builtin.py lists: the policy modules never import the registry.
POLICIES = (
    (
        "sponge",
        from_config,
        "Sponge: every 1 s the fewest cores (threads in a replica), then "
        "the smallest batch, meeting every queued request's budget (EDF) and the rate; needs "
        "batching in each model's config",
        True,
        False,
    ),
)


def static(
    cores: int, models: Sequence[ModelSLO], cluster: ClusterSpec, profiles: dict[str, SpongeProfile], b_max: int = B_MAX
) -> SpongePolicy:
    """A fixed ``cores`` per model (the paper's static 8- and 16-core instances), the batch
    still chosen each second by Sponge's rule at those cores."""
    return SpongePolicy(models, cluster, profiles, c_min=cores, c_max=cores, b_max=b_max, name=f"static-{cores}")
