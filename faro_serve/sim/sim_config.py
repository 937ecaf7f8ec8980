"""The simulated cluster a run is given (:class:`SimConfig`): its resources, the routers'
queue limits, cold start, per-request time distributions and clients, and the run's seed.

Kept apart from the driver (``runner``) that plays a policy on it: the scenarios, the
history replay, matched validation and the benchmarks build one; it only checks its fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..distributions import PAPER_PROCESSING, PAPER_ROUTER_OVERHEAD, TimeDist
from ..measures import LOOK_BACK_S
from ..resources import Capacity


@dataclass(frozen=True)
class SimConfig:
    """The simulated cluster (defaults: the paper-matched setup, faro-parameters.md)."""

    capacity_cpus: float
    capacity_memory_gb: float | None = None  # memory is not binding in the paper's runs
    # GPUs and Ray custom resources the models may take (None: not binding), as
    # ClusterSpec.gpus / resources; every resource a model declares is checked
    capacity_gpus: float | None = None
    capacity_resources: dict[str, float] | None = None
    cold_start_s: float = 60.0
    queue_limit: int = 50
    # requests each serving replica holds beyond the one it serves, counted against no queue
    # limit: Ray Serve's max_ongoing_requests - 1 (a plain replica that serves one at a time
    # takes max_ongoing_requests; the rest wait at it). So an arrival is refused only when
    # queue_limit + this x serving replicas wait (ray-tuned: 50 + 1 x replicas)
    queue_per_replica: int = 0
    processing: TimeDist | tuple[TimeDist, ...] = PAPER_PROCESSING
    router_overhead: TimeDist = PAPER_ROUTER_OVERHEAD
    # a replica's idle gap between two queued requests: the router's dispatch round trip
    # (0 = the paper's model; matched validation calibrates it on the live system)
    replica_hold_s: float = 0.0
    # a client gives up on a request not answered within this (a replay's per-request
    # timeout); inf: clients wait for ever, the paper's model (kernels.advance)
    client_timeout_s: float = math.inf
    # True: the server drops a request its client gave up on (faro-serve's front does);
    # False: it serves it anyway, for nobody (what plain Ray Serve did live, docs/compare.md)
    cancel_timed_out: bool = True
    # True: batching replicas batch as Ray's own @serve.batch does (plain Ray Serve): a batch
    # closes when its wait (the model's batching.batch_wait_s) ends, and starts at the
    # model's largest batch; False: as under Faro's gate, a replica takes what is queued
    # when it frees (kernels.advance)
    ray_batching: bool = False
    look_back_s: float = LOOK_BACK_S  # the live meters' too (faro_serve.measures)
    # None: each model's min_replicas; a mapping: by model name (a model not named: its
    # min_replicas), e.g. what each deployment of a recorded cluster ran at its first minute
    initial_replicas: int | Mapping[str, int] | None = None
    seed: int = 0
    draw: int = 0  # > 0: same counts, another draw of the per-request randomness (workload.Workload)
    keep_records: bool = False  # keep every request record (tests, live comparison)
    # cut time at least this often (s) besides minute starts and ticks (None: only there);
    # the kernels are exact at any cut, so this only checks that (sim/pipeline_sim.py)
    max_step_s: float | None = None

    def __post_init__(self) -> None:
        if not self.capacity_cpus > 0:
            raise ValueError(f"capacity must be > 0 (got {self.capacity_cpus:g})")
        if self.cold_start_s < 0 or not math.isfinite(self.cold_start_s):
            raise ValueError(f"cold start must be a finite number >= 0 (got {self.cold_start_s:g})")
        if self.queue_limit < 0:
            raise ValueError(f"queue limit must be >= 0 (got {self.queue_limit})")
        if self.queue_per_replica < 0:
            raise ValueError(f"queue per replica must be >= 0 (got {self.queue_per_replica})")
        if not (0 <= self.replica_hold_s < 60):
            raise ValueError(f"replica hold must be in [0, 60) s (got {self.replica_hold_s:g})")
        if not self.client_timeout_s > 0:
            raise ValueError(f"client timeout must be > 0 s (got {self.client_timeout_s:g})")
        if self.look_back_s <= 0:
            raise ValueError("look-back must be > 0 s")
        if self.max_step_s is not None and not self.max_step_s > 0:
            raise ValueError(f"max step must be > 0 s (got {self.max_step_s:g})")

    @property
    def capacity(self) -> Capacity:
        """Every resource's cap (faro_serve.resources)."""
        return Capacity.of(self.capacity_cpus, self.capacity_memory_gb, self.capacity_gpus, self.capacity_resources)
