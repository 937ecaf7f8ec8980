"""What one replica of a model serves, as every Faro mechanism judges it (issue 47).

The plan, the reactive step, the surge rule, the overload guard, re-plans and moves all ask
the same questions of a model: how long one request alone takes, how the replicas serve
(one request at a time, ``concurrency`` at once, or in batches along a batch curve), the
latency of ``c`` replicas at a rate, the most a count of replicas serves within the SLO,
and the fewest replicas that serve a rate. :func:`service_of` answers them once per model
and observation, so that a batching model is never sized as if it served one request at a
time in one place and in batches in another.

One request's time: the replicas' measured processing time, else the model's prior
(``processing_ms``), else the default (``ModelSLO.planning_ms``). A batching replica times whole
batches: the meter reports their request-weighted mean time and mean batch ``b``, so one
request's time is ``measured / f(b)``, ``f`` the batch curve's shape; with per-size batch
times it is their least-squares scale, ``sum(n t) / sum(n f(b))``.

The batch curve: as the model's config declares it (a profile, points or Sponge's model),
else measured live (``Batching.measured``): the flat-then-linear hinge fitted to the
median batch time of each size the replicas served (:data:`MIN_BATCHES` batches of at
least two sizes). Until then a batch is taken to save nothing (``f(b) = b``: the most
replicas), and :attr:`Service.curve_known` says so: the batch is then left at its largest,
so that batches form and are measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from faro_serve.batch_curve import fit_hinge
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.batched_latency import curve_at, latency_batched, max_rate_batched
from faro_serve.engine.latency import ESTIMATORS, latency, max_rate_for_slo, min_replicas_for_slo

if TYPE_CHECKING:
    import numpy.typing as npt

    from autoscaler.contract.policy import ModelObservation

# Processing time assumed for a model with neither a measurement nor a prior yet.
MIN_BATCHES = 20  # batches of one size before its median counts toward a measured curve


@dataclass(frozen=True)
class Service:
    """One model's replicas as the planner's estimators see them."""

    model: ModelSLO
    p_s: float  # one request alone on a replica (s)
    shape: np.ndarray | None = None  # the batch curve's f(b), b = 0..max batch; None: no batching
    curve_known: bool = True  # False: a curve to be measured, not measured yet (f(b) = b)

    @property
    def bmax(self) -> int:
        return 1 if self.shape is None else len(self.shape) - 1

    def at_batch(self, b: int) -> "Service":
        """This model's replicas with their largest batch ``b`` (1: one at a time)."""
        if self.shape is None or b >= self.bmax:
            return self
        return Service(self.model, self.p_s, None if b <= 1 else self.shape[: b + 1], self.curve_known)

    def saturation_rate(self, b: int | None = None) -> float:
        """Requests/s one replica serves flat out: ``concurrency / p``, or at full batches
        of ``b`` (default: its largest) ``b / (p f(b))``."""
        if self.shape is None:
            return self.model.concurrency / self.p_s
        b = self.bmax if b is None else min(max(int(b), 1), self.bmax)
        return b / (self.p_s * float(self.shape[b]))

    @property
    def processing_ms(self) -> float:
        return self.p_s * 1e3

    def latency(self, replicas: int, lam: float, cluster: ClusterSpec, exact: bool = False) -> float:
        """The SLO-percentile latency (s) of ``replicas`` at ``lam`` requests/s, at the
        largest batch (the cluster's estimator; ``exact``: no relaxation past rho_max)."""
        est = ESTIMATORS[cluster.estimator]
        if exact and cluster.estimator == "mdc":
            est = ESTIMATORS["mdc-exact"]
        q = self.model.percentile / 100
        if self.shape is None:
            return latency(replicas * self.model.concurrency, lam, self.p_s, q, cluster.rho_max, est)
        return latency_batched(replicas, lam, self.p_s, q, cluster.rho_max, est, self.shape, self.bmax)

    def max_rate(self, replicas: int, cluster: ClusterSpec) -> float:
        """The most requests/s ``replicas`` serve within the SLO (0: not even one alone)."""
        m = self.model
        slo, q = m.slo_ms / 1e3, m.percentile / 100
        if self.shape is None:
            return max_rate_for_slo(
                replicas, self.p_s, slo, q, cluster.estimator, cluster.rho_max, concurrency=m.concurrency
            )
        return max_rate_batched(
            replicas, self.p_s, slo, q, ESTIMATORS[cluster.estimator], cluster.rho_max, self.shape, self.bmax
        )

    def replicas_for(self, lam: float, cluster: ClusterSpec) -> int:
        """The fewest replicas that meet the SLO at ``lam`` requests/s, at most the model's
        maximum (also when not even that meets it)."""
        m = self.model
        slo = m.slo_ms / 1e3
        if self.shape is None:
            try:
                k, _ = min_replicas_for_slo(
                    lam,
                    self.p_s,
                    slo,
                    m.percentile / 100,
                    cluster.estimator,
                    cluster.rho_max,
                    limit=m.max_replicas,
                    concurrency=m.concurrency,
                )
            except ValueError:  # not even max_replicas meet the SLO at this rate
                k = m.max_replicas
            return k
        if self.latency(m.max_replicas, lam, cluster, exact=True) > slo:
            return m.max_replicas
        lo, hi = 0, m.max_replicas  # latency falls with replicas: the first that meets it
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.latency(mid, lam, cluster, exact=True) <= slo:
                hi = mid
            else:
                lo = mid
        return hi


def measured_shape(batch_times: npt.ArrayLike | None, bmax: int) -> np.ndarray | None:
    """The shape of the hinge fitted to live batch times (rows of batch size, batches,
    median seconds), up to ``bmax``; None with fewer than two sizes of
    :data:`MIN_BATCHES` batches."""
    if batch_times is None:
        return None
    rows = np.asarray(batch_times, float).reshape(-1, 3)
    rows = rows[(rows[:, 1] >= MIN_BATCHES) & (rows[:, 2] > 0)]
    if np.unique(rows[:, 0]).size < 2:
        return None
    # to 1 %: the next minutes' medians move it a little, and each new shape costs the
    # estimator a table (batched_latency.batch_table, about half a second)
    return np.round(fit_hinge(rows[:, 0], rows[:, 2]).shape(bmax), 2)


def service_of(model: ModelSLO, o: ModelObservation | None = None) -> Service:
    """``model``'s :class:`Service` from what its replicas reported (``o``: its
    :class:`~autoscaler.contract.policy.ModelObservation`, or None: its config alone)."""
    measured_ms = o.processing_ms if o is not None else None
    p_ms = model.planning_ms(measured_ms)
    b = model.batching
    if b is None:
        return Service(model, p_ms / 1e3)
    shape, known = b.shape(model.cpus), not b.measured
    times = getattr(o, "batch_times", None)
    if b.measured:
        fitted = measured_shape(times, b.max_batch_size)
        if fitted is not None:
            shape, known = fitted, True
    if measured_ms:  # the replicas time batches: one request's time from them
        rows = None if times is None else np.asarray(times, float).reshape(-1, 3)
        if rows is not None and rows.size and rows[:, 1].sum() > 0:
            f = np.array([curve_at(shape, x) for x in rows[:, 0]])
            n = rows[:, 1] * rows[:, 0]  # requests behind each size's median
            p_ms = 1e3 * float(np.sum(n * rows[:, 2]) / np.sum(n * f))
        elif getattr(o, "mean_batch", 1.0) > 1:
            p_ms = measured_ms / curve_at(shape, float(cast("ModelObservation", o).mean_batch))  # o: given here
    return Service(model, p_ms / 1e3, shape, known)
