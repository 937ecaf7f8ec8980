"""Two real Ray nodes on this machine, each with a Serve proxy of its own (docs/multinode.md).

``ray start --head`` and ``ray start --address``, explicit free ports, a private temp dir, so
no other Ray on the machine is affected. Serve started with ``proxy_location: EveryNode``
puts a proxy on each node; the worker's binds a port of its own through Ray's
``RAY_SERVE_WORKER_PROXY_HTTP_PORT`` (made for proxies that share a machine). Each node runs
``ray start --block`` in its own session, so teardown ends exactly the processes started
here, by process id (never ``ray stop``, which stops every Ray on the machine).

Used by ``tests/test_multinode.py`` and ``bench.proxy_bench``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from faro_serve.ports import free_port

RAY = str(Path(sys.executable).parent / "ray")


def node_ports() -> list[str]:
    """Every port a node opens, free and explicit: two nodes share this machine."""
    return [
        "--node-manager-port",
        str(free_port()),
        "--object-manager-port",
        str(free_port()),
        "--metrics-export-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--dashboard-agent-grpc-port",
        str(free_port()),
        "--runtime-env-agent-port",
        str(free_port()),
    ]


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
    """``cond()``'s first truthy value within ``timeout`` seconds (HTTP and lookup errors
    count as not yet), else None."""
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


@dataclass
class TwoNodes:
    head: subprocess.Popen
    worker: subprocess.Popen
    gcs: str  # host:port
    dashboard: str  # URL
    http: str  # the head's proxy
    http2: str  # the worker's proxy
    env: dict = field(repr=False)
    tmp: str = ""


@contextmanager
def two_nodes(cpus: int = 1):
    """Start a head and a worker node of ``cpus`` CPUs each; yield :class:`TwoNodes`; end
    both. Token authentication is off for this private loopback cluster."""
    tmp = tempfile.mkdtemp(prefix="fmn", dir="/tmp")  # short: Ray's socket paths have a length limit
    gcs, dash, http, http2 = free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    common = [
        "--block",
        f"--num-cpus={cpus}",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={tmp}",
        "--object-store-memory=200000000",
        "--disable-usage-stats",
    ]
    procs: list[subprocess.Popen] = []

    def start(args, log, extra_env=None):
        p = subprocess.Popen(
            [RAY, "start", *common, *args, *node_ports()],
            start_new_session=True,
            stdout=open(Path(tmp) / log, "w"),
            stderr=subprocess.STDOUT,
            env={**env, **(extra_env or {})},
        )
        procs.append(p)
        return p

    try:
        head = start(
            [
                "--head",
                f"--port={gcs}",
                f"--dashboard-port={dash}",
                "--dashboard-host=127.0.0.1",
                "--include-dashboard=true",
                f"--ray-client-server-port={free_port()}",
            ],
            "head.log",
        )
        base_dash = f"http://127.0.0.1:{dash}"
        if not wait_for(
            lambda: httpx.get(f"{base_dash}/api/version", timeout=2, trust_env=False).status_code == 200, 60
        ):
            raise RuntimeError("the head node did not start: " + (Path(tmp) / "head.log").read_text()[-2000:])
        # the worker's proxy shares this machine with the head's: ports of its own
        worker = start(
            [f"--address=127.0.0.1:{gcs}"],
            "worker.log",
            {"RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(http2), "RAY_SERVE_WORKER_PROXY_GRPC_PORT": str(free_port())},
        )
        from ray.util.state import list_nodes

        if not wait_for(lambda: len([n for n in list_nodes(address=base_dash) if n.state == "ALIVE"]) == 2, 60):
            raise RuntimeError("the worker node did not join: " + (Path(tmp) / "worker.log").read_text()[-2000:])
        yield TwoNodes(
            head,
            worker,
            f"127.0.0.1:{gcs}",
            base_dash,
            f"http://127.0.0.1:{http}",
            f"http://127.0.0.1:{http2}",
            env,
            tmp,
        )
    finally:
        for p in reversed(procs):
            kill_session(p)
        shutil.rmtree(tmp, ignore_errors=True)
