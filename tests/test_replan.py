"""Issue 31: re-plan on surprise and moving replicas in a full cluster (autoscaler.faro.replan,
FaroPolicy). Pure and Ray-free: observations are built by hand."""

import numpy as np
import pytest

from autoscaler import ModelObservation, Observation, make_policy
from autoscaler.driving.explain import explain
from autoscaler.faro.moves import donor_ok
from autoscaler.faro.replan import relevel, surprise
from autoscaler.policies.service import Service
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import latency_mdc

SLO = dict(slo_ms=720, processing_ms=154)


def obs(now, rates, targets, latency=None, serving=None, cpus=8, history=None):
    """``rates``: req/s per model over the last tick; the history is flat at ``history``
    (default: the same rates)."""
    history = history or rates
    latency = latency or {}
    serving = serving or targets
    return Observation(
        now=now,
        capacity_cpus=cpus,
        capacity_memory_gb=None,
        models={
            n: ModelObservation(
                n,
                serving[n],
                targets[n],
                np.full(20, history[n] * 60.0),
                arrival_rate=rates[n],
                latency_ms=latency.get(n),
                processing_ms=154.0,
            )
            for n in rates
        },
    )


def replan_policy(**kw):
    models = [ModelSLO(name=n, **SLO) for n in ("a", "b", "c")]
    return make_policy("faro-fairsum", models, ClusterSpec(cpus=8, replan=True, **kw))


def run(policy, ticks, rates, targets, start=10.0):
    """Decide at every tick from ``start`` for ``ticks`` ticks; the decisions that were made."""
    out = []
    for k in range(ticks):
        d = policy.decide(obs(start + 10.0 * k, rates, targets, history=FLAT))
        if d is not None:
            out.append((start + 10.0 * k, d))
            targets = {**targets, **d.replicas}
    return out


FLAT = {"a": 1.0, "b": 1.0, "c": 1.0}


def test_rate_leaving_the_band_replans_the_whole_cluster_within_one_tick():
    policy = replan_policy(replan_trigger_s=10.0)
    first = policy.decide(obs(0.0, FLAT, {"a": 2, "b": 2, "c": 2}))
    assert first.kind == "long_term"
    targets = dict(first.replicas)
    assert run(policy, 6, FLAT, targets) == []  # t = 10..60: the rate is in the band
    d = policy.decide(obs(70.0, {**FLAT, "a": 12.0}, targets, history=FLAT))
    assert d is not None and d.kind == "replan"
    assert d.info["replan"]["trigger"]["a"]["why"] == "rate above the forecast band"
    assert set(d.info["models"]) == {"a", "b", "c"}  # the whole cluster was solved
    assert d.replicas["a"] > targets["a"]
    assert "re-levelled" in d.info["models"]["a"]["predictor"]
    text = "\n".join(explain([{"t": 70.0, "decision": {"kind": d.kind, "replicas": dict(d.replicas), "info": d.info}}]))
    assert "re-plan: a: rate above the forecast band" in text


def test_default_trigger_needs_the_rate_sustained():
    policy = replan_policy(replan_margin=1.0)  # the rate averaged over 30 s must leave the band
    policy.decide(obs(0.0, FLAT, {"a": 1, "b": 1, "c": 1}))
    one = {"a": 1, "b": 1, "c": 1}  # the targets in force (the test holds them)
    run(policy, 6, FLAT, one)
    # the band is 1..1 req/s; a 30 s mean beyond 2 x 1 + 3 sd of its count (2.55) is a
    # surprise; 5 req/s needs more replicas than one (it serves 3.08 within the SLO)
    up = {**FLAT, "a": 5.0}
    assert policy.decide(obs(70.0, up, one, history=FLAT)) is None  # one tick: mean 2.33
    assert policy.decide(obs(80.0, FLAT, one, history=FLAT)) is None  # back
    assert policy.decide(obs(90.0, FLAT, one, history=FLAT)) is None
    assert policy.decide(obs(100.0, up, one, history=FLAT)) is None  # mean 2.33 again
    d = policy.decide(obs(110.0, up, one, history=FLAT))  # mean 3.67: it holds
    assert d is not None and d.kind == "replan" and d.replicas["a"] > 1


