"""Moves between Faro's plans (ours, issue 31; ``ClusterSpec.moves``, on by default).

A model over its SLO for the trigger period that the full cluster cannot give one more
replica takes one from the donor whose loss costs the cluster objective least
(:func:`best_move`), when the objective (the engine's window utilities, cold start
included, over the time left until the next plan) gains at least ``move_min_gain``. A donor
must stay within its SLO with one replica fewer under M/D/c at the higher of its rate now
and its forecast p90 (:func:`donor_ok`); no replica moves back before the next plan. Step
3f of ``autoscaler.faro.composition``; the same code live and in the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autoscaler.contract.policy import Decision, Observation
from autoscaler.faro.parts import FaroParts
from autoscaler.faro.replan import relevel
from autoscaler.policies.service import Service
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import make_problem
from faro_serve.resources import resource_names, usage

if TYPE_CHECKING:
    from faro_serve.engine.problem import Problem


def with_moves(p: FaroParts, obs: Observation, due: list[str], d: Decision | None) -> Decision | None:
    """For each ``due`` model the reactive step could not give a replica (oldest first),
    move one from the donor whose loss costs the cluster objective least, when the
    objective gains at least ``move_min_gain`` over the time left to the next plan."""
    c = p.cluster
    current = {n: o.target_replicas for n, o in obs.models.items()}
    after = {**current, **(d.replicas if d else {})}
    starving = [n for n in due if after[n] <= current[n] and p.moved.get(n) != "out" and n in p.band]
    if not starving or len(p.band) < len(p.slo):
        return d
    window = p.last_long_term + c.long_term_interval_s - obs.now
    svcs = p.services(obs)
    procs = {n: s.processing_ms for n, s in svcs.items()}
    steps = max(1, round(window / 60.0))
    rates, hi = {}, {}
    for n, o in obs.models.items():
        now = p.fresh_rate(n)
        now = o.arrival_rate if now is None else now
        if n in starving:
            now += o.queue_length / 60.0
        rates[n] = np.repeat(relevel(np.array(p.band[n], float), now)[:, None], steps, axis=1)
        last_min = float(o.arrivals_per_min[-1]) / 60.0 if len(o.arrivals_per_min) else 0.0
        hi[n] = max(now, last_min, p.band[n][2])

    def can_give(n: str) -> bool:
        o = obs.models[n]
        m = p.slo[n]
        return (
            n not in due
            and p.moved.get(n) != "in"
            and n not in p.violating.since
            and o.replicas >= after[n]
            and (o.latency_ms is None or o.latency_ms <= m.slo_ms)
            and donor_ok(svcs[n], after[n], hi[n], c)
        )

    donors = [n for n in obs.models if can_give(n)]
    if not donors or window <= c.cold_start_s:
        return d
    prob = move_problem(
        p.models, c, after, rates, procs, window, {n: s.shape for n, s in svcs.items() if s.shape is not None}
    )
    names = [m.name for m in p.models]
    dem = p.demand
    free = obs.capacity.free(usage(after, dem), resource_names(dem))

    def fits(g: str, r: str) -> bool:  # r's new replica in what g's leaves free
        gm, rm = dem[g], dem[r]
        return all(gm.get(k, 0.0) + f >= rm.get(k, 0.0) - 1e-9 for k, f in free.items())

    moves: list[dict[str, Any]] = []
    for r in starving:
        best = best_move(prob, names, after, r, [g for g in donors if fits(g, r)], c.move_min_gain)
        if best is None:
            continue
        g, gain = best
        after[r] += 1
        after[g] -= 1
        donors.remove(g)
        for k in free:
            free[k] += dem[g].get(k, 0.0) - dem[r].get(k, 0.0)
        p.moved[r], p.moved[g] = "in", "out"
        # the new replica needs its cold start: the trigger waits for it, as after a surge
        p.surge_hold[r] = obs.now + c.cold_start_s + c.reactive_trigger_s
        p.violating.update(r, False, obs.now)
        moves.append(
            {
                "from": g,
                "to": r,
                "gain": round(gain, 4),
                "donor_rate_rps": round(hi[g], 3),
                "recipient_rate_rps": round(float(np.median(rates[r])), 3),
            }
        )
    if not moves:
        return d
    if d is None:
        d = Decision({}, {}, "move", {})
    for mv in moves:
        d.set(mv["from"], replicas=after[mv["from"]])
        d.set(mv["to"], replicas=after[mv["to"]])
    d.info["moves"] = moves
    if d.kind == "reactive":
        d.kind = "reactive+move"
    return d


def donor_ok(service: Service, replicas: int, rate: float, cluster: ClusterSpec) -> bool:
    """Whether the model stays within its SLO at ``rate`` (requests/s) with one replica
    fewer than ``replicas`` (the engine's estimator for how its replicas serve), and above
    its minimum."""
    if replicas - 1 < max(service.model.min_replicas, 1):
        return False
    return rate <= service.max_rate(replicas - 1, cluster)


def move_problem(
    models: Sequence[ModelSLO],
    cluster: ClusterSpec,
    current: Mapping[str, int],
    rates: Mapping[str, np.ndarray],
    processing_ms: Mapping[str, float],
    window_s: float,
    batch_shapes: Mapping[str, np.ndarray] | None = None,
) -> Problem:
    """The engine's problem that scores moves: the cluster objective over window utilities
    (a replica added now serves after the cold start) over ``window_s``, each model's rate
    ``rates[name]`` (samples x steps, requests/s)."""
    spec = cluster.model_copy(update={"window_s": float(window_s)})
    return make_problem(
        models, dict(rates), dict(current), spec, processing_ms=dict(processing_ms), batch_shapes=batch_shapes
    )


def best_move(
    prob: Problem,
    names: Sequence[str],
    replicas: Mapping[str, int],
    recipient: str,
    donors: Sequence[str],
    min_gain: float,
) -> tuple[str, float] | None:
    """The donor whose replica, moved to ``recipient``, raises ``prob``'s objective most
    (from ``replicas``), with the gain; None when no move gains more than ``min_gain``."""
    x = np.array([replicas[n] for n in names], float)
    d = np.zeros(len(names))
    base = prob.value(x, d)
    r = list(names).index(recipient)
    best = None
    for n in donors:
        i = list(names).index(n)
        y = x.copy()
        y[r] += 1
        y[i] -= 1
        gain = prob.value(y, d) - base
        if gain > min_gain and (best is None or gain > best[1] + 1e-12):
            best = (n, float(gain))
    return best
