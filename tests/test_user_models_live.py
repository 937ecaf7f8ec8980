"""A user's own Ray Serve deployments under Faro, on a real local Ray cluster (issue 34):
deployed as a user would, through ``faro_serve.scaled``/``faro_serve.run`` and through a
Serve config written by ``faro-serve init``; their answers are the user's, byte for byte;
Faro meters, bounds, drops and scales them, on HTTP and on handle traffic.

The user's code (``tests/user_apps/shop.py``) knows nothing of faro-serve; Ray's workers
import it from ``PYTHONPATH``, as a user's installed package. One Ray cluster serves the
module (tests run in file order); traffic goes to loopback only, bounded in count and time.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import ray
from live_helpers import day_trace, fire, free_port, wait_for
from ray import serve
from starlette.responses import JSONResponse
from user_apps.shop import (
    Caption,
    ClassifierAPI,
    Clean,
    Gallery,
    Preprocess,
    Sentiment,
    Shop,
    Tag,
    TextClassifier,
    label,
)

import faro_serve
from faro_serve import SLO, Cluster, Pipeline, Stage
from faro_serve.serving.names import meter_name

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent

CLF = SLO(name="clf", slo_ms=300, processing_ms=50, cpus=0.25, max_replicas=4)
API = SLO(name="api", slo_ms=500, cpus=0.25, max_replicas=2)
SENTIMENT = SLO(name="sentiment", app="shop", slo_ms=300, processing_ms=50, cpus=0.25, max_replicas=4)
WIDE = SLO(name="wide", slo_ms=3000, cpus=0.25, concurrency=3, max_replicas=1)
# a pipeline (issue 35): clean, then tag and (for half the queries) caption side by side;
# one SLO end to end, measured at the ingress
GALLERY = Pipeline(
    name="gallery",
    slo_ms=400,
    stages=[
        Stage(name="clean", cpus=0.1, processing_ms=20, max_replicas=3),
        Stage(name="tag", after=["clean"], cpus=0.1, processing_ms=80, max_replicas=6),
        Stage(name="caption", after=["clean"], fraction=0.5, cpus=0.1, processing_ms=30, max_replicas=3),
    ],
)
MODELS = [CLF, API, SENTIMENT, WIDE]
STAGES = [m.name for m in GALLERY.stage_models()]
# 1.75 CPUs of room for the single models as before the pipeline joined, plus its stages'
# minimums (0.3): with 1.75 in all, clf's two replicas after its load test left no room for
# sentiment's second (the cluster full, a fresh-clone run failed on it)
CLUSTER = Cluster(
    cpus=2.05, long_term_interval_s=20, window_s=120, cold_start_s=5, reactive_interval_s=2, reactive_trigger_s=4
)


def apps() -> dict:
    # the user's async ingress and preprocessor take many requests at once (Ray's advice for
    # an ingress that awaits handles; at Ray's default of 5 the ingress, not the model,
    # bounds the app: 6 requests/s here, with or without Faro)
    light = {"ray_actor_options": {"num_cpus": 0.05}, "max_ongoing_requests": 100}
    return {
        "clf": faro_serve.scaled(TextClassifier, CLF).bind(delay_s=0.05),
        "api": faro_serve.scaled(ClassifierAPI, API).bind(),
        "shop": Shop.options(**light).bind(
            Preprocess.options(**light).bind(), faro_serve.scaled(Sentiment, SENTIMENT).bind()
        ),
        "wide": faro_serve.scaled(TextClassifier.options(name="Wide"), WIDE).bind(delay_s=0.4),
        "gallery": faro_serve.scaled(Gallery.options(**light), GALLERY).bind(
            *(
                faro_serve.scaled(d, GALLERY, stage=n).bind()
                for d, n in ((Clean, "clean"), (Tag, "tag"), (Caption, "caption"))
            )
        ),
    }


@pytest.fixture(scope="module")
def live():
    dash, http = free_port(), free_port()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), str(TESTS.parent), old) if p)
    try:  # the raylet and every worker inherit it: the user's package is installed
        ray.init(
            address="local",
            num_cpus=3,
            num_gpus=2,
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dash,
            log_to_driver=False,
        )
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
    serve.start(http_options={"host": "127.0.0.1", "port": http})
    dashboard = f"http://127.0.0.1:{dash}"
    faro_serve.run(apps(), MODELS + [GALLERY], CLUSTER, dashboard_url=dashboard, forecaster="fallback")
    base = f"http://127.0.0.1:{http}"
    client = httpx.Client(base_url=base, timeout=60)
    assert wait_for(lambda: set(status(client).get("models", {})) == {m.name for m in MODELS} | set(STAGES), 120), (
        status(client)
    )
    yield {"client": client, "base": base, "dashboard": dashboard, "http": http}
    client.close()
    serve.shutdown()
    ray.shutdown()


def status(client) -> dict:
    try:
        r = client.get("/faro/status", timeout=5)
        return r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def meter(app: str, deployment: str) -> dict:
    h = serve.get_deployment_handle(meter_name(deployment), app_name=app)
    return h.metrics.remote(reset_mean=False).result(timeout_s=30)


def running(app: str, deployment: str) -> int:
    dep = serve.status().applications[app].deployments[deployment]
    return dep.replica_states.get("RUNNING", 0)


def load_until(base: str, path: str, n: int, cond) -> tuple[list, bool, float]:
    """``n`` requests at 40/s (100 open at most) to ``path`` while waiting up to 60 s for
    ``cond``: (every answer, whether ``cond`` came, seconds until it came)."""
    res, t0 = [], time.time()
    load = threading.Thread(
        target=lambda: res.extend(fire(base, path, n, 100, 40.0, json.dumps({"text": "good"}).encode())), daemon=True
    )
    load.start()
    came = wait_for(cond, 60, every=1)
    took = time.time() - t0
    load.join(timeout=150)
    return res, bool(came), took


def test_the_answers_are_the_users_byte_for_byte(live):
    c = live["client"]
    r = c.post("/clf", json={"text": "a good day"})
    assert r.status_code == 200 and r.content == JSONResponse(label("a good day")).body
    r = c.post("/clf", json={"delay_s": 0})  # the user's own error answer, untouched
    assert (r.status_code, r.text) == (422, "text missing")
    r = c.post("/clf", json={"text": "x", "stream": True})  # a StreamingResponse passes through
    assert r.status_code == 200 and r.text == "chunk-0;chunk-1;chunk-2;"
    assert r.headers["content-type"].startswith("text/plain")
    r = c.post("/api/classify", json={"text": "fine and great"})  # a FastAPI ingress
    assert r.status_code == 200 and r.json() == label("fine and great")
    r = c.post("/api/classify", json={"txt": 1})  # FastAPI's own validation error
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "text"]
    r = c.post("/shop", json={"text": "  Good   News "})  # composed: ingress -> handles
    assert r.status_code == 200 and r.json() == label("good news")
    # metered where each request reached the deployment: the proxy (HTTP) or a handle
    for app, dep in (("clf", "TextClassifier"), ("api", "ClassifierAPI"), ("shop", "Sentiment")):
        assert wait_for(lambda: meter(app, dep)["arrivals_total"] >= 1, 15, every=0.5), (app, dep)
    # the meters write no access logs (several calls a second each); the user's deployment does
    # (Serve's replica logs, in Ray's documented place for the running session)
    logs = Path("/tmp/ray/session_latest/logs/serve")
    mine = wait_for(
        lambda: "POST /clf 200" in "".join(f.read_text() for f in logs.glob("replica_clf_TextClassifier_*.log")),
        15,
        every=0.5,
    )
    assert mine
    meters = list(logs.glob("replica_clf_TextClassifier-faro-meter_*.log"))
    assert meters and not any("CALL ingest" in f.read_text() for f in meters)


def test_a_handler_that_raises_gives_its_500_and_is_counted_failed(live):
    c = live["client"]
    before = meter("clf", "TextClassifier")["dropped"].get("error", 0)
    assert c.post("/clf", json={"text": "x", "fail": True}).status_code == 500
    assert c.post("/api/boom").status_code == 500
    assert wait_for(lambda: meter("clf", "TextClassifier")["dropped"].get("error", 0) == before + 1, 15, every=0.5)
    assert wait_for(lambda: meter("api", "ClassifierAPI")["dropped"].get("error", 0) == 1, 15, every=0.5)
    assert c.post("/clf", json={"text": "still here"}).status_code == 200  # the replica serves on


def test_a_replica_of_concurrency_k_serves_k_requests_at_once(live):
    """``wide``: one replica of concurrency 3 (max_replicas 1); 9 requests of 0.4 s at once:
    the user's code never holds more than 3, and the others wait their turn, not fail."""
    res = fire(live["base"], "/wide", 9, 9, body=json.dumps({"text": "x"}).encode())
    assert [r[0] for r in res] == [200] * 9, res
    h = serve.get_deployment_handle("Wide", app_name="wide")
    assert h.most_at_once.remote().result(timeout_s=30) == 3
    took = sorted(r[1] for r in res)
    assert took[-1] >= 3 * 0.4 * 0.9, took  # three rounds of three, not one round of nine


