"""``faro-serve whatif`` (issue 48, item 2): a plain Ray Serve cluster's history, built here
from real per-minute counts (tests/data/guard_day9.csv), replayed as it ran and under Faro.

The report's figures are checked against the simulator called directly with the models,
policies and config the docs describe; the as-run replay against each deployment's own
settings; bad input against one clear line and exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.special import ndtr

from autoscaler import make_policy
from autoscaler.driving.forecasters import choose_forecaster
from autoscaler.policies.ray_rule import RayServePolicy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.sim import SimConfig, parse_dist, simulate
from faro_serve.traces import load_trace
from forecasting.serve_history import AppLatency, DeploymentHistory, ServeHistory, bucket_quantile

DATA = Path(__file__).resolve().parent / "data" / "guard_day9.csv"
START = 1_767_225_600.0  # 2026-01-01 00:00 UTC
MINUTES = 45
STEP = 15  # the Ranker's load triples from this minute
PROC_LE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, math.inf]  # Ray's buckets (ms)
LAT_LE = [50, 100, 200, 300, 500, 800, 1200, 2000, 5000, math.inf]
RANKER = {
    "min_replicas": 1,
    "max_replicas": 8,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 4,
    "downscale_delay_s": 60,
    "metrics_interval_s": 2,
    "look_back_period_s": 10,
}
CONFIGS = {
    "shop/Ranker": {
        "autoscaling_config": RANKER,
        "max_ongoing_requests": 2,
        "max_queued_requests": -1,
        "ray_actor_options": {"num_cpus": 1},
    },
    "shop/Ingress": {
        "num_replicas": 2,
        "max_ongoing_requests": 5,
        "max_queued_requests": -1,
        "ray_actor_options": {"num_cpus": 0.5},
    },
    "search/Embed": {
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 4},
        "max_ongoing_requests": 5,
        "max_queued_requests": -1,
        "ray_actor_options": {"num_cpus": 2, "num_gpus": 0.5},
    },
}
PROC = {"shop/Ranker": (80.0, 0.45), "shop/Ingress": (20.0, 0.3), "search/Embed": (200.0, 0.3)}  # median ms, shape


def cdf(le, median, shape):
    return np.array([1.0 if math.isinf(x) else float(ndtr(math.log(x / median) / shape)) for x in le])


def serve_history(minutes: int = MINUTES, ranker_config: dict | None = None) -> ServeHistory:
    """Three deployments on real counts: an autoscaling Ranker whose load triples at STEP, a
    fixed Ingress, a GPU Embed at Ray's default rule; processing histograms of known
    lognormals; each application's end-to-end latency per 5 minutes."""
    counts = dict(zip(*(lambda t: (t.names, t.counts))(load_trace(DATA, days=9, sample=0))))
    arr = {
        "shop/Ranker": counts["job1"][:minutes] / 4.0 * np.where(np.arange(minutes) >= STEP, 3, 1),
        "shop/Ingress": counts["job0"][:minutes] / 8.0,
        "search/Embed": counts["job2"][:minutes] / 10.0,
    }
    rec = {
        "shop/Ranker": np.ceil(arr["shop/Ranker"] * 0.09 / 60 / 0.6),
        "shop/Ingress": np.full(minutes, 2.0),
        "search/Embed": np.ceil(arr["search/Embed"] * 0.21 / 60 / 0.5),
    }
    rec["search/Embed"][0] = 2  # it starts above its minimum
    rec["search/Embed"][3] = np.nan  # a minute Prometheus did not scrape
    deps = {}
    for key, a in arr.items():
        app, dep = key.split("/")
        med, s = PROC[key]
        cfg = dict(CONFIGS[key])
        if key == "shop/Ranker" and ranker_config:
            cfg["autoscaling_config"] = {**RANKER, **ranker_config}
        deps[key] = DeploymentHistory(
            app,
            dep,
            a.round(3).tolist(),
            rec[key].tolist(),
            PROC_LE,
            (cdf(PROC_LE, med, s) * a.sum()).round(1).tolist(),
            med * math.exp(s * s / 2),
            cfg,
        )
    lat = {}
    for app, n, med in (
        ("shop", arr["shop/Ranker"] + arr["shop/Ingress"], 150.0),
        ("search", arr["search/Embed"], 300.0),
    ):
        steps = np.add.reduceat(n, np.arange(0, minutes, 5))
        lat[app] = AppLatency(LAT_LE, 300.0, (steps[:, None] * cdf(LAT_LE, med, 0.6)[None, :]).round(2).tolist())
    return ServeHistory(START, minutes, deps, lat, ["read from a test"], "test-history")


