"""A restarted autoscaler loop carries on from its saved state (Ray-free, with a fake
cluster whose fronts measure a load that changes over time): the same decisions as an
uninterrupted loop; a stale plan replaced at the first tick; stale or foreign state ignored.
The live version (a killed autoscaler replica on a real cluster) is in test_serving_live.py."""

import json

import numpy as np
import pytest
from meter_reports import meter_report

from autoscaler.driving.loop import AutoscalerLoop
from faro_serve.serving.schema import parse_autoscaler_config


def config(policy=None):
    return parse_autoscaler_config(
        {
            "cluster": {"cpus": 3, "objective": "fair_sum", "reactive_trigger_s": 20},
            "policy": policy,
            "models": [
                {"name": "a", "slo_ms": 720, "processing_ms": 154, "cpus": 0.25},
                {"name": "b", "slo_ms": 720, "processing_ms": 154, "cpus": 0.25},
            ],
        }
    )


def rate(name: str, t: float) -> float:
    """Requests/s: a rises in steps, b falls, so plans and reactive steps both happen."""
    return (2.0 + 3.0 * (t // 200)) if name == "a" else max(0.5, 8.0 - 2.5 * (t // 250))


class Cluster:
    """Replicas start at once; a front reports the load of ``rate``, and a p99 over the SLO
    while its replicas are more than 60 % busy."""

    def __init__(self):
        self.running = {"a": 1, "b": 1}
        self.t = 0.0
        self.scaled = []

    def capacity(self):
        return 3.0, None

    def running_replicas(self):
        return dict(self.running)

    def meter_reports(self, names):
        out = {}
        for n in names:
            minutes = int(self.t // 60)
            lam = rate(n, self.t)
            busy = lam * 0.154 / self.running[n]
            latency = 400.0 if busy < 0.6 else 3000.0
            out[n] = meter_report(
                n,
                arrivals_per_min=[60 * rate(n, 60 * m) for m in range(minutes)],
                current_minute_count=lam * (self.t - 60 * minutes),
                current_minute_elapsed_s=self.t - 60 * minutes,
                arrival_rate=lam,
                latency_ms=latency,
                processing={"mean_ms": 154.0},
                queue_length=0.0,
                mean_in_flight=lam * latency / 1e3,
            )  # Little's law
        return out

    def scale(self, name, replicas):
        self.scaled.append((self.t, name, replicas))
        self.running[name] = replicas

    def control(self, *args):
        pass


class Store:
    """The saved state, through JSON as the live store keeps it."""

    def __init__(self):
        self.doc = None

    def load(self):
        return None if self.doc is None else json.loads(self.doc)

    def save(self, state):
        self.doc = json.dumps(state)


def run(loop, cluster, times):
    out = []
    for t in times:
        cluster.t = t
        d = loop.step()["decision"]
        out.append(None if d is None else (d["kind"], d["replicas"]))
    return out


@pytest.mark.parametrize("policy", [None, "aiad", "ray-serve", "mark"])
def test_a_restarted_loop_decides_as_the_uninterrupted_one(policy):
    times = np.arange(0, 900, 10.0)
    ref_cluster = Cluster()
    ref = AutoscalerLoop(config(policy), ref_cluster, clock=lambda: ref_cluster.t)
    want = run(ref, ref_cluster, times)
    k = 47  # a tick between plans, with timers running
    assert sum(d is not None for d in want) >= 2 and any(d is not None for d in want[k:])

    cluster, store = Cluster(), Store()
    first = AutoscalerLoop(config(policy), cluster, clock=lambda: cluster.t, store=store)
    got = run(first, cluster, times[:k])
    # the autoscaler dies; Serve starts a new one, which finds the saved state
    again = AutoscalerLoop(config(policy), cluster, clock=lambda: cluster.t, store=store)
    cluster.t = times[k]
    assert again.restored is not None and again.start == first.start
    got += run(again, cluster, times[k:])
    assert got == want


def test_a_stale_plan_is_replaced_at_the_first_tick_and_a_fresh_one_kept():
    cluster, store = Cluster(), Store()
    loop = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    assert run(loop, cluster, [0.0])[0][0] == "long_term"
    run(loop, cluster, [10.0, 20.0])
    # restarted 100 s after the plan: the plan holds (a fresh loop would plan at once)
    fresh = AutoscalerLoop(config(), Cluster(), clock=lambda: 100.0)
    assert run(fresh, fresh.cluster, [100.0])[0][0] == "long_term"
    soon = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    d = run(soon, cluster, [100.0])[0]
    assert soon.restored is not None and (d is None or d[0] != "long_term")
    # restarted 320 s after it (the long-term interval is 300 s): planned at the first tick
    late = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    cluster.t = 320.0
    assert late.restored is not None
    assert run(late, cluster, [320.0])[0][0] == "long_term"


def test_stale_or_foreign_state_is_not_restored():
    cluster, store = Cluster(), Store()
    run(AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store), cluster, [0.0, 10.0])
    cluster.t = 10.0 + 601.0  # older than max(2 x 300 s, 600 s)
    old = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    assert old.restored is None and old.start == cluster.t
    cluster.t = 20.0  # a faro-fairsum state offered to AIAD
    assert AutoscalerLoop(config("aiad"), cluster, clock=lambda: cluster.t, store=store).restored is None

    class Broken:
        def load(self):
            raise ConnectionError("store gone")

        def save(self, state):
            raise ConnectionError("store gone")

    loop = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=Broken())
    assert loop.restored is None and loop.step()["decision"]["kind"] == "long_term"  # still works


def test_a_restarted_loop_restores_each_models_setting():
    """The setting record (issue 33) is what the loop saves: a drop rate set before the
    restart is in force after it and sent to the fronts; a saved field the config no longer
    allows is left out; an unreadable setting, or a state without per-model settings, starts
    from the fronts' defaults, never crashes."""
    from autoscaler.contract.setting import Setting

    cluster, store = Cluster(), Store()
    sent = []
    cluster.control = lambda name, setting, pct: sent.append((name, setting))
    loop = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    cluster.t = 0.0
    loop.step()
    loop.settings["a"] = loop.settings["a"].merged(Setting(drop_rate=0.3))
    cluster.t = 10.0
    loop.step()
    saved = json.loads(store.doc)
    assert saved["version"] == 2 and saved["settings"]["a"] == {"drop_rate": 0.3}  # no replicas
    cluster.t = 20.0
    again = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    again.step()
    assert again.settings["a"].drop_rate == 0.3 and again.settings["a"].replicas == cluster.running["a"]
    assert ("a", again.settings["a"]) in sent
    # b's batch size is not allowed any more: left out, a's drop rate restored
    store.doc = json.dumps({**saved, "settings": {"a": {"drop_rate": 0.5}, "b": {"batch_size": 4}}})
    later = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    later.step()
    assert later.settings["a"].drop_rate == 0.5 and later.settings["b"].batch_size is None
    # a state without per-model settings (an older version's): the fronts' defaults, no crash
    old = {k: v for k, v in saved.items() if k != "settings"}
    store.doc = json.dumps({**old, "version": 1, "drop_rates": {"a": 0.5}})
    v1 = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    v1.step()
    assert v1.settings["a"].drop_rate == 0.0
    store.doc = json.dumps({**saved, "settings": {"a": {"cores": 4}}})
    bad = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t, store=store)
    bad.step()
    assert bad.settings["a"].drop_rate == 0.0


