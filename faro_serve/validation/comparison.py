"""Matched validation, the pure part: the workload both sides replay and how to compare them
(paper section 6.5, Table 7).

The paper checks its simulator by running the same workload on the cluster and in the
simulator and comparing, per policy, the *cluster utility* (sum over jobs of the per-minute
utility, averaged over minutes): 9.6 % mean relative difference, and the ranking of the
policies by Kendall's tau, given as a distance (0 = the same order, 1 = reversed).

Nothing here touches Ray; ``faro_serve.validation.live_runs`` runs the live side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy import stats

from autoscaler.policies.ray_rule import RAY_DEFAULTS, RAY_TUNED

from ..config import ClusterSpec, ModelSLO
from ..distributions import PAPER_PROCESSING, TimeDist
from ..traces import Trace, TraceError, load_trace


@dataclass(frozen=True)
class Workload:
    """One trace slice, its jobs and their SLOs: exactly what both sides get."""

    trace: str
    day: int | None = 10
    sample: int | None = 0
    jobs: tuple[str, ...] = ("job1", "job5", "job7", "job8")
    start: int = 180  # first trace minute
    minutes: int = 20
    rate_scale: float = 1.0
    slo_ms: float = 720.0
    percentile: float = 99.0
    processing_ms: float = 154.0  # the SLO's processing prior (the paper's ResNet34)
    slowdown: float = 1.0  # processing times, SLO and prior x this (time-scaled queueing)
    seed: int = 0

    def load(self) -> Trace:
        """The slice: these jobs, minutes [start, start + minutes), counts x rate_scale."""
        if self.minutes < 1:
            raise TraceError(f"--minutes must be >= 1 (got {self.minutes})")
        if self.start < 0:
            raise TraceError(f"--start must be >= 0 (got {self.start})")
        if not (math.isfinite(self.rate_scale) and self.rate_scale > 0):
            raise TraceError(f"--rate-scale must be > 0 (got {self.rate_scale:g})")
        if not (math.isfinite(self.slowdown) and self.slowdown > 0):
            raise TraceError(f"--slowdown must be > 0 (got {self.slowdown:g})")
        tr = load_trace(self.trace, days=self.day, sample=self.sample, jobs=list(self.jobs))
        if self.start + self.minutes > tr.minutes:
            raise TraceError(
                f"{self.trace}: minutes {self.start}..{self.start + self.minutes} "
                f"are beyond the {tr.minutes} minutes selected"
            )
        return tr.window(self.start, self.start + self.minutes).scale(self.rate_scale)

    def models(self, names: list[str]) -> list[ModelSLO]:
        k = self.slowdown
        return [
            ModelSLO(name=n, slo_ms=self.slo_ms * k, percentile=self.percentile, processing_ms=self.processing_ms * k)
            for n in names
        ]

    def processing(self) -> TimeDist:
        """The paper's measured ResNet34 lognormal, every time x ``slowdown``.

        A slowdown of 2 with a rate scale of 0.5 is the same queueing system on a clock
        running at half speed (utilisation, queue lengths and utility unchanged) with half
        the requests per second: what lets a 2-core machine carry the HTTP load."""
        return PAPER_PROCESSING.scaled_to_mean(PAPER_PROCESSING.mean * self.slowdown)


# Live baselines that are not faro-serve policies, and the simulator policy standing for each:
# ``ray-native`` is plain Ray Serve under Ray's own autoscaler at its defaults
# (faro_serve/serving/native.py), ``ray-serve`` the simulator's model of Ray's rule;
# ``ray-tuned`` the same with the settings Ray's guide advises for latency, ``ray-serve-tuned``
# its model.
NATIVE = {"ray-native": "ray-serve", "ray-tuned": "ray-serve-tuned"}
# The Ray Serve settings each live baseline deploys (autoscaler.policies.baselines: one source for
# both sides and the report).
RAY_SETTINGS = {"ray-native": RAY_DEFAULTS, "ray-tuned": RAY_TUNED}

# The live replay's per-request timeout: the simulator's clients give up after it too
# (SimConfig.client_timeout_s).
REPLAY_TIMEOUT_S = 60.0
# Plain Ray Serve queues without limit (max_queued_requests -1); a ring this large never fills.
UNBOUNDED_QUEUE = 10**6
# Simulations per policy in a matched validation: draws of the per-request randomness at the
# live run's per-minute counts, compared by their mean (compare). Fixed at 5 before the
# second live seed of docs/validation.md was run; 5 draws halve the spread of one.
SIM_DRAWS = 5


def sim_policy(policy: str) -> str:
    """The simulator policy that runs beside a live ``policy``."""
    return NATIVE.get(policy, policy)


def sim_queue(policy: str, queue_limit: int = 50) -> dict:
    """The ``SimConfig`` fields of the simulated server behind a live ``policy``: faro-serve's
    front tail-drops at ``queue_limit`` and drops a request whose client left; plain Ray
    Serve serves given-up requests anyway (docs/compare.md) behind its
    ``max_queued_requests`` (-1: no limit), each running replica holding
    ``max_ongoing_requests`` (one in service, the rest waiting at it, beyond the limit)."""
    ray = RAY_SETTINGS.get(policy)
    if ray is None:
        return {"queue_limit": queue_limit, "queue_per_replica": 0, "cancel_timed_out": True}
    limit = ray["max_queued_requests"]
    return {
        "queue_limit": UNBOUNDED_QUEUE if limit < 0 else limit,
        "queue_per_replica": 0 if limit < 0 else ray["max_ongoing_requests"] - 1,
        "cancel_timed_out": False,
    }


def ray_settings_line(settings: dict) -> str:
    """Ray Serve's settings as one line: the ``autoscaling_config`` fields, then the
    deployment options."""
    a = ", ".join(
        f"{k}: {v:g}"
        for k, v in settings["autoscaling_config"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    d = ", ".join(f"{k}: {settings[k]}" for k in ("max_ongoing_requests", "max_queued_requests") if k in settings)
    return f"autoscaling_config {{{a}}}; {d}"


def cluster_spec(capacity: float) -> ClusterSpec:
    """Both sides' policies plan with the same settings: the capacity, paper defaults else."""
    return ClusterSpec(cpus=capacity)


