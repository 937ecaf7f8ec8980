"""The Ray Serve history reader (forecasting/rayserve.py, issue 48) against a real Prometheus
serving a TSDB built with promtool from Ray Serve's own series, crafted so that the truth is
known: a replica that restarts (a counter reset), a deployment that appears mid-range, a
scrape gap. Every minute's arrivals must equal the requests counted in it; each oddity is
named in the notes. The live version (a real Ray Serve app scraped as it runs) is in
test_operations_live.py."""

import math
import re
import shutil
import subprocess
import time

import httpx
import numpy as np
import pytest
from live_helpers import free_port, wait_for

from autoscaler.driving.serve_metrics import ServeMetricsObserver
from faro_serve.meter_report import decode_meter_report
from forecasting.prometheus import PrometheusError
from forecasting.rayserve import REQUESTS, ServeMetricsStore, read_serve_history
from forecasting.serve_counters import _seconds, export_lag_s
from forecasting.serve_history import ServeHistory, ServeHistoryError, bucket_quantile

M = 60  # minutes in the range
SCRAPE = 15


def _series(rng, t0, scrapes, start=0, reset_at=None, gap=None):
    """(values at each scrape time, increments per scrape) of one replica's counter."""
    inc = rng.poisson(5, scrapes).astype(float)
    inc[:start] = 0
    vals, c = [], 0.0
    for j in range(scrapes):
        if reset_at is not None and j == reset_at:
            c = 0.0
        c += inc[j]
        t = t0 + SCRAPE * j
        if j < start or (gap and gap[0] < t - t0 <= gap[1]):
            continue
        vals.append((t, c))
    return vals, inc


def _truth(inc, t0, minutes):
    """Requests per minute (t0 + 60 k, t0 + 60 (k + 1)], scrape j at t0 + 15 j."""
    out = np.zeros(minutes)
    for j, x in enumerate(inc):
        k = math.ceil(SCRAPE * j / 60.0) - 1
        if 0 <= k < minutes:
            out[k] += x
    return out


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.skip("Debian's prometheus (with promtool) is not installed (make install as root installs it)")
    tmp = tmp_path_factory.mktemp("prom")
    rng = np.random.default_rng(7)
    t0 = (int(time.time()) // 60 - 180) * 60  # three hours ago: inside the retention
    scrapes = (M + 1) * 60 // SCRAPE + 1
    lines, truth = [], {}
    rep = {"r1": _series(rng, t0, scrapes), "r2": _series(rng, t0, scrapes, reset_at=80)}
    truth["a/A"] = sum(_truth(inc, t0, M) for _, inc in rep.values())
    newb = _series(rng, t0, scrapes, start=101)  # appears in minute 25
    truth["b/B"] = _truth(newb[1], t0, M)
    gapc = _series(rng, t0, scrapes, gap=(1800, 2040))  # no scrape in minutes 30-33
    truth["c/C"] = _truth(gapc[1], t0, M)
    for (app, dep, rid), (vals, _) in {
        ("a", "A", "r1"): rep["r1"],
        ("a", "A", "r2"): rep["r2"],
        ("b", "B", "r3"): newb,
        ("c", "C", "r4"): gapc,
    }.items():
        lab = f'application="{app}",deployment="{dep}",replica="{rid}",route="/{app}"'
        lines += [f"{REQUESTS}{{{lab}}} {v:g} {t}" for t, v in vals]
    for j in range(scrapes):  # A: two healthy replicas; its processing time histogram
        t = t0 + SCRAPE * j
        lines += [
            f'ray_serve_deployment_replica_healthy{{application="a",deployment="A",replica="{r}"}} 1 {t}'
            for r in ("r1", "r2")
        ]
        for le, share in (("50.0", 0.5), ("100.0", 0.9), ("+Inf", 1.0)):
            lines.append(
                f'ray_serve_deployment_processing_latency_ms_bucket{{application="a",'
                f'deployment="A",replica="r1",le="{le}"}} {share * 10 * j:g} {t}'
            )
    (tmp / "in.om").write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "in.om"), str(tmp / "data")],
        check=True,
        capture_output=True,
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp / "p.yml").write_text("global: {scrape_interval: 15s}\n")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / 'p.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: _ready(url), 30), "prometheus did not start"
        yield {"url": url, "t0": t0, "truth": truth, "incs": {"c/C": gapc[1].tolist()}}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ready(url):
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_every_minute_equals_the_requests_counted_in_it_and_each_oddity_is_named(prom, tmp_path):
    h = read_serve_history(prom["url"], M, end=prom["t0"] + 60 * M)
    assert h.start == prom["t0"] and h.minutes == M and sorted(h.deployments) == ["a/A", "b/B", "c/C"]
    a, b, c = (np.array(h.deployments[k].arrivals) for k in ("a/A", "b/B", "c/C"))
    truth = prom["truth"]
    assert np.allclose(a, truth["a/A"]), a - truth["a/A"]  # across r2's restart
    assert np.allclose(b, truth["b/B"]) and b[:25].sum() == 0 and b[25] > 0
    out = np.r_[30:35]
    keep = np.setdiff1d(np.arange(M), out)
    assert np.allclose(c[keep], truth["c/C"][keep])
    assert c[out].sum() == pytest.approx(truth["c/C"][out].sum())  # spread over the gap
    notes = " | ".join(h.notes)
    assert "a/A: 1 counter reset(s)" in notes
    assert "b/B: appears at minute 25" in notes
    # (Prometheus 2 reads a range [t - 1m, t], 3 (t - 1m, t]: the gap starts one minute apart)
    assert re.search(r"c/C: no scrape for [34] minute\(s\) after minute 3[01]: the requests", notes), notes
    dep = h.deployments["a/A"]
    assert set(dep.replicas) == {2.0}
    assert dep.processing_quantile(0.5) == pytest.approx(50.0, rel=0.02)
    assert 50 < dep.processing_quantile(0.7) < 100
    # the export: saved and read back, the same history
    back = ServeHistory.load(h.save(tmp_path / "export.json"))
    assert back.deployments["a/A"].arrivals == dep.arrivals and back.notes == h.notes
    assert back.select(["B"]).deployments.keys() == {"b/B"}
    with pytest.raises(ServeHistoryError, match="'Z' is not a deployment of this history; it has a/A, b/B, c/C"):
        back.select(["Z"])