def test_faro_scales_a_user_model_under_http_load(live, report):
    """``clf`` serves 20/s on one replica (50 ms each); 40/s needs at least 3 replicas.
    Every request is answered: 200, or 503 from the queue bound while replicas start."""
    res, grew, t_grew = load_until(live["base"], "/clf", 1000, lambda: running("clf", "TextClassifier") >= 2)
    assert grew, status(live["client"])["models"]["clf"]
    codes = [r[0] for r in res]
    assert len(res) == 1000 and set(codes) <= {200, 503}, sorted(set(map(str, codes)))
    reasons = {r[2] for r in res if r[0] == 503}
    assert reasons <= {"ray"}, reasons  # only the queue bound refuses (no drop rate asked)
    st = status(live["client"])["models"]["clf"]
    assert st["target"] >= 2 and st["arrival_rate"] > 0
    report(
        f"user model clf under 40/s (20/s per replica): 2 replicas running after {t_grew:.0f} s, "
        f"{codes.count(200)} x 200, {codes.count(503)} x 503 (queue bound) of 1000; "
        f"target {st['target']}"
    )


def test_the_inner_deployment_of_a_composed_app_scales_on_handle_traffic(live, report):
    """``Sentiment`` is reached only through the ingress's handle: its queue and its
    measurements are in the ingress replica's router; 40/s on 50 ms needs 2+ replicas."""
    t0 = time.time()
    res, grew, t_grew = load_until(live["base"], "/shop", 800, lambda: running("shop", "Sentiment") >= 2)
    assert grew, status(live["client"])["models"]["sentiment"]
    codes = [r[0] for r in res]
    assert len(res) == 800 and set(codes) <= {200, 503}, sorted(set(map(str, codes)))
    assert running("shop", "Shop") == 1  # the ingress is the user's: not Faro's to scale
    st = status(live["client"])["models"]["sentiment"]
    took = sorted(r[1] for r in res if r[0] == 200)
    report(
        f"composed app, inner model at 40/s through a handle: 2 replicas after {t_grew:.0f} s, "
        f"{codes.count(200)} x 200, {codes.count(503)} x 503 of 800; 200s p50 "
        f"{took[len(took) // 2]:.2f} s, max {took[-1]:.2f} s; load took {time.time() - t0:.0f} s; "
        f"target {st['target']}"
    )


