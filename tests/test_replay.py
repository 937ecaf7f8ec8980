"""``faro-serve replay``: the open-loop Poisson schedule (pure) and one live replay on a real
local Ray Serve (paper section 6: the load generator; a dropped request is failed, not resent).

All traffic goes to loopback on free ports, bounded in count and time.
"""

from __future__ import annotations

import csv
import json
import socket
import time

import httpx
import numpy as np
import pytest

from faro_serve.ports import free_port
from faro_serve.replay.loadgen import build_schedule, check_url, parse_map, select_trace
from faro_serve.traces import Trace, TraceError


def _trace(counts, names=None) -> Trace:
    counts = np.asarray(counts, dtype=float)
    return Trace(names or [f"job{i}" for i in range(counts.shape[0])], counts)


def _csv(tmp_path, rows: dict[str, list[float]], name="t.csv"):
    p = tmp_path / name
    with p.open("w") as f:
        f.write("minute,job,requests\n")
        for job, counts in rows.items():
            for m, c in enumerate(counts):
                f.write(f"{m},{job},{c}\n")
    return p


# ---------------------------------------------------------------- the pure schedule


def test_counts_are_respected_on_average_and_instants_fall_in_their_minute():
    tr = _trace([[30, 120, 0, 60], [5, 5, 5, 5]])
    per_minute = np.zeros((2, 4))
    runs = 200
    for seed in range(runs):
        s = build_schedule(tr, seed=seed)
        assert np.all(np.diff(s.send_s) >= 0)  # sorted by send time
        minute = np.floor(s.trace_s / 60).astype(int)
        np.add.at(per_minute, (s.model, minute), 1)
        assert np.array_equal(np.bincount(s.model * 4 + minute, minlength=8).reshape(2, 4), s.counts)
    mean = per_minute / runs
    # Poisson mean within 4 standard errors of the trace count; a zero minute stays empty
    se = np.sqrt(np.maximum(tr.counts, 1) / runs)
    assert np.all(np.abs(mean - tr.counts) < 4 * se), mean
    assert mean[0, 2] == 0


def test_instants_are_uniform_within_a_minute():
    s = build_schedule(_trace([[20000]]), seed=1)
    hist, _ = np.histogram(s.trace_s, bins=6, range=(0, 60))
    assert s.trace_s.min() >= 0 and s.trace_s.max() < 60
    assert np.all(np.abs(hist / s.size - 1 / 6) < 0.01), hist


def test_the_same_seed_gives_the_same_schedule_and_another_seed_does_not():
    tr = _trace([[40, 50], [10, 70]])
    a, b, c = build_schedule(tr, seed=7), build_schedule(tr, seed=7), build_schedule(tr, seed=8)
    assert np.array_equal(a.model, b.model) and np.array_equal(a.send_s, b.send_s)
    assert not (a.size == c.size and np.array_equal(a.send_s, c.send_s))


def test_time_scale_compresses_send_times_but_not_trace_time():
    tr = _trace([[30, 30, 30]])
    a, b = build_schedule(tr, time_scale=1.0, seed=3), build_schedule(tr, time_scale=0.25, seed=3)
    assert np.array_equal(a.trace_s, b.trace_s)  # the same requests, the same metric minutes
    assert np.allclose(b.send_s, a.send_s * 0.25)
    assert b.duration_s == pytest.approx(45.0) and a.duration_s == pytest.approx(180.0)
    assert b.send_s.max() < 45.0


def test_rate_scale_multiplies_the_counts():
    tr = _trace([[100, 200, 300]])
    sizes = {y: np.mean([build_schedule(tr, rate_scale=y, seed=s).size for s in range(50)]) for y in (0.1, 1.0, 2.0)}
    assert sizes[0.1] == pytest.approx(60, rel=0.1)
    assert sizes[1.0] == pytest.approx(600, rel=0.05)
    assert sizes[2.0] == pytest.approx(1200, rel=0.05)
    assert build_schedule(tr, rate_scale=0.0).size == 0


