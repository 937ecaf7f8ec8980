"""A simulated experiment's inputs in one picklable object: trace, models, cluster, policy.

Shared by ``faro-serve simulate``, ``faro-serve suite`` and the benchmark so that all three
build the paper-matched setup the same way (faro-parameters.md): every job a ResNet34 with
a 720 ms p99 SLO, a 154 ms processing prior, 1 CPU / 1 GiB per replica, starting at one
replica; the simulated processing time the measured lognormal (scaled when another mean is
asked for); cold start 60 s; router queue 50.

The run's arrival history starts with a warm-up: the last ``warmup_minutes`` before the day
(same sample; by default a day and an hour, the daily context's input), when the file has
them, as a long-running system would have seen. The forecaster is told the trace's day
length (360 points for the Faro workload): its daily context (forecasting/daily.py) looks a
replayed day back, not 1,440 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler import make_policy
from autoscaler.driving.forecasters import set_daily, set_recurrence
from faro_serve.config import Batching, ClusterSpec, ModelSLO
from faro_serve.traces import (
    Trace,
    TraceError,
    day_minutes,
    default_warmup,
    duplicate_jobs,
    load_trace,
    previous_day_tail,
)
from forecasting.base import check_fraction
from forecasting.daily import DEFAULT_WEIGHT
from forecasting.recurrence import DEFAULT_SHARE

from ..distributions import PAPER_PROCESSING, PAPER_ROUTER_OVERHEAD, parse_dist
from .runner import SimConfig, SimResult, simulate


def check_forecast_flags(daily_weight: float, recurrence_share: float) -> None:
    """A ValueError naming the flag (--daily-weight, --recurrence-share) outside 0..1; both
    scenario kinds check them here, before any forecaster is built."""
    for flag, v in (("--daily-weight", daily_weight), ("--recurrence-share", recurrence_share)):
        check_fraction(v, flag)


@dataclass(frozen=True)
class Scenario:
    trace: str
    day: int | None = None
    sample: int | None = None
    jobs: tuple[str, ...] | None = None
    minutes: int | None = None
    rescale: tuple[float, float] | None = None  # requests per minute, low..high
    n_jobs: int | None = None  # duplicate jobs (with jitter) up to this many
    jitter: float = 0.1
    warmup_minutes: int | None = None  # None: a day and an hour (warmup())
    daily_weight: float = DEFAULT_WEIGHT  # the N-HiTS forecaster's daily context (0: off)
    recurrence_share: float = DEFAULT_SHARE  # its samples raised to recurring peaks (0: off)
    slo_ms: float = 720.0
    percentile: float = 99.0
    processing_ms: float = 154.0
    processing_dist: str | None = None  # e.g. "const:0.154"; default: paper lognormal
    overhead_dist: str | None = None  # default: paper router overhead
    cold_start_s: float = 60.0
    queue_limit: int = 50
    replica_hold_ms: float = 0.0  # idle gap between queued requests (0: the paper's model)
    batching: Batching | None = None  # every job's replicas batch (profile, largest batch)
    gpus_per_replica: float = 0.0  # every job's replicas take this many GPUs (Ray's num_gpus)
    capacity_gpus: float | None = None  # GPUs the jobs share (None: not binding)

    def validate(self) -> "Scenario":
        if self.minutes is not None and self.minutes < 1:
            raise ValueError(f"--minutes must be >= 1 (got {self.minutes})")
        if self.gpus_per_replica < 0 or (self.capacity_gpus is not None and self.capacity_gpus < 0):
            raise ValueError("--gpus-per-replica and --capacity-gpus must be >= 0")
        check_forecast_flags(self.daily_weight, self.recurrence_share)
        if self.warmup_minutes is not None and self.warmup_minutes < 0:
            raise ValueError(f"--warmup-minutes must be >= 0 (got {self.warmup_minutes})")
        if not self.processing_ms > 0:
            raise ValueError(f"--processing-ms must be > 0 (got {self.processing_ms:g})")
        if not self.slo_ms > self.processing_ms:
            raise ValueError(f"--slo-ms ({self.slo_ms:g}) must exceed the processing time ({self.processing_ms:g} ms)")
        if not 0 < self.percentile < 100:
            raise ValueError(f"--percentile must be in (0, 100) (got {self.percentile:g})")
        if self.cold_start_s < 0:
            raise ValueError(f"--cold-start-s must be >= 0 (got {self.cold_start_s:g})")
        if self.queue_limit < 0:
            raise ValueError(f"--queue-limit must be >= 0 (got {self.queue_limit})")
        if not 0 <= self.replica_hold_ms < 60000:
            raise ValueError(f"--replica-hold-ms must be in [0, 60000) (got {self.replica_hold_ms:g})")
        if self.n_jobs is not None and self.n_jobs < 1:
            raise ValueError(f"--n-jobs must be >= 1 (got {self.n_jobs})")
        self.distributions()  # parse errors surface here
        return self

    def distributions(self):
        proc = (
            parse_dist(self.processing_dist)
            if self.processing_dist
            else PAPER_PROCESSING.scaled_to_mean(self.processing_ms / 1e3)
        )
        ovh = parse_dist(self.overhead_dist) if self.overhead_dist else PAPER_ROUTER_OVERHEAD
        return proc, ovh

    def load(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(job names, counts jobs x minutes, warm-up history jobs x minutes)."""
        jobs = list(self.jobs) if self.jobs else None
        tr = load_trace(self.trace, days=self.day, sample=self.sample, jobs=jobs)
        warm = None
        if self.day is not None:
            warm = previous_day_tail(self.trace, self.day, self.sample, self.warmup(), jobs)
        if warm is None or warm.shape[0] != len(tr.names):
            warm = np.zeros((len(tr.names), 0))
        both = Trace(tr.names, np.concatenate([warm, tr.counts], axis=1))
        if self.rescale is not None:
            both = both.rescale(*self.rescale, fit=tr.counts)  # the day's range, whatever the warm-up
        if self.n_jobs is not None:
            both = duplicate_jobs(both, self.n_jobs, self.jitter, seed=0)
        n_warm = warm.shape[1]
        counts = both.counts[:, n_warm:]
        if self.minutes is not None:
            if self.minutes > counts.shape[1]:
                raise TraceError(
                    f"{self.trace}: --minutes {self.minutes} exceeds the {counts.shape[1]} minutes selected"
                )
            counts = counts[:, : self.minutes]
        return both.names, counts, both.counts[:, :n_warm]

    def day_minutes(self) -> int:
        """The length of the trace's day (its daily period), 1440 without a day."""
        return day_minutes(self.trace, self.day, self.sample)

    def warmup(self) -> int:
        """Minutes of history before the day: ``warmup_minutes``, else a day and an hour."""
        return default_warmup(self.trace, self.day, self.sample, self.warmup_minutes)

    def models(self, names: list[str]) -> list[ModelSLO]:
        return [
            ModelSLO(
                name=n,
                slo_ms=self.slo_ms,
                percentile=self.percentile,
                processing_ms=self.processing_ms,
                batching=self.batching,
                gpus=self.gpus_per_replica,
            )
            for n in names
        ]

    def cluster(self, capacity: float) -> ClusterSpec:
        """The policies' view: the capacity, every other setting the paper's default."""
        return ClusterSpec(cpus=capacity, gpus=self.capacity_gpus)

    def sim_config(self, capacity: float, seed: int, keep_records: bool = False) -> SimConfig:
        proc, ovh = self.distributions()
        return SimConfig(
            capacity_cpus=capacity,
            capacity_gpus=self.capacity_gpus,
            cold_start_s=self.cold_start_s,
            queue_limit=self.queue_limit,
            processing=proc,
            router_overhead=ovh,
            replica_hold_s=self.replica_hold_ms / 1e3,
            seed=seed,
            keep_records=keep_records,
        )


def run_scenario(
    sc: Scenario, policy: str, capacity: float, seed: int = 0, forecaster=None, loaded=None, keep_records: bool = False
) -> SimResult:
    """Build the policy by name and simulate; ``loaded`` reuses a :meth:`Scenario.load` result."""
    names, counts, warm = loaded if loaded is not None else sc.load()
    models = sc.models(names)
    if forecaster is not None:  # the trace's day is the daily context's period
        set_daily(forecaster, (sc.day_minutes(), sc.daily_weight))
        set_recurrence(forecaster, sc.recurrence_share)
    pol = make_policy(policy, models, sc.cluster(capacity), forecaster)
    return simulate(counts, models, pol, sc.sim_config(capacity, seed, keep_records), warmup_history=warm)
