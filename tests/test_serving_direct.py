"""The direct data path (the default, ``data_path: direct``) on a real local Ray cluster:
the model replicas are the HTTP ingress, the queue is kept in Ray Serve's proxy by
``ProxyQueueRouter``, and the meter gathers what the router and the replicas report. The
opt-in router front's own behaviour (its JSON tail-drop, its retry when a replica dies) is
tested here too, on one model of the same cluster; tests/test_serving_live.py covers the
default path as a whole.

One Ray cluster serves the module; all traffic goes to loopback, bounded in count and time.
"""

import asyncio
import threading
import time

import httpx
import pytest
import ray
from live_helpers import check_drop_share, check_flood, fire, local_serve, wait_for
from ray import serve
from ray.util.state import list_actors

from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.serving.app import deploy

pytestmark = pytest.mark.slow

CAPACITY = 2.0  # CPUs; 0.25 per replica -> 8 replicas
SLOS = [
    (
        ModelSLO(name="dir-a", slo_ms=720, processing_ms=154, cpus=0.25, max_replicas=4),
        {"model": {"kind": "synthetic"}, "initial_replicas": 3, "data_path": "direct"},
    ),
    (
        ModelSLO(name="dir-b", slo_ms=200, processing_ms=20, cpus=0.25, max_replicas=2),
        {
            "model": {"kind": "synthetic", "processing": "const:0.02"},
            "max_body_kb": 64,
            "queue_limit": 20,
            "data_path": "direct",
        },
    ),
    (
        ModelSLO(name="frt", slo_ms=200, processing_ms=20, cpus=0.25, max_replicas=2),
        {
            "model": {"kind": "synthetic", "processing": "const:0.02"},
            "queue_limit": 20,
            "initial_replicas": 2,
            "data_path": "front",
        },
    ),
    # slow request bodies (issue 50): a deadline of 3 s, a queue that holds 100 slow clients
    (
        ModelSLO(name="dir-slow", slo_ms=500, processing_ms=100, cpus=0.25, max_replicas=2),
        {
            "model": {"kind": "synthetic", "processing": "const:0.1"},
            "initial_replicas": 2,
            "queue_limit": 200,
            "body_timeout_s": 3.0,
            "data_path": "direct",
        },
    ),
]


@pytest.fixture(scope="module")
def live():
    dashboard, base = local_serve()
    cluster = ClusterSpec(
        cpus=CAPACITY,
        objective="fair_sum",
        long_term_interval_s=600,
        window_s=120,
        cold_start_s=10,
        reactive_interval_s=2,
        reactive_trigger_s=6,
    )
    # the autoscaler watches and reports only, so the replica counts stay as deployed
    deploy(SLOS, cluster, dashboard_url=dashboard, enabled=False, forecaster="fallback")
    client = httpx.Client(base_url=base, timeout=60)
    yield {"base": base, "client": client, "dashboard": dashboard}
    client.close()
    serve.shutdown()
    ray.shutdown()


def meter(model: str) -> dict:
    return serve.get_deployment_handle("Meter", app_name=model).metrics.remote(reset_mean=False).result(timeout_s=30)


def running(model: str) -> int:
    return serve.status().applications[model].deployments["Model"].replica_states.get("RUNNING", 0)


def test_direct_models_answer_and_refuse_bad_bodies(live):
    c = live["client"]
    assert c.post("/dir-a/predict", content=b"").status_code == 200
    r = c.post("/dir-b/predict", json={"image": "not base64!"})
    assert r.status_code == 400 and r.json()["reason"] == "bad_request"
    r = c.post("/dir-b/predict", content=b"x" * (70 * 1024))
    assert r.status_code == 413 and r.json()["reason"] == "too_large"
    assert c.post("/nope/predict", content=b"x").status_code == 404
    assert {"/predict", "/metrics"} <= set(c.get("/dir-a/openapi.json").json()["paths"])
    # the meter's figures, as a front's /metrics gives them (replicas report once a second)
    m = wait_for(
        lambda: (lambda m: m if m["dropped"].get("too_large") else None)(c.get("/dir-b/metrics").json()), 10, every=0.5
    )
    assert m and m["model"] == "dir-b" and m["dropped"] == {"bad_request": 1, "too_large": 1}, m
    assert c.post("/dir-b/predict", content=b"x").status_code == 200  # still serving