def test_a_flat_trace_never_replans():
    policy = replan_policy()
    targets = dict(policy.decide(obs(0.0, FLAT, {"a": 2, "b": 2, "c": 2})).replicas)
    rng = np.random.default_rng(0)
    kinds = []
    for k in range(1, 120):  # 20 minutes of Poisson counting noise around the forecast
        rates = {n: rng.poisson(10.0 * r) / 10.0 for n, r in FLAT.items()}
        d = policy.decide(obs(10.0 * k, rates, targets, history=FLAT))
        if d is not None:
            kinds.append(d.kind)
            targets = {**targets, **d.replicas}
    assert "replan" not in kinds and kinds.count("long_term") == 3


def test_hysteresis_no_replan_within_the_gap():
    policy = replan_policy(replan_trigger_s=10.0, replan_gap_s=60.0)
    one = {"a": 1, "b": 1, "c": 1}
    policy.decide(obs(0.0, FLAT, one))
    # 5 req/s on one replica: a surprise (band 1..1), not a surge (one replica serves 3.1)
    up = {**FLAT, "a": 5.0}
    # within the gap after the long-term plan: no re-plan, however surprising
    assert policy.decide(obs(30.0, up, one, history=FLAT)) is None
    d = policy.decide(obs(60.0, up, one, history=FLAT))
    assert d.kind == "replan"
    targets = {**one, **d.replicas}
    # b surprises now, but the last re-plan was 10-50 s ago
    both = {**up, "b": 5.0}
    for t in (70.0, 80.0, 90.0, 100.0, 110.0):
        assert policy.decide(obs(t, both, targets, history=FLAT)) is None
    d = policy.decide(obs(120.0, both, targets, history=FLAT))
    assert d.kind == "replan" and list(d.info["replan"]["trigger"]) == ["b"]  # a's band moved


def test_on_by_default_and_off_when_switched_off():
    assert ClusterSpec(cpus=8).replan is True and ClusterSpec(cpus=8).replan_latency is True
    for on in (True, False):
        policy = make_policy(
            "faro-fairsum", [ModelSLO(name="a", **SLO), ModelSLO(name="b", **SLO)], ClusterSpec(cpus=8, replan=on)
        )
        policy.decide(obs(0.0, {"a": 1.0, "b": 1.0}, {"a": 2, "b": 2}))
        kinds = [
            getattr(
                policy.decide(obs(t, {"a": 16.0, "b": 1.0}, {"a": 2, "b": 2}, history={"a": 1.0, "b": 1.0})),
                "kind",
                None,
            )
            for t in (70.0, 80.0, 90.0, 100.0)
        ]  # a's rate far above its band
        assert ("replan" in kinds) is on, kinds


def test_no_replan_under_heavy_overload():
    """Needing twice the cluster, no share meets the SLOs: no re-plan (the long-term plan and
    its overload guard decide); with the guard off, the same surprise re-plans. (The surge
    rule is off: a 20x step would be a surge plan, tests/test_surge.py.)"""

    def last(guard):
        policy = make_policy(
            "faro-fairsum",
            [ModelSLO(name=n, **SLO) for n in "abc"],
            ClusterSpec(cpus=8, overload_guard=guard, surge=False),
        )
        base = {"a": 3.0, "b": 3.0, "c": 3.0}
        policy.decide(obs(0.0, base, {"a": 3, "b": 3, "c": 2}))
        return [
            getattr(policy.decide(obs(t, {**base, "a": 60.0}, {"a": 3, "b": 3, "c": 2}, history=base)), "kind", None)
            for t in (70.0, 80.0, 90.0, 100.0)
        ]

    assert "replan" not in last(1.25)
    assert "replan" in last(None)


def test_surprise_band_and_relevel():
    band = (1.0, 2.0, 4.0)
    assert surprise(3.0, band, 0.25, 30.0) is None
    assert surprise(9.0, band, 0.25, 30.0) == "above"
    assert surprise(0.0, (10.0, 12.0, 14.0), 0.25, 60.0) == "below"
    # counting noise is no surprise: 1 request in 10 s against a forecast of 0.01 req/s
    assert surprise(0.1, (0.0, 0.0, 0.01), 0.25, 10.0) is None
    s = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert np.median(relevel(s, 5.0)) == pytest.approx(5.0)
    assert np.all(relevel(np.zeros((2, 2)), 3.0) == 3.0)


