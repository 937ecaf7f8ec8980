"""InferLine's low-frequency Planner (SoCC '20, section 4.3): the cheapest per-stage
configuration (replicas, batch size, resources per replica) whose tail end-to-end latency
on a sample trace, estimated by the discrete-event Estimator (``pipeline_des``), meets the
SLO.

Profiles (section 4.1): per stage and resource choice, the time of a batch of every size
``1, 2, 4, ... max_batch_size``. This cluster has no accelerator types to choose between,
so a "hardware" choice is the CPUs per replica: the stage's own ``cpus`` and, for a stage
that declares a batch profile ``l(b, c)``, multiples of it (``cpu_factors``); a stage
without a profile has one choice (nothing says how its time scales with cores: the
paper's preprocess stage that "cannot utilize a GPU"). Cost = CPUs reserved plus
``gpu_cost`` per GPU, summed over replicas (section 6's per-CPU / per-GPU prices).

Search, as the paper gives it:

* Algorithm 1: every stage at batch 1, one replica, its fastest choice; infeasible when
  the batch-1 service time along the longest path already exceeds the SLO; else add a
  replica to the throughput bottleneck (fewest queries/s at the pipeline's entry,
  ``replicas b / l(b) / s_m``) until the Estimator's percentile meets the SLO.
* Algorithm 2: repeatedly apply, over all stages, the feasible action of least cost among
  {double the batch, remove a replica, downgrade the hardware}, until none is feasible. A
  batch increase keeps the cost, so it wins only when nothing cheaper is feasible (then
  it may let a replica go); equal costs go to the lower latency. The downgrade re-runs
  Algorithm 1 for that stage alone on the next cheaper choice (others frozen) and then
  the local cost minimisation; kept only when cheaper.

[gap] termination: the batch stops at the stage's ``max_batch_size``, the replicas at its
``max_replicas`` (Algorithm 1 fails when the bottleneck cannot grow). [gap] a batch is
only doubled to a size whose full batch, plus the batch-1 time of the rest of the longest
path through the stage, is within the SLO: a larger one can only be on time while it is
not full, so the sample may accept it while a burst (or the tuner's throughput
``b / l(b)``, section 5) would count on it (measured: with it, a tuned pipeline that scaled
down missed 11.7 % of its queries, docs/inferline.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from .pipeline_des import PipelineRun, StageSpec, simulate, visit_matrix

if TYPE_CHECKING:
    from ..model_slo import Batching
    from ..pipelines import PipelineSLO


@dataclass(frozen=True)
class StageProfile:
    """A stage for the planner: its place in the DAG and its profile per resource choice
    (``times[cpus][k - 1]`` = seconds for a batch of ``k``; cheapest choice first)."""

    spec: StageSpec
    times: dict[float, np.ndarray]
    max_replicas: int = 100
    min_replicas: int = 1
    gpus: float = 0.0

    @property
    def choices(self) -> list[float]:
        return sorted(self.times)

    def batches(self, cpus: float) -> list[int]:
        n = len(self.times[cpus])
        return [b for b in (1 << i for i in range(8)) if b <= n]


@dataclass(frozen=True)
class StageConfig:
    replicas: int
    batch: int
    cpus: float


@dataclass
class Plan:
    """The planner's answer: ``feasible`` (else ``reason``), the configuration per stage,
    its estimated percentile latency (s) on the sample and its cost."""

    feasible: bool
    configs: dict[str, StageConfig] = field(default_factory=dict)
    latency_s: float = float("inf")
    cost: float = float("inf")
    reason: str = ""
    evaluations: int = 0


def batch_times(
    processing_s: float,
    batching: Batching | None = None,
    cpus: float = 1.0,
    at_cpus: float | None = None,
    max_batch: int | None = None,
) -> np.ndarray:
    """Seconds per batch of ``1 .. max_batch`` at ``at_cpus`` (default ``cpus``): one
    request alone takes ``processing_s`` at the stage's ``cpus`` (the measured scale) and
    the batch profile ``l(b, c)`` gives the shape across batch sizes and cores (the
    simulator's rule, ``Batching`` docstring). No profile: batch 1 only."""
    if batching is None:
        return np.array([processing_s])
    c = cpus if at_cpus is None else at_cpus
    b = np.arange(1, (max_batch or batching.max_batch_size) + 1, dtype=float)
    if batching.gamma is None and batching.eps is None:  # a curve of its own: no cores in it
        return cast(np.ndarray, processing_s * batching.shape(cpus, int(b[-1]))[1:])

    g, e, d, h = (v or 0.0 for v in (batching.gamma, batching.eps, batching.delta, batching.eta))

    def lat(bb: float | np.ndarray, cc: float) -> float | np.ndarray:  # Sponge's l(b, c)
        return g * bb / cc + e / cc + d * bb + h

    return cast(np.ndarray, processing_s * lat(b, c) / lat(1.0, cpus))


class _Search:
    def __init__(
        self,
        stages: Sequence[StageProfile],
        arrivals: np.ndarray,
        slo_s: float,
        percentile: float,
        seed: int,
        gpu_cost: float,
    ):
        self.stages = list(stages)
        self.specs = [s.spec for s in self.stages]
        self.arr = np.sort(np.asarray(arrivals, float))
        self.vis = visit_matrix(self.specs, self.arr.size, seed)
        self.slo, self.q, self.gpu_cost = slo_s, percentile, gpu_cost
        self.evals = 0
        self.memo: dict[tuple[StageConfig, ...], float] = {}
        # batch-1 time (fastest choice) of the longest path through each stage, without it
        t1 = [min(st.times[c][0] for c in st.choices) for st in self.stages]
        fwd, back = list(t1), list(t1)
        for i, st in enumerate(self.stages):
            fwd[i] += max((fwd[p] for p in st.spec.parents), default=0.0)
        for i in reversed(range(len(self.stages))):
            kids = [j for j, st in enumerate(self.stages) if i in st.spec.parents]
            back[i] += max((back[j] for j in kids), default=0.0)
        self.rest = [fwd[i] + back[i] - 2 * t1[i] for i in range(len(t1))]

    def latency(self, cfg: list[StageConfig]) -> float:
        key = tuple(cfg)
        if key not in self.memo:
            self.evals += 1
            run = simulate(
                self.arr,
                self.specs,
                [c.replicas for c in cfg],
                [c.batch for c in cfg],
                [st.times[c.cpus] for st, c in zip(self.stages, cfg)],
                visits=self.vis,
            )
            self.memo[key] = run.percentile(self.q)
        return self.memo[key]

    def feasible(self, cfg: list[StageConfig]) -> bool:
        return self.latency(cfg) <= self.slo

    def cost(self, cfg: list[StageConfig]) -> float:
        return sum(c.replicas * (c.cpus + self.gpu_cost * st.gpus) for st, c in zip(self.stages, cfg))

    def throughput(self, i: int, c: StageConfig) -> float:
        """Queries/s at the pipeline's entry that stage ``i`` sustains."""
        t: float = self.stages[i].times[c.cpus][c.batch - 1]
        return c.replicas * c.batch / t / self.stages[i].spec.fraction

    def grow(self, cfg: list[StageConfig], only: int | None = None) -> list[StageConfig] | None:
        """Algorithm 1's loop: a replica to the bottleneck (or to stage ``only``) until
        feasible; None when it cannot grow."""
        cfg = list(cfg)
        while not self.feasible(cfg):
            cands = [
                i
                for i in (range(len(cfg)) if only is None else [only])
                if cfg[i].replicas < self.stages[i].max_replicas
            ]
            if not cands:
                return None
            i = min(cands, key=lambda j: self.throughput(j, cfg[j]))
            cfg[i] = StageConfig(cfg[i].replicas + 1, cfg[i].batch, cfg[i].cpus)
        return cfg

    def moves(self, cfg: list[StageConfig], i: int, hardware: bool = True) -> Iterator[StageConfig]:
        c, st = cfg[i], self.stages[i]
        if c.batch * 2 in st.batches(c.cpus) and (st.times[c.cpus][2 * c.batch - 1] + self.rest[i] < self.slo):
            yield StageConfig(c.replicas, c.batch * 2, c.cpus)
        if c.replicas > st.min_replicas:
            yield StageConfig(c.replicas - 1, c.batch, c.cpus)
        if hardware:
            cheaper = [x for x in st.choices if x < c.cpus]
            if cheaper:
                down = self.downgrade(cfg, i, cheaper[-1])
                if down is not None:
                    yield down

    def downgrade(self, cfg: list[StageConfig], i: int, cpus: float) -> StageConfig | None:
        start = list(cfg)
        start[i] = StageConfig(self.stages[i].min_replicas, 1, cpus)
        trial = self.grow(start, only=i)
        if trial is None:
            return None
        trial = self.minimise(trial, only=i)
        return trial[i] if self.cost(trial) < self.cost(cfg) else None

    def minimise(self, cfg: list[StageConfig], only: int | None = None) -> list[StageConfig]:
        """Algorithm 2's loop (``only``: the localised version, no hardware moves)."""
        while True:
            cands = []
            for i in range(len(cfg)) if only is None else [only]:
                for new in self.moves(cfg, i, hardware=only is None):
                    trial = list(cfg)
                    trial[i] = new
                    if self.feasible(trial):
                        cands.append(((self.cost(trial), self.latency(trial)), trial))
            if not cands:
                return cfg
            cfg = min(cands, key=lambda x: x[0])[1]


def plan(
    stages: Sequence[StageProfile],
    arrivals: np.ndarray,
    slo_s: float,
    percentile: float = 99.0,
    *,
    seed: int = 0,
    gpu_cost: float = 1.0,
) -> Plan:
    """The cheapest configuration meeting ``percentile`` latency <= ``slo_s`` on the sample
    ``arrivals`` (seconds), by the paper's greedy search (module docstring)."""
    if len(arrivals) == 0:
        return Plan(False, reason="the sample trace has no queries")
    s = _Search(stages, arrivals, slo_s, percentile, seed, gpu_cost)
    start = [StageConfig(max(1, st.min_replicas), 1, st.choices[-1]) for st in s.stages]
    longest = [0.0] * len(s.stages)  # batch-1 service time along the longest path
    for i, st in enumerate(s.stages):
        longest[i] = st.times[start[i].cpus][0] + max((longest[p] for p in st.spec.parents), default=0.0)
    if max(longest) >= slo_s:
        return Plan(
            False,
            reason=f"the batch-1 service time on the longest path "
            f"({max(longest) * 1e3:.0f} ms) is not below the SLO ({slo_s * 1e3:.0f} ms)",
        )
    cfg = s.grow(start)
    if cfg is None:
        return Plan(
            False, reason="the SLO is not met with every bottleneck stage at its max_replicas", evaluations=s.evals
        )
    cfg = s.minimise(cfg)
    return Plan(
        True, {st.spec.name: c for st, c in zip(s.stages, cfg)}, s.latency(cfg), s.cost(cfg), evaluations=s.evals
    )


def evaluate(
    stages: Sequence[StageProfile],
    arrivals: np.ndarray,
    configs: dict[str, StageConfig],
    percentile: float = 99.0,
    *,
    seed: int = 0,
) -> PipelineRun:
    """The Estimator's run of a given configuration (``pipeline_des.PipelineRun``), with
    the same visit draws as :func:`plan` on the same sample and seed."""
    arr = np.sort(np.asarray(arrivals, float))
    specs = [st.spec for st in stages]
    cfg = [configs[sp.name] for sp in specs]
    return simulate(
        arr,
        specs,
        [c.replicas for c in cfg],
        [c.batch for c in cfg],
        [st.times[c.cpus] for st, c in zip(stages, cfg)],
        seed=seed,
    )


def profiles(
    pipeline: PipelineSLO, processing_s: dict[str, float] | None = None, cpu_factors: Sequence[float] = (1.0, 2.0)
) -> list[StageProfile]:
    """A ``PipelineSLO``'s stages as :class:`StageProfile` in topological order; each
    stage's one-request time from ``processing_s`` (else its ``processing_ms``, else
    100 ms) and its batch profile; ``cpu_factors`` x its cpus are the resource choices of a
    stage with a profile."""
    order = pipeline.order()
    models = {m.name: m for m in pipeline.stage_models()}
    index = {n: i for i, n in enumerate(order)}
    out = []
    for n in order:
        m, st = models[n], pipeline.stage(n)
        p = (processing_s or {}).get(n) or m.planning_ms() / 1e3
        facs = cpu_factors if m.batching is not None else (1.0,)
        times = {m.cpus * f: batch_times(p, m.batching, m.cpus, m.cpus * f) for f in facs}
        out.append(
            StageProfile(
                StageSpec(n, tuple(index[x] for x in st.after), st.fraction),
                times,
                m.max_replicas,
                m.min_replicas,
                m.gpus,
            )
        )
    return out
