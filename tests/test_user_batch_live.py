"""A user's ``@serve.batch`` deployment under Faro on a real local Ray cluster (issue 47).

The deployment (``tests/user_apps/batcher.py``) is Ray Serve's documented batching code and
knows nothing of faro-serve: ``__call__`` awaits ``self.infer(body)``, ``infer`` is
``@serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)`` and gets the list. Before
issue 47 every request to it under Faro failed (500: Ray's wrapper handed ``infer`` the list
of the replica objects). Here it is deployed through ``faro_serve.scaled``/``faro_serve.run``
on a Ray started with declared GPUs (its SLO reserves half a GPU per replica), and the
autoscaler runs a user's policy that sets the batch size (a decision reaches Ray's
``set_max_batch_size`` through the meter) and a drop rate. One Ray cluster for the module;
traffic to loopback only, bounded in count and time."""

import asyncio
import os
from pathlib import Path

import httpx
import pytest
import ray
from live_helpers import fire, free_port, wait_for
from ray import serve
from user_apps.batcher import Batcher

import faro_serve
from faro_serve import SLO, Cluster
from faro_serve.serving.names import meter_name

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent

BATCHER = SLO(name="batcher", slo_ms=2000, cpus=0.25, gpus=0.5, max_replicas=1)
DROPPER = SLO(name="dropper", slo_ms=2000, cpus=0.25, gpus=0.5, max_replicas=1)
CLUSTER = Cluster(cpus=1.0, long_term_interval_s=600, reactive_interval_s=1, cold_start_s=5)


@pytest.fixture(scope="module")
def live():
    http, dash = free_port(), free_port()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(TESTS.parent), old) if p)
    try:  # the raylet and every worker inherit it: the user's package is installed
        # the dashboard serves the REST API the autoscaler scales through, as a user's Ray does
        ray.init(
            address="local",
            num_cpus=2,
            num_gpus=2,
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dash,
            log_to_driver=False,
        )
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
    serve.start(http_options={"host": "127.0.0.1", "port": http})
    apps = {
        "batcher": faro_serve.scaled(Batcher, BATCHER).bind(base_s=0.1),
        "dropper": faro_serve.scaled(Batcher.options(name="Dropper"), DROPPER, queue_limit=20).bind(base_s=0.1),
    }
    faro_serve.run(
        apps,
        [BATCHER, DROPPER],
        CLUSTER,
        forecaster="fallback",
        policy="user_plugins.my_policies:BatchesAndDrops",
        dashboard_url=f"http://127.0.0.1:{dash}",
    )
    base = f"http://127.0.0.1:{http}"
    yield {"base": base}
    serve.shutdown()
    ray.shutdown()


def meter(app: str, deployment: str) -> dict:
    h = serve.get_deployment_handle(meter_name(deployment), app_name=app)
    return h.metrics.remote(reset_mean=False).result(timeout_s=30)


def answers(base: str, path: str, n: int, concurrency: int) -> list:
    async def go():
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            sem = asyncio.Semaphore(concurrency)

            async def one(i):
                async with sem:
                    r = await c.post(path, content=b"x" * (1 + i % 5))
                    return r.status_code, (r.json() if r.status_code == 200 else r.text)

            return await asyncio.gather(*(one(i) for i in range(n)))

    return asyncio.run(go())


def test_every_request_is_answered_in_batches_of_the_size_the_autoscaler_set(live):
    """32 clients at once: every request answered 200 with the user's own answer; batches
    larger than 1 form through Faro's router and gate, and none larger than the 4 the
    policy set (the decorator's 16 would allow 16): the decision reached Ray's queue."""
    assert wait_for(lambda: meter("batcher", "Batcher").get("batch_size") == 4, 60), meter("batcher", "Batcher")
    res = answers(live["base"], "/batcher", 200, 32)
    assert [s for s, _ in res] == [200] * 200, {s for s, _ in res}
    sizes = [a["batch"] for _, a in res]
    assert all(a["bytes"] == 1 + i % 5 for i, (_, a) in enumerate(res))  # each its own answer
    assert max(sizes) == 4 and sum(s > 1 for s in sizes) > 150, sorted(set(sizes))
    m = wait_for(lambda: (lambda x: x if x.get("batch_times") else None)(meter("batcher", "Batcher")), 10)
    assert m["mean_batch"] > 2 and {int(r[0]) for r in m["batch_times"]} <= {1, 2, 3, 4}


def test_the_status_shows_the_batch_in_force_and_the_batches_served(live, cli):
    """``/faro/status`` and ``faro-serve status``, as an operator reads them."""

    def seen():
        r = httpx.get(live["base"] + "/faro/status", timeout=10).json()["models"].get("batcher", {})
        return r if r.get("batch_size") == 4 and (r.get("mean_batch") or 0) > 1 else None

    assert wait_for(seen, 30), httpx.get(live["base"] + "/faro/status").json()["models"]
    code, out, _ = cli("status", "--url", live["base"])
    assert code == 0 and "batcher: batch 4 in force" in out


def test_the_batched_method_over_a_handle_is_a_request_of_its_own(live):
    """A handle call of the @serve.batch method itself (``handle.infer.remote(x)``): the
    guard's drop rate and slots apply, and the calls batch together."""
    h = serve.get_app_handle("batcher")
    outs = [r.result(timeout_s=60) for r in [h.infer.remote(b"abc") for _ in range(12)]]
    assert all(o["bytes"] == 3 for o in outs) and max(o["batch"] for o in outs) > 1


def test_drops_and_the_queue_bound_still_hold(live):
    """The policy drops half of ``dropper``'s requests: 503 with the reason; a flood past
    its queue of 20 gets Ray's 503 too; every request is answered, 200 or 503."""
    assert wait_for(lambda: meter("dropper", "Dropper").get("drop_rate") == 0.5, 60)
    res = fire(live["base"], "/dropper", 300, 150)
    codes = [r[0] for r in res]
    assert len(res) == 300 and set(codes) <= {200, 503}, sorted(set(map(str, codes)))
    reasons = {r[2] for r in res if r[0] == 503}
    assert "drop_rate" in reasons and codes.count(200) > 0