def test_select_and_map_jobs_to_models():
    tr = _trace([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    sub, names = select_trace(tr, None, parse_map("job2=synth-a,job0=synth-b"), start=1, minutes=2)
    assert sub.names == ["job2", "job0"] and names == ["synth-a", "synth-b"]
    assert sub.counts.tolist() == [[8, 9], [2, 3]]
    _, names = select_trace(tr, ["job1"], {}, 0, None)
    assert names == ["job1"]
    with pytest.raises(TraceError, match="beyond"):
        select_trace(tr, None, {}, start=2, minutes=5)
    with pytest.raises(TraceError, match="not in trace"):
        select_trace(tr, ["job7"], {}, 0, None)
    with pytest.raises(ValueError, match="JOB=MODEL"):
        parse_map("job0:synth-a")


def test_a_schedule_over_the_cap_is_refused_not_truncated():
    with pytest.raises(ValueError, match="max-requests"):
        build_schedule(_trace([[1000, 1000]]), max_requests=500)
    with pytest.raises(ValueError, match="time-scale"):
        build_schedule(_trace([[1]]), time_scale=0)


def test_only_loopback_unless_allowed():
    for ok in ("http://127.0.0.1:8000", "http://localhost:1/", "http://127.3.2.1:80", "http://[::1]:8000"):
        assert check_url(ok).startswith("http")
    for bad in ("http://10.0.0.1:8000", "http://example.com", "http://0.0.0.0:8000"):
        with pytest.raises(ValueError, match="allow-remote"):
            check_url(bad)
    assert check_url("http://10.0.0.1:8000", allow_remote=True) == "http://10.0.0.1:8000"
    with pytest.raises(ValueError, match="--url"):
        check_url("127.0.0.1:8000")


# ---------------------------------------------------------------- the sender, on a tiny local server


async def _serve_tiny(handler_delay: dict[str, float], seen: list | None = None):
    """A minimal HTTP/1.1 server on loopback: /slow/predict answers 200 after a delay,
    /trickle/predict sends its body one byte every 0.3 s (12 s in all), /drop/predict
    answers 503 at once (reason drop_rate), anything else 404."""
    import asyncio

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if line.lower().startswith(b"x-faro-network-ms:") and seen is not None:
                    seen.append(float(line.split(b":")[1]))
            if length:
                await reader.readexactly(length)
            model = path.strip("/").split("/")[0]
            if model == "slow":
                await asyncio.sleep(handler_delay["slow"])
                code, body = "200 OK", b'{"result": "ok"}'
            elif model == "trickle":  # headers at once, then one body byte every 0.3 s
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 40\r\nConnection: close\r\n\r\n"
                )
                for _ in range(40):
                    await writer.drain()
                    await asyncio.sleep(0.3)
                    writer.write(b" ")
                return
            elif model == "drop":
                code, body = "503 Service Unavailable", b'{"error": "dropped", "reason": "drop_rate"}'
            else:
                code, body = "404 Not Found", b'{"error": "no such model"}'
            writer.write(
                f"HTTP/1.1 {code}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _send(schedule, **kw):
    import asyncio

    from faro_serve.replay.client import send_schedule

    async def go():
        server = await _serve_tiny({"slow": kw.pop("delay", 1.0)}, kw.pop("seen", None))
        port = server.sockets[0].getsockname()[1]
        try:
            return await send_schedule(schedule, f"http://127.0.0.1:{port}", status_every_s=None, **kw)
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(go())


def test_open_loop_sends_on_time_whatever_the_answers_and_counts_the_cap():
    # 40 requests to a model answering after 1.5 s, all due within 2 s (time scale 1/30)
    s = build_schedule(_trace([[40]]), names=["slow"], time_scale=1 / 30, seed=2)
    rec = _send(s, delay=1.5, max_in_flight=1000, timeout_s=10)
    c = rec.counts()
    assert c["sent"] == c["answered"] == c["by_status"]["200"] == s.size and c["errors"] == 0
    lag = rec.send_s - s.send_s
    assert np.nanmax(lag) < 0.3, lag  # nobody waited for an answer before sending
    assert np.nanmin(rec.latency_s) > 1.4
    assert rec.wall_s < s.duration_s + 3.0
    # with at most 5 open requests and answers after 3 s: the rest are not sent, and counted
    rec = _send(s, delay=3.0, max_in_flight=5, timeout_s=10)  # none answers within the 2 s
    c = rec.counts()
    assert c["sent"] == 5 and c["not_sent"] == s.size - 5 and c["scheduled"] == s.size


def test_a_network_delay_travels_in_a_header_and_counts_in_the_latency():
    """--network-delay (Sponge's budgets, issue 20): each request declares its drawn network
    time in x-faro-network-ms; the report's latency is that plus the answer time; the
    schedule's counts and instants are the ones without a network."""
    from faro_serve.replay.network import draw_network, parse_network
    from faro_serve.replay.replay_report import client_latency, replay_result

    plain = build_schedule(_trace([[40]]), names=["slow"], time_scale=1 / 30, seed=2)
    s = build_schedule(_trace([[40]]), names=["slow"], time_scale=1 / 30, seed=2, network=parse_network("const:0.3"))
    assert np.array_equal(s.trace_s, plain.trace_s) and s.network == "const:0.3"
    seen: list = []
    rec = _send(s, delay=0.2, timeout_s=10, seen=seen)
    assert seen == [300.0] * s.size
    _send(plain, delay=0.0, timeout_s=10, seen=seen)
    assert len(seen) == s.size  # the schedule without a network sent no header
    served, lat = client_latency(s, rec)
    assert served.all() and np.allclose(lat, rec.latency_s + 0.3)
    # an SLO the fastest answer meets alone (by 150 ms), and no answer with its 300 ms of network
    slo_ms = 1e3 * (float(np.min(rec.latency_s)) + 0.15)
    res = replay_result(s, rec, {"slow": slo_ms}, {"slow": 99.0})
    assert res.summary.cluster_slo_violation_rate == 1.0
    # Sponge's bandwidth walk: 0.2 MB at 0.5-7 MB/s plus 20 ms, one bandwidth per second
    net = draw_network(parse_network("bandwidth"), np.arange(0, 600, 0.05), seed=3)
    assert 0.2 / 7 + 0.02 - 1e-9 <= net.min() < 0.1 and 0.2 < net.max() <= 0.2 / 0.5 + 0.02 + 1e-9
    per_second = net.reshape(600, 20)
    assert np.allclose(per_second, per_second[:, :1])
    with pytest.raises(ValueError, match="more than 60 s"):
        draw_network(parse_network("const:61"), np.zeros(3))


def test_a_503_is_a_failed_request_not_resent_and_errors_are_counted():
    from faro_serve.replay.replay_report import replay_result

    s = build_schedule(_trace([[30, 30], [30, 30]]), names=["slow", "drop"], time_scale=1 / 60, seed=4)
    rec = _send(s, delay=0.05, timeout_s=10)
    c = rec.counts()
    n_drop = int((s.model == 1).sum())
    assert c["by_status"] == {"200": s.size - n_drop, "503": n_drop} and c["sent"] == s.size  # once each
    assert {r for st, r in zip(rec.status, rec.reason) if st == "503"} == {"drop_rate"}
    res = replay_result(s, rec, {"slow": 1000.0, "drop": 1000.0}, {"slow": 99.0, "drop": 99.0})
    assert res.summary.job_dropped.tolist() == [0, n_drop]
    assert res.summary.job_slo_violation_rate.tolist() == [0.0, 1.0]  # a drop violates the SLO
    assert res.summary.job_lost_utility[1] == 1.0 and res.summary.job_lost_utility[0] == 0.0
    # a closed port: every request is an error, and still accounted for
    import asyncio

    from faro_serve.replay.client import send_schedule

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rec = asyncio.run(send_schedule(s, f"http://127.0.0.1:{port}", status_every_s=None, timeout_s=5))
    c = rec.counts()
    assert c["errors"] == c["sent"] == s.size and c["answered"] == 0


def test_the_timeout_bounds_the_whole_request_not_each_read():
    # every read of the trickling answer comes within 0.3 s, far below the 1.5 s timeout,
    # but the whole answer takes 12 s: the request must end as a timeout after about 1.5 s
    s = build_schedule(_trace([[3]]), names=["trickle"], time_scale=1 / 60, seed=1)
    t0 = time.perf_counter()
    rec = _send(s, timeout_s=1.5)
    c = rec.counts()
    assert c["sent"] == c["errors"] == s.size and c["answered"] == 0
    assert set(rec.reason) == {"TimeoutError"}
    assert time.perf_counter() - t0 < 6.0


# ---------------------------------------------------------------- the command's bad input


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--url", "http://192.168.1.5:8000"], "not a loopback address"),
        (["--time-scale", "0"], "--time-scale must be > 0"),
        (["--rate-scale", "-1"], "--rate-scale must be >= 0"),
        (["--minutes", "9"], "beyond the trace"),
        (["--jobs", "nope"], "not in trace"),
        (["--map", "a=b"], "jobs not in trace: a"),
        (["--jobs", "job0", "--map", "job1=b"], "--map names job(s) not replayed"),
        (["--map", "junk"], "JOB=MODEL"),
        (["--max-requests", "10", "--rate-scale", "100"], "above --max-requests"),
        (["--max-in-flight", "0"], "--max-in-flight must be >= 1"),
        (["--network-delay", "fast"], "--network-delay 'fast': cannot read distribution"),
        (["--network-delay", "bandwidth:0"], "PAYLOAD_MB > 0"),
        (["--slo-ms", "500", "--out", "/dev/null"], "--out /dev/null: is a file, not a directory"),
    ],
)
def test_bad_flags_exit_2_with_one_line(cli, tmp_path, extra, message):
    trace = _csv(tmp_path, {"job0": [10, 20, 30], "job1": [5, 5, 5]})
    code, out, err = cli("replay", "--trace", str(trace), "--out", str(tmp_path / "o"), *extra)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("faro-serve: error:") and message in lines[0], err