def test_a_pipelines_stages_scale_on_handle_traffic_and_it_is_measured_end_to_end(live, cli, report):
    """24 queries/s through the gallery pipeline's ingress, half asking for a caption (the
    fan-out): ``tag`` (80 ms, 12.5/s a replica) must grow to 2 or more; ``clean`` and ``caption`` are
    reached through handles too. Every query is answered; the ingress's meter counts every
    one and measures the end-to-end latency the status shows for the pipeline."""
    before = meter("gallery", "Gallery")["arrivals_total"]
    res, t0 = [], time.time()
    bodies = (json.dumps({"text": "Good Day"}).encode(), json.dumps({"text": "good", "caption": 1}).encode())
    loads = [
        threading.Thread(target=lambda b=b: res.extend(fire(live["base"], "/gallery", 360, 50, 12.0, b)), daemon=True)
        for b in bodies
    ]
    for t in loads:
        t.start()
    grew = wait_for(lambda: running("gallery", "Tag") >= 2, 60, every=1)
    t_grew = time.time() - t0
    for t in loads:
        t.join(timeout=150)
    st = status(live["client"])
    assert grew, st["models"]["tag"]
    codes = [r[0] for r in res]
    assert len(res) == 720 and set(codes) <= {200, 503}, sorted(set(map(str, codes)))
    assert running("gallery", "Gallery") == 1  # the ingress is the user's: measured, not scaled
    pipe = st["pipelines"]["gallery"]
    assert pipe["measured"] and pipe["stages"][0] == "clean" and pipe["slo_ms"] == 400
    assert pipe["latency_ms"] is not None and pipe["latency_ms"] > 80, pipe  # clean + tag at least
    # every query reached the ingress's meter, once (its routers report every second)
    wait_for(lambda: meter("gallery", "Gallery")["arrivals_total"] - before >= 720, 20)
    assert meter("gallery", "Gallery")["arrivals_total"] - before == 720
    code, out, _ = cli("status", "--url", live["base"])  # what the operator reads
    assert code == 0 and "pipeline gallery: stages clean, tag, caption; SLO 400 ms p99" in out, out
    took = sorted(r[1] for r in res if r[0] == 200)
    report(
        f"pipeline gallery (clean -> tag | caption x0.5) at 24/s: tag 2 replicas after "
        f"{t_grew:.0f} s (targets clean {st['models']['clean']['target']}, tag "
        f"{st['models']['tag']['target']}, caption {st['models']['caption']['target']}); "
        f"{codes.count(200)} x 200, {codes.count(503)} x 503 of 720; client p50 "
        f"{took[len(took) // 2]:.2f} s; ingress-measured e2e p99 {pipe['latency_ms']:.0f} ms"
    )