class Refusing(Cluster):
    """Serve's REST API refuses every scale (as when Ray runs without its dashboard)."""

    refuse = True

    def scale(self, name, replicas):
        if self.refuse:
            raise ConnectionError("[Errno 111] Connection refused")
        super().scale(name, replicas)


def test_a_failing_apply_stays_in_the_status_across_the_ticks_that_decide_nothing():
    """Issue 50: where Serve's REST API cannot be reached, only the ticks that decide fail (a
    plan every long-term interval); the no-op ticks between used to reset the count the
    status showed, so the failure was invisible. TickFailures keeps it until a tick applies
    a decision, on a real loop whose load grows."""
    from autoscaler.driving.tick_failures import TickFailures
    from faro_serve.commands.status import tick_error_lines

    cluster = Refusing()
    failures = TickFailures(clock=lambda: cluster.t)
    loop = AutoscalerLoop(config(), cluster, clock=lambda: cluster.t)
    shown_after_an_ok_tick = 0
    while cluster.t < 900:
        try:
            failures.ok(loop.step())
            shown_after_an_ok_tick += failures.status() is not None
        except ConnectionError as err:
            failures.fail(err)
        cluster.t += loop.tick_s
    st = failures.status()
    assert st is not None and st["failed"] >= 2 and shown_after_an_ok_tick > 0, st
    assert st["error"] == "ConnectionError: [Errno 111] Connection refused"
    assert tick_error_lines(st)[0].startswith(
        f"{st['failed']} autoscaler ticks failed since it last applied a decision"
    )
    assert cluster.scaled == []
    cluster.refuse = False  # the URL fixed: the next decision applied clears it
    while failures.status() is not None and cluster.t < 1800:
        failures.ok(loop.step())
        cluster.t += loop.tick_s
    assert failures.status() is None and cluster.scaled and tick_error_lines(None) == []


