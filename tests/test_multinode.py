"""faro-serve across two Ray nodes with a proxy on each, and losing one (paper section 5;
docs/multinode.md).

Two real Ray nodes on this machine (``ray start --head`` and ``ray start --address``, one CPU
each, free ports, a private temp dir so no other Ray on the machine is affected), Serve
started with ``proxy_location: EveryNode``: the worker's proxy listens on a port of its own
(Ray's ``RAY_SERVE_WORKER_PROXY_HTTP_PORT``, for proxies that share a machine). The models'
replicas land on both nodes; requests sent through both proxies at once are all answered,
each model's meter counts exactly the arrivals sent, both routers report, and no replica
ever held more than ``PIPELINE`` requests; the autoscaler's capacity is both nodes' CPUs.
Then the worker dies (its raylet and every process it started are killed) under load: the
head's proxy keeps serving, losing at most the requests in flight on the lost node, and the
capacity drops to one node.

Each node runs ``ray start --block`` in its own session, so teardown ends exactly the
processes this test started, by process id (never ``ray stop``, which stops every Ray on the
machine). The test process itself never joins the cluster: a short subprocess deploys, and
the checks use HTTP and the dashboard's state API, so killing a node cannot take pytest down.

The KubeRay manifest (``faro-serve kuberay``) is checked here too, against a small model of
the RayService fields KubeRay requires.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from bench import ray_nodes
from bench.ray_nodes import kill_session, wait_for
from faro_serve.serving.proxy_queue import PIPELINE

DEPLOY = textwrap.dedent("""
    import sys
    import ray
    from ray import serve
    from faro_serve.config import ClusterSpec, ModelSLO
    from faro_serve.serving.app import deploy

    gcs, http, dash = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ray.init(address=gcs, log_to_driver=False)
    serve.start(proxy_location="EveryNode", http_options={"host": "127.0.0.1", "port": http})
    models = [(ModelSLO(name=n, slo_ms=720, processing_ms=50, cpus=0.25, max_replicas=4),
               {"model": {"kind": "synthetic", "processing": "const:0.05"}, "initial_replicas": 3})
              for n in ("mn-a", "mn-b")]
    # enabled: false measures and reports (capacity included) but keeps the replica counts,
    # so the placement checked below is Serve's, not a scaling decision's
    deploy(models, ClusterSpec(cpus=2, objective="fair_sum", reactive_interval_s=2,
                               long_term_interval_s=20, window_s=120, cold_start_s=10),
           dashboard_url=dash, enabled=False, forecaster="fallback")
    print("deployed")