def test_each_minute_is_read_as_late_as_ray_exports_and_prometheus_scrapes(prom):
    # Prometheus scrapes nothing now (an archived TSDB): Ray's own 10 s export and 10 s scrape
    assert export_lag_s(prom["url"]) == 10.0  # half of each
    assert export_lag_s(f"http://127.0.0.1:{free_port()}") == 10.0
    assert (_seconds("15s"), _seconds("1m30s"), _seconds("500ms"), _seconds("soon")) == (15.0, 90.0, 0.5, None)
    # read one scrape late, each minute holds the requests of (t0 + 60 k + 15, t0 + 60 (k + 1) + 15]
    t0, incs = prom["t0"], prom["incs"]["c/C"]
    h = read_serve_history(prom["url"], 20, end=t0 + 60 * 20, lag_s=SCRAPE)
    late = [sum(incs[4 * k + 2 : 4 * k + 6]) for k in range(20)]
    assert h.deployments["c/C"].arrivals == late
    assert late != list(prom["truth"]["c/C"][:20])


def test_the_same_minutes_serve_as_the_autoscalers_restore_source_and_its_observation(prom):
    t0, truth = prom["t0"], prom["truth"]
    store = ServeMetricsStore(prom["url"], {"mA": ("a", "A")})
    got = store.load("mA", 40, end_minute=t0 // 60 + 40)  # minutes 0..39 of the range
    assert np.allclose(got, truth["a/A"][:40])
    # what a shadow autoscaler reads 5 s into minute 41: a meter's report of the 30 minutes
    # before minute 40, the minute that ended 5 s ago still open (its last scrapes may be
    # missing: serve_metrics.LAG_S), decoded strictly
    obs = ServeMetricsObserver(prom["url"], 30, clock=lambda: t0 + 60 * 41 + 5)
    raw = obs.reports(
        {"mA": ("a", "A"), "mB": ("b", "B"), "gone": ("x", "X")}, {"mA": 2, "mB": 1}, {"mA": 99.0, "mB": 95.0}
    )
    assert sorted(raw) == ["mA", "mB"]
    ra = decode_meter_report(raw["mA"], "mA")
    assert np.allclose(ra.arrivals_per_min, truth["a/A"][10:40]) and ra.replicas == 2
    rb = decode_meter_report(raw["mB"], "mB")
    assert np.allclose(rb.arrivals_per_min, truth["b/B"][25:40])  # from its first minute on
    assert ra.current_minute_elapsed_s == pytest.approx(65.0)
    assert ra.arrival_rate == pytest.approx(truth["a/A"][39:41].mean() / 60, rel=0.5)
    assert ra.processing.mean_ms is None or ra.processing.mean_ms > 0


def test_a_bad_url_an_empty_range_and_no_ray_metrics_are_one_clear_error(prom):
    with pytest.raises(PrometheusError, match="cannot read Prometheus"):
        read_serve_history(f"http://127.0.0.1:{free_port()}", 10)
    with pytest.raises(ServeHistoryError, match="no Ray Serve requests in the 10 minutes before"):
        read_serve_history(prom["url"], 10, end=prom["t0"] - 3600)
    with pytest.raises(ServeHistoryError, match="minutes must be between 1 and"):
        read_serve_history(prom["url"], 0)


def test_forecast_train_reads_ray_serves_counters_where_there_are_no_faro_series(prom, cli, tmp_path):
    code, out, err = cli(
        "forecast",
        "train",
        "--from",
        prom["url"],
        "--current",
        "fallback",
        "--prometheus-minutes",
        "400",
        "--holdout-minutes",
        "20",
        "--max-steps",
        "5",
        "--out",
        str(tmp_path / "fc"),
    )
    # trained on the three deployments' minutes and judged (5 steps: saved or not, either way)
    assert code in (0, 1) and "no faro arrivals" not in err, (code, out, err)
    assert "loss" in out + err


def test_a_new_autoscaler_without_a_store_starts_from_the_clusters_prometheus_history(prom, tmp_path):
    """``prometheus_url`` and no ``history_dir``: the first tick's history of a model whose
    meter has just started (3 minutes) is Ray Serve's minutes before them, then the meter's."""
    from meter_reports import meter_report

    from autoscaler.driving.driver import MeterSnapshot
    from autoscaler.driving.history import HistoryKeeper
    from faro_serve.config import ModelSLO
    from faro_serve.serving.autoscaler_deployment import open_history
    from faro_serve.serving.schema import parse_autoscaler_config

    t0, truth = prom["t0"], prom["truth"]
    cfg = parse_autoscaler_config(
        {
            "cluster": {"cpus": 2},
            "prometheus_url": prom["url"],
            "models": [ModelSLO(name="mA", app="a", deployment="A", slo_ms=720).model_dump()],
        }
    )
    store = open_history(cfg)
    assert store is not None and store.where == {"mA": ("a", "A")}
    # one history source protocol: Prometheus's counters and the SQLite store both are one
    from forecasting.store import ArrivalStore, HistorySource

    assert isinstance(store, HistorySource) and isinstance(ArrivalStore(tmp_path), HistorySource)
    keeper = HistoryKeeper(store, keep_minutes=40)
    now = t0 + 60 * 45 + 10  # the meter's minutes: 42, 43, 44; minute 45 open for 10 s
    raw = {"mA": meter_report("mA", arrivals_per_min=[1.0, 2.0, 3.0], current_minute_elapsed_s=10.0)}
    snaps = {"mA": MeterSnapshot.from_meter(raw["mA"])}
    joined = keeper.observe(now, raw, snaps)["mA"].arrivals_per_min
    assert joined.size == 40 and list(joined[-3:]) == [1.0, 2.0, 3.0]
    assert np.allclose(joined[:-3], truth["a/A"][5:42])  # Prometheus's minutes 5..41 before them
    assert keeper.status()["joined_minutes"] == {"mA": 37}


def test_the_service_time_is_read_in_the_quietest_minutes():
    """Ray times a request from when a replica admits it: in a busy minute the wait for the
    user's code is in it. The quietest quarter of the minutes (fewest requests per replica)
    gives the service time."""
    from forecasting.serve_history import DeploymentHistory

    le = [50.0, 100.0, 200.0, math.inf]
    quiet, busy = [80.0, 100.0, 100.0, 100.0], [0.0, 20.0, 300.0, 400.0]  # 80 % under 50 ms; mostly slow
    d = DeploymentHistory(
        "a",
        "A",
        arrivals=[100, 400, 100, 400, 400, 400, 400, 400],
        replicas=[1, 1, 1, 1, 2, 2, 1, 1],
        processing_le=le,
        processing_counts=list(np.add(np.multiply(quiet, 2), np.multiply(busy, 6))),
        processing_mean_ms=150.0,
        processing_step_s=60.0,
        processing_steps=[quiet, busy, quiet, busy, busy, busy, busy, busy],
        processing_step_ms=[4000.0, 60000.0, 4000.0, 60000.0, 60000.0, 60000.0, 60000.0, 60000.0],
    )
    counts, mean = d.quiet_processing()
    assert counts == [160.0, 200.0, 200.0, 200.0] and mean == pytest.approx(40.0)  # the 2 quiet minutes
    assert d.processing_quantile(0.5) > 100 > bucket_quantile(le, counts, 0.5)
    old = DeploymentHistory(
        "a", "A", arrivals=[1], replicas=[1], processing_le=le, processing_counts=[1, 2, 3, 4], processing_mean_ms=99.0
    )
    assert old.quiet_processing() == ([1, 2, 3, 4], 99.0)  # an export without the steps


def test_the_service_time_is_taken_out_of_rays_processing_time():
    """A replica of one-at-a-time code that admits several requests: Ray's processing time is
    its sojourn, T = S + lam S^2 / (2 (1 - lam S)) (M/D/1). 600 requests a minute on one
    replica of 50 ms service spend 75 ms each there; the service time read back is 50 ms, at
    any load, and a quiet minute's is its own time."""
    from forecasting.serve_history import service_time_ms

    assert service_time_ms([600], [600 * 75.0], [1]) == pytest.approx(50.0)
    assert service_time_ms([1200, 300], [1200 * 75.0, 300 * 75.0], [2, 1]) == pytest.approx(50.0)  # per replica
    assert service_time_ms([3], [3 * 50.0], [1]) == pytest.approx(50.0, rel=0.01)  # hardly any wait
    assert service_time_ms([0, 0], [0, 0], [1, 1]) is None
