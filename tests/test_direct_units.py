"""The direct data path's parts without Ray running: the proxy queue's router (the real
class, driven as Ray's router drives it), the meter's merge of reports, and late arrivals
in the router statistics."""

import asyncio
import time
from types import SimpleNamespace

import pytest
from ray.serve.request_router import PendingRequest

from faro_serve.serving.direct import Meter
from faro_serve.serving.messages import (
    Answered,
    Arrival,
    Dropped,
    GaveUp,
    MeterAnswer,
    NetworkTime,
    Processed,
    ReplicaReport,
    RouterReport,
    decode,
)
from faro_serve.serving.proxy_queue import ProxyQueueRouter
from faro_serve.serving.stats import MeterStats


def _router():
    router = ProxyQueueRouter(
        deployment_id=SimpleNamespace(app_name="m", name="Model"), handle_source=SimpleNamespace(value="test")
    )
    router.initialize_state()
    router._start_reporting = lambda: None  # no meter here: report() is read directly
    return router, [SimpleNamespace(replica_id=k, max_ongoing_requests=2) for k in "ab"]


def _request(k, created_at=100.0):
    return PendingRequest(args=[], kwargs={}, metadata=SimpleNamespace(internal_request_id=k), created_at=created_at)


def test_proxy_queue_sends_the_next_request_to_the_replica_that_frees_first():
    async def run():
        router, reps = _router()
        first = [(await router.choose_replicas(reps, _request(k)))[0][0].replica_id for k in ("r0", "r1")]
        assert sorted(first) == ["a", "b"]  # idle replicas first
        # both busy: the next one waits on the replica whose request started first, the
        # one after on the other; one request runs on each and one waits behind it
        second = [(await router.choose_replicas(reps, _request(k)))[0][0].replica_id for k in ("r2", "r3")]
        assert second == first
        assert router.in_flight() == {"a": 2, "b": 2}
        waiting = asyncio.create_task(router.choose_replicas(reps, _request("r4")))
        await asyncio.sleep(0.02)
        assert not waiting.done()  # every replica full: the call waits, it does not spin
        router.on_request_completed(first[1], "r1")
        assert await asyncio.wait_for(waiting, 1) == []  # woken: Ray asks again at once
        again = await router.choose_replicas(reps, _request("r4"))
        assert again[0][0].replica_id == first[1]
        rep = router.report()
        # five arrivals (r4 counted once though chosen twice), one answer
        assert [type(e) for e in rep.events] == [Arrival] * 5 + [Answered]
        assert rep.dispatched == 2 and rep.waiting == 2  # two at work, two behind them
        assert router.report().events == ()

    asyncio.run(run())


def test_proxy_queue_times_out_to_see_new_replicas_and_counts_waiting():
    async def run():
        router, reps = _router()
        for k in ("r0", "r1"):
            assert (await router.choose_replicas(reps[:1], _request(k)))[0][0].replica_id == "a"
        t0 = asyncio.get_running_loop().time()
        assert await router.choose_replicas(reps[:1], _request("r2")) == []
        assert asyncio.get_running_loop().time() - t0 >= 0.09  # waited, then asked afresh
        assert router.report().waiting == 2  # r1 behind r0 on a, r2 in the proxy
        # replica b arrives: r2 goes there
        assert (await router.choose_replicas(reps, _request("r2")))[0][0].replica_id == "b"

    asyncio.run(run())


def test_proxy_queue_forgets_requests_ray_gave_up_on():
    async def run():
        router, reps = _router()
        for k in ("r0", "r1"):
            await router.choose_replicas(reps[:1], _request(k))  # both on a
        assert await router.choose_replicas(reps[:1], _request("r2")) == []  # queued
        assert router.report().waiting == 2
        router.prune(stale_s=60)
        assert router.report().waiting == 2  # asked about recently: still queued
        await asyncio.sleep(0.05)
        router.prune(stale_s=0.01)  # r2's client went away: Ray stops asking about it
        rep = router.report()
        assert rep.waiting == 1 and rep.dispatched == 1  # r0, r1 on a, kept
        assert [type(e) for e in rep.events] == [GaveUp]  # the meter uncounts r2
        router.update_replicas([reps[1]])  # a died with r0 and r1 on it
        assert router.report().dispatched == 0 and router._sent_at == {}
        # a request cancelled between the choice and the send gets no completion report
        r3 = _request("r3")
        assert (await router.choose_replicas(reps[1:], r3))[0][0].replica_id == "b"
        r3.future.cancel()
        assert router.in_flight() == {"b": 1}
        await router.choose_replicas(reps[1:], _request("r4"))
        assert router.in_flight() == {"b": 1}  # r3 uncounted: b holds r4 alone

    asyncio.run(run())