# -- moving replicas in a full cluster ---------------------------------------------------


def move_setup(donors: dict[str, tuple[float, int]], hot_rate=12.0, hot_replicas=2, cpus=None):
    """'hot' over its SLO at ``hot_replicas``; ``donors``: name -> (rate, replicas); the
    cluster exactly full. Returns the policy and a function making the tick's observation."""
    models = [ModelSLO(name="hot", **SLO)] + [ModelSLO(name=n, **SLO) for n in donors]
    targets = {"hot": hot_replicas, **{n: r for n, (_, r) in donors.items()}}
    cpus = cpus or sum(targets.values())
    policy = make_policy("faro-fairsum", models, ClusterSpec(cpus=cpus, moves=True))
    rates = {"hot": hot_rate, **{n: r for n, (r, _) in donors.items()}}

    def at(now, tg=None):
        return obs(now, rates, tg or targets, latency={"hot": 2000.0}, cpus=cpus)

    return policy, at, targets


def plan_then(policy, at, targets, until=40.0):
    policy.decide(at(0.0))  # a long-term plan (its targets are ignored: the test sets them)
    out = []
    t = 10.0
    while t <= until:
        d = policy.decide(at(t, targets))
        if d is not None:
            out.append(d)
        t += 10.0
    return out


def test_full_cluster_moves_a_replica_from_slack_to_the_starving_model():
    policy, at, targets = move_setup({"idle": (0.5, 4)})
    decided = plan_then(policy, at, targets)
    assert len(decided) == 1
    d = decided[0]
    assert d.kind == "move"
    assert dict(d.replicas) == {"hot": 3, "idle": 3}
    mv = d.info["moves"][0]
    assert mv["from"] == "idle" and mv["to"] == "hot" and mv["gain"] > 0
    text = "\n".join(explain([{"t": 40.0, "decision": {"kind": d.kind, "replicas": dict(d.replicas), "info": d.info}}]))
    assert "move: one replica idle -> hot" in text
    # no second move while the new replica starts, and none back before the next plan
    later = [policy.decide(at(t, {"hot": 3, "idle": 3})) for t in (50.0, 60.0, 70.0, 80.0)]
    assert all(x is None for x in later)


def test_a_donor_whose_slo_would_break_is_never_the_donor():
    # 'busy' at 2 replicas meets its SLO, at 1 it would not (M/D/1 at 4 req/s)
    assert latency_mdc(1, 4.0, 0.154, 0.99) > 0.72 >= latency_mdc(2, 4.0, 0.154, 0.99)
    m = ModelSLO(name="busy", **SLO)
    svc = Service(m, 0.154)  # 154 ms alone, one request at a time
    assert not donor_ok(svc, 2, 4.0, ClusterSpec(cpus=8))
    assert donor_ok(svc, 3, 4.0, ClusterSpec(cpus=8))
    policy, at, targets = move_setup({"busy": (4.0, 2)})
    assert plan_then(policy, at, targets) == []
    # beside a model with slack, the slack one gives, not the busy one
    policy, at, targets = move_setup({"busy": (4.0, 2), "idle": (0.5, 3)})
    d = plan_then(policy, at, targets)
    assert len(d) == 1 and d[0].info["moves"][0]["from"] == "idle"


def test_a_move_must_fit_the_recipients_replica():
    # 'hot' needs 2 CPUs a replica; the donor's replica frees 1: nothing can move
    models = [ModelSLO(name="hot", cpus=2, **SLO), ModelSLO(name="idle", **SLO)]
    policy = make_policy("faro-fairsum", models, ClusterSpec(cpus=8, moves=True))
    tg = {"hot": 2, "idle": 4}
    rates = {"hot": 12.0, "idle": 0.5}
    policy.decide(obs(0.0, rates, tg, cpus=8))
    for t in (10.0, 20.0, 30.0, 40.0):
        assert policy.decide(obs(t, rates, tg, latency={"hot": 2000.0}, cpus=8)) is None


def test_no_move_when_the_objective_does_not_gain():
    # 'hot' over its SLO but its rate is served within the SLO at its replicas (a transient
    # latency, e.g. a slow start): one more replica gains nothing, so nothing moves
    policy, at, targets = move_setup({"idle": (0.5, 4)}, hot_rate=1.0)
    assert plan_then(policy, at, targets) == []