def test_replicas_outside_new_bounds_are_scaled_into_them_at_once():
    """A loop (re)started over a model whose running replicas lie outside its SLO's bounds
    (the user raised min_replicas) scales it into them at its first tick: no plan would,
    since every decision is clamped to the bounds, and the target shown said 3 while 1 ran."""
    pinned = config().model_copy(
        update={
            "models": [config().models[0].model_copy(update={"min_replicas": 3, "max_replicas": 3}), config().models[1]]
        }
    )
    cluster = Cluster()
    loop = AutoscalerLoop(pinned, cluster, clock=lambda: cluster.t)
    loop.step()
    assert cluster.scaled[0] == (0.0, "a", 3) and loop.targets["a"] == 3
    for _ in range(30):
        loop.step()
        cluster.t += loop.tick_s
    assert cluster.running["a"] == 3


def test_a_model_with_none_running_is_left_to_the_next_decision():
    """No replica running may mean replicas starting: observing does not force the minimum
    (that could stop some), as it does force a count above the maximum; the next decision,
    clamped to at least the minimum, scales it."""
    from meter_reports import FakeCluster

    t = [0.0]
    cluster = FakeCluster({"a": 0, "b": 5})  # b's SLO allows at most 4
    loop = AutoscalerLoop(
        config().model_copy(
            update={"models": [config().models[0], config().models[1].model_copy(update={"max_replicas": 4})]}
        ),
        cluster,
        clock=lambda: t[0],
    )
    loop._observe(t[0])  # the observation alone, before any decision
    assert cluster.scaled == [("b", 4)] and loop.targets == {"a": 0, "b": 4}
    for _ in range(200):
        loop.step()
        if ("a", 1) in cluster.scaled:
            break
        t[0] += loop.tick_s
    assert ("a", 1) in cluster.scaled and cluster.running["a"] == 1


class Redeploying(Cluster):
    """Serve's applications with the time each was last deployed, as Ray reports them."""

    def __init__(self):
        super().__init__()
        self.deployed_at = {"a": 100.0, "b": 100.0}

    def redeploy(self, name, initial_replicas=1):
        """``serve deploy`` of a changed config: Ray resets the count to initial_replicas."""
        self.deployed_at[name] += 1
        self.running[name] = initial_replicas


def test_a_redeployed_model_application_is_scaled_back_at_the_next_tick():
    """Issue 50: ``serve deploy`` of a model application with changed args brings it back at
    Ray's initial_replicas while the loop's target stands; no decision differs from that
    target, so before, the model ran below its target (and its SLO's min_replicas) until a
    plan moved it. The next tick tells Serve the target again; a model not redeployed is left."""
    pinned = config().model_copy(
        update={
            "models": [config().models[0].model_copy(update={"min_replicas": 3, "max_replicas": 3}), config().models[1]]
        }
    )
    cluster = Redeploying()
    loop = AutoscalerLoop(pinned, cluster, clock=lambda: cluster.t)
    loop.step()  # into a's bounds: 3
    cluster.t += loop.tick_s
    loop.step()
    assert cluster.running["a"] == 3 and loop.targets["a"] == 3
    cluster.redeploy("a")
    cluster.t += loop.tick_s
    n = len(cluster.scaled)
    loop.step()
    assert ("a", 3) in [(name, r) for _, name, r in cluster.scaled[n:]] and cluster.running["a"] == 3
    assert all(name != "b" or r == loop.targets["b"] for _, name, r in cluster.scaled[n:])
    n = len(cluster.scaled)
    cluster.t += loop.tick_s
    loop.step()  # nothing redeployed since: no scale call for it
    assert [s for s in cluster.scaled[n:] if s[1] == "a"] == []