def test_proxy_queue_latency_is_from_rays_arrival_time():
    async def run():
        router, reps = _router()
        created = time.time() - 0.5
        chosen = (await router.choose_replicas(reps, _request("r0", created)))[0][0]
        router.on_request_completed(chosen.replica_id, "r0")
        ev = router.report().events
        assert ev[0] == Arrival(created) and isinstance(ev[1], Answered)
        assert ev[1].latency_s == pytest.approx(0.5, abs=0.1)

    asyncio.run(run())


def test_router_stats_put_a_late_arrival_in_its_own_minute_and_second():
    st = MeterStats(start=0.0)
    for t in (10.0, 50.0, 70.0):
        st.arrival(t)
    st.arrival(75.0, at=55.0)  # reported 20 s late: minute 0, already closed
    st.arrival(75.0, at=74.0)
    assert list(st.minutes) == [3] and st._minute_count == 2
    assert st.per_second(76.0, 3) == [0, 1, 0] and st.arrival_rate(76.0, 10) == pytest.approx(0.2)
    st.processed(75.0, 0.1)
    assert st.processing(76.0)["n"] == 1


def test_meter_merges_router_and_replica_reports():
    m = Meter.func_or_class("m")
    now = time.time()
    m.ingest(
        "router-1",
        RouterReport(
            (Answered(now - 0.1, 0.3), Arrival(now - 0.4), Arrival(now - 0.2)), waiting=1, dispatched=1, replicas=2
        ).wire(),
    )
    ans = m.ingest("replica-x", ReplicaReport((Processed(now - 0.1, 0.15), Dropped(now, "drop_rate"))).wire())
    assert decode(ans, MeterAnswer) == MeterAnswer(drop_rate=0.0, batch_in_force=1)
    m.control(drop_rate=0.25)
    assert decode(m.ingest("replica-x", ReplicaReport(()).wire())).drop_rate == 0.25
    snap = m.metrics(reset_mean=False)
    assert snap["arrivals_total"] == 2 and snap["completed_total"] == 1
    assert snap["dropped"] == {"drop_rate": 1} and snap["latency_ms"] == pytest.approx(300)
    assert snap["processing"]["mean_ms"] == pytest.approx(150)
    assert (snap["waiting"], snap["dispatched"], snap["dispatch_capacity"]) == (1, 1, 2)
    assert snap["in_flight"] == 1  # two arrived, one answered
    m.ingest("router-1", RouterReport((GaveUp(time.time()),), 0, 0, 2).wire())  # the other one's client left
    assert m.metrics(reset_mean=False)["in_flight"] == 0


def test_a_batching_replica_takes_two_batches_of_the_size_in_force():
    """The proxy's router follows the batch size the meter answers: a replica holds up to
    two batches (the one served and the next), never more than its max_ongoing_requests."""

    async def run():
        router, _ = _router()
        reps = [SimpleNamespace(replica_id="a", max_ongoing_requests=16)]
        for k in range(2):  # batch 1 in force: two requests, as an unbatched replica
            assert (await router.choose_replicas(reps, _request(f"r{k}")))[0][0].replica_id == "a"
        assert router.pick(reps) is None
        router._batch = 4
        for k in range(2, 8):
            assert (await router.choose_replicas(reps, _request(f"r{k}")))[0][0].replica_id == "a"
        assert router.pick(reps) is None and router.in_flight() == {"a": 8}
        router._batch = 64  # capped by the replica's own limit
        for k in range(8, 16):
            await router.choose_replicas(reps, _request(f"r{k}"))
        assert router.pick(reps) is None and router.in_flight() == {"a": 16}
        waiting = asyncio.create_task(router.choose_replicas(reps, _request("late", created_at=time.time() - 2)))
        await asyncio.sleep(0.02)
        router._batch_model = True
        since = router.report().waiting_since  # Sponge's budgets: when each queued one came
        # the one waiting here, and the 16 - 64 (the batch in force: all it holds) on the replica
        assert len(since) == 1 and time.time() - since[0] == pytest.approx(2, abs=0.5)
        router._batch = 4  # then the replica serves 4 and holds 12 behind them
        since = router.report().waiting_since
        assert len(since) == 13 and time.time() - since[-1] == pytest.approx(2, abs=0.5)
        waiting.cancel()

    asyncio.run(run())