def test_a_trace_replayed_on_the_users_model_accounts_for_every_request(live, cli, tmp_path, report):
    """``faro-serve replay`` on the user's route and body: a burst past ``clf``'s 4 replicas
    (20, 60, 20 requests/s for 10 s each; 20/s per replica) in the contended cluster."""
    trace = day_trace(tmp_path / "t.csv", {"j": [200, 600, 200]})
    out = tmp_path / "replay"
    code, _, err = cli(
        "replay",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--map",
        "j=clf",
        "--url",
        live["base"],
        "--time-scale",
        str(1 / 6),
        "--path",
        "/{model}",
        "--body",
        '{"text": "good"}',
        "--out",
        str(out),
        "--no-progress",
    )
    assert code == 0, err
    doc = json.loads((out / "result.json").read_text())
    acc = doc["accounting"]
    assert acc["sent"] == acc["scheduled"] and 900 <= acc["sent"] <= 1100, acc
    assert acc["errors"] == 0 and acc["answered"] == acc["sent"], acc  # no hang, none lost
    assert set(acc["by_status"]) <= {"200", "503"}, acc
    report(
        f"replay on the user's clf (20/60/20 requests/s, 10 s each, 20/s per replica, at "
        f"most 4): {acc['by_status']} of {acc['sent']} sent"
    )


def test_an_slo_naming_a_deployment_that_is_not_running_is_named_and_the_rest_serve(live):
    from faro_serve.serving.app import AUTOSCALER_APP, autoscaler_app

    ghost = SLO(name="ghost", app="clf", deployment="Nope", slo_ms=300, cpus=0.25)
    cfg = {
        "cluster": CLUSTER.model_dump(),
        "models": [m.model_dump() for m in MODELS + [ghost]],
        "dashboard_url": live["dashboard"],
        "forecaster": "fallback",
    }
    serve.run(autoscaler_app(cfg), name=AUTOSCALER_APP, route_prefix="/faro", blocking=False)
    why = wait_for(lambda: status(live["client"]).get("not_running", {}).get("ghost"), 60)
    assert why == "application 'clf' has no deployment 'Nope' (it has TextClassifier, TextClassifier-faro-meter)"
    assert live["client"].post("/clf", json={"text": "ok"}).status_code == 200


def test_gpu_models_are_planned_within_the_gpus_ray_has(live, report):
    """Ray here declares 2 GPUs (the models run on CPU; Ray schedules by the number). Two
    models of 1 GPU per replica, both loaded past one replica: the autoscaler reads the
    GPUs from Ray, never targets more than 2 in total, and the replicas start."""
    g1 = SLO(name="g1", slo_ms=300, processing_ms=50, cpus=0.25, gpus=1, max_replicas=3)
    g2 = SLO(name="g2", slo_ms=300, processing_ms=50, cpus=0.25, gpus=1, max_replicas=3)
    big = SLO(name="big", slo_ms=300, cpus=0.25, gpus=3)  # Ray has 2: refused before deploying
    with pytest.raises(faro_serve.config.ConfigError, match="need 3 GPUs but the cluster has 2"):
        faro_serve.run(
            {"big": faro_serve.scaled(TextClassifier.options(name="Big"), big).bind()},
            [big],
            CLUSTER,
            dashboard_url=live["dashboard"],
        )
    assert "big" not in serve.status().applications
    for app in ("clf", "api", "shop", "wide"):  # room for these two
        serve.delete(app)
    faro_serve.run(
        {
            m.name: faro_serve.scaled(TextClassifier.options(name=f"Gpu{m.name}"), m).bind(delay_s=0.05)
            for m in (g1, g2)
        },
        [g1, g2],
        CLUSTER,
        dashboard_url=live["dashboard"],
        forecaster="fallback",
    )
    c = live["client"]
    assert wait_for(lambda: set(status(c).get("models", {})) == {"g1", "g2"}, 90), status(c)
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            st = status(c).get("models", {})
            if st:
                seen.append(sum(st[n]["target"] for n in st))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    body = json.dumps({"text": "good"}).encode()
    loads = [
        threading.Thread(target=fire, args=(live["base"], f"/{n}", 300, 60, 40.0, body), daemon=True)
        for n in ("g1", "g2")
    ]
    for t in loads:
        t.start()
    for t in loads:
        t.join(timeout=120)
    stop.set()
    watcher.join(timeout=5)
    st = status(c)
    assert seen and max(seen) <= 2, seen
    assert st["capacity"]["GPU"] == 2
    assert running("g1", "Gpug1") == 1 and running("g2", "Gpug2") == 1
    report(
        f"2 GPU models (1 GPU per replica) under 40/s each on 2 GPUs: targets summed to at "
        f"most {max(seen)} over {len(seen)} looks; p99 g1 {st['models']['g1']['latency_ms']} ms"
    )