def test_the_meter_counts_what_the_router_and_replicas_report(live):
    time.sleep(2.5)  # earlier requests reported (once a second)
    before = meter("dir-b")
    res = fire(live["base"], "/dir-b/predict", 60, 4)
    assert [r[0] for r in res] == [200] * 60

    def reported(m):  # the router and the replica report on their own clocks
        return (
            m["arrivals_total"] - before["arrivals_total"] >= 60
            and m["completed_total"] - before["completed_total"] >= 60
            and m["processing"]["n"] >= 60
        )

    after = wait_for(lambda: (lambda m: m if reported(m) else None)(meter("dir-b")), 15)
    assert after, meter("dir-b")
    assert after["arrivals_total"] - before["arrivals_total"] == 60
    assert after["completed_total"] - before["completed_total"] == 60
    assert after["processing"]["n"] >= 60 and 15 <= after["processing"]["p50_ms"] <= 60
    # end-to-end latency is measured in the proxy: at least the processing time
    assert after["latency_p50_ms"] >= after["processing"]["p50_ms"]
    assert after["dispatch_capacity"] == 1 and after["waiting"] == 0
    # the autoscaler reads the meter as it reads a front
    st = wait_for(
        lambda: (lambda s: s if (s["models"].get("dir-b") or {}).get("latency_ms") else None)(
            live["client"].get("/faro/status").json()
        ),
        30,
    )
    assert st and st["models"]["dir-b"]["processing_ms"] >= 15


def test_direct_drop_rate_half_gives_half_503s(live):
    front = serve.get_deployment_handle("Meter", app_name="dir-b")
    front.control.remote(drop_rate=0.5).result(timeout_s=30)
    time.sleep(2.5)  # the replicas learn it with their next report
    dropped = check_drop_share(fire(live["base"], "/dir-b/predict", 400, 8), 400)
    front.control.remote(drop_rate=0.0).result(timeout_s=30)
    time.sleep(2.5)
    assert meter("dir-b")["dropped"]["drop_rate"] == dropped


def test_a_flood_gets_503s_and_every_request_an_answer(live, report, chaos):
    """The flood of issue 19: 1,500 requests, 300 at a time, at a model with 3 replicas of
    the paper's ResNet34 time (mean 154 ms) and a queue limit of 50. Nothing is lost:
    sent = 200s + 503s, the refusals are Ray's tail-drop, and they come at once. Every 200
    comes without a hang: the queue's wait is (50 + 2 x 3) / 3 x 154 ms = 2.9 s plus its
    processing; on fresh clones the slowest 200 took 4.4 to 5.07 s (issue 19's target was
    5 s), so the figure is reported and the test asserts behaviour (check_flood)."""
    res = fire(live["base"], "/dir-a/predict", 1500, 300)
    f = check_flood(res, 1500, "ray")
    report(
        f"flood 1500 x 300 at 3 replicas: {f['200']} x 200 (max {f['max_200_s']:.1f} s), "
        f"{f['503']} x 503 (median {f['median_503_s']:.2f} s, p90 {f['p90_503_s']:.2f} s)"
    )
    chaos(
        "a flood: 1,500 requests 300 at a time at 3 replicas and a queue of 50",
        1500,
        f["200"] + f["503"],
        0,
        0,
        None,
        f"{f['200']} x 200 (slowest {f['max_200_s']:.1f} s), "
        f"{f['503']} x 503 from Ray's tail-drop (median {f['median_503_s']:.2f} s)",
    )


def test_the_front_tail_drops_with_its_own_json(live, report):
    # 2 replicas of 20 ms, queue limit 20: an admitted request waits about 0.2 s. The opt-in
    # front answers its refusals after a second hop: 300 at once get them at a median of
    # 0.85 s on this 2-core machine, 1.25-1.68 s on busier CI machines (the default path's:
    # 0.2-0.5 s); check_flood asserts that nothing hangs and the figures are reported
    f = check_flood(fire(live["base"], "/frt/predict", 300, 300), 300, "queue_full")
    report(
        f"front flood 300 x 300 at 2 replicas: {f['200']} x 200 (max {f['max_200_s']:.1f} s), "
        f"{f['503']} x 503 (median {f['median_503_s']:.2f} s, p90 {f['p90_503_s']:.2f} s)"
    )