""")


@pytest.fixture
def two_nodes():
    with ray_nodes.two_nodes() as n:
        yield {
            "head": n.head,
            "worker": n.worker,
            "gcs": n.gcs,
            "dashboard": n.dashboard,
            "http": n.http,
            "http2": n.http2,
            "env": n.env,
            "tmp": n.tmp,
        }


async def _load(
    bases: list[str], models: tuple[str, ...], per: int, clients: int, stop: asyncio.Event | None = None
) -> list[tuple[str, str, int | str, float]]:
    """``clients`` concurrent clients per (proxy, model), each sending until ``per`` requests
    went through that pair (or ``stop`` is set): (proxy, model, status or error, time answered)."""
    out: list = []

    async def one_pair(base, model):
        left = [per]
        async with httpx.AsyncClient(base_url=base, timeout=30, trust_env=False) as c:

            async def client():
                while left[0] > 0 and not (stop and stop.is_set()):
                    left[0] -= 1
                    try:
                        code = (await c.post(f"/{model}/predict")).status_code
                    except httpx.HTTPError as err:
                        code = type(err).__name__
                        await asyncio.sleep(0.2)  # a proxy gone: do not spin
                    out.append((base, model, code, time.time()))

            await asyncio.gather(*(client() for _ in range(clients)))

    await asyncio.gather(*(one_pair(b, m) for b in bases for m in models))
    return out


def _meter(client: httpx.Client, model: str) -> dict:
    return client.get(f"/{model}/metrics").json()


@pytest.mark.slow
def test_two_proxies_serve_count_and_bound_and_survive_losing_a_node(two_nodes, report, chaos):
    from ray.util.state import list_actors, list_nodes

    n = two_nodes
    t0 = time.time()
    dep = subprocess.run(
        [sys.executable, "-c", DEPLOY, n["gcs"], n["http"].rsplit(":", 1)[1], n["dashboard"]],
        env=n["env"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert dep.returncode == 0 and "deployed" in dep.stdout, dep.stderr[-3000:]
    client = httpx.Client(base_url=n["http"], timeout=30, trust_env=False)
    models = ("mn-a", "mn-b")

    nodes = {x.node_id: x for x in list_nodes(address=n["dashboard"])}
    worker_id = next(i for i, x in nodes.items() if not x.is_head_node)

    def replicas():
        return [
            a
            for a in list_actors(address=n["dashboard"], filters=[("state", "=", "ALIVE")])
            if a.class_name in ("ServeReplica:mn-a:Model", "ServeReplica:mn-b:Model")
        ]

    # 6 replicas of 0.25 CPU need 1.5 CPUs: they cannot all sit on one 1-CPU node
    placed = wait_for(lambda: (lambda r: r if len(r) == 6 else None)(replicas()), 60)
    assert placed, replicas()
    on_nodes = {a.node_id for a in placed}
    assert on_nodes == set(nodes), {a.class_name: a.node_id for a in placed}
    # both proxies answer (the worker's starts with the first replicas on its node)
    for base in (n["http"], n["http2"]):
        assert wait_for(
            lambda: all(
                httpx.post(f"{base}/{m}/predict", timeout=10, trust_env=False).status_code == 200 for m in models
            ),
            60,
        ), base

    # the autoscaler's capacity is both nodes' CPUs
    st = wait_for(lambda: (lambda s: s if s.get("capacity_cpus") == 2 else None)(client.get("/faro/status").json()), 60)
    assert st, client.get("/faro/status").text

    # load through both proxies at once: 8 clients per proxy and model, 16 on 3 replicas
    # of each model, so both proxies' routers contend for every replica
    def settled(m):  # the meter's count once the routers' reports (every second) are in
        first = _meter(client, m)["arrivals_total"]
        time.sleep(2.5)
        return _meter(client, m)["arrivals_total"], first

    before = {m: settled(m)[0] for m in models}  # the read above adds one arrival each
    per = 120
    sent = asyncio.run(_load([n["http"], n["http2"]], models, per, clients=8))
    codes = {}
    for base, m, code, _ in sent:
        codes[(base, m, code)] = codes.get((base, m, code), 0) + 1
    assert all(code == 200 for _, _, code, _ in sent), codes
    assert len(sent) == 2 * 2 * per
    time.sleep(2.5)
    for m in models:
        snap = _meter(client, m)
        # every request sent through either proxy, plus the one read that counted `before`
        assert snap["arrivals_total"] - before[m] == 2 * per + 1, (m, snap["arrivals_total"], before[m])
        assert snap["routers"] == 2, snap  # each proxy's router reports its own queue
        assert 1 <= snap["replica_held_max"] <= PIPELINE, snap  # the bound, whoever sent them
    held = {m: _meter(client, m)["replica_held_max"] for m in models}

    # kill the worker's proxy alone under load through both proxies (issue 50): the head's
    # proxy serves on untouched; the worker's cuts off at most what it held (2 clients per
    # model), refuses connections until Serve has started it again, then serves
    proxy = next(
        a
        for a in list_actors(address=n["dashboard"], filters=[("state", "=", "ALIVE")])
        if a.class_name == "ProxyActor" and a.node_id == worker_id
    )
    stop_p, t_pk = asyncio.Event(), [0.0]

    async def load_and_kill_proxy():
        task = asyncio.create_task(_load([n["http"], n["http2"]], models, 10_000, clients=2, stop=stop_p))
        await asyncio.sleep(3)
        t_pk[0] = time.time()
        os.kill(proxy.pid, signal.SIGKILL)
        await asyncio.sleep(4)
        stop_p.set()
        return await task

    during_p = asyncio.run(load_and_kill_proxy())
    head_p = [c for base, _, c, _ in during_p if base == n["http"]]
    assert head_p and all(c == 200 for c in head_p), set(map(str, head_p))
    worker_p = [c for base, _, c, t in during_p if base == n["http2"] and t >= t_pk[0]]
    cut = [c for c in worker_p if not isinstance(c, int) and c != "ConnectError"]
    assert len(cut) <= 2 * len(models), cut
    assert all(c == 200 or c == "ConnectError" or c in cut for c in worker_p), set(map(str, worker_p))
    assert wait_for(
        lambda: all(
            httpx.post(f"{n['http2']}/{m}/predict", timeout=10, trust_env=False).status_code == 200 for m in models
        ),
        120,
        every=1,
    ), "the worker's proxy did not come back"
    chaos(
        "a proxy SIGKILLed (the worker's, of two), load through both",
        len(head_p) + len(worker_p),
        len(head_p) + sum(isinstance(c, int) for c in worker_p),
        0,
        len(cut),
        time.time() - t_pk[0],
        f"the head's proxy: {len(head_p)} x 200; the worker's: the {len(cut)} in flight on it cut "
        f"off (its connections die with it), then refused at connect until Serve restarted it",
    )

    # lose the worker node under load through both proxies
    lost = [a.class_name for a in placed if a.node_id == worker_id]
    stop = asyncio.Event()
    t_kill = [0.0]

    async def load_and_kill():
        task = asyncio.create_task(_load([n["http"], n["http2"]], models, 10_000, clients=2, stop=stop))
        await asyncio.sleep(5)
        t_kill[0] = time.time()
        await asyncio.to_thread(kill_session, n["worker"], 0)
        await asyncio.sleep(20)
        stop.set()
        return await task

    during = asyncio.run(load_and_kill())
    head_after = [(code, t) for base, _, code, t in during if base == n["http"] and t >= t_kill[0]]
    head_before = [code for base, _, code, t in during if base == n["http"] and t < t_kill[0]]
    assert head_before and all(c == 200 for c in head_before)
    failed = [c for c, _ in head_after if c != 200]
    # the head's proxy lost at most what was in flight on the lost node's replicas
    assert len(failed) <= PIPELINE * len(lost), (failed, len(lost))
    assert sum(1 for c, _ in head_after if c == 200) > 0  # and kept serving
    assert wait_for(
        lambda: any(x.node_id == worker_id and x.state == "DEAD" for x in list_nodes(address=n["dashboard"])), 90
    )

    # every model answers through the head's proxy within a bounded time
    def all_ok():
        return all(client.post(f"/{m}/predict").status_code == 200 for m in models for _ in range(3))

    assert wait_for(all_ok, 90, every=2), "no 200s after losing the worker node"
    t_ok = time.time()
    # the capacity the autoscaler sees is one node
    st = wait_for(lambda: (lambda s: s if s.get("capacity_cpus") == 1 else None)(client.get("/faro/status").json()), 60)
    assert st, client.get("/faro/status").text
    survivors = replicas()
    assert survivors and {a.node_id for a in survivors} == {nid for nid in nodes if nid != worker_id}
    bare_5xx = sum(1 for c, _ in head_after if isinstance(c, int) and c >= 500 and c != 503)
    cut = sum(1 for c, _ in head_after if not isinstance(c, int))
    chaos(
        "the worker node killed (its proxy and replicas), load through the head's proxy",
        len(head_after),
        len(head_after) - cut,
        bare_5xx,
        cut,
        t_ok - t_kill[0],
        f"{len(failed)} not 200 of {len(head_after)} ({len(lost)} replicas lost, at most "
        f"{PIPELINE} each); the worker's own proxy went with it",
    )
    report(
        f"multinode, two proxies: {len(sent)} requests through both, all 200, meters counted each; "
        f"most held by one replica {held} (bound {PIPELINE}); worker killed under load: head proxy "
        f"failed {len(failed)} of {len(head_after)} after the kill ({len(lost)} replicas lost); "
        f"all models 200 again {t_ok - t_kill[0]:.0f} s after; test {time.time() - t0:.0f} s"
    )


# ---------------------------------------------------------------- faro-serve kuberay

ROOT = Path(__file__).resolve().parent.parent


class _M(BaseModel):
    model_config = ConfigDict(extra="allow")


class Quantities(_M):
    cpu: str
    memory: str = Field(pattern=r"^[0-9]+(Gi|Mi)$")


class Resources(_M):
    requests: Quantities
    limits: Quantities


class Container(_M):
    name: str
    image: str
    resources: Resources


class PodSpec(_M):
    containers: list[Container] = Field(min_length=1)


class Template(_M):
    spec: PodSpec


class HeadGroup(_M):
    rayStartParams: dict[str, str]  # KubeRay takes string values only
    template: Template


class WorkerGroup(_M):
    groupName: str
    replicas: int = Field(ge=1)
    minReplicas: int = Field(ge=0)
    maxReplicas: int = Field(ge=1)
    rayStartParams: dict[str, str]
    template: Template


class RayClusterSpec(_M):
    rayVersion: str
    headGroupSpec: HeadGroup
    workerGroupSpecs: list[WorkerGroup] = Field(min_length=1)


class RayServiceSpec(_M):
    serveConfigV2: str
    rayClusterConfig: RayClusterSpec


class Metadata(_M):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class RayService(_M):
    apiVersion: str = Field(pattern=r"^ray\.io/v1$")
    kind: str = Field(pattern=r"^RayService$")
    metadata: Metadata
    spec: RayServiceSpec


def _cpus(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def test_kuberay_manifest_has_what_kuberay_needs_and_the_serve_config_verbatim(cli, tmp_path):
    from ray.serve.schema import ServeDeploySchema

    from faro_serve.serving.schema import parse_autoscaler_config, parse_model_args

    out = tmp_path / "rayservice.yaml"
    code, _, err = cli("kuberay", "--config", str(ROOT / "serve_config.yaml"), "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    assert "pip install faro-serve" in text.split("apiVersion")[0]  # the image note
    rs = RayService.model_validate(yaml.safe_load(text))
    served = yaml.safe_load(rs.spec.serveConfigV2)
    assert rs.spec.serveConfigV2 == (ROOT / "serve_config.yaml").read_text()
    assert served == yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    ServeDeploySchema.model_validate(served)
    faro = next(a for a in served["applications"] if a["name"] == "faro")
    cfg = parse_autoscaler_config(faro["args"])
    for app in served["applications"]:
        if app["import_path"].endswith(":model_app"):
            parse_model_args(app["args"])
    rc = rs.spec.rayClusterConfig
    assert rc.headGroupSpec.rayStartParams["dashboard-host"] == "0.0.0.0"
    assert rc.headGroupSpec.rayStartParams["num-cpus"] == "0"  # model replicas on workers only
    head = rc.headGroupSpec.template.spec.containers[0]
    assert head.image == "rayproject/ray:2.60.0-py311"
    w = rc.workerGroupSpecs[0]
    pod_cpus = _cpus(w.template.spec.containers[0].resources.limits.cpu)
    assert float(w.rayStartParams["num-cpus"]) == pod_cpus
    assert w.replicas == w.minReplicas == w.maxReplicas
    assert w.replicas * pod_cpus == cfg.cluster.cpus  # the faro capacity, in worker pods


def test_kuberay_options_sizing_in_cluster_and_bad_input(cli, tmp_path):
    code, out, err = cli(
        "kuberay",
        "--config",
        str(ROOT / "serve_config.yaml"),
        "--worker-cpus",
        "0.75",
        "--image",
        "me/faro:1",
        "--in-cluster",
        "--name",
        "faro-test",
    )
    assert code == 0, err
    rs = RayService.model_validate(yaml.safe_load(out))
    w = rs.spec.rayClusterConfig.workerGroupSpecs[0]
    assert w.replicas == 3 and w.template.spec.containers[0].image == "me/faro:1"  # ceil(2 / 0.75)
    served = yaml.safe_load(rs.spec.serveConfigV2)
    original = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    assert served["http_options"]["host"] == "0.0.0.0"
    faro = next(a for a in served["applications"] if a["name"] == "faro")
    assert faro["args"].pop("dashboard_url") == "http://faro-test-head-svc:8265"
    served["http_options"]["host"] = original["http_options"]["host"]
    assert served == original  # nothing else changed

    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "serve_config.yaml").read_text().replace("slo_ms: 400", "slo_ms: 0"))
    for args, msg in ([str(bad)], "slo_ms"), ([str(tmp_path / "none.yaml")], "cannot read"):
        code, _, err = cli("kuberay", "--config", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and msg in err, err
    code, _, err = cli("kuberay", "--name", "Bad_Name")
    assert code == 2 and "--name" in err
