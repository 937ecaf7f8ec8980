"""The chaos suite (issue 50): each fault under steady load, with its accounting.

One real deployment serves the module, started as an operator starts it: ``faro-serve run
<config>`` as a child process (``ray start`` and ``serve run`` as its children), three
models (a synthetic one on the default direct path, one behind the opt-in router front, a
ResNet18 for bodies that must be parsed) and the autoscaler, whose history store is corrupt
when it starts. Steady load (``live_helpers.SteadyLoad``: closed-loop clients on loopback)
runs through every fault; each test asserts the accounting (every request sent is answered,
refused at connect, or lost: nothing hangs), and adds its row to the table in
docs/reliability.md (``chaos`` fixture, conftest.py). The last tests stop deployments with
SIGINT and SIGTERM under load. Faults tested in other modules (a flood, slow bodies, a
worker node and its proxy lost) add their rows there.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from live_helpers import SteadyLoad, wait_for

from faro_serve.ports import free_port
from faro_serve.serving.proxy_queue import PIPELINE
from forecasting.rayserve import dashboard_headers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SYNTH = {"kind": "synthetic", "processing": "const:0.05"}


def png(size: int = 64) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (120, 30, 200)).save(buf, format="PNG")
    return buf.getvalue()


def config(
    path: Path, history: Path, models: tuple[str, ...] = ("chaos", "chaos-front", "chaos-img"), **chaos_args
) -> dict:
    """A serve config of the module's models on free ports; returns its document."""
    slos = {
        "chaos": {
            "name": "chaos",
            "slo_ms": 500,
            "processing_ms": 50,
            "cpus": 0.25,
            "min_replicas": 2,
            "max_replicas": 3,
        },
        "chaos-front": {
            "name": "chaos-front",
            "slo_ms": 500,
            "processing_ms": 50,
            "cpus": 0.25,
            "min_replicas": 2,
            "max_replicas": 2,
        },
        "chaos-img": {
            "name": "chaos-img",
            "slo_ms": 2000,
            "processing_ms": 150,
            "cpus": 0.25,
            "min_replicas": 1,
            "max_replicas": 1,
        },
    }
    # chaos starts below its min_replicas: the autoscaler scales it into its bounds (and
    # again after a redeploy, which resets the count to initial_replicas)
    apps = {
        "chaos": {"name": "chaos", "model": SYNTH, "cpus": 0.25, "initial_replicas": 1, **chaos_args},
        "chaos-front": {
            "name": "chaos-front",
            "model": SYNTH,
            "cpus": 0.25,
            "initial_replicas": 2,
            "data_path": "front",
        },
        "chaos-img": {"name": "chaos-img", "model": {"kind": "vision", "arch": "resnet18"}, "cpus": 0.25},
    }
    faro = {
        "name": "faro",
        "route_prefix": "/faro",
        "import_path": "faro_serve.serving.app:autoscaler_app",
        "args": {
            "cluster": {
                "cpus": 2,
                "objective": "fair_sum",
                "long_term_interval_s": 600,
                "window_s": 120,
                "cold_start_s": 10,
                "reactive_interval_s": 2,
                "reactive_trigger_s": 6,
            },
            "models": [slos[m] for m in models],
            "forecaster": "fallback",
            "history_dir": str(history),
            "dashboard_url": f"http://127.0.0.1:{free_port()}",
        },
    }
    doc = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": free_port()},
        "applications": [faro]
        + [
            {
                "name": m,
                "route_prefix": f"/{m}",
                "import_path": "faro_serve.serving.app:model_app",
                "external_scaler_enabled": True,
                "args": apps[m],
            }
            for m in models
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


class Run:
    """``python -m faro_serve run <config>`` as a child in its own session, its output in a file."""

    def __init__(self, cfg: Path, doc: dict, where: Path):
        self.doc, self.where = doc, where
        self.base = f"http://127.0.0.1:{doc['http_options']['port']}"
        self.dashboard = doc["applications"][0]["args"]["dashboard_url"]
        self.temp = tempfile.mkdtemp(prefix="fc-", dir="/tmp")  # short: Ray's socket paths
        self.out = where / "run.out"
        with self.out.open("wb") as f:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "faro_serve",
                    "run",
                    str(cfg),
                    "--ray-temp-dir",
                    self.temp,
                    "--log-dir",
                    str(where / "logs"),
                    "--drain-timeout",
                    "20",
                ],
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.client = httpx.Client(base_url=self.base, timeout=30)

    def ready(self, models: dict[str, bytes], timeout: float = 240) -> bool:
        def up():
            assert self.proc.poll() is None, self.output()
            try:
                return all(self.client.post(f"/{m}/predict", content=b).status_code == 200 for m, b in models.items())
            except httpx.HTTPError:
                return False

        return bool(wait_for(up, timeout, every=2))

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def signal_and_wait(self, sig: int, timeout: float = 120) -> int:
        os.kill(self.proc.pid, sig)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            try:
                self.signal_and_wait(signal.SIGINT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", self.temp], check=False)

    def pids(self, app: str, deployment: str = "Model") -> list[int]:
        """The processes of the RUNNING replicas, from Serve's REST API."""
        r = httpx.get(f"{self.dashboard}/api/serve/applications/", headers=dashboard_headers(), timeout=10)
        dep = r.json()["applications"].get(app, {}).get("deployments", {}).get(deployment, {})
        return [int(x["pid"]) for x in dep.get("replicas", []) if x.get("state") == "RUNNING"]

    def replicas(self, app: str, deployment: str = "Model") -> int:
        return len(self.pids(app, deployment))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    where = tmp_path_factory.mktemp("chaos")
    history = where / "history"
    history.mkdir()
    (history / "arrivals.sqlite3").write_bytes(b"\x00 not a database " * 200)  # corrupt at start
    doc = config(where / "serve_config.yaml", history)
    r = Run(where / "serve_config.yaml", doc, where)
    r.history = history
    try:
        assert r.ready({"chaos": b"x", "chaos-front": b"x", "chaos-img": png()}), r.output()[-3000:]
        yield r
    finally:
        r.stop()


def _note(t: dict) -> str:
    return f"{t['200']} x 200" + (f", {t['503']} x 503" if t["503"] else "")


def test_a_corrupt_history_store_is_set_aside_and_every_model_serves(run, chaos):
    aside = list(run.history.glob("arrivals.sqlite3.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"\x00 not a database")
    st = wait_for(lambda: (lambda s: s if s.get("ticks") else None)(run.client.get("/faro/status").json()), 60)
    assert st and st["enabled"], st
    with SteadyLoad([f"{run.base}/chaos/predict", f"{run.base}/chaos-front/predict"], clients=2) as load:
        time.sleep(6)
    t = load.tally()
    assert t["sent"] == t["answered"] == t["200"] > 0, t
    chaos(
        "corrupt history store at start",
        t["sent"],
        t["answered"],
        t["5xx"],
        t["lost"],
        None,
        f"the store moved aside (arrivals.sqlite3.corrupt-<time>), a fresh one; {_note(t)}",
    )


FUZZ = [
    b"",
    b"\x00" * 10,
    os.urandom(2048),
    png()[:40],
    b"GIF89a" + os.urandom(100),
    b'{"image": "not base64!"}',
    b'{"image": 12}',
    b'{"image": ""}',
    b"[1, 2, 3]",
    b"{",
    b'{"image": "' + b"A" * 5000 + b'"}',
    "é".encode("latin-1") * 50,
]


def test_fuzzed_bodies_and_a_pixel_bomb_are_refused_while_others_are_served(run, chaos):
    from test_vision_device import pixel_bomb

    rng = random.Random(50)
    bodies = FUZZ + [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))) for _ in range(28)]
    with SteadyLoad([f"{run.base}/chaos/predict"], clients=3) as load:
        time.sleep(1)
        fuzzed = [run.client.post("/chaos-img/predict", content=b) for b in bodies]
        t0 = time.time()
        bomb = run.client.post("/chaos-img/predict", content=pixel_bomb(20_000, 20_000))
        bomb_s = time.time() - t0
        after = run.client.post("/chaos-img/predict", content=png())
        time.sleep(1)
    codes = sorted({r.status_code for r in fuzzed})
    assert all(400 <= r.status_code < 500 and r.json().get("reason") for r in fuzzed), codes
    assert bomb.status_code == 413 and bomb.json()["reason"] == "too_many_pixels", bomb.text
    assert after.status_code == 200 and bomb_s < 5
    t = load.tally()
    assert t["sent"] == t["answered"] == t["200"] > 0, t
    chaos(
        "fuzzed bodies (40) to an image model",
        len(bodies) + t["sent"],
        len(bodies) + t["answered"],
        t["5xx"],
        t["lost"],
        None,
        f"each fuzzed body {'/'.join(map(str, codes))} with a reason; steady load on another model {_note(t)}",
    )
    chaos(
        "pixel bomb (20,000 x 20,000 PNG)",
        1 + t["sent"],
        1 + t["answered"],
        0,
        0,
        None,
        f"413 too_many_pixels in {bomb_s:.2f} s, the next image 200",
    )


