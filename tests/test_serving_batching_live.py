"""Batches and variants live on the direct path (issue 20), on a real local Ray cluster of
their own (beside test_serving_direct.py's models the extra replicas slowed the front's
flood on 2 cores): serve.batch with the batch size changed live through the meter, and a
task switching variant under load. All traffic to loopback, bounded in count and time."""

import asyncio
import time

import httpx
import pytest
import ray
from live_helpers import local_serve, wait_for
from ray import serve

from faro_serve.config import Batching, ClusterSpec, ModelSLO, Variant
from faro_serve.serving.app import deploy

pytestmark = pytest.mark.slow

SLOS = [
    # a batching replica (issue 20): a batch of b takes 0.2 s x (0.25 b + 0.75)
    (
        ModelSLO(
            name="dir-batch",
            slo_ms=2000,
            processing_ms=200,
            cpus=0.25,
            max_replicas=1,
            batching=Batching(gamma=0.05, eps=0.15, max_batch_size=8),
        ),
        {
            "model": {"kind": "synthetic", "processing": "const:0.2", "batch_share": 0.25},
            "max_batch_size": 8,
            "data_path": "direct",
        },
    ),
    # a task with two variants (INFaaS, issue 20): the route serves the one in force
    (
        ModelSLO(
            name="dir-task",
            slo_ms=400,
            processing_ms=20,
            cpus=0.25,
            max_replicas=1,
            variants=[
                Variant(name="fast", accuracy=70, processing_ms=20),
                Variant(name="slow", accuracy=75, processing_ms=80),
            ],
            min_accuracy=70,
        ),
        {
            "model": {"kind": "synthetic", "processing": "const:0.02"},
            "initial_variant": "fast",
            "variants": {"slow": {"kind": "synthetic", "processing": "const:0.08"}},
            "data_path": "direct",
        },
    ),
]


@pytest.fixture(scope="module")
def live():
    dashboard, base = local_serve()
    cluster = ClusterSpec(
        cpus=0.5,
        objective="fair_sum",
        long_term_interval_s=600,
        window_s=120,
        cold_start_s=10,
        reactive_interval_s=2,
        reactive_trigger_s=6,
    )
    # the autoscaler watches and reports only; the tests set batch sizes and variants themselves
    deploy(SLOS, cluster, dashboard_url=dashboard, enabled=False, forecaster="fallback")
    yield {"base": base, "dashboard": dashboard, "cluster": cluster}
    serve.shutdown()
    ray.shutdown()


def meter(model: str) -> dict:
    return serve.get_deployment_handle("Meter", app_name=model).metrics.remote(reset_mean=False).result(timeout_s=30)


