"""``faro-serve demo`` (``make run``): the bundled slice, the report, bad input, the sender's
early stop, and two live runs of the real command on a real local Ray (a complete one and
one stopped with Ctrl-C), each with its own ports, checking that nothing is left running.

All traffic goes to loopback, bounded in count and time.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from faro_serve.demo import DEMO_MAP, DEMO_RATE_SCALE, DEMO_TRACE
from faro_serve.demo.deployment import read_config, session_members
from faro_serve.ports import free_port
from faro_serve.replay.client import NOT_SENT, ReplayRecords
from faro_serve.replay.loadgen import build_schedule, parse_map
from faro_serve.traces import Trace, load_trace

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"


# ---------------------------------------------------------------- the bundled slice


def test_the_bundled_slice_is_real_data_with_a_model_per_job():
    tr = load_trace(DEMO_TRACE)
    assert sorted(tr.names) == ["job1", "job2", "job7", "job8"] and tr.minutes == 6
    mapping = parse_map(DEMO_MAP)
    assert set(mapping) == set(tr.names)
    assert set(mapping.values()) == set(read_config(ROOT / "serve_config.yaml").models)
    # the load changes: job7 jumps at least fivefold within the slice
    j7 = tr.counts[tr.names.index("job7")]
    assert j7.max() > 5 * j7.min()
    # scaled, the peak stays within what a 2-core machine serves (about 20 requests/s)
    assert tr.counts.sum(axis=0).max() * DEMO_RATE_SCALE / 60 < 25
    if SHARED.exists():  # verbatim rows of the shared trace (day 4, sample 0, minutes 68-73)
        src = load_trace(SHARED, days=4, sample=0).select(tr.names)
        assert np.array_equal(src.counts[:, 68:74], tr.counts)


def test_the_slice_ships_as_package_data():
    import importlib.resources

    assert (importlib.resources.files("faro_serve") / "data" / "demo_trace.csv").is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert '"data/*.csv"' in text and "[tool.setuptools.package-data]" in text


def test_read_config_of_the_default_serve_config():
    t = read_config(ROOT / "serve_config.yaml")
    assert t.url == "http://127.0.0.1:8000" and t.dashboard_port == 8265
    assert t.models == ["resnet18", "resnet34", "synth-a", "synth-b"]


def test_demo_image_is_a_jpeg_the_resnets_decode():
    from PIL import Image

    from faro_serve.demo.live import demo_image

    data = demo_image()
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "JPEG" and im.size == (160, 120)
    assert len(data) < 20_000


# ---------------------------------------------------------------- the report, on synthetic records


def _fake_run(minutes=3, interrupted_at=None):
    """A schedule and records as the sender would return them: 200s, a few 503s, polls."""
    tr = Trace(["a", "b"], np.array([[60.0] * minutes, [30.0] * minutes]))
    s = build_schedule(tr, names=["synth-a", "resnet18"], time_scale=0.5, seed=1)
    rng = np.random.default_rng(0)
    n = s.size
    status = ["200"] * n
    for i in rng.choice(n, 5, replace=False):
        status[i] = "503"
    lat = rng.uniform(0.05, 0.3, n)
    if interrupted_at is not None:
        for i in np.flatnonzero(s.send_s >= interrupted_at):
            status[i] = NOT_SENT
    lat = np.where([st == NOT_SENT for st in status], np.nan, lat)
    send = np.where([st == NOT_SENT for st in status], np.nan, s.send_s)
    polls = [
        (
            t,
            {
                "policy": "faro-fairsum",
                "capacity_cpus": 2.0,
                "models": {
                    "synth-a": {
                        "slo_ms": 720,
                        "percentile": 99,
                        "replicas": 1 + int(t > 40),
                        "target": 2,
                        "arrival_rate": 1.0,
                        "latency_ms": 300.0,
                    },
                    "resnet18": {"slo_ms": 400, "percentile": 99, "replicas": 1, "target": 1},
                },
            },
        )
        for t in np.arange(0.0, 30.0 * minutes, 5.0)
    ]
    rec = ReplayRecords(
        model=s.model.copy(),
        trace_s=s.trace_s.copy(),
        send_s=send,
        status=status,
        latency_s=lat,
        reason=["queue_full" if st == "503" else "" for st in status],
        wall_s=30.0 * minutes,
        status_polls=polls,
    )
    return s, rec


def _render(s, rec, tmp_path, interrupted=False, reached=None):
    from faro_serve.demo.report import plot_timeline, render_markdown, trim
    from faro_serve.replay.replay_report import replay_document, replay_result

    slo = {"synth-a": 720.0, "resnet18": 400.0}
    ms, mr = trim(s, rec, reached) if reached else (s, rec)
    res = replay_result(ms, mr, slo, {"synth-a": 99.0, "resnet18": 99.0}, policy="faro-fairsum")
    doc = replay_document(res, ms, mr, "http://127.0.0.1:1")
    doc["accounting"] = rec.counts()
    plot_timeline(tmp_path / "timeline.png", ms, mr, res.table.p_all, slo)
    meta = {
        "when": "now",
        "wall_s": 99.0,
        "deployment": "test",
        "trace": "fake",
        "interrupted": interrupted,
        "stopped_at_s": 40.0,
        "full_minutes": s.minutes,
        "unsent_after_stop": 7,
        "files": ["report.md"],
    }
    return render_markdown(doc, res, ms, mr, slo, meta), doc, ms


def test_report_has_the_accounting_a_row_per_model_and_per_minute_and_a_png(tmp_path):
    s, rec = _fake_run()
    md, doc, _ = _render(s, rec, tmp_path)
    acc = doc["accounting"]
    assert acc["sent"] == acc["answered"] == s.size and acc["by_status"] == {"200": s.size - 5, "503": 5}
    assert f"sent {s.size:,} = answered {s.size:,} (200: {s.size - 5:,}, 503: 5) + errors 0" in md
    assert "Partial report" not in md
    for name in ("synth-a", "resnet18"):
        assert f"| {name} | " in md
        assert sum(1 for line in md.splitlines() if f"| {name} | " in line) == 1 + s.minutes
    assert "![arrivals, replicas and p99 vs SLO per model](timeline.png)" in md
    assert "| 400 ms |" in md and "faro-fairsum" in md
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
    # the per-minute sent counts add up to the model's requests
    from faro_serve.demo.report import per_minute

    pm = per_minute(s, rec)
    assert pm["sent"].sum() == s.size and pm["503"].sum() == 5
    assert pm["replicas"][0, 0] == 1.0 and pm["replicas"][0, 2] == 2.0  # 2 replicas after 40 s


def test_an_interrupted_run_reports_the_minutes_it_reached(tmp_path):
    s, rec = _fake_run(minutes=4, interrupted_at=40.0)  # a minute is 30 s: stopped in minute 2
    md, doc, ms = _render(s, rec, tmp_path, interrupted=True, reached=2)
    acc = doc["accounting"]
    assert acc["scheduled"] == s.size and acc["not_sent"] == int((s.send_s >= 40.0).sum()) > 0
    assert acc["sent"] == acc["answered"] + acc["errors"]
    assert ms.minutes == 2 and doc["minutes"] == 2
    assert "Partial report: interrupted (Ctrl-C) after 40 s" in md and "minutes 1-2 of 4" in md


# ---------------------------------------------------------------- the sender's early stop


def test_stop_sending_ends_a_replay_early_and_every_request_is_accounted_for():
    from faro_serve.replay.client import send_schedule

    async def go():
        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            n = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            if n:
                await reader.readexactly(n)
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, stop.set)
        results = []
        s = build_schedule(Trace(["j"], np.array([[600.0]])), names=["m"], time_scale=0.1, seed=3)  # 6 s
        t0 = time.monotonic()
        try:
            rec = await send_schedule(
                s,
                f"http://127.0.0.1:{port}",
                status_every_s=None,
                body=b"x",
                stop_sending=stop,
                on_result=lambda i, st, lat: results.append(st),
            )
        finally:
            server.close()
            await server.wait_closed()
        return s, rec, results, time.monotonic() - t0

    s, rec, results, wall = asyncio.run(go())
    c = rec.counts()
    assert wall < 4.0  # stopped after 1 s (+ the open requests), not the 6 s of the schedule
    assert c["scheduled"] == s.size and c["not_sent"] > s.size / 2
    assert c["sent"] == c["answered"] + c["errors"] == len(results) > 0
    assert c["by_status"].get("200", 0) > 0


# ---------------------------------------------------------------- bad input: exit 2, one line


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--trace", "/nonexistent/trace.csv"], "no such trace file"),
        (["--url", "http://192.168.1.5:8000"], "not a loopback address"),
        (["--config", "/nonexistent/serve.yaml"], "no such file"),
        (["--map", "job2=nope"], "has no model nope"),
        (["--time-scale", "0"], "--time-scale must be > 0"),
        (["--minutes", "60"], "beyond the trace"),
        (["--jobs", "job99"], "not in trace"),
        (["--startup-timeout", "0"], "--startup-timeout must be > 0"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, tmp_path, extra, message):
    code, out, err = cli("demo", "--out", str(tmp_path / "o"), *extra)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("faro-serve: error:") and message in lines[0], err


def test_a_config_that_is_not_a_serve_config_exits_2(cli, tmp_path):
    for text, message in (
        ("just: text\n", "not a Serve config"),
        ("applications: []\n", "needs exactly one application"),
        ("http_options: {host: 10.1.2.3}\napplications: []\n", "not a loopback"),
    ):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(text)
        code, _, err = cli("demo", "--config", str(cfg), "--out", str(tmp_path / "o"))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_nothing_listening_at_url_is_a_clear_error(cli, tmp_path):
    code, _, err = cli("demo", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "o"))
    assert code == 2 and "cannot reach" in err and len(err.strip().splitlines()) == 1


_SPAWN_WITH_SIGINT_IGNORED = """
import os, signal, subprocess, sys
from pathlib import Path
from faro_serve.demo.deployment import LocalDeployment
os.environ["RAY_AUTH_MODE"] = "disabled"  # no token to generate for this probe
code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
probe = [sys.executable, "-c", code]
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a script's background job (cmd &)
plain = subprocess.run(probe, capture_output=True, text=True).stdout.strip()
log = Path(sys.argv[1])
LocalDeployment(None, log.parent)._spawn(probe, log).wait(timeout=30)
spawned = log.read_text().splitlines()[-1].strip()
print(plain, spawned, signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""


def test_children_get_sigint_even_when_the_demo_runs_as_a_background_job(tmp_path):
    """A script's ``faro-serve demo &`` ignores SIGINT; the ``serve run`` it spawns must not."""
    script = [sys.executable, "-c", _SPAWN_WITH_SIGINT_IGNORED, str(tmp_path / "child.log")]
    out = subprocess.run(script, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    # a plain child inherits the ignore; the demo's spawn gives Python's KeyboardInterrupt
    # handler; and the demo's own disposition is restored afterwards
    assert out == ["False", "True", "True"]


def test_a_port_in_use_stops_before_starting_anything(cli, tmp_path):
    cfg = _config(tmp_path)
    port = yaml.safe_load(cfg.read_text())["http_options"]["port"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        code, _, err = cli("demo", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert code == 1 and f"port {port}" in err and "in use" in err


# ---------------------------------------------------------------- live: the real command


def _config(tmp_path, models=None) -> Path:
    """serve_config.yaml with free HTTP and dashboard ports (and only ``models`` if given)."""
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    doc["http_options"]["port"] = free_port()
    faro = doc["applications"][0]
    faro["args"]["dashboard_url"] = f"http://127.0.0.1:{free_port()}"
    faro["args"]["forecaster"] = "fallback"  # not about the forecaster: no N-HiTS to load
    if models:
        faro["args"]["models"] = [m for m in faro["args"]["models"] if m["name"] in models]
        doc["applications"] = [faro] + [a for a in doc["applications"][1:] if a["name"] in models]
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class _Demo:
    """``python -m faro_serve demo ...`` as a child; its output read line by line as it comes."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "faro_serve", "demo", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=lambda f=f, buf=buf: buf.extend(iter(f.readline, "")), daemon=True)
            for f, buf in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for t in self._readers:
            t.start()

    def wait_for(self, text: str, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            if any(text in line for line in self.err):
                return True
            time.sleep(0.5)
        return any(text in line for line in self.err)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)  # the demo shuts its deployment down on SIGTERM
            self.proc.wait(timeout=90)
        for t in self._readers:
            t.join(timeout=5)
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def child_pids(self) -> list[int]:
        import re

        for line in self.err:
            m = re.search(r"ray start \(pid (\d+)\) and serve run \(pid (\d+)\)", line)
            if m:
                return [int(m.group(1)), int(m.group(2))]
        return []


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _assert_nothing_left(pids: list[int]) -> None:
    assert len(pids) == 2, "the demo did not report its children"
    # nothing running in their sessions (Ray's workers included): the demo checked it too
    assert session_members(pids) == []
    # and the groups disappear: an orphan may stay a zombie until PID 1 reaps it
    end = time.time() + 15
    while any(_group_exists(p) for p in pids) and time.time() < end:
        time.sleep(0.5)
    assert not any(_group_exists(p) for p in pids), [p for p in pids if _group_exists(p)]


@pytest.mark.slow
def test_live_demo_completes_accounts_for_every_request_and_leaves_nothing_running(tmp_path, report):
    cfg, out = _config(tmp_path), tmp_path / "run"
    t0 = time.time()
    demo = _Demo(
        "--config",
        str(cfg),
        "--start",
        "2",
        "--minutes",
        "2",
        "--time-scale",
        "0.25",
        "--rate-scale",
        "0.1",
        "--out",
        str(out),
        "--no-live",
    )
    code, stdout, err = demo.finish(timeout=240)
    wall = time.time() - t0
    assert code == 0, err[-3000:]
    _assert_nothing_left(demo.child_pids())
    doc = json.loads((out / "result.json").read_text())
    acc = doc["accounting"]
    assert acc["sent"] == acc["answered"] + acc["errors"] == acc["scheduled"]
    assert acc["errors"] == 0 and acc["not_sent"] == 0, acc
    assert set(acc["by_status"]) <= {"200", "503"}, doc["failures"]
    with (out / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == acc["scheduled"]
    ok = {r["model"] for r in rows if r["status"] == "200"}
    assert ok == {"resnet18", "resnet34", "synth-a", "synth-b"}  # every model answered
    md = (out / "report.md").read_text()
    assert (out / "timeline.png").stat().st_size > 5_000
    assert f"sent {acc['sent']:,} = answered {acc['answered']:,}" in md and "Partial" not in md
    # the autoscaler's decisions (it plans at its first tick) and the machine, with a verdict
    assert "## Autoscaler decisions" in md and "long_term decision" in md, md
    assert "## The machine" in md and "Verdict: " in md and "| 1 | " in md
    assert f"report: {out / 'report.md'}" in stdout and f"sent {acc['sent']:,} = answered" in stdout
    assert (out / "serve.log").stat().st_size > 0
    report(
        f"live demo: {acc['sent']} sent, by status {acc['by_status']}, errors {acc['errors']}, "
        f"{wall:.0f} s wall (startup included)"
    )


@pytest.mark.slow
def test_live_demo_ctrl_c_writes_a_partial_report_and_shuts_down(tmp_path, report):
    cfg, out = _config(tmp_path, models={"synth-a", "synth-b"}), tmp_path / "run"
    demo = _Demo(
        "--config",
        str(cfg),
        "--map",
        "job7=synth-a,job1=synth-b",
        "--time-scale",
        "0.5",
        "--rate-scale",
        "0.2",
        "--out",
        str(out),
        "--no-live",
    )
    assert demo.wait_for("ready after", timeout=240), "".join(demo.err)[-3000:]
    time.sleep(12)  # a trace minute lasts 30 s: stop within the first
    t0 = time.time()
    demo.proc.send_signal(signal.SIGINT)
    code, stdout, err = demo.finish(timeout=120)
    assert code == 130, err[-3000:]
    _assert_nothing_left(demo.child_pids())
    md = (out / "report.md").read_text()
    assert "Partial report: interrupted (Ctrl-C)" in md
    acc = json.loads((out / "result.json").read_text())["accounting"]
    assert acc["sent"] == acc["answered"] + acc["errors"] and acc["not_sent"] > 0 and acc["sent"] > 0
    assert "partial report (interrupted)" in stdout
    report(f"demo Ctrl-C: {acc['sent']} sent, {acc['not_sent']} not sent, shut down in {time.time() - t0:.0f} s")


def test_report_explains_decisions_and_says_when_the_machine_was_the_bottleneck(tmp_path):
    """The report's decisions (from a real autoscaler loop's records) and the machine
    section: minute 2 has an oversubscribed CPU and synth-a's processing time tripled."""
    from test_serving_units import FakeCluster, config

    from autoscaler.driving.loop import AutoscalerLoop
    from faro_serve.demo.diagnosis import decisions_section, machine_minutes, machine_section

    cluster = FakeCluster({"a": 1, "b": 1})
    t = [0.0]
    loop = AutoscalerLoop(config(), cluster, clock=lambda: t[0])
    cluster.fronts["a"].update(arrivals_per_min=[2400] * 20, latency_ms=1440.0)
    loop.step()
    t[0] = 12.0
    loop.step()
    records = list(loop.history)
    assert records, "the loop decided nothing"
    lines = "\n".join(decisions_section(records, replay_start_wall=-30.0))
    assert "## Autoscaler decisions" in lines and "long-term plans" in lines
    assert "[t=30 s] long_term decision" in lines  # shifted to the replay's clock
    assert "estimated p99" in lines and "bound by the capacity" in lines
    assert "no decision" in "\n".join(decisions_section([], None))

    s, rec = _fake_run(minutes=3)
    polls = [
        (
            tt,
            {
                "models": {
                    "synth-a": {
                        "processing_ms": 150.0 * (3 if 30 <= tt < 60 else 1),
                        "replicas": 1 + int(tt > 40),
                        "target": 1 + int(tt >= 10),
                    },
                    "resnet18": {"processing_ms": 60.0, "replicas": 1, "target": 1},
                }
            },
        )
        for tt in np.arange(0.0, 90.0, 5.0)
    ]
    load = [(tt, 5.0 if 30 <= tt < 60 else 1.0) for tt in np.arange(0.0, 90.0, 5.0)]
    mm = machine_minutes(polls, load, ["synth-a", "resnet18"], 30.0, 3, cores=2)
    assert [bool(w) for w in mm["bound"]] == [False, True, False]
    assert "load average 5.0 on 2 cores" in mm["bound"][1][0] and "synth-a processing 450 ms" in mm["bound"][1][1]
    assert mm["lags"]["synth-a"] == [pytest.approx(45.0 - 10.0)]  # target 2 at 10 s, serving at 45 s
    md = "\n".join(
        machine_section(
            mm,
            ["synth-a", "resnet18"],
            {"synth-a": np.array([True, False, True]), "resnet18": np.ones(3, bool)},
            "warm-up: measured",
        )
    )
    assert "machine was the bottleneck in minute(s) 2 (minute 2: synth-a over the SLO)" in md
    assert "| 2 | 5.0 | 450 | 60 |" in md and "warm-up: measured" in md
    quiet = machine_minutes(polls[:6], [(0.0, 0.5)], ["synth-a"], 30.0, 1, cores=2)
    assert "the machine kept up in every minute" in "\n".join(machine_section(quiet, ["synth-a"]))


def test_the_demo_is_sized_to_the_machine_by_its_warm_up():
    """size_rate keeps the default where the busiest minutes fit, and on a slower machine
    (processing tripled) or a CPU-bound mix picks the largest scale that does."""
    from faro_serve.demo.warmup import ModelFit, check, size_rate
    from faro_serve.engine import min_replicas_for_slo

    def fits(factor):  # the ResNets compute (CPU ~ processing); synth-a sleeps
        return [
            ModelFit("resnet18", 400, 99, 0.25, 4, 60 * factor, 55 * factor, 5.0 / 0.3),
            ModelFit("resnet34", 600, 99, 0.25, 4, 100 * factor, 95 * factor, 2.0 / 0.3),
            ModelFit("synth-a", 720, 99, 0.25, 6, 154, 0.0, 18.0 / 0.3),
        ]

    scale, why = size_rate(fits(1), 0.3, 2.0, cores=2)
    assert scale == 0.3 and "fits this machine" in why
    slow, why = size_rate(fits(3), 0.3, 2.0, cores=2)
    assert 0.1 <= slow < 0.3 and "the default 0.3" in why and "compute needs" in why, why
    assert not check(fits(3), slow, 2.0, 2) and check(fits(3), slow + 0.01, 2.0, 2)
    # at the chosen scale every model's busiest minute is met within its max_replicas
    for f in fits(3):
        assert min_replicas_for_slo(f.peak_rps * slow, f.processing_ms / 1e3, f.slo_ms / 1e3, 0.99)[0] <= f.max_replicas
    # a CPU-bound model alone: the compute budget binds (half of one core here)
    heavy = [ModelFit("resnet50", 3000, 99, 0.25, 8, 400, 400, 6.0)]
    s, why = size_rate(heavy, 1.0, 2.0, cores=1)
    assert "compute needs" in why and 6.0 * s * 0.4 <= 0.5 + 1e-9 and s > 0.15