def test_a_replica_killed_under_load(run, chaos):
    """SIGKILL of one replica of each path under load. Direct path: Ray's proxy answers 500
    for what the dead replica held (at most PIPELINE: its running request and the one behind
    it); Ray's router re-routes what it had not handed over. Front: retried, no 500."""
    assert wait_for(lambda: len(run.pids("chaos")) >= 2 and len(run.pids("chaos-front")) == 2, 60)
    direct, front = f"{run.base}/chaos/predict", f"{run.base}/chaos-front/predict"
    with SteadyLoad([direct, front], clients=4) as load:
        time.sleep(3)
        before = {app: run.pids(app) for app in ("chaos", "chaos-front")}
        kill_t = time.time()
        for app, pids in before.items():
            os.kill(pids[0], signal.SIGKILL)

        def replaced():  # a new replica RUNNING in place of each killed one
            now = {app: run.pids(app) for app in before}
            return all(pids[0] not in now[app] and len(now[app]) >= len(pids) for app, pids in before.items())

        back = wait_for(replaced, 60, every=0.5)
        recover = time.time() - kill_t
        time.sleep(2)
    assert back
    d, f = load.tally(direct), load.tally(front)
    for t in (d, f):
        assert t["sent"] == t["answered"] and t["lost"] == t["hung"] == 0, t
    assert d["5xx"] <= PIPELINE and d["200"] >= d["sent"] - PIPELINE, d
    assert f["5xx"] == 0 and f["200"] >= f["sent"] - 2, f
    # what the killed replica held (0 when the kill fell between its requests, as in one
    # fresh-clone run), each sent once more: none of it a 5xx (above), none sent twice over
    retried = run.client.get("/chaos-front/metrics").json()["retried"]
    assert retried <= 4, retried
    chaos(
        f"a replica SIGKILLed (direct path, {len(before['chaos'])} replicas)",
        d["sent"],
        d["answered"],
        d["5xx"],
        d["lost"],
        recover,
        f"{d['5xx']} x 500 from Ray's proxy for what it held (no retry on this path); {_note(d)}",
    )
    chaos(
        "a replica SIGKILLed (router front, 2 replicas)",
        f["sent"],
        f["answered"],
        f["5xx"],
        f["lost"],
        recover,
        f"{retried} retried once on the other replica (counted in the meter); {_note(f)}",
    )


