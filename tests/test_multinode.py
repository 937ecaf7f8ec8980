"""faro-serve across two Ray nodes, and losing one (beyond one machine; paper section 5).

Two real Ray nodes on this machine (``ray start --head`` and ``ray start --address``, one CPU
each, free ports, a private temp dir so no other Ray on the machine is affected): the models'
replicas land on both nodes, the autoscaler's capacity is both nodes' CPUs, and after the
second node dies (its raylet and every process it started are killed) the service keeps
answering and the capacity drops to one node.

Each node runs ``ray start --block`` in its own session, so teardown ends exactly the
processes this test started, by process id (never ``ray stop``, which stops every Ray on the
machine). The test process itself never joins the cluster: a short subprocess deploys, and
the checks use HTTP and the dashboard's state API, so killing a node cannot take pytest down.

The KubeRay manifest (``faro-serve kuberay``) is checked here too, against a small model of
the RayService fields KubeRay requires.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from live_helpers import free_port

VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")


def node_ports() -> list[str]:
    """Every port a node opens, free and explicit: two nodes share this machine."""
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port())]


def session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (a node's ``ray start --block`` and all it started)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session
            out.append(int(d.name))
    return out


def kill_session(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the node's ``ray start`` (it stops its children), then SIGKILL what is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    for pid in session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def wait_for(cond, timeout: float, every: float = 1.0):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = cond()
        except (httpx.HTTPError, ValueError, KeyError):
            v = None
        if v:
            return v
        time.sleep(every)
    return None


DEPLOY = textwrap.dedent("""
    import sys
    import ray
    from ray import serve
    from faro_serve.config import ClusterSpec, ModelSLO
    from faro_serve.serving.app import deploy

    gcs, http, dash = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ray.init(address=gcs, log_to_driver=False)
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": http})
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
    tmp = tempfile.mkdtemp(prefix="fmn", dir="/tmp")  # short: Ray's socket paths have a length limit
    gcs, dash, http = free_port(), free_port(), free_port()
    # Token authentication off for this private cluster: the test's clients carry no token.
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", f"--temp-dir={tmp}",
              "--object-store-memory=200000000", "--disable-usage-stats"]
    procs: list[subprocess.Popen] = []

    def start(args, log):
        p = subprocess.Popen([RAY, "start", *common, *args, *node_ports()], start_new_session=True,
                             stdout=open(Path(tmp) / log, "w"), stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        return p

    try:
        head = start(["--head", f"--port={gcs}", f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
                      "--include-dashboard=true", f"--ray-client-server-port={free_port()}"], "head.log")
        base_dash = f"http://127.0.0.1:{dash}"
        assert wait_for(lambda: httpx.get(f"{base_dash}/api/version", timeout=2, trust_env=False)
                        .status_code == 200, 60), (Path(tmp) / "head.log").read_text()[-2000:]
        worker = start([f"--address=127.0.0.1:{gcs}"], "worker.log")
        from ray.util.state import list_nodes

        assert wait_for(lambda: len([n for n in list_nodes(address=base_dash) if n.state == "ALIVE"]) == 2, 60), \
            (Path(tmp) / "worker.log").read_text()[-2000:]
        yield {"head": head, "worker": worker, "gcs": f"127.0.0.1:{gcs}", "dashboard": base_dash,
               "http": f"http://127.0.0.1:{http}", "env": env, "tmp": tmp}
    finally:
        for p in reversed(procs):
            kill_session(p)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_serves_across_two_nodes_and_survives_losing_one(two_nodes, report):
    from ray.util.state import list_actors, list_nodes

    n = two_nodes
    t0 = time.time()
    dep = subprocess.run([sys.executable, "-c", DEPLOY, n["gcs"], n["http"].rsplit(":", 1)[1], n["dashboard"]],
                         env=n["env"], capture_output=True, text=True, timeout=150)
    assert dep.returncode == 0 and "deployed" in dep.stdout, dep.stderr[-3000:]
    client = httpx.Client(base_url=n["http"], timeout=30, trust_env=False)

    nodes = {x.node_id: x for x in list_nodes(address=n["dashboard"])}
    worker_id = next(i for i, x in nodes.items() if not x.is_head_node)

    def replicas():
        return [a for a in list_actors(address=n["dashboard"], filters=[("state", "=", "ALIVE")])
                if a.class_name in ("ServeReplica:mn-a:Model", "ServeReplica:mn-b:Model")]

    # 6 replicas of 0.25 CPU need 1.5 CPUs: they cannot all sit on one 1-CPU node
    placed = wait_for(lambda: (lambda r: r if len(r) == 6 else None)(replicas()), 60)
    assert placed, replicas()
    on_nodes = {a.node_id for a in placed}
    assert on_nodes == set(nodes), {a.class_name: a.node_id for a in placed}
    for m in ("mn-a", "mn-b"):
        assert client.post(f"/{m}/predict").status_code == 200

    # the autoscaler's capacity is both nodes' CPUs
    st = wait_for(lambda: (lambda s: s if s.get("capacity_cpus") == 2 else None)(client.get("/faro/status").json()), 60)
    assert st, client.get("/faro/status").text

    # lose the second node: its raylet and everything it started
    lost = [a.class_name for a in placed if a.node_id == worker_id]
    kill_session(n["worker"], grace_s=0)
    t_kill = time.time()
    assert wait_for(lambda: any(x.node_id == worker_id and x.state == "DEAD"
                                for x in list_nodes(address=n["dashboard"])), 90)

    # the service keeps answering: every model gets 200s again within a bounded time
    def all_ok():
        return all(client.post(f"/{m}/predict").status_code == 200 for m in ("mn-a", "mn-b") for _ in range(3))

    assert wait_for(all_ok, 90, every=2), "no 200s after losing the worker node"
    t_ok = time.time()
    # the capacity the autoscaler sees is one node
    st = wait_for(lambda: (lambda s: s if s.get("capacity_cpus") == 1 else None)(client.get("/faro/status").json()), 60)
    assert st, client.get("/faro/status").text
    survivors = replicas()
    assert survivors and {a.node_id for a in survivors} == {nid for nid in nodes if nid != worker_id}
    report(f"multinode: replicas on both nodes ({len(lost)} of 6 on the worker), capacity 2 -> 1; "
           f"serving again {t_ok - t_kill:.0f} s after the node was killed; {len(survivors)} replicas left; "
           f"test {time.time() - t0:.0f} s")


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
    code, out, err = cli("kuberay", "--config", str(ROOT / "serve_config.yaml"), "--worker-cpus", "0.75",
                         "--image", "me/faro:1", "--in-cluster", "--name", "faro-test")
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
