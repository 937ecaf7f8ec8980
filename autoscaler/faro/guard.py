"""The overload guard (ours, beyond the paper): under heavy overload a long-term plan of a
fairness objective (fair, fair_sum, penalty_fair_sum) may not cut a model below the
replicas its observed rate needs.

Why: when what the models' observed rates need exceeds the capacity by far (16 replicas for a
day whose minutes need 32), a fairness objective levels every model down toward the same
poor utility: it cuts models that meet their SLO now to give replicas to models no share
can serve, and both fail. Keeping a cut model at what its current rate needs (never above
what it has) and taking the replicas back from the plan's largest increases keeps the
models that can be served served. Measured on the simulator (docs/simulator.md, "The
overload guard"): tuned on day 8, Faro-FairSum at 16 replicas lost 7.89 -> 7.49; on day 10,
5.92 -> 5.14, faro-fair 7.33 -> 7.06, faro-penaltyfairsum 9.52 -> 9.00; at 32 and 36
replicas, at 100 jobs and on the Azure day the guard never acts (the need stays below
``overload_guard`` x the capacity). Not for Sum, which keeps what it can serve already (the
guard made it worse). Clusters with pipelines are left to the plan (a stage's need is not
one model's); a batching model's need is its batches' (``service.py``). Ray-free.
"""

from __future__ import annotations

from collections.abc import Mapping

from autoscaler.contract.policy import Decision, ModelObservation, Observation
from autoscaler.policies.service import Service, service_of
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.resources import demand, usage

# the objectives that level models down under overload; Sum already keeps what it can serve
# (with the guard faro-sum lost 4.83 instead of 4.26 at 16 replicas on day 10)
FAIR = ("fair", "fair_sum", "penalty_fair_sum")


def _rate_and_service(o: ModelObservation, m: ModelSLO) -> tuple[float, Service]:
    """The model's observed rate (the last tick's or the last minute's, the larger) and how
    its replicas serve (``service.py``)."""
    last = float(o.arrivals_per_min[-1]) / 60.0 if len(o.arrivals_per_min) else 0.0
    return max(o.arrival_rate, last), service_of(m, o)


def observed_need(obs: Observation, slo: Mapping[str, ModelSLO], cluster: ClusterSpec) -> dict[str, int]:
    """Replicas each model needs to meet its SLO at its observed rate (at least its minimum,
    at most its maximum)."""
    out = {}
    for n, o in obs.models.items():
        lam, svc = _rate_and_service(o, slo[n])
        out[n] = max(svc.replicas_for(lam, cluster), slo[n].min_replicas)
    return out


def heavy_overload(obs: Observation, slo: Mapping[str, ModelSLO], cluster: ClusterSpec) -> bool:
    """Whether the observed rates need ``overload_guard`` x the cluster's CPUs or more (False
    when the guard is off)."""
    if cluster.overload_guard is None:
        return False
    need = observed_need(obs, slo, cluster)
    return sum(need[n] * slo[n].cpus for n in need) >= cluster.overload_guard * obs.capacity_cpus


def fit_capacity(
    decision: Decision, obs: Observation, slo: Mapping[str, ModelSLO], keep: frozenset[str] = frozenset()
) -> None:
    """Give replicas back until ``decision`` fits every resource (CPUs, memory, GPUs, custom):
    the largest increase first, then, with none left, the deepest cut goes one further
    (never a model in ``keep``)."""
    planned = decision.replicas  # (a fresh mapping per read: read once)
    tgt = {n: planned.get(n, o.target_replicas) for n, o in obs.models.items()}
    dem = {n: demand(slo[n]) for n in tgt}
    while not obs.capacity.fits(usage(tgt, dem)):
        ups = [(tgt[n] - obs.models[n].target_replicas, n) for n in tgt if tgt[n] > obs.models[n].target_replicas]
        if ups:
            n = max(ups)[1]  # the plan's largest increase gives one back
        else:
            downs = [
                (tgt[n] - obs.models[n].target_replicas, n)
                for n in tgt
                if tgt[n] > slo[n].min_replicas and n not in keep
            ]
            if not downs:
                break
            n = min(downs)[1]  # nothing left to take back: the deepest cut goes one further
        tgt[n] -= 1
        decision.set(n, replicas=tgt[n])


def keep_saturated(decision: Decision, obs: Observation, slo: Mapping[str, ModelSLO]) -> list[str]:
    """A re-plan at the rates seen now does not cut a *saturated* model: one over its SLO now
    or with more requests queued than it has replicas. Its measured rate is only what it was
    let in (live, requests refused at the queue bound are never seen as arrivals), so a plan
    at that rate under-counts it; keeping it where it is, the plan's increases elsewhere give
    the replicas back. Returns the models kept."""
    kept = []
    for n, t1 in decision.replicas.items():
        o = obs.models.get(n)
        if o is None or t1 >= o.target_replicas:
            continue
        over = o.latency_ms is not None and o.latency_ms > slo[n].slo_ms
        if over or o.queue_length > max(o.target_replicas, 1):
            decision.set(n, replicas=o.target_replicas)
            kept.append(n)
    if kept:
        fit_capacity(decision, obs, slo, frozenset(kept))
    return kept


def guard_cuts(
    decision: Decision | None, obs: Observation, slo: Mapping[str, ModelSLO], cluster: ClusterSpec
) -> Decision | None:
    """``decision`` (a long-term plan) with its cuts limited under heavy overload: a model the
    plan cuts keeps what its observed rate needs (never more than it has), and the plan's
    largest increases give the replicas back so the capacity holds. Unchanged when
    ``cluster.overload_guard`` is None or the observed need is below it x the capacity."""
    if decision is None or cluster.overload_guard is None or cluster.objective not in FAIR:
        return decision
    if any(m.pipeline is not None for m in slo.values()):
        return decision  # a stage's need is not one model's: not judged here
    need = observed_need(obs, slo, cluster)
    if sum(need[n] * slo[n].cpus for n in need) < cluster.overload_guard * obs.capacity_cpus:
        return decision
    kept = []
    for n, t1 in decision.replicas.items():
        o = obs.models.get(n)
        if o is None or t1 >= o.target_replicas:
            continue
        lam, svc = _rate_and_service(o, slo[n])
        if lam > svc.max_rate(max(t1, 1), cluster):
            decision.set(n, replicas=min(o.target_replicas, need[n]))
            kept.append(n)
    if not kept:
        return decision
    fit_capacity(decision, obs, slo)
    decision.info["overload_guard"] = {
        "kept": sorted(kept),
        "need_cpus": round(sum(need[n] * slo[n].cpus for n in need), 2),
        "capacity_cpus": obs.capacity_cpus,
    }
    return decision
