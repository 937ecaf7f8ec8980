"""A simulated experiment with pipelines (issue 35): single models and pipelines on a trace.

The trace has one job per single model and one per pipeline (its queries at the entry);
``sources`` maps a model's or pipeline's name to another job of the trace. Each model's
and stage's simulated processing time is the scenario's distribution (default: the paper's
lognormal) scaled to its ``processing_ms``, as :class:`~faro_serve.sim.scenario.Scenario`
does for its models. :func:`suite_scenario` is the pipeline suite's setup
(bench/pipeline_suite.py, docs/pipeline-sim.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler import make_policy
from autoscaler.driving.forecasters import set_daily, set_recurrence
from faro_serve.config import ClusterSpec, FaroConfig, ModelSLO
from faro_serve.pipelines import PipelineSLO, check_unique, expand
from faro_serve.traces import Trace, TraceError, day_minutes, default_warmup, load_trace, previous_day_tail
from forecasting.daily import DEFAULT_WEIGHT
from forecasting.recurrence import DEFAULT_SHARE

from ..distributions import PAPER_PROCESSING, PAPER_ROUTER_OVERHEAD, parse_dist
from .pipeline_sim import stage_processing
from .runner import SimConfig, SimResult, simulate
from .scenario import check_forecast_flags


@dataclass(frozen=True)
class PipelineScenario:
    trace: str
    models: tuple[ModelSLO, ...] = ()
    pipelines: tuple[PipelineSLO, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()  # (model or pipeline, trace job) where they differ
    day: int | None = None
    sample: int | None = None
    start_minute: int = 0  # replay from this minute of the day
    minutes: int | None = None
    warmup_minutes: int | None = None  # None: a day and an hour (the daily context's input)
    daily_weight: float = DEFAULT_WEIGHT  # the N-HiTS forecaster's daily context (0: off)
    recurrence_share: float = DEFAULT_SHARE  # its samples raised to recurring peaks (0: off)
    processing_dist: str | None = None  # its shape, scaled to each model's processing_ms
    overhead_dist: str | None = None
    cold_start_s: float = 60.0
    queue_limit: int = 50
    cluster: ClusterSpec | None = None  # the policies' settings (its cpus: the capacity's)

    def __post_init__(self) -> None:
        if not self.models and not self.pipelines:
            raise ValueError("a pipeline scenario needs models or pipelines")
        check_unique(self.pipelines)
        expand(self.models, self.pipelines)  # name clashes
        check_forecast_flags(self.daily_weight, self.recurrence_share)

    @classmethod
    def from_config(cls, cfg: FaroConfig, trace: str, **kw) -> "PipelineScenario":
        """A config's single models and pipelines (and its cluster's settings) on a trace."""
        return cls(trace=trace, models=tuple(cfg.models), pipelines=tuple(cfg.pipelines), cluster=cfg.cluster, **kw)

    @property
    def job_names(self) -> list[str]:
        """The jobs measured: the single models, then the pipelines."""
        return [m.name for m in self.models] + [p.name for p in self.pipelines]

    def all_models(self) -> list[ModelSLO]:
        return expand(self.models, self.pipelines)

    def load(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(job names, counts jobs x minutes, warm-up history jobs x minutes); a TraceError
        naming the model or pipeline without a job in the trace."""
        src = dict(self.sources)
        names = self.job_names
        want = [src.get(n, n) for n in names]
        tr = load_trace(self.trace, days=self.day, sample=self.sample)
        missing = [(n, j) for n, j in zip(names, want) if j not in tr.names]
        if missing:
            kinds = {p.name for p in self.pipelines}
            what = "; ".join(f"{'pipeline' if n in kinds else 'model'} {n!r} has no job {j!r}" for n, j in missing)
            raise TraceError(
                f"{self.trace}: {what} (the trace's jobs: {', '.join(tr.names)}); "
                f"a pipeline's job is its queries at the entry"
            )
        counts = tr.select(want).counts[:, self.start_minute :]
        if self.minutes is not None:
            if self.minutes > counts.shape[1]:
                raise TraceError(
                    f"{self.trace}: {self.minutes} minutes from minute "
                    f"{self.start_minute} exceed the {counts.shape[1]} selected"
                )
            counts = counts[:, : self.minutes]
        if counts.shape[1] == 0:
            raise TraceError(f"{self.trace}: no minutes from minute {self.start_minute}")
        need = default_warmup(self.trace, self.day, self.sample, self.warmup_minutes)
        warm = tr.select(want).counts[:, max(self.start_minute - need, 0) : self.start_minute]
        if warm.shape[1] < need and self.day is not None:  # and the days before
            prev = previous_day_tail(self.trace, self.day, self.sample, need - warm.shape[1], want)
            if prev is not None and prev.shape[0] == len(names):
                warm = np.concatenate([prev, warm], axis=1)
        return names, Trace(names, counts).counts, warm

    def distributions(self):
        proc = parse_dist(self.processing_dist) if self.processing_dist else PAPER_PROCESSING
        ovh = parse_dist(self.overhead_dist) if self.overhead_dist else PAPER_ROUTER_OVERHEAD
        return proc, ovh

    def policy_cluster(self, capacity: float) -> ClusterSpec:
        base = self.cluster or ClusterSpec(cpus=capacity)
        return base.model_copy(update={"cpus": float(capacity)})

    def sim_config(self, capacity: float, seed: int, keep_records: bool = False) -> SimConfig:
        proc, ovh = self.distributions()
        per_model = (
            tuple(proc.scaled_to_mean(m.processing_ms / 1e3) if m.processing_ms else proc for m in self.models) or proc
        )
        c = self.cluster
        return SimConfig(
            capacity_cpus=capacity,
            capacity_memory_gb=c.memory_gb if c else None,
            capacity_gpus=c.gpus if c else None,
            capacity_resources=c.resources if c else None,
            cold_start_s=self.cold_start_s,
            queue_limit=self.queue_limit,
            processing=per_model,
            router_overhead=ovh,
            seed=seed,
            keep_records=keep_records,
        )

    def run(
        self, policy: str, capacity: float, seed: int = 0, forecaster=None, loaded=None, keep_records: bool = False
    ) -> SimResult:
        """Build the policy by name over the models and stages, told the pipelines, and
        simulate; ``loaded`` reuses a :meth:`load` result."""
        _, counts, warm = loaded if loaded is not None else self.load()
        if forecaster is not None:  # the trace's day is the daily context's period
            set_daily(forecaster, (day_minutes(self.trace, self.day, self.sample), self.daily_weight))
            set_recurrence(forecaster, self.recurrence_share)
        pol = make_policy(
            policy, self.all_models(), self.policy_cluster(capacity), forecaster, pipelines=self.pipelines
        )
        proc, _ = self.distributions()
        return simulate(
            counts,
            self.models,
            pol,
            self.sim_config(capacity, seed, keep_records),
            warmup_history=warm,
            pipelines=self.pipelines,
            stage_processing=stage_processing(self.pipelines, proc),
        )