def test_moves_on_by_default_and_off_the_reactive_step_is_as_it_was():
    assert ClusterSpec(cpus=8).moves is True
    models = [ModelSLO(name="hot", **SLO), ModelSLO(name="idle", **SLO)]
    for moves, want in ((False, None), (True, {"hot": 3, "idle": 3})):
        policy = make_policy("faro-fairsum", models, ClusterSpec(cpus=6, moves=moves))
        tg = {"hot": 2, "idle": 4}
        policy.decide(obs(0.0, {"hot": 12.0, "idle": 0.5}, tg, cpus=6))
        got = [
            policy.decide(obs(t, {"hot": 12.0, "idle": 0.5}, tg, latency={"hot": 2000.0}, cpus=6))
            for t in (10.0, 20.0, 30.0, 40.0)
        ]
        assert got[:3] == [None, None, None]
        assert (got[3] if want is None else dict(got[3].replicas)) == want


# -- the same policy in the simulator ----------------------------------------------------


def _sim(counts, **spec):
    from faro_serve.sim.runner import SimConfig, simulate

    models = [ModelSLO(name=n, **SLO) for n in ("a", "b")]
    pol = make_policy("faro-fairsum", models, ClusterSpec(cpus=12, cold_start_s=10, **spec))
    seen = []
    decide = pol.decide

    def logged(o):
        d = decide(o)
        if d is not None:
            seen.append((o.now, d.kind))
        return d

    pol.decide = logged
    res = simulate(
        counts,
        models,
        pol,
        SimConfig(capacity_cpus=12, cold_start_s=10, seed=3),
        warmup_history=np.tile(counts[:, :1], (1, 30)),
    )
    return res, seen


def test_simulated_step_out_of_the_band_replans_within_one_tick_of_the_trigger():
    r1 = 3.08  # what one replica serves within the SLO
    counts = np.tile(np.array([[r1 * 60], [r1 * 60]]), (1, 12))
    counts[0, 7:] = 4 * r1 * 60  # at 420 s, between the plans of 300 and 600 s
    res, seen = _sim(counts, replan=True, replan_latency=False, surge=False)
    replans = [t for t, k in seen if k == "replan"]
    assert replans and 420.0 < replans[0] <= 420.0 + 30.0 + 10.0  # trigger held + one tick
    assert all(b - a >= 60.0 for a, b in zip(replans, replans[1:]))  # the gap


@pytest.mark.parametrize("level", [0.9, 2.0])
def test_simulated_flat_trace_neither_replans_nor_moves(level):
    counts = np.tile(np.array([[level * 3.08 * 60], [4 * 3.08 * 60]]), (1, 40))
    on, seen = _sim(counts, replan=True, moves=True)
    off, _ = _sim(counts, replan=False, moves=False)
    assert not any(k in ("replan", "move", "reactive+move") for _, k in seen)
    assert np.array_equal(on.targets, off.targets)


def test_a_replan_does_not_cut_a_saturated_model():
    """Live, requests refused at the queue bound are never seen as arrivals, so a model over
    its SLO (or queued beyond its replicas) measures less than its load: a re-plan keeps its
    replicas and takes the difference back from its own increases (guard.keep_saturated)."""
    from autoscaler.contract.policy import Decision
    from autoscaler.faro.guard import keep_saturated

    models = {n: ModelSLO(name=n, **SLO) for n in ("a", "b", "c")}
    o = obs(60.0, {"a": 9.0, "b": 0.1, "c": 1.0}, {"a": 3, "b": 3, "c": 2}, latency={"b": 5000.0}, cpus=8)
    d = Decision({"a": 5, "b": 1, "c": 2}, {}, "replan", {})
    assert keep_saturated(d, o, models) == ["b"]
    assert dict(d.replicas) == {"a": 3, "b": 3, "c": 2}  # a's increase gave b's two back
    # within its SLO and not queued: the cut stands
    o2 = obs(60.0, {"a": 9.0, "b": 0.1, "c": 1.0}, {"a": 3, "b": 3, "c": 2}, cpus=8)
    d2 = Decision({"a": 5, "b": 1, "c": 2}, {}, "replan", {})
    assert keep_saturated(d2, o2, models) == [] and d2.replicas["b"] == 1