def test_a_config_written_by_faro_serve_init_deploys_with_serve_deploy(live, tmp_path):
    """The user's path in YAML: ``faro-serve init`` writes the config, ``serve deploy``
    deploys it (replacing the module's applications: the module's last test), the model
    answers and is planned."""
    cfg = tmp_path / "my_config.yaml"
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    bin_dir = Path(sys.executable).parent
    out = subprocess.run(
        [
            str(bin_dir / "faro-serve"),
            "init",
            "user_apps.shop:TextClassifier",
            "--name",
            "yclf",
            "--slo-ms",
            "300",
            "--cpus",
            "0.25",
            "--cluster-cpus",
            "1",
            "--port",
            str(live["http"]),
            "-o",
            str(cfg),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    import yaml

    doc = yaml.safe_load(cfg.read_text())
    doc["applications"][0]["args"].update({"dashboard_url": live["dashboard"], "forecaster": "fallback"})
    doc["applications"][1]["args"]["init_kwargs"] = {"delay_s": 0.02}
    cfg.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        [str(bin_dir / "serve"), "deploy", str(cfg), "-a", live["dashboard"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    c = live["client"]
    assert wait_for(lambda: c.post("/yclf", json={"text": "good"}).status_code == 200, 90, every=2)
    assert c.post("/yclf", json={"text": "good"}).content == JSONResponse(label("good")).body
    st = wait_for(lambda: status(c).get("models", {}).get("yclf"), 60)
    assert st and st["target"] >= 1 and set(status(c)["models"]) == {"yclf"}
    assert wait_for(lambda: meter("yclf", "TextClassifier")["arrivals_total"] >= 2, 15, every=0.5)


@pytest.mark.parametrize(
    "example,path,body,check",
    [
        (
            "text_classifier",
            "/sentiment",
            {"text": "a wonderful film"},
            lambda r: r.json()["label"] == "positive" and 0.5 < r.json()["score"] <= 1,
        ),
        (
            "composed",
            "/reviews/score",
            {"text": "The plot was dull, and boring."},
            lambda r: r.json()["label"] == "negative" and r.json()["text"] == "the plot was dull and boring",
        ),
        (
            "pipeline",
            "/moderate/check",
            {"text": "A dull plot, buy now free http://x.example"},
            lambda r: r.json()["label"] == "negative" and r.json()["spam"] is True,
        ),
    ],
)
def test_the_examples_deploy_from_their_own_configs(live, tmp_path, example, path, body, check):
    """examples/*/config.yaml as a user runs them (``serve deploy``; here on the module's
    cluster and port, planning with the fallback forecaster): they answer, Faro plans them."""
    import yaml

    doc = yaml.safe_load((TESTS.parent / "examples" / example / "config.yaml").read_text())
    doc["http_options"]["port"] = live["http"]
    doc["applications"][0]["args"].update({"dashboard_url": live["dashboard"], "forecaster": "fallback"})
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    # the module's applications deployed from Python stay through a `serve deploy`: free
    # their CPUs (Ray has 2 here) for the example's replicas
    for name in set(serve.status().applications) - {a["name"] for a in doc["applications"]}:
        serve.delete(name)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "serve"), "deploy", str(cfg), "-a", live["dashboard"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    c = live["client"]

    def answers() -> bool:  # replicas still starting (a classifier trains at start): wait
        try:
            return c.post(path, json=body, timeout=15).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_for(answers, 180, every=2), serve.status().applications
    r = c.post(path, json=body)
    assert check(r), r.text
    args = doc["applications"][0]["args"]
    model = (args.get("models") or args["pipelines"][0]["stages"])[0]["name"]
    assert wait_for(lambda: model in status(c).get("models", {}), 60), status(c)
    assert c.post(path, json={"nope": 1}).status_code in (400, 422)  # the user's own error