def test_bad_trace_exits_2(cli, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("minute,job\n0,a\n")
    for path in (bad, tmp_path / "missing.csv"):
        code, _, err = cli("replay", "--trace", str(path))
        assert code == 2 and len(err.strip().splitlines()) == 1 and "faro-serve: error:" in err


def test_nothing_listening_is_a_clear_error(cli, tmp_path):
    trace = _csv(tmp_path, {"job0": [1]})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code, _, err = cli(
        "replay", "--trace", str(trace), "--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "o")
    )
    assert code == 2 and "cannot reach" in err and len(err.strip().splitlines()) == 1
    # told the SLO, it does not ask the server first: every request fails to connect, the
    # records are written, and it says so and exits 1 rather than report a lost run as a result
    code, out, err = cli(
        "replay",
        "--trace",
        str(trace),
        "--url",
        f"http://127.0.0.1:{port}",
        "--slo-ms",
        "500",
        "--time-scale",
        "0.02",
        "--no-progress",
        "--out",
        str(tmp_path / "o"),
    )
    assert code == 1 and "errors 1" in out
    assert err.strip().splitlines()[-1] == (
        f"faro-serve: error: no request was answered (error:ClientConnectorError 1); is faro-serve "
        f"serving at http://127.0.0.1:{port}? (records kept in {tmp_path / 'o'})"
    )
    assert (tmp_path / "o" / "records.csv").is_file() and (tmp_path / "o" / "result.json").is_file()


# ---------------------------------------------------------------- live: a real local Ray Serve

SIM_KEYS = {
    "policy",
    "capacity",
    "seed",
    "lost_cluster_utility",
    "lost_effective_utility",
    "cluster_slo_violation_rate",
    "fairness",
    "wall_s",
    "minutes",
    "requests",
    "dropped",
    "decisions",
    "jobs",
    "forecaster",
}


@pytest.fixture(scope="module")
def serving():
    import ray
    from ray import serve

    from faro_serve.config import ClusterSpec, ModelSLO
    from faro_serve.serving.app import deploy

    dash, http = free_port(), free_port()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dash,
        log_to_driver=False,
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http})
        models = [
            (
                ModelSLO(name="synth-a", slo_ms=720, processing_ms=154, cpus=0.25, max_replicas=4),
                {"model": {"kind": "synthetic"}},
            ),
            (
                ModelSLO(name="synth-b", slo_ms=300, processing_ms=50, cpus=0.25, max_replicas=4),
                {"model": {"kind": "synthetic", "processing": "const:0.05"}},
            ),
        ]
        cluster = ClusterSpec(
            cpus=2,
            objective="fair_sum",
            long_term_interval_s=30,
            window_s=120,
            cold_start_s=10,
            reactive_interval_s=2,
            reactive_trigger_s=6,
        )
        deploy(models, cluster, dashboard_url=f"http://127.0.0.1:{dash}", forecaster="fallback")
        base = f"http://127.0.0.1:{http}"
        end = time.time() + 90
        while time.time() < end:  # the autoscaler knows the SLOs after its first tick
            try:
                st = httpx.get(f"{base}/faro/status", timeout=5, trust_env=False).json()
                if {"synth-a", "synth-b"} <= set(st.get("models", {})):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        yield base
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.slow
def test_live_replay_accounts_for_every_request_and_reports_the_simulate_metrics(serving, cli, tmp_path, report):
    # two trace minutes of two jobs at 20 s per minute (time scale 1/3): about 80 s of load
    trace = _csv(tmp_path, {"job0": [240, 360, 300], "job1": [120, 120, 200]})
    out = tmp_path / "run"
    t0 = time.time()
    code, stdout, err = cli(
        "replay",
        "--trace",
        str(trace),
        "--map",
        "job0=synth-a,job1=synth-b",
        "--minutes",
        "2",
        "--time-scale",
        "0.3333",
        "--rate-scale",
        "0.5",
        "--url",
        serving,
        "--out",
        str(out),
        "--seed",
        "3",
        "--no-progress",
        "--step-at",
        "60",
    )
    wall = time.time() - t0
    assert code == 0, err
    assert wall < 120
    doc = json.loads((out / "result.json").read_text())
    assert SIM_KEYS <= set(doc), SIM_KEYS - set(doc)
    acc = doc["accounting"]
    assert acc["errors"] == 0 and acc["not_sent"] == 0, acc
    assert acc["sent"] == acc["answered"] == sum(acc["by_status"].values()) == acc["scheduled"]
    assert set(acc["by_status"]) <= {"200", "503"}
    assert acc["by_status"].get("200", 0) > 0
    assert doc["requests"] == acc["sent"] and doc["dropped"] == acc["by_status"].get("503", 0)
    assert set(doc["jobs"]) == {"synth-a", "synth-b"} and doc["minutes"] == 2
    assert doc["policy"].startswith("faro") and doc["capacity"] == 2
    assert len(doc["per_minute_p99_ms"]["synth-a"]) == 2
    with (out / "records.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == acc["scheduled"]
    assert {r["model"] for r in rows} == {"synth-a", "synth-b"}
    served = [float(r["latency_ms"]) for r in rows if r["status"] == "200"]
    assert min(served) > 40  # a synthetic model sleeps; a 200 is a real answer
    # the surge metrics of the step at trace second 60 (job0: 240 -> 360 per minute)
    surge = doc["surge"]
    assert surge["step_s"] == 60 and set(surge["models"]) == {"synth-a", "synth-b"}
    after = [r for r in rows if 60 <= float(r["trace_s"]) < 180]
    for n, m in surge["models"].items():
        mine = [r for r in after if r["model"] == n]
        assert m["requests"] == len(mine)
        assert m["dropped"] == sum(r["status"] != "200" for r in mine)
        assert m["recovery_s"] is None or 0 <= m["recovery_s"] <= 60
    assert "step at 60 s" in stdout
    # the table and the accounting line are printed
    assert "lost cluster utility" in stdout and f"sent {acc['sent']:,} = answered" in stdout
    # the metric code is the simulator's: recomputing from the records gives the same numbers
    from faro_serve.metrics import summarize_records

    names = ["synth-a", "synth-b"]
    s = summarize_records(
        names,
        [names.index(r["model"]) for r in rows],
        [float(r["trace_s"]) for r in rows],
        [float(r["latency_ms"]) / 1e3 if r["latency_ms"] else np.nan for r in rows],
        [r["status"] != "200" for r in rows],
        np.array([0.72, 0.3]),
        minutes=2,
    )
    assert s.lost_cluster_utility == pytest.approx(doc["lost_cluster_utility"], abs=1e-6)
    assert s.cluster_slo_violation_rate == pytest.approx(doc["cluster_slo_violation_rate"], abs=1e-6)
    report(
        f"live replay: {acc['sent']} sent, by status {acc['by_status']}, lost cluster utility "
        f"{doc['lost_cluster_utility']:.3f}, SLO violation rate {doc['cluster_slo_violation_rate']:.2%}, "
        f"p99 ms {doc['per_minute_p99_ms']}, {wall:.0f} s"
    )


def test_replay_and_simulator_draw_the_same_per_minute_counts_for_a_seed():
    """Matched validation needs a live replay and a simulated run of one seed to see the
    very same load: both draw their counts through faro_serve.sim.workload.draw_counts."""
    from faro_serve.distributions import NO_OVERHEAD, PAPER_PROCESSING
    from faro_serve.sim.workload import Workload

    trace = Trace(["a", "b"], np.array([[30.0, 60.0, 5.0, 0.0], [10.0, 0.0, 90.0, 44.0]]))
    for seed in (0, 7):
        sim = Workload(trace.counts, PAPER_PROCESSING, NO_OVERHEAD, seed=seed)
        live = build_schedule(trace, seed=seed)
        assert live.counts.tolist() == sim.counts.tolist()
        assert np.bincount(live.model, minlength=2).tolist() == sim.counts.sum(axis=1).tolist()


def test_a_simulator_draw_keeps_the_counts_and_redraws_each_request():
    """Matched validation's expected value (validation.compare.SIM_DRAWS): draw k > 0 is the
    same per-minute load with other arrival offsets and processing times; draw 0 is the
    seed's own stream, so earlier results stay reproducible."""
    from faro_serve.distributions import NO_OVERHEAD, PAPER_PROCESSING
    from faro_serve.sim.workload import Workload

    counts = np.array([[30.0, 60.0, 5.0], [10.0, 0.0, 90.0]])
    base, again = (Workload(counts, PAPER_PROCESSING, NO_OVERHEAD, seed=3) for _ in range(2))
    d1, d2 = (Workload(counts, PAPER_PROCESSING, NO_OVERHEAD, seed=3, draw=k) for k in (1, 2))
    assert base.counts.tolist() == d1.counts.tolist() == d2.counts.tolist()
    m0, m0b, m1, m2 = (w.minute(1) for w in (base, again, d1, d2))
    assert np.array_equal(m0.arrival, m0b.arrival) and np.array_equal(m0.proc, m0b.proc)
    assert m0.arrival.size == m1.arrival.size == m2.arrival.size
    assert not np.array_equal(m0.arrival, m1.arrival) and not np.array_equal(m1.arrival, m2.arrival)
    assert not np.array_equal(m0.proc, m1.proc)
    with pytest.raises(ValueError, match="draw must be >= 0"):
        Workload(counts, PAPER_PROCESSING, NO_OVERHEAD, draw=-1)


def test_status_on_loopback_ignores_a_proxy_from_the_environment(monkeypatch):
    import http.server
    import threading

    from faro_serve.commands._live import fetch_status

    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as sock:  # a proxy address where nothing listens
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{dead}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        assert fetch_status(f"http://127.0.0.1:{server.server_port}", timeout=5) == {"path": "/faro/status"}
    finally:
        server.shutdown()
        server.server_close()


def test_post_burst_records_every_answer_with_its_reason():
    """The flood sender of the tests and bench.flood, against a real loopback HTTP server:
    every request ends with its status (faro-serve's JSON reason, "ray" for a text error)
    or, where nothing listens, the error's name; never more open than asked."""
    import asyncio
    import http.server
    import threading

    from faro_serve.replay.client import post_burst

    lock, seen = threading.Lock(), {"n": 0, "open": 0, "max_open": 0}
    stop = threading.Event()  # set by the server at its 40th request (the second burst's 10th)

    class Server(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                seen["n"] += 1
                k = seen["n"]
                if k == 40:
                    stop.set()
                seen["open"] += 1
                seen["max_open"] = max(seen["max_open"], seen["open"])
            time.sleep(0.02)
            code, kind, body = (
                (200, "application/json", b"{}")
                if k % 3 == 1
                else (503, "application/json", b'{"reason": "queue_full"}')
                if k % 3 == 2
                else (500, "text/plain", b"Internal Server Error")
            )
            with lock:
                seen["open"] -= 1
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = asyncio.run(post_burst(f"http://127.0.0.1:{server.server_port}/m", 30, 4))
        assert len(res) == 30 and seen["n"] == 30 and seen["max_open"] <= 4
        # stopped from another thread: no request starts after, every one started is answered
        early = asyncio.run(post_burst(f"http://127.0.0.1:{server.server_port}/m", 2000, 4, rate=200.0, stop=stop))
    finally:
        server.shutdown()
    assert 10 <= len(early) == seen["n"] - 30 < 2000 and all(isinstance(r[0], int) for r in early)
    by_code = {c: [r for r in res if r[0] == c] for c in (200, 503, 500)}
    assert [len(v) for v in by_code.values()] == [10, 10, 10]
    assert {r[2] for r in by_code[200]} == {None} and {r[2] for r in by_code[503]} == {"queue_full"}
    assert {r[2] for r in by_code[500]} == {"ray"} and all(r[1] >= 0.02 for r in res)
    with socket.socket() as sock:  # nothing listens here: each request is an error, none lost
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    res = asyncio.run(post_burst(f"http://127.0.0.1:{dead}/m", 5, 2, rate=100.0))
    assert len(res) == 5 and all(isinstance(r[0], str) and r[2] is None for r in res)
