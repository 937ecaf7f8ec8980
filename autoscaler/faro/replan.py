"""Between Faro's five-minute plans (ours, issue 31): re-plan on surprise.

Pure functions over numbers and the engine; :class:`~autoscaler.faro.hybrid.FaroPolicy` keeps the
state and calls them, so the live autoscaler and the simulator run the same code.

* **Surprise** (:func:`surprise`): a model's arrival rate, averaged over the last
  ``replan_trigger_s``, leaves the last plan's forecast band, p10..p90 of its samples,
  widened by ``replan_margin`` (relative) and by three standard deviations of a Poisson
  count over that averaging time (so a low rate's counting noise is no surprise).
* **Re-plan** (:func:`relevel`): the cluster is planned again by the engine, with a
  fresh forecast, in which a surprised model's samples are scaled so that their median is
  the rate it has now.
* **Scope** (:func:`replan_scope`, ``ClusterSpec.replan_scope``): by default (``"cluster"``)
  a re-plan plans every model. With ``"groups"``, a cluster the planner solves in groups
  (50 models or more, paper section 3.4) re-plans only the groups of the models that
  triggered it, within what they hold and what is free; the other groups keep their
  replicas. At 100 models some model leaves its band nearly every minute and a re-plan
  touches about half the groups, so a re-plan costs about half as much; on day 10 with
  100 jobs it lost 2 % more utility (1.06 against 1.04, 3 seeds; docs/simulator.md), so
  it is not the default. Below 50 models the one group is the whole cluster.

Moves, the other step between the plans, are ``autoscaler.faro.moves``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import make_problem
from faro_serve.engine.hierarchy import model_groups
from faro_serve.resources import Capacity, demand, usage

Z_POISSON = 3.0  # standard deviations of a Poisson count that are not a surprise


def band_of(samples: np.ndarray) -> tuple[float, float, float]:
    """p10, p50 and p90 (requests/s) of a model's forecast samples (samples x steps)."""
    qs = np.quantile(np.asarray(samples, float), (0.1, 0.5, 0.9))  # one sort for the three
    p10, p50, p90 = (round(float(q), 4) for q in qs)
    return p10, p50, p90


def bands_of(samples: Mapping[str, np.ndarray]) -> dict[str, tuple[float, float, float]]:
    """:func:`band_of` of every model, the models whose samples share a shape in one
    quantile call (each plan takes every model's band: 100 calls were 4 % of a replay)."""
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for n, s in samples.items():
        by_shape.setdefault(np.shape(s), []).append(n)
    out = {}
    for names in by_shape.values():
        stacked = np.stack([np.asarray(samples[n], float).reshape(-1) for n in names])
        qs = np.quantile(stacked, (0.1, 0.5, 0.9), axis=1)  # as band_of's, row by row
        for k, n in enumerate(names):
            out[n] = (round(float(qs[0, k]), 4), round(float(qs[1, k]), 4), round(float(qs[2, k]), 4))
    return {n: out[n] for n in samples}


def replan_scope(
    models: Sequence[ModelSLO], cluster: ClusterSpec, triggers: set[str]
) -> tuple[list[str], ClusterSpec] | None:
    """The models a re-plan triggered by ``triggers`` plans (module doc: Scope), in model
    order, and the spec to plan them with: as many groups as they fill (a scope of 40 in
    one COBYLA would cost more than the whole cluster in its groups). None: the whole
    cluster (one group, ``replan_scope`` "cluster", or every group touched)."""
    if cluster.replan_scope == "cluster":
        return None
    groups = model_groups(len(models), cluster)
    touched = [g for g in groups if any(models[j].name in triggers for j in g)]
    if len(groups) <= 1 or not touched or len(touched) == len(groups):
        return None
    names = [models[i].name for i in sorted(i for g in touched for i in g)]
    return names, cluster.model_copy(update={"groups": len(touched)})


def scoped_capacity(
    models: Sequence[ModelSLO], cluster: ClusterSpec, capacity: Capacity, targets: Mapping[str, int], scope: set[str]
) -> Capacity:
    """What the models in ``scope`` may hold: the cluster's capacity (its config's caps and
    ``capacity``) less what every other model's ``targets`` take."""
    cap = Capacity.of_cluster(cluster).capped_by(capacity)
    others = {m.name: targets[m.name] for m in models if m.name not in scope}
    used = usage(others, {m.name: demand(m) for m in models if m.name in others})
    return cap.replaced(**{r: max(0.0, cap[r] - a) for r, a in used.items() if math.isfinite(cap[r])})


def surprise(rate: float, band: Sequence[float], margin: float, seconds: float) -> str | None:
    """``"above"`` or ``"below"`` when ``rate`` (averaged over ``seconds``) is outside the
    band p10..p90 widened by ``margin`` and by Z_POISSON standard deviations of a Poisson
    count over ``seconds``; None inside it."""
    p10, _, p90 = band
    seconds = max(seconds, 1e-9)
    hi = p90 * (1 + margin) + Z_POISSON * math.sqrt(max(p90, 1.0 / seconds) / seconds)
    lo = p10 * (1 - margin) - Z_POISSON * math.sqrt(max(p10, 0.0) / seconds)
    if rate > hi:
        return "above"
    if rate < lo:
        return "below"
    return None


def relevel(samples: np.ndarray, rate: float) -> np.ndarray:
    """``samples`` scaled so that their median is ``rate`` (a constant ``rate`` when the
    median is 0): the forecast's shape and spread, the level seen now."""
    s = np.asarray(samples, float)
    med = float(np.median(s))
    if med <= 1e-9:
        return np.full(s.shape, float(rate))
    return s * (float(rate) / med)


def prune_changes(
    models: Sequence[ModelSLO],
    cluster: ClusterSpec,
    samples: Mapping[str, np.ndarray],
    current: Mapping[str, int],
    planned: Mapping[str, int],
    processing_ms: Mapping[str, float],
    keep: set[str],
    min_gain: float,
    capacity: Capacity | None = None,
    batch_shapes: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, int], float]:
    """``planned`` with every change that is not worth ``min_gain`` undone, and its gain.

    A re-plan re-solves the whole cluster, and where the objective is flat (an overloaded
    cluster) a fresh forecast reshuffles replicas for nothing but cold starts. So, greedily,
    the change of a model outside ``keep`` (the surprised models) whose undoing costs the
    cluster objective least (the engine's window utilities at ``samples``, cold start
    included) is undone while that cost is below ``min_gain`` and the result fits the
    capacity (``capacity``: what the cluster has now, every resource). The gain is the kept
    allocation's objective minus the current one's."""
    prob = make_problem(
        models,
        dict(samples),
        dict(current),
        cluster,
        processing_ms=dict(processing_ms),
        capacity=capacity,
        batch_shapes=batch_shapes,
    )
    names = [m.name for m in models]
    d = np.zeros(len(names))
    x = np.array([current[n] for n in names], float)
    y = np.array([planned.get(n, current[n]) for n in names], float)
    value = prob.value(y, d)
    while True:
        best = None
        for i, n in enumerate(names):
            if n in keep or y[i] == x[i]:
                continue
            z = y.copy()
            z[i] = x[i]
            if not prob.fits(z):
                continue
            v = prob.value(z, d)
            if value - v < min_gain and (best is None or v > best[1]):
                best = (i, v)
        if best is None:
            break
        y[best[0]] = x[best[0]]
        value = best[1]
    return {n: int(y[i]) for i, n in enumerate(names)}, float(value - prob.value(x, d))