def cluster_utility(summary) -> float:
    """Mean over minutes of the sum over jobs of utility (the paper's cluster utility)."""
    return float(np.mean(summary.cluster_utility)) if len(summary.cluster_utility) else 0.0


def relative_difference(live: float, sim: float) -> float:
    """``|sim - live| / |live|`` (the live run is the reference); inf if live is 0 and sim not."""
    if live == 0:
        return 0.0 if sim == 0 else math.inf
    return abs(sim - live) / abs(live)


def kendall_distance(a: list[float], b: list[float]) -> float:
    """The paper's Kendall-tau distance between two rankings: the fraction of pairs ordered
    differently (0 identical, 1 reversed). Pairs tied on one side count half."""
    pairs = list(combinations(range(len(a)), 2))
    if not pairs:
        return 0.0
    bad = 0.0
    for i, j in pairs:
        s = np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])
        bad += 1.0 if s < 0 else 0.5 if s == 0 and (a[i] != a[j] or b[i] != b[j]) else 0.0
    return bad / len(pairs)


def kendall_tau(a: list[float], b: list[float]) -> float:
    """scipy's tau-b correlation (1 identical order, -1 reversed); nan with < 2 policies."""
    if len(a) < 2:
        return math.nan
    return float(stats.kendalltau(a, b).statistic)


def compare(live: dict, sim: dict) -> dict:
    """Per policy: live and simulated cluster utility, lost utility and SLO violation rate,
    their differences; then the ranking agreement. ``live``: policy -> SimResult; ``sim``:
    policy -> SimResult, or a list of them (draws of the per-request randomness at the live
    run's counts), compared by their mean: one live run against the simulator's expected
    value, not against another single draw (paper 6.5 compares one live run with one
    simulation; at a few percent apart the draw decides the order)."""
    rows = []
    for p in live:
        lv = live[p].summary
        draws = [d.summary for d in (sim[p] if isinstance(sim[p], (list, tuple)) else [sim[p]])]
        cu_l = cluster_utility(lv)
        cus = [cluster_utility(d) for d in draws]
        cu_s = float(np.mean(cus))
        rows.append(
            {
                "policy": p,
                "live_cluster_utility": cu_l,
                "sim_cluster_utility": cu_s,
                "sim_draws": len(draws),
                "sim_cluster_utility_min": float(np.min(cus)),
                "sim_cluster_utility_max": float(np.max(cus)),
                "utility_rel_diff": relative_difference(cu_l, cu_s),
                "live_lost_utility": lv.lost_cluster_utility,
                "sim_lost_utility": float(np.mean([d.lost_cluster_utility for d in draws])),
                "live_slo_violation_rate": lv.cluster_slo_violation_rate,
                "sim_slo_violation_rate": float(np.mean([d.cluster_slo_violation_rate for d in draws])),
                "live_requests": int(lv.job_requests.sum()),
                "sim_requests": int(draws[0].job_requests.sum()),
            }
        )
    lu = [r["live_cluster_utility"] for r in rows]
    su = [r["sim_cluster_utility"] for r in rows]
    diffs = [r["utility_rel_diff"] for r in rows]
    return {
        "rows": rows,
        "mean_utility_rel_diff": float(np.mean(diffs)) if diffs else math.nan,
        "max_utility_rel_diff": float(np.max(diffs)) if diffs else math.nan,
        "kendall_distance": kendall_distance(lu, su),
        "kendall_tau": kendall_tau(lu, su),
        "live_ranking": [r["policy"] for r in sorted(rows, key=lambda r: -r["live_cluster_utility"])],
        "sim_ranking": [r["policy"] for r in sorted(rows, key=lambda r: -r["sim_cluster_utility"])],
    }


