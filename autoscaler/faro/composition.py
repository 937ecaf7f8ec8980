"""How Faro's parts compose, and in which order: the one place that says it (paper 4.4 for
the long-term plan and the reactive step; the rest is ours, issues 18, 31, 35, 47).

Every tick :meth:`FaroPolicy.decide <autoscaler.faro.hybrid.FaroPolicy.decide>` calls
:func:`decide`, which runs, in this order:

1. **Remember the rates** (``hybrid._remember_rates``): the last ticks' arrival rates that
   the re-plan and the moves judge a surprise by.
2. **Long-term plan**, when ``long_term_interval_s`` has passed since the last one
   (``hybrid.long_term``): forecast the window (``pipeline_aware.forecast_samples``: a
   pipeline forecast at its entry), plan every model at once (``faro_serve.engine.plan``),
   then the **overload guard** (``guard.guard_cuts``) keeps a fairness plan under heavy
   overload from cutting a model below what its observed rate needs.
3. Otherwise the **short-term step** (:func:`short_term`), when ``reactive``:

   a. judge each model (a pipeline end to end, ``pipeline_aware.judged``) against its SLO
      and time how long it has been over (``violating``; a surge's or a move's new
      replicas make the timer wait for them, ``surge_hold``);
   b. the models over it for ``reactive_trigger_s`` are due, oldest first; a due pipeline
      names its bottleneck stage (``pipeline_aware.resolve_due``);
   c. **re-plan on surprise** (``hybrid.replan``, ``replan.py``; ``ClusterSpec.replan``):
      a rate out of its forecast band, or a due model, plans the whole cluster again; when
      it does, that plan is the step's decision;
   d. else the **reactive step**: one more replica for each due model, within free
      capacity, first come first served (``policies.common.fcfs_decision``);
   e. **larger batches**: a due batching model whose largest batch serves a fifth more gets
      it at once (``hybrid.with_larger_batches``);
   f. **moves** (``moves.with_moves``; ``ClusterSpec.moves``): a due
      model that got no replica takes one from the donor whose loss costs least.
4. **Surge** last, over whatever 2 or 3 decided (``surge.SurgeAware.with_surge``;
   ``ClusterSpec.surge``): a model whose rate jumped past what its replicas serve gets what
   it needs at once, or, when the surging models do not all fit, the **surge plan** plans
   the cluster at the rates seen now; a plan never cuts a surging model below its need.
   The surge sizes a batching model at its largest batch, so a flat curve's model serving
   smaller ones gets its largest with the replicas, as in 3e (issue 47).

The oracle (``hybrid.OraclePolicy``) composes the same way with its re-plans and surge
plans switched off. Everything here runs live and in the simulator alike.
"""

from __future__ import annotations

from autoscaler.contract.policy import Decision, Observation
from autoscaler.faro import moves
from autoscaler.faro.guard import guard_cuts
from autoscaler.faro.parts import FaroParts
from autoscaler.policies.common import fcfs_decision


def decide(p: FaroParts, obs: Observation) -> Decision | None:
    """One tick of Faro: steps 1 to 4 of the module docstring."""
    p._remember_rates(obs)
    if obs.now - p.last_long_term >= p.cluster.long_term_interval_s:
        return p.with_surge(obs, guard_cuts(p.long_term(obs), obs, p.slo, p.cluster))
    if p.reactive:
        return p.with_surge(obs, p.short_term(obs))
    return p.with_surge(obs, None)


def short_term(p: FaroParts, obs: Observation) -> Decision | None:
    """Step 3: the models over their SLO for the trigger period get a re-plan, or one more
    replica each within free capacity, larger batches and moves; never fewer replicas."""
    for n, o in p.judged(obs):
        over = o.latency_ms is not None and o.latency_ms > p.slo[n].slo_ms
        # while a surge's replicas are still coming, the trigger waits
        p.violating.update(n, over and obs.now >= p.surge_hold.get(n, -float("inf")), obs.now)
    p.watch_pipelines(obs)
    due = [
        n
        for n in sorted(p.violating.since, key=p.violating.since.__getitem__)
        if p.violating.held(n, obs.now, p.cluster.reactive_trigger_s)
    ]
    for n in due:  # restart the timer: the next step needs another full trigger period
        p.violating.restart(n, obs.now)
    due = p.resolve_due(obs, due)  # a pipeline: its bottleneck stage
    if p.cluster.replan:
        d = p.replan(obs, due)
        if d is not None:
            return d
    d = fcfs_decision(p.models, obs, {n: obs.models[n].target_replicas + 1 for n in due}, due, "reactive")
    if d is not None:
        d.info = {"scaled_up": sorted(d.replicas)}
    d = p.with_larger_batches(obs, due, d)
    if p.cluster.moves:
        d = moves.with_moves(p, obs, due, d)
    return d