def test_a_batching_replica_follows_a_live_batch_size_change(live):
    """serve.batch with the batch size set live (issue 20): the autoscaler's setting goes
    through the meter to the replica (reconfigure) and to the proxy's router (two batches
    per replica); 16 requests at once are served one by one at batch 1, in batches of up
    to 8 after the change, and one by one again after the change back. Every one answers."""
    front = serve.get_deployment_handle("Meter", app_name="dir-batch")

    async def burst(n):
        async with httpx.AsyncClient(base_url=live["base"], timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/dir-batch/predict", content=b"x") for _ in range(n)))
        assert [r.status_code for r in rs] == [200] * n
        return [r.json()["batch"] for r in rs]

    assert set(asyncio.run(burst(16))) == {1}  # batch 1 in force (no user_config, no setting)
    front.control.remote(batch_size=8).result(timeout_s=30)
    m = wait_for(lambda: (lambda m: m if m.get("batch_size") == 8 else None)(meter("dir-batch")), 15)
    assert m and "queued_ages_s" in m, meter("dir-batch")  # the replica took it; Sponge's view
    time.sleep(1.5)  # the proxy's router learns it with its next report
    batches = asyncio.run(burst(16))
    assert max(batches) > 2 and max(batches) <= 8, batches
    front.control.remote(batch_size=1).result(timeout_s=30)
    assert wait_for(lambda: meter("dir-batch").get("batch_size") == 1, 15)
    assert set(asyncio.run(burst(8))) == {1}


def test_a_task_switches_variant_live_and_answers_throughout(live):
    """INFaaS's variant switch live (issue 20): requests every 100 ms while the meter is told
    to serve the other variant; every request is answered, first by the variant deployed,
    then by the new one once its replica has loaded it."""
    front = serve.get_deployment_handle("Meter", app_name="dir-task")

    async def stream():
        out = []
        async with httpx.AsyncClient(base_url=live["base"], timeout=60) as c:

            async def one():
                r = await c.post("/dir-task/predict", content=b"x")
                out.append((time.time(), r.status_code, r.json().get("variant")))

            tasks = []
            for k in range(80):
                if k == 20:
                    await front.control.remote(variant="slow")
                tasks.append(asyncio.create_task(one()))
                await asyncio.sleep(0.1)  # 10 per second: 0.8 of the slow variant's one replica
            await asyncio.gather(*tasks)
        return sorted(out)

    res = asyncio.run(stream())
    assert [r[1] for r in res] == [200] * 80
    served = [r[2] for r in res]
    assert served[0] == "fast" and served[-1] == "slow", served
    switched = served.index("slow")
    assert set(served[switched:]) == {"slow"}  # no flapping back
    assert wait_for(lambda: meter("dir-task").get("variant") == "slow", 10)


def test_sponge_runs_live_on_budgets_net_of_the_clients_network_time(live):
    """Sponge end to end (issue 20), last in this module: the autoscaler redeployed to run
    Sponge on the batching model; requests at 10/s (twice what batch 1 serves) that declare
    0.8 s of network time in x-faro-network-ms, as the replay's --network-delay sends it.
    The meter learns the network time, Sponge sees queued budgets below SLO - 0.8 s and
    raises the batch; the replica serves batches of 3 and more although the requests come
    one by one (serve.batch alone formed batches of 1 here: serving/edf_gate.py); every
    request answers. A malformed header is a 400 naming it."""
    from faro_serve.serving.app import autoscaler_app
    from faro_serve.serving.names import AUTOSCALER_APP, NETWORK_HEADER

    slo = SLOS[0][0]
    config = {
        "cluster": live["cluster"].model_dump(),
        "models": [slo.model_dump()],
        "policy": "sponge",
        "dashboard_url": live["dashboard"],
        "enabled": True,
    }
    serve.run(autoscaler_app(config), name=AUTOSCALER_APP, route_prefix=f"/{AUTOSCALER_APP}", blocking=False)

    def decisions():
        r = httpx.get(f"{live['base']}/faro/decisions", params={"limit": 50}, timeout=10)
        return r.json() if r.status_code == 200 else []

    assert wait_for(lambda: any(d.get("policy") == "sponge" for d in decisions()), 30), decisions()

    async def stream():
        out, net = [], {NETWORK_HEADER: "800"}
        async with httpx.AsyncClient(base_url=live["base"], timeout=60) as c:
            bad = await c.post("/dir-batch/predict", content=b"x", headers={NETWORK_HEADER: "soon"})

            async def one():
                r = await c.post("/dir-batch/predict", content=b"x", headers=net)
                out.append((r.status_code, r.json().get("batch")))

            tasks = []
            for _ in range(120):
                tasks.append(asyncio.create_task(one()))
                await asyncio.sleep(0.1)
            m = await serve.get_deployment_handle("Meter", app_name="dir-batch").metrics.remote(
                reset_mean=False
            )  # while the clients' network time is fresh (3 s)
            await asyncio.gather(*tasks)
        return bad, out, m

    bad, out, m = asyncio.run(stream())
    assert bad.status_code == 400 and NETWORK_HEADER in bad.json()["error"], bad.text
    assert [s for s, _ in out] == [200] * 120
    assert m.get("network_ms") == pytest.approx(800, abs=1), m
    ours = [d for d in decisions() if d.get("policy") == "sponge"]
    info = [
        d["decision"]["info"]["dir-batch"] for d in ours if "dir-batch" in ((d.get("decision") or {}).get("info") or {})
    ]
    queued = [i for i in info if i.get("min_budget_s") is not None]
    assert queued and all(i["min_budget_s"] < 2.0 - 0.8 for i in queued), info
    assert max(i["batch"] for i in info) >= 2, info
    assert max(b for _, b in out) >= 3, sorted(b for _, b in out)