def markdown(cmp: dict, mean_target: float = 0.05, max_target: float = 0.08) -> str:
    """The comparison as a markdown table and two summary lines; the targets are issue 19's
    (mean relative difference of cluster utility at most 5 %, max at most 8 %)."""
    n = max((r.get("sim_draws", 1) for r in cmp["rows"]), default=1)
    sim = f"sim (mean of {n} draws) | range" if n > 1 else "sim"
    lines = [
        f"| policy | cluster utility live | {sim} | rel. diff | lost utility live | sim | SLO violations live | sim |",
        "|---|---:|---:|" + ("---:|" if n > 1 else "") + "---:|---:|---:|---:|---:|",
    ]
    for r in cmp["rows"]:
        rng = f" | {r['sim_cluster_utility_min']:.3f}-{r['sim_cluster_utility_max']:.3f}" if n > 1 else ""
        lines.append(
            f"| {r['policy']} | {r['live_cluster_utility']:.3f} | {r['sim_cluster_utility']:.3f}{rng} "
            f"| {100 * r['utility_rel_diff']:.1f} % | {r['live_lost_utility']:.3f} "
            f"| {r['sim_lost_utility']:.3f} | {100 * r['live_slo_violation_rate']:.2f} % "
            f"| {100 * r['sim_slo_violation_rate']:.2f} % |"
        )
    ok_mean = cmp["mean_utility_rel_diff"] <= mean_target
    ok_max = cmp["max_utility_rel_diff"] <= max_target
    lines += [
        "",
        f"Mean relative difference of cluster utility {100 * cmp['mean_utility_rel_diff']:.1f} % "
        f"(target {100 * mean_target:.0f} %: {'met' if ok_mean else 'missed'}), max "
        f"{100 * cmp['max_utility_rel_diff']:.1f} % (target {100 * max_target:.0f} %: "
        f"{'met' if ok_max else 'missed'}).",
        f"Ranking live: {' > '.join(cmp['live_ranking'])}; simulated: "
        f"{' > '.join(cmp['sim_ranking'])}; Kendall-tau distance {cmp['kendall_distance']:.3f} "
        f"(0 = same order), tau-b {cmp['kendall_tau']:.3f}.",
    ]
    return "\n".join(lines)


def fit_overhead(overhead_s: np.ndarray) -> TimeDist:
    """A lognormal fitted to measured per-request overheads (seconds) for the simulator,
    as the paper's simulator uses a measured router-overhead distribution."""
    x = np.asarray(overhead_s, float)
    x = x[np.isfinite(x) & (x > 0)]
    if x.size < 20:
        raise ValueError(f"need at least 20 positive overhead samples to fit (got {x.size})")
    shape, loc, scale = stats.lognorm.fit(x, floc=max(0.0, float(x.min()) * 0.9))
    return TimeDist("lognorm", (float(shape), float(loc), float(scale)))


def scale_up_lags(polls: list[tuple[float, dict]], names: list[str]) -> list[float]:
    """Seconds from a target increase to the replicas reaching it, from status polls: the
    live cold start the simulator should assume."""
    lags: list[float] = []
    for n in names:
        pending: list[tuple[float, int]] = []  # (time the target rose, target)
        prev_target = None
        for t, st in polls:
            m = (st.get("models") or {}).get(n)
            if not m or m.get("target") is None or m.get("replicas") is None:
                continue
            target, running = int(m["target"]), int(m["replicas"])
            if prev_target is not None and target > prev_target:
                pending.append((t, target))
            prev_target = target
            still = []
            for t0, tg in pending:
                (lags.append(t - t0) if running >= tg else still.append((t0, tg)))
            pending = still
    return lags