ARGS = (
    "--capacity",
    "16",
    "--capacity-gpus",
    "2",
    "--slo",
    "shop/Ranker=500@99",
    "--forecaster",
    "fallback",
    "--seed",
    "3",
)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return serve_history().save(tmp_path_factory.mktemp("whatif") / "export.json")


@pytest.fixture(scope="module")
def report(export) -> dict:
    """One run of the command, in-process, on the export (saved and loaded as a user's)."""
    from faro_serve.cli import main

    out = export.parent / "report"
    assert main(["whatif", "--export", str(export), *ARGS, "--out", str(out)]) == 0
    return {"dir": out, "json": json.loads((out / "whatif.json").read_text()), "md": (out / "report.md").read_text()}


def _direct(hist: ServeHistory, f: dict):
    """Both runs with the simulator called here, set up as docs/whatif.md says."""
    keys = sorted(hist.deployments)
    names = [k.replace("/", ".") for k in keys]
    rows = [f["deployments"][k] for k in keys]
    slo = {
        k: (500.0, 99.0)
        if k == "shop/Ranker"
        else (round(bucket_quantile(LAT_LE, np.sum(hist.latency[k.split("/")[0]].counts, axis=0), 0.99), 1), 99.0)
        for k in keys
    }
    cpus = {k: float(CONFIGS[k]["ray_actor_options"]["num_cpus"]) for k in keys}
    gpus = {k: float(CONFIGS[k]["ray_actor_options"].get("num_gpus", 0)) for k in keys}
    bounds = {"shop/Ranker": (1, 8), "shop/Ingress": (2, 2), "search/Embed": (1, 4)}
    mean = {k: hist.deployments[k].processing_mean_ms for k in keys}

    def model(k, n, lo, hi):
        return ModelSLO(
            name=n,
            slo_ms=slo[k][0],
            percentile=slo[k][1],
            processing_ms=mean[k],
            min_replicas=lo,
            max_replicas=hi,
            cpus=cpus[k],
            gpus=gpus[k],
        )

    ray_models = [model(k, n, *bounds[k]) for k, n in zip(keys, names)]
    faro_models = [
        model(k, n, 1, min(int(16 // cpus[k]), int(2 // gpus[k]) if gpus[k] else 10**9)) for k, n in zip(keys, names)
    ]
    counts = np.array([hist.deployments[k].arrivals for k in keys])
    # max_ongoing_requests: 5 for two of three (the most common); max_queued_requests -1
    cfg = SimConfig(
        capacity_cpus=16,
        capacity_gpus=2,
        queue_limit=10**6,
        queue_per_replica=4,
        processing=tuple(parse_dist(r["processing"]) for r in rows),
        seed=3,
        initial_replicas={n: int(hist.deployments[k].replicas[0]) for k, n in zip(keys, names)},
    )
    cluster = ClusterSpec(cpus=16, gpus=2)
    defaults = {
        "target_ongoing_requests": 2,
        "upscale_delay_s": 30,
        "downscale_delay_s": 600,
        "look_back_period_s": 30,
        "metrics_interval_s": 10,
    }
    rules = {"shop.Ranker": {k: v for k, v in RANKER.items() if "replicas" not in k}, "search.Embed": defaults}
    ray = simulate(counts, ray_models, RayServePolicy(ray_models, cluster, per_model=rules), cfg)
    faro = simulate(
        counts, faro_models, make_policy("faro-fairsum", faro_models, cluster, choose_forecaster("fallback")[0]), cfg
    )
    return keys, ray, faro


def test_the_report_is_the_simulator_called_directly_with_each_deployments_settings(report, export):
    f = report["json"]
    hist = ServeHistory.load(export)
    keys, ray, faro = _direct(hist, f)
    assert list(f["deployments"]) == keys
    for res, col in ((ray, "as_run"), (faro, "faro")):
        for i, k in enumerate(keys):
            row = f["deployments"][k]
            bad = int(res.table.over_slo[i].sum() + res.table.dropped[i].sum())
            hours = res.targets[:, i].sum() * res.tick_s / 3600
            assert row["requests"] == int(res.summary.job_requests[i])
            assert row[col]["violating"] == bad and row[col]["dropped"] == int(res.summary.job_dropped[i])
            assert row[col]["slo_violation_rate"] == pytest.approx(bad / row["requests"], abs=1e-6)
            assert row[col]["replica_hours"] == pytest.approx(hours, abs=1e-3)
            assert row[col]["gpu_hours"] == pytest.approx(hours * row["gpus"], abs=1e-3)
        tot = f["total"][col]
        assert tot["violating"] == int(res.table.over_slo.sum() + res.table.dropped.sum())
        assert tot["replica_hours"] == pytest.approx(res.targets.sum() * res.tick_s / 3600, abs=1e-2)
    assert f["total"]["requests"] == int(ray.summary.job_requests.sum()) == int(faro.summary.job_requests.sum())
    # the minutes that differ most: the per-minute violating requests of the two runs
    diff = (faro.table.over_slo + faro.table.dropped - ray.table.over_slo - ray.table.dropped).sum(axis=0)
    top = f["top_minutes"]
    assert [m["difference"] for m in top] == [int(diff[m["minute"]]) for m in top]
    assert [abs(m["difference"]) for m in top] == sorted((abs(int(x)) for x in diff if x), reverse=True)[: len(top)]
    assert top and top[0]["time"].startswith("2026-01-01 00:")
    # the recorded side and the simulator's own check
    rec = np.array(hist.deployments["search/Embed"].replicas, float)
    emb = f["deployments"]["search/Embed"]
    assert emb["recorded"]["mean_replicas"] == pytest.approx(np.nanmean(rec), abs=1e-3)
    assert emb["recorded"]["minutes_without_replicas"] == 1
    assert emb["recorded"]["gpu_hours"] == pytest.approx(np.nansum(rec) / 60 * 0.5, abs=1e-3)
    n, slow = hist.latency["search"].over(emb["slo_ms"])
    assert emb["check"]["measured_violation_rate"] == pytest.approx(slow / n, abs=1e-6)
    assert emb["check"]["simulated_mean_serving_replicas"] == pytest.approx(ray.serving[:, 0].mean(), abs=1e-3)
    assert any("max_ongoing_requests differs" in x and "5, the most common" in x for x in f["notes"])
    assert "read from a test" in f["notes"] and "read from a test" in report["md"]
    assert sorted(p.name for p in (report["dir"] / "plots").iterdir()) == [
        "search.Embed.png",
        "shop.Ingress.png",
        "shop.Ranker.png",
    ]


def test_the_processing_time_is_the_lognormal_of_the_recorded_histogram(report):
    for k, (med, s) in PROC.items():
        d = parse_dist(report["json"]["deployments"][k]["processing"])
        assert d.kind == "lognorm" and d.params[0] == pytest.approx(s, abs=0.02)
        assert d.params[2] * 1e3 == pytest.approx(med, rel=0.03)
        assert d.mean * 1e3 == pytest.approx(med * math.exp(s * s / 2), rel=1e-6)  # the recorded mean


def test_service_scale_replays_every_service_time_scaled_and_says_so(report, export):
    from faro_serve.sim.history_replay import run_whatif
    from faro_serve.sim.history_replay_report import figures

    slos = {"shop/Ranker": (500.0, 99.0)}
    base = figures(run_whatif(ServeHistory.load(export), 16, 2, slos, forecaster=None, parallel=False))
    fast = figures(
        run_whatif(ServeHistory.load(export), 16, 2, slos, forecaster=None, parallel=False, service_scale=0.8)
    )
    for k, r in base["deployments"].items():
        assert fast["deployments"][k]["processing_mean_ms"] == pytest.approx(0.8 * r["processing_mean_ms"], rel=1e-3)
        assert parse_dist(fast["deployments"][k]["processing"]).mean == pytest.approx(
            0.8 * parse_dist(r["processing"]).mean, rel=1e-6
        )
    ranker = "shop/Ranker"  # the same SLO, a faster model: fewer violations as run
    assert fast["deployments"][ranker]["as_run"]["violating"] < base["deployments"][ranker]["as_run"]["violating"]
    assert "every service time read back times 0.8 (--service-scale)" in fast["notes"]


def test_the_as_run_replay_follows_each_deployments_own_settings():
    from faro_serve.sim.history_replay import run_whatif

    fc = choose_forecaster("fallback")[0]
    fast = run_whatif(serve_history(), 16, 2, {"Ranker": (500, 99)}, forecaster=fc)
    slow = run_whatif(
        serve_history(ranker_config={"upscale_delay_s": 240}), 16, 2, {"Ranker": (500, 99)}, forecaster=fc
    )
    names = [d.key for d in fast.deployments]
    ing, rk = names.index("shop/Ingress"), names.index("shop/Ranker")
    assert (fast.as_run.targets[:, ing] == 2).all() and (fast.as_run.serving[:, ing] == 2).all()  # fixed

    def first_up(res):
        t = res.tick_times
        up = t[(t >= 60 * STEP) & (res.targets[:, rk] > res.targets[t < 60 * STEP, rk].max())]
        return float(up[0] - 60 * STEP)

    # the load triples at STEP: Ray's rule scales the Ranker up within its 4 s delay plus its
    # 10 s look-back; with 240 s it waits at least that long
    assert first_up(fast.as_run) <= 30 < 240 <= first_up(slow.as_run)
    assert fast.as_run.targets[:, rk].max() > 1 and fast.as_run.tick_s == 2  # its metrics interval
    # the as-run replay starts where the cluster was recorded, Faro too
    assert fast.as_run.serving[0].tolist() == [2, 2, 1] and fast.faro.serving[0].tolist() == [2, 2, 1]


def test_derived_slos_are_the_applications_measured_p99_and_are_named_so(report):
    deps = report["json"]["deployments"]
    assert not deps["shop/Ranker"]["slo_derived"] and deps["shop/Ranker"]["slo_ms"] == 500
    for k, app in (("shop/Ingress", "shop"), ("search/Embed", "search")):
        tot = np.sum(serve_history().latency[app].counts, axis=0)
        assert deps[k]["slo_derived"] and deps[k]["slo_ms"] == round(bucket_quantile(LAT_LE, tot, 0.99), 1)
        assert f"| {k} | {deps[k]['requests']:,} | {deps[k]['slo_ms']:g} ms @ p99 (derived) |" in report["md"]
    assert "SLOs derived" in report["md"] and "search/Embed, shop/Ingress." in report["md"]
    assert "| shop/Ranker | " in report["md"] and "500 ms @ p99 |" in report["md"]


def test_deployments_selects_and_the_summary_names_the_report(cli, export, tmp_path):
    code, out, err = cli(
        "whatif",
        "--export",
        str(export),
        *ARGS,
        "--deployments",
        "Ranker,search/Embed",
        "--no-plots",
        "--out",
        str(tmp_path / "r"),
    )
    assert code == 0, err
    f = json.loads((tmp_path / "r" / "whatif.json").read_text())
    assert list(f["deployments"]) == ["search/Embed", "shop/Ranker"] and f["plots"] == []
    assert "shop/Ranker" in out and "shop/Ingress" not in out and f"report: {tmp_path / 'r'}/report.md" in out
    assert f"whatif: replaying {MINUTES} minutes of 2 deployments, as run and under faro-fairsum;" in err


def _fake_prometheus(monkeypatch, series: list):
    """httpx.get answering every Prometheus query with ``series`` for the requests query
    and nothing for the others."""

    def get(url, params=None, timeout=None):
        q = (params or {}).get("query", "")
        result = series if "request_counter" in q and "resets" not in q else []
        return httpx.Response(
            200, json={"status": "success", "data": {"result": result}}, request=httpx.Request("GET", url)
        )

    monkeypatch.setattr(httpx, "get", get)


def test_prometheus_is_read_and_saved_as_an_export(cli, monkeypatch, tmp_path):
    from forecasting.rayserve import read_serve_history

    end = START + 60 * 30
    vals = [[end - 60 * (29 - i), str(100.0 + 20 * i)] for i in range(30)]  # a counter, +20 a minute
    _fake_prometheus(
        monkeypatch, [{"metric": {"application": "a", "deployment": "M", "replica": "r1"}, "values": vals}]
    )
    code, out, err = cli(
        "whatif",
        "--prometheus",
        "http://prom:9090",
        "--minutes",
        "30",
        "--end",
        str(end),
        "--save",
        str(tmp_path / "e.json"),
        "--capacity",
        "4",
        "--slo",
        "M=400",
        "--policy",
        "aiad",
        "--no-plots",
        "--out",
        str(tmp_path / "r"),
    )
    assert code == 0, err
    saved, read = ServeHistory.load(tmp_path / "e.json"), read_serve_history("http://prom:9090", 30, end)
    assert saved.minutes == 30 and list(saved.deployments) == ["a/M"]
    assert saved.deployments["a/M"].arrivals == read.deployments["a/M"].arrivals
    assert sum(read.deployments["a/M"].arrivals) > 0
    f = json.loads((tmp_path / "r" / "whatif.json").read_text())
    assert f["deployments"]["a/M"]["mode"] == "unknown" and f["policy"] == "aiad"
    assert any("a/M: no Serve config" in n for n in f["notes"])
    assert any("no processing time recorded" in n for n in f["notes"])


@pytest.mark.parametrize(
    "args, says",
    [
        (("--slo", "shop/Ranker=fast"), "--slo 'shop/Ranker=fast': write DEPLOYMENT=MS"),
        (("--slo", "shop/Ranker=300@100"), "PERCENTILE in (0, 100)"),
        (("--slo", "=300"), "write DEPLOYMENT=MS"),
        (("--slo", "Nope=300"), "--slo 'Nope' is not a deployment of this history; it has search/Embed"),
        (("--slo", "shop/Ranker=50"), "not above its mean processing time"),
        (("--deployments", "Ranker,Nope"), "--deployments: 'Nope' is not a deployment of this history"),
        (("--capacity", "5"), "--capacity 5: the deployments start at 6 CPUs"),
        (("--capacity", "0"), "--capacity must be a finite number > 0"),
        (("--capacity-gpus", None), "search/Embed takes 0.5 GPU(s) per replica: give --capacity-gpus"),
        (("--minutes", "30"), "--minutes is taken with --prometheus, not with --export"),
        (("--policy", "nope"), "unknown policy 'nope'"),
        (("--service-scale", "0"), "--service-scale must be a finite number > 0"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(cli, export, tmp_path, args, says):
    base = ["--export", str(export), "--capacity", "16", "--capacity-gpus", "2", "--forecaster", "fallback"]
    if args[1] is None:  # leave a flag out
        i = base.index(args[0])
        base, args = base[:i] + base[i + 2 :], ()
    code, out, err = cli("whatif", *base, *args, "--out", str(tmp_path / "r"))
    assert code == 2 and says in err and err.startswith("faro-serve: error:"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_bad_sources_are_one_clear_line_and_exit_2(cli, monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    cases = []
    for text, says in (
        ("{not json", "not a faro-serve export (not JSON"),
        ('{"version": 7}', "not a faro-serve export of version 1"),
        ('{"version": 1, "start": 0}', "a malformed export (KeyError"),
        (json.dumps({"version": 1, "start": 0, "minutes": 5, "deployments": {}}), "no deployments in the history"),
    ):
        bad.write_text(text)
        cases.append((cli("whatif", "--export", str(bad), "--capacity", "4"), says))
    cases.append((cli("whatif", "--export", str(tmp_path / "none.json"), "--capacity", "4"), "cannot read the export"))
    cases.append((cli("whatif", "--prometheus", "prom:9090", "--capacity", "4"), "prom:9090: cannot read Prometheus"))
    cases.append(
        (
            cli("whatif", "--prometheus", "http://127.0.0.1:1", "--capacity", "4"),
            "http://127.0.0.1:1: cannot read Prometheus (ConnectError",
        )
    )
    cases.append(
        (
            cli("whatif", "--prometheus", "http://p", "--end", "yesterday", "--capacity", "4"),
            "--end 'yesterday': give an ISO time",
        )
    )
    for n in ("20000", "0"):  # Prometheus answers at most 11,000 points a series: said before asking it
        cases.append(
            (
                cli("whatif", "--prometheus", "http://127.0.0.1:1", "--minutes", n, "--capacity", "4"),
                f"--minutes {n}: give 1 to 10,999 (Prometheus answers at most 11,000 points a series)",
            )
        )
    _fake_prometheus(monkeypatch, [])  # Prometheus answers, with no Ray Serve series
    cases.append(
        (
            cli("whatif", "--prometheus", "http://prom:9090", "--end", "2026-01-01T00:00", "--capacity", "4"),
            "no Ray Serve requests in the 1440 minutes before 2026-01-01 00:00 UTC",
        )
    )
    for (code, out, err), says in cases:
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (says, err)


def test_a_range_over_a_day_is_reported_by_day():
    """More than a day: the days table, in time order in the JSON, the most different first
    in the report (one fixed deployment against Faro, so the run is quick)."""
    from faro_serve.sim.history_replay import run_whatif
    from faro_serve.sim.history_replay_report import figures, markdown

    n = 2 * 1440
    start = START - 30 * 60  # 23:30 UTC: the range touches three days
    arr = np.where(np.arange(n) % 1440 < 720, 30.0, 300.0)
    le = [50.0, 100.0, 200.0, math.inf]
    d = DeploymentHistory(
        "a",
        "M",
        arr.tolist(),
        [3.0] * n,
        le,
        [0.5 * arr.sum(), 0.9 * arr.sum(), arr.sum(), arr.sum()],
        60.0,
        {"num_replicas": 3},
    )
    hist = ServeHistory(start, n, {"a/M": d}, {}, [], "t")
    w = run_whatif(hist, 8, slos={"a/M": (400.0, 99.0)}, policy="aiad")
    f = figures(w)
    assert [x["day"] for x in f["days"]] == ["2025-12-31", "2026-01-01", "2026-01-02"]
    assert [x["minutes"] for x in f["days"]] == [30, 1440, n - 30 - 1440]
    assert sum(x["requests"] for x in f["days"]) == f["total"]["requests"]
    assert f["days"][1]["as_run_replica_hours"] == pytest.approx(3 * 24, abs=0.01)  # fixed at 3
    assert f["days"][1]["recorded_replica_hours"] == pytest.approx(3 * 24, abs=0.01)
    assert "## Days, the most different first" in markdown(f, [])


def test_the_as_run_replay_in_a_process_of_its_own_gives_the_same_figures():
    from faro_serve.sim.history_replay import run_whatif
    from faro_serve.sim.history_replay_report import figures

    def run(parallel, progress=None):
        w = run_whatif(
            serve_history(),
            16,
            2,
            {"Ranker": (500, 99)},
            forecaster=choose_forecaster("fallback")[0],
            parallel=parallel,
            progress=progress,
        )
        return {k: v for k, v in figures(w).items() if k != "wall_s"}

    calls: dict[bool, list] = {True: [], False: []}
    assert run(True, lambda *a: calls[True].append(a)) == run(False, lambda *a: calls[False].append(a)) == run(True)
    # each replay reports each minute as it starts; beside the other process, only Faro's
    faro = [("faro-fairsum", m, MINUTES) for m in range(1, MINUTES + 1)]
    assert calls[False] == [("as run", m, MINUTES) for m in range(1, MINUTES + 1)] + faro
    assert calls[True] == faro


def test_a_long_replay_says_how_far_it_is_and_how_long_is_left():
    import io

    from faro_serve.commands.whatif import ReplayProgress

    now = [0.0]
    out = io.StringIO()
    p = ReplayProgress("whatif: replaying", out, clock=lambda: now[0])
    for m in range(1, 201):  # 0.2 s a minute: quiet for its first 10 s (50 minutes)
        p("faro-fairsum", m, 200)
        now[0] += 0.2
    for m in range(1, 11):  # another replay, done in 1 s: nothing to say
        p("as run", m, 10)
        now[0] += 0.1
    head, *lines = out.getvalue().splitlines()
    assert head == "whatif: replaying"
    assert lines[0] == "whatif: faro-fairsum: 60 of 200 minutes (30 %) in 12 s, about 28 s left"
    assert lines[1] == "whatif: faro-fairsum: 80 of 200 minutes (40 %) in 16 s, about 24 s left"
    assert lines[-1] == "whatif: faro-fairsum: 200 of 200 minutes (100 %) in 40 s" and len(lines) == 8


def test_the_scale_bench_runs_on_a_tiny_cluster(tmp_path):
    """bench/whatif_scale.py's export and timing on 4 deployments x 90 minutes (the week of
    100 is a benchmark, not a test)."""
    from bench.whatif_scale import main, synthetic_history

    hist, cpus, gpus = synthetic_history(4, 90)
    assert [d.config["autoscaling_config"].get("upscale_delay_s") for d in hist.deployments.values()] == [
        None,
        3,
        None,
        3,
    ]  # Ray's defaults and its guide's latency settings, in turn
    assert cpus >= max(np.nansum([d.replicas for d in hist.deployments.values()], axis=0))
    assert main(["--deployments", "4", "--minutes", "90", "--forecaster", "fallback", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "whatif_scale.json").read_text())["row"]
    assert row["deployments"] == 4 and row["minutes"] == 90 and row["requests"] > 0
    assert row["read_and_simulate_s"] <= row["target_s"] and (tmp_path / "whatif_scale_report" / "report.md").exists()
    # the Faro replay's time and, of it, the time Faro's own decisions took (issue 48)
    assert (
        0.0 < row["faro_policy_s"] <= row["faro_s"] + 0.05 and 0.0 <= row["as_run_policy_s"] <= row["as_run_s"] + 0.05
    )
    assert "own decisions" in (tmp_path / "whatif_scale.md").read_text()


def _session(sid: int) -> dict[int, str]:
    """{pid: command line} of the processes in session ``sid`` (Linux /proc)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
                    out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the processes from Linux's /proc")
def test_ctrl_c_during_a_replay_stops_it_at_once_with_one_line_and_nothing_left(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: whatif, the as-run replay's
    process and the solver's child. One line says so, no child's traceback, none left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from bench.whatif_scale import synthetic_history

    hist, cpus, gpus = synthetic_history(20, 3000)  # 60,000 deployment-minutes: two processes
    export = hist.save(tmp_path / "export.json")
    argv = [sys.executable, "-m", "faro_serve", "whatif", "--export", str(export), "--capacity", str(cpus)]
    argv += ["--capacity-gpus", str(gpus), "--forecaster", "fallback", "--no-plots", "--out", str(tmp_path / "r")]
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not any("sandbox_child" in c for c in _session(p.pid).values()):  # Faro is planning
            assert p.poll() is None and time.monotonic() < deadline, "no solver child came up"
            time.sleep(0.2)
        time.sleep(3)  # Faro plans: its child solves most of the time
        group = _session(p.pid)
        assert any("multiprocessing" in c for c in group.values()), group  # the as-run replay's process
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "faro-serve: interrupted" and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()
    deadline = time.monotonic() + 10
    while _session(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _session(p.pid), _session(p.pid)
