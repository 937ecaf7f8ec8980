"""What a simulation run hands back (:class:`SimResult`) and the assembly of its rows and
records: the stages' own rows (:class:`StageMeter`, :func:`stage_rows`) and the request
records of jobs and stages (:func:`join_records`).

Kept apart from the driver (``runner``) and the pipelines (``pipeline_sim``) that fill it:
the replays build a :class:`SimResult` too, and ``to_dict()`` is the simulate JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from faro_serve.config import ModelSLO
from faro_serve.metrics import MinuteTable, Summary, minute_table, summarize


@dataclass
class SimResult:
    policy: str
    names: list[str]
    capacity_cpus: float
    seed: int
    table: MinuteTable
    summary: Summary
    wall_s: float
    tick_times: np.ndarray  # (ticks,)
    targets: np.ndarray  # (ticks, models) target replicas after each tick's decision
    serving: np.ndarray  # (ticks, models) replicas serving at each tick
    decisions: dict[str, int] = field(default_factory=dict)  # decision kind -> count
    records: dict[str, np.ndarray] | None = None  # model, arrival_s, latency_s, dropped
    # with pipelines: ``names`` are the jobs (single models, then pipelines: their rows are
    # end to end) and ``model_names`` the columns of targets/serving (single models, then
    # stages); the stages' own rows (their latency at the stage) are ``stage_summary``
    model_names: list[str] | None = None
    pipelines: list[str] = field(default_factory=list)
    stage_table: MinuteTable | None = None
    stage_summary: Summary | None = None
    stage_records: dict[str, np.ndarray] | None = None  # stage, arrival_s, latency_s, dropped
    tick_s: float = 10.0
    # of wall_s, the seconds inside the policy's decide(): its own decisions, which the
    # live autoscaler spends too (the rest is the simulator's; whatif reports both)
    policy_s: float = 0.0

    def replica_minutes(self) -> dict[str, float]:
        """Target replicas (starting ones included) x minutes, per model and stage."""
        cols = self.model_names or self.names
        return {n: float(self.targets[:, i].sum() * self.tick_s / 60.0) for i, n in enumerate(cols)}

    def to_dict(self, per_job: bool = True) -> dict:
        out = {
            "policy": self.policy,
            "capacity": self.capacity_cpus,
            "seed": self.seed,
            **self.summary.to_dict(per_job=False),
            "wall_s": round(self.wall_s, 3),
            "minutes": self.table.minutes,
            "requests": int(self.summary.job_requests.sum()),
            "dropped": int(self.summary.job_dropped.sum()),
            "decisions": dict(self.decisions),
        }
        if per_job:
            out["jobs"] = self.summary.to_dict()["jobs"]
        if self.pipelines:
            out["pipelines"] = list(self.pipelines)
            rm = self.replica_minutes()
            out["replica_minutes"] = round(sum(rm.values()), 3)
            out["stages"] = stage_rows(self.stage_table, self.stage_summary, rm)
        return out


class StageMeter:
    """The stages' own rows: each stage's requests (arrival at the stage, latency there)
    summarised against its own ``slo_ms``, with the same metric code as the jobs."""

    def __init__(self, names: list[str], spec: Mapping[str, ModelSLO], n_min: int, keep: bool):
        self.names, self.n_min, self.keep = list(names), n_min, keep
        self.table = MinuteTable.empty(self.names, n_min)
        self.slo_s = np.array([spec[n].slo_ms / 1e3 for n in self.names])
        self.pct = np.array([spec[n].percentile for n in self.names])
        self.parts: list[tuple] = []

    def add(self, parts) -> None:
        sizes = [p[0].size for p in parts]
        if sum(sizes) == 0:
            return
        sidx = np.repeat(np.arange(len(self.names)), sizes)
        arr, lat, drp = (np.concatenate([p[k] for p in parts]) for k in range(3))
        self.table = self.table.merge(minute_table(self.names, sidx, arr, lat, drp, self.slo_s, self.n_min, self.pct))
        if self.keep:
            self.parts.append((sidx, arr, lat, drp))

    def result(self) -> dict:
        """SimResult's stage fields."""
        return dict(
            stage_table=self.table,
            stage_summary=summarize(self.table, self.slo_s),
            stage_records=join_records(self.parts, "stage") if self.keep else None,
        )


def join_records(parts, key: str) -> dict[str, np.ndarray]:
    """Record parts ``(index, arrival, latency, dropped)`` as one dict of arrays."""
    cols = list(zip(*parts)) if parts else [[np.empty(0, int)], [np.empty(0)], [np.empty(0)], [np.empty(0, bool)]]
    return dict(zip((key, "arrival_s", "latency_s", "dropped"), (np.concatenate(c) for c in cols)))


def stage_rows(
    table: MinuteTable | None, summary: Summary | None, replica_minutes: Mapping[str, float]
) -> dict[str, dict]:
    """Per stage: its summary row, replica-minutes and the median over minutes of its
    SLO-percentile latency at the stage (ms)."""
    if table is None:
        return {}
    st = summary.to_dict()["jobs"] if summary else {}
    out = {}
    for i, n in enumerate(table.names):
        v = table.p_served[i]
        v = v[np.isfinite(v)]
        out[n] = {
            **st.get(n, {}),
            "replica_minutes": round(replica_minutes[n], 3),
            "latency_ms_median_minute": round(float(np.median(v)) * 1e3, 3) if v.size else None,
        }
    return out