def test_the_meter_passes_batching_both_ways():
    """Replicas report the batch and threads in force; the router its waiting requests'
    arrivals; the autoscaler's setting goes back to both in the answers."""
    m = Meter.func_or_class("m")
    now = time.time()
    m.ingest(
        "router-1",
        RouterReport(
            (Arrival(now - 0.5), Arrival(now - 0.3)),
            waiting=2,
            dispatched=0,
            replicas=1,
            waiting_since=(now - 0.5, now - 0.3),
        ).wire(),
    )
    ans = decode(
        m.ingest(
            "replica-x",
            ReplicaReport(
                (Processed(now, 0.3, 4), Processed(now, 0.3, 4), Processed(now, 0.1, 1)), batch_size=4, threads=1
            ).wire(),
        )
    )
    assert ans.batch_size is None and ans.batch_in_force == 4  # the user_config's batch
    snap = m.metrics(reset_mean=False)
    assert (snap["batch_size"], snap["threads"]) == (4, 1)
    assert snap["mean_batch"] == pytest.approx(3.0)  # request-weighted: (4 + 4 + 1) / 3
    assert snap["queued_ages_s"] == pytest.approx([0.3, 0.5], abs=0.2) and snap["network_ms"] == 0
    # clients that declare their network time (x-faro-network-ms): a queued request is taken
    # to have spent the median of the last 3 s's before it came (its budget starts lower)
    m.ingest("replica-x", ReplicaReport((NetworkTime(now, 0.2), NetworkTime(now, 0.4), NetworkTime(now, 0.9))).wire())
    snap = m.metrics(reset_mean=False)
    assert snap["network_ms"] == pytest.approx(400) and snap["queued_ages_s"] == pytest.approx([0.7, 0.9], abs=0.2)
    m.control(batch_size=8, threads=2)
    ans = decode(m.ingest("router-1", RouterReport((), waiting=0, dispatched=0, replicas=1).wire()))
    assert (ans.batch_size, ans.threads, ans.batch_in_force) == (8, 2, 8)


def test_the_synthetic_model_serves_a_batch_in_one_pass():
    """A batch of b sleeps one drawn time x (share b + 1 - share), as the simulator serves it;
    a batch share outside (0, 1] is refused."""
    from deployments.synthetic import SyntheticModel

    m = SyntheticModel(processing="const:0.05", batch_share=0.5)
    t0 = time.perf_counter()
    answers = asyncio.run(m.predict_batch([b"x"] * 6))
    took = time.perf_counter() - t0
    assert [a["batch"] for a in answers] == [6] * 6
    assert 0.175 <= took < 0.175 + 0.5 and answers[0]["processing_ms"] >= 175
    with pytest.raises(ValueError, match="batch_share"):
        SyntheticModel(batch_share=0)


def test_a_variant_switch_loads_beside_the_variant_in_force():
    """INFaaS's switch in a replica: the variant in force answers while the next one loads
    (here 0.3 s), then requests go to the new one; switching back is immediate."""
    from faro_serve.serving.variant_model import VariantModel

    class Slow:  # a variant that takes 0.3 s to load
        def __init__(self, tag):
            time.sleep(0.3)
            self.tag = tag

        def predict(self, payload):
            return {"tag": self.tag}

    class Fast(Slow):
        def __init__(self, tag):
            self.tag = tag

    vm = VariantModel({"a": (Fast, {"tag": "A"}), "b": (Slow, {"tag": "B"})}, "a")
    assert asyncio.run(vm.predict(b"")) == {"tag": "A", "variant": "a"}
    vm.switch("b")
    assert asyncio.run(vm.predict(b""))["variant"] == "a"  # b still loading: a answers
    deadline = time.time() + 5
    while vm.current != "b" and time.time() < deadline:
        time.sleep(0.05)
    assert asyncio.run(vm.predict(b"")) == {"tag": "B", "variant": "b"}
    vm.switch("a")
    assert vm.current == "a"  # loaded before: at once
    with pytest.raises(ValueError, match="unknown variant 'c'"):
        vm.switch("c")
    with pytest.raises(ValueError, match="does not serve batches"):
        asyncio.run(vm.predict_batch([b""]))


@pytest.mark.parametrize(
    "args, message",
    [
        ({"variants": {"b": {"kind": "synthetic"}}}, "variants need initial_variant"),
        ({"initial_variant": "a"}, "initial_variant needs variants"),
        ({"initial_variant": "b", "variants": {"b": {"kind": "synthetic"}}}, "list only the other variants"),
        (
            {"initial_variant": "a", "variants": {"b": {"kind": "synthetic"}}, "data_path": "front"},
            "variants need data_path: direct",
        ),
        ({"max_batch_size": 4, "data_path": "front"}, "max_batch_size > 1 needs data_path: direct"),
        ({"max_batch_size": 65}, "max_batch_size"),
    ],
)
def test_batching_and_variant_app_args_are_checked(args, message):
    from faro_serve.config import ConfigError
    from faro_serve.serving.schema import parse_model_args

    with pytest.raises(ConfigError, match=message):
        parse_model_args({"name": "t", "model": {"kind": "synthetic"}, **args})
    ok = parse_model_args(
        {
            "name": "t",
            "model": {"kind": "synthetic"},
            "initial_variant": "a",
            "variants": {"b": {"kind": "vision", "arch": "resnet50"}},
            "max_batch_size": 8,
        }
    )
    assert ok.variants["b"].arch == "resnet50" and ok.max_batch_size == 8