# -- the pipeline suite's setup ------------------------------------------------------------


def suite_pipelines() -> list[PipelineSLO]:
    """Three pipelines of ResNet-like stages (milliseconds on 1 CPU): a chain of 2, a chain
    of 3 and a fan-out whose second branch sees 40 % of the queries."""
    return [
        PipelineSLO(
            name="detect-classify",
            slo_ms=800.0,
            stages=[
                dict(name="detect", processing_ms=100.0),
                dict(name="classify", after=["detect"], processing_ms=154.0),
            ],
        ),
        PipelineSLO(
            name="ocr-translate",
            slo_ms=1000.0,
            stages=[
                dict(name="crop", processing_ms=50.0),
                dict(name="ocr", after=["crop"], processing_ms=154.0),
                dict(name="translate", after=["ocr"], processing_ms=100.0),
            ],
        ),
        PipelineSLO(
            name="tag-caption",
            slo_ms=900.0,
            stages=[
                dict(name="embed", processing_ms=154.0),
                dict(name="caption", after=["embed"], processing_ms=100.0),
                dict(name="tag", after=["embed"], processing_ms=80.0, fraction=0.4),
            ],
        ),
    ]


#: where each pipeline's and single model's traffic comes from (faro10_jobs.csv: job0..8
#: Azure Functions 2019, job9 the Twitter stream)
SUITE_SOURCES = (
    ("detect-classify", "job0"),
    ("ocr-translate", "job9"),
    ("tag-caption", "job3"),
    ("resnet-a", "job1"),
    ("resnet-b", "job5"),
    ("resnet-c", "job7"),
)
#: the slice reported (day 10 sample 0, the existing suite's) and the one the capacity was
#: chosen on (day 8 sample 0; nothing is tuned on the reported slice)
SUITE_DAY, SUITE_DEV_DAY = 10, 8
SUITE_CAPACITY = 40.0


def suite_scenario(
    trace: str, day: int = SUITE_DAY, sample: int = 0, minutes: int | None = None, start_minute: int = 0
) -> PipelineScenario:
    """Three paper ResNet34 jobs (720 ms p99) beside the three pipelines of
    :func:`suite_pipelines`, their traffic from the Faro trace's jobs (SUITE_SOURCES)."""
    singles = tuple(ModelSLO(name=n, slo_ms=720.0, processing_ms=154.0) for n in ("resnet-a", "resnet-b", "resnet-c"))
    return PipelineScenario(
        trace=trace,
        models=singles,
        pipelines=tuple(suite_pipelines()),
        sources=SUITE_SOURCES,
        day=day,
        sample=sample,
        minutes=minutes,
        start_minute=start_minute,
    )