def test_the_autoscaler_killed_under_load(run, chaos):
    with SteadyLoad([f"{run.base}/chaos/predict"], clients=3) as load:
        time.sleep(2)
        kill_t = time.time()
        os.kill(run.pids("faro", "FaroAutoscaler")[0], signal.SIGKILL)

        def ticks():
            try:
                r = run.client.get("/faro/status", timeout=5)
                return r.json().get("ticks") if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                return None

        time.sleep(0.5)
        first = wait_for(ticks, 90, every=0.5)  # a new autoscaler answers ...
        back = first and wait_for(lambda: (ticks() or 0) > first, 30, every=0.5)  # ... and ticks
        recover = time.time() - kill_t
        time.sleep(1)
    assert back
    t = load.tally()
    assert t["sent"] == t["answered"] == t["200"] > 0, t
    chaos(
        "the autoscaler SIGKILLed",
        t["sent"],
        t["answered"],
        t["5xx"],
        t["lost"],
        recover,
        f"models served throughout; a new autoscaler ticking again; {_note(t)}",
    )


def test_a_model_application_redeployed_under_load(run, chaos):
    """``serve deploy`` of the config with the model's args changed: Ray replaces its
    replicas one by one (the old ones finish what they hold), and resets the count to
    ``initial_replicas``; the autoscaler then scales it back into its SLO's bounds."""
    doc = yaml.safe_load((run.where / "serve_config.yaml").read_text())
    doc["applications"][1]["args"]["max_body_kb"] = 4096
    new = run.where / "redeploy.yaml"
    new.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    serve_cli = str(Path(sys.executable).parent / "serve")
    with SteadyLoad([f"{run.base}/chaos/predict"], clients=4) as load:
        time.sleep(2)
        old = set(run.pids("chaos"))
        t0 = time.time()
        out = subprocess.run(
            [serve_cli, "deploy", "--address", run.dashboard, str(new)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr

        def replaced():
            r = httpx.get(f"{run.dashboard}/api/serve/applications/", headers=dashboard_headers(), timeout=10)
            app = r.json()["applications"]["chaos"]
            pids = set(run.pids("chaos"))
            return (
                app["status"] == "RUNNING"
                and app["deployed_app_config"]["args"].get("max_body_kb") == 4096
                and len(pids) >= 2
                and not pids & old
            )  # all replaced, back to min_replicas

        done = wait_for(replaced, 90, every=0.5)
        recover = time.time() - t0
        time.sleep(2)
    assert done
    t = load.tally()
    assert t["sent"] == t["answered"] == t["200"] > 0, t
    chaos(
        "a model application redeployed (serve deploy)",
        t["sent"],
        t["answered"],
        t["5xx"],
        t["lost"],
        recover,
        f"Ray's rolling update: old replicas finish what they hold; the count, reset to "
        f"initial_replicas (1), scaled back to min_replicas (2) by the autoscaler; {_note(t)}",
    )


def _stopped_under_load(r: Run, sig: int, urls: list[str]) -> tuple[int, dict, float, dict]:
    with SteadyLoad(urls, clients=4) as load:
        time.sleep(3)
        t0 = time.time()
        code = r.signal_and_wait(sig)
        took = time.time() - t0
        time.sleep(1)
    return code, load.tally(), took, dict(load.reasons)


def _check_stop(code: int, t: dict, reasons: dict, out: str, sig: str) -> None:
    assert code == 0, out[-3000:]
    assert t["lost"] == t["hung"] == t["5xx"] == 0 and not t["other"], t
    assert t["sent"] == t["answered"] + t["refused"] and t["200"] > 0, t
    # every refusal says why: only the drain's 503 (a client that honours Retry-After
    # sends once more into a closed port, refused at connect: never accepted, so never lost)
    assert set(reasons) <= {"503 shutting_down"} and t["503"] >= 1, reasons
    assert f"{sig}: draining" in out and "drained in" in out, out[-3000:]
    assert "Stack" not in out and "stack trace" not in out.lower(), out[-3000:]


def test_sigint_drains_then_stops_under_load(run, chaos):
    urls = [f"{run.base}/{m}/predict" for m in ("chaos", "chaos-front")]
    code, t, took, reasons = _stopped_under_load(run, signal.SIGINT, urls)
    _check_stop(code, t, reasons, run.output(), "SIGINT")
    chaos(
        "SIGINT (Ctrl-C) to `faro-serve run`",
        t["sent"],
        t["answered"],
        t["5xx"],
        t["lost"],
        None,
        f"drained, then Serve and Ray stopped in {took:.0f} s, exit 0; {_note(t)} (shutting_down), "
        f"{t['refused']} refused at connect after the port closed",
    )


def test_sigterm_drains_then_stops_under_load(tmp_path, chaos):
    history = tmp_path / "history"
    doc = config(tmp_path / "serve_config.yaml", history, models=("chaos",))
    r = Run(tmp_path / "serve_config.yaml", doc, tmp_path)
    try:
        assert r.ready({"chaos": b"x"}), r.output()[-3000:]
        code, t, took, reasons = _stopped_under_load(r, signal.SIGTERM, [f"{r.base}/chaos/predict"])
        _check_stop(code, t, reasons, r.output(), "SIGTERM")
    finally:
        r.stop()
    chaos(
        "SIGTERM to `faro-serve run`",
        t["sent"],
        t["answered"],
        t["5xx"],
        t["lost"],
        None,
        f"drained, then Serve and Ray stopped in {took:.0f} s, exit 0, no stack dump; {_note(t)} "
        f"(shutting_down), {t['refused']} refused at connect after the port closed",
    )