def test_proxy_queue_with_another_proxy_counts_a_refusal_once_and_looks_elsewhere():
    """Two proxies: the other proxy's router filled replica a. Ray's strict bound makes a
    refuse; Ray reports its queue length, cancels the attempt (a completion callback) and
    asks again. The request is one arrival and one answer, and the retry goes to b."""

    async def run():
        router, reps = _router()
        router._replicas = {r.replica_id: r for r in reps}  # what update_replicas keeps
        pr = _request("r0")
        first = (await router.choose_replicas(reps[:1], pr))[0][0]  # only a offered: a
        assert first.replica_id == "a"
        router.on_new_queue_len_info("a", 2)  # a holds the other proxy's two: refused
        router.on_request_completed("a", "r0")  # the cancelled attempt
        assert router.in_flight() == {} and router.report().events == (Arrival(100.0),)
        again = (await router.choose_replicas(reps, pr))[0][0]
        assert again.replica_id == "b"  # a counts as full for about a service time
        router.on_new_queue_len_info("b", 1)  # accepted: b holds ours alone
        router.on_request_routed(pr, "b", None)
        assert router._loads(reps) == {"a": 2, "b": 1}
        router.on_request_completed("b", "r0")
        assert [type(e) for e in router.report().events] == [Answered]  # one answer
        await asyncio.sleep(router._service_s + 0.01)
        assert router._loads(reps) == {"a": 0, "b": 0}  # the other proxy's are done by now

    asyncio.run(run())


def test_a_draining_meter_tells_its_replicas_and_knows_when_they_are_done():
    """Issue 50, the drain: the meter's answers say ``draining`` from the moment it is told;
    a replica counts as told once a report sent after that says it refuses new requests, and
    the model is drained when every replica is told, none is busy and nothing is queued."""
    from faro_serve.serving.draining import is_drained

    m = Meter.func_or_class("m")
    m.ingest("router-1", RouterReport((), waiting=0, dispatched=2, replicas=2).wire())
    for r in ("replica-x", "replica-y"):
        ans = decode(m.ingest(r, ReplicaReport((), draining=False, busy=1).wire()), MeterAnswer)
        assert ans.draining is False
    st = m.drain()
    assert st == {"model": "m", "draining": True, "replicas": 2, "told": 0, "busy": 2, "queued": 2}
    assert decode(m.ingest("replica-x", ReplicaReport((), draining=False, busy=1).wire())).draining
    assert m.drain_state()["told"] == 0  # it had not heard yet
    m.ingest("replica-x", ReplicaReport((Dropped(time.time(), "shutting_down"),), draining=True, busy=0).wire())
    m.ingest("replica-y", ReplicaReport((), draining=True, busy=1).wire())
    st = m.drain_state()
    assert (st["told"], st["busy"]) == (2, 1) and not is_drained(st)
    m.ingest("replica-y", ReplicaReport((), draining=True, busy=0).wire())
    assert not is_drained(m.drain_state())  # the proxy's router still holds two
    m.ingest("router-1", RouterReport((), waiting=0, dispatched=0, replicas=2).wire())
    assert is_drained(m.drain_state()) and m.drain() == m.drain_state()  # idempotent
    assert m.metrics(reset_mean=False)["dropped"] == {"shutting_down": 1}


def test_a_replica_refuses_new_requests_once_draining_and_counts_the_admitted_ones():
    from faro_serve.serving.replica_report import ReplicaReporter

    rep = ReplicaReporter(None, "m", lambda ans: None)
    assert rep.admit() and rep.admit() and rep.busy == 2
    rep.draining = True
    assert not rep.admit() and rep.busy == 2
    rep.release()
    rep.release()
    assert rep.busy == 0


def test_the_drain_finds_every_meter_and_nothing_else_by_name():
    from faro_serve.serving.names import MODEL, is_meter, meter_name

    assert is_meter(meter_name(MODEL)) and is_meter(meter_name("TextClassifier"))
    assert not is_meter(MODEL) and not is_meter("TextClassifier") and not is_meter("FaroAutoscaler")