def test_the_proxy_queue_sends_each_request_to_a_free_replica(live):
    """As many requests at once as dir-a has replicas, five rounds: none waits on its
    replica behind another (the replica reports that wait, which would be a whole
    processing time, over 80 ms for this distribution)."""
    n = running("dir-a")
    assert n == 3

    async def round_():
        async with httpx.AsyncClient(base_url=live["base"], timeout=60) as c:

            async def one():
                return (await c.post("/dir-a/predict", content=b"")).json()["waited_ms"]

            return await asyncio.gather(*(one() for _ in range(n)))

    waits = [w for _ in range(5) for w in asyncio.run(round_())]
    assert len(waits) == 5 * n and max(waits) < 20, waits


def test_the_front_retries_a_request_whose_replica_died(live):
    """What the opt-in front wins: a replica killed under load costs no 500, the front
    sends its requests again (docs/serving.md, which path to pick)."""
    results = []
    load = threading.Thread(
        target=lambda: results.extend(fire(live["base"], "/frt/predict", 150, 40, 10.0)), daemon=True
    )
    load.start()
    time.sleep(4)
    victim = next(
        a
        for a in list_actors(address=live["dashboard"], filters=[("state", "=", "ALIVE")])
        if a.class_name == "ServeReplica:frt:Model"
    )
    ray.kill(ray.get_actor(victim.name, namespace="serve"), no_restart=True)
    load.join(timeout=180)
    codes = [r[0] for r in results]
    assert len(results) == 150 and set(codes) <= {200, 503}, sorted(set(map(str, codes)))
    assert codes.count(200) >= 140
    assert wait_for(lambda: running("frt") == 2, 60)
    assert live["client"].post("/frt/predict", content=b"").status_code == 200


async def _slow_clients(port: int, n: int, hold_s: float) -> list[str]:
    """``n`` clients that send their headers and 10 bytes of a 100 KB body, then wait: each
    one's status line, or what became of it within ``hold_s``."""

    async def one():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(
                b"POST /dir-slow/predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                b"100000\r\nContent-Type: application/octet-stream\r\n\r\n" + b"x" * 10
            )
            await w.drain()
            line = await asyncio.wait_for(r.readline(), hold_s)
            w.close()
            return line.decode().strip()
        except asyncio.TimeoutError:
            return "no answer"
        except OSError as err:
            return type(err).__name__

    return await asyncio.gather(*(one() for _ in range(n)))


def test_slow_clients_do_not_stall_a_model(live, report, chaos):
    """Issue 50: 100 clients that send a few bytes of their body and wait, against a model of
    two replicas (before: two such clients held every slot, normal requests timed out). The
    normal requests sent meanwhile are all answered within the SLO plus the body deadline;
    the slow ones get 408 (body_timeout) or 503 (uploads: the replica already receives a
    slow body), none is left unanswered."""
    port = int(live["base"].rsplit(":", 1)[1])
    slow = {}
    t = threading.Thread(target=lambda: slow.update(r=asyncio.run(_slow_clients(port, 100, 60.0))), daemon=True)
    t.start()
    time.sleep(0.5)
    normal = fire(live["base"], "/dir-slow/predict", 60, 60, 4.0)
    t.join(timeout=90)
    codes = [r[0] for r in normal]
    lat = sorted(r[1] for r in normal)
    assert codes == [200] * 60, sorted(set(map(str, codes)))
    assert lat[-1] <= 0.5 + 3.0, lat[-5:]  # p99 of 60: the slowest
    lines = slow["r"]
    kinds = {k: sum(k in line for line in lines) for k in ("408", "503", "200")}
    assert kinds["408"] >= 1 and kinds["408"] + kinds["503"] == 100, lines[:5]
    report(
        f"slow bodies: 100 slow clients -> {kinds['408']} x 408, {kinds['503']} x 503; "
        f"60 normal requests all 200, slowest {lat[-1]:.2f} s (bound 3.5 s)"
    )
    chaos(
        "100 slow bodies (headers and 10 bytes, then silence) at 2 replicas",
        160,
        60 + kinds["408"] + kinds["503"],
        0,
        100 - kinds["408"] - kinds["503"],
        None,
        f"the slow ones {kinds['408']} x 408 body_timeout, {kinds['503']} x 503 uploads; 60 "
        f"normal requests meanwhile all 200, slowest {lat[-1]:.2f} s",
    )
