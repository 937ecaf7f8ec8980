"""A user's deployment under Faro, without a Ray cluster (issue 34): the replica guard's
drops, slots, failure counting and streaming; the subclass around the user's class; the
import-path loader and ``faro-serve init`` with their errors. The live side is
``test_user_models_live.py``."""

import asyncio

import pytest
import yaml
from ray import serve
from starlette.requests import Request
from starlette.responses import StreamingResponse
from user_apps.shop import TextClassifier

import faro_serve
from faro_serve.config import ConfigError, parse_config
from faro_serve.serving.guarded_class import guarded_class
from faro_serve.serving.messages import Dropped as DroppedEvent
from faro_serve.serving.messages import Processed
from faro_serve.serving.replica_guard import Dropped, ReplicaGuard
from faro_serve.serving.user_app import UserAppArgs, load_deployment


def guard(concurrency=1):
    g = ReplicaGuard(None, "m", concurrency)
    g.seen = []
    g._event = g.seen.append  # what would go to the meter
    return g


def request(body: bytes = b"{}") -> Request:
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}, receive)


def test_at_most_concurrency_requests_run_in_the_users_code_at_once():
    g, inside, most = guard(concurrency=2), [0], [0]

    async def work(x):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        await asyncio.sleep(0.02)
        inside[0] -= 1
        return x * 2

    async def main():
        return await asyncio.gather(*(g.call(work, i) for i in range(6)))

    assert asyncio.run(main()) == [0, 2, 4, 6, 8, 10]
    assert most[0] == 2
    assert [type(e) for e in g.seen] == [Processed] * 6
    assert all(0.015 < e.processing_s < 1 for e in g.seen)  # the time in the user's code


def test_a_drop_is_a_503_over_http_and_dropped_over_a_handle_and_is_counted():
    g = guard()
    g.drop_rate = 1.0
    with pytest.raises(Dropped, match="drop rate 1.000"):
        asyncio.run(g.call(lambda: 1))
    resp = asyncio.run(g.request(lambda r: 1, request()))
    assert resp.status_code == 503 and b'"reason":"drop_rate"' in resp.body
    assert [e.reason for e in g.seen] == ["drop_rate", "drop_rate"]


def test_a_raise_or_a_5xx_counts_failed_once_and_reaches_the_caller():
    g = guard()

    def boom():
        raise ValueError("the user's bug")

    with pytest.raises(ValueError):
        asyncio.run(g.call(boom))
    sent = []

    async def app(scope, receive, send):  # an ASGI app answering 500 (FastAPI's own 500)
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(g.asgi(app, {"type": "http"}, receive, send))
    assert [m.get("status") for m in sent] == [500, None]  # passed through untouched
    assert [e.reason for e in g.seen if isinstance(e, DroppedEvent)] == ["error", "error"]


def test_a_streaming_answer_holds_its_slot_until_its_last_chunk():
    g, order = guard(concurrency=1), []

    def stream(_req):
        async def chunks():
            order.append("first streams")
            yield b"a"
            await asyncio.sleep(0.05)
            yield b"b"
            order.append("first done")

        return StreamingResponse(chunks())

    async def main():
        first = await g.request(stream, request())

        async def drain():
            return [c async for c in first.body_iterator]

        async def second():
            await asyncio.sleep(0.01)
            await g.call(lambda: order.append("second runs"))

        body, _ = await asyncio.gather(drain(), second())
        return body

    assert asyncio.run(main()) == [b"a", b"b"]
    assert order == ["first streams", "first done", "second runs"]


def test_the_users_class_runs_unchanged_behind_the_guard():
    class Model:
        def __init__(self, k):
            self.k = k

        def helper(self, x):  # sync, called by the user's own code on self
            return x + self.k

        async def __call__(self, req):
            return self.helper(1)

        async def predict(self, x):
            return self.helper(x)

    cls = guarded_class(Model, "m", 1)
    obj = cls(5, _faro_meter=None)
    assert cls.__name__ == "Model" and isinstance(obj, Model)
    assert asyncio.run(obj(request())) == 6  # nested: helper ran as written, synchronously
    assert asyncio.run(obj.predict(2)) == 7  # a handle call, through the guard

    async def handle_call():  # Ray calls a sync method on the replica's loop, awaits what it returns
        return await obj.helper(3)

    assert asyncio.run(handle_call()) == 8
    obj._faro_guard.drop_rate = 1.0
    with pytest.raises(Dropped):
        asyncio.run(obj.predict(2))
    assert asyncio.run(obj(request())).status_code == 503


def test_a_wrong_deployment_is_named_clearly():
    with pytest.raises(ConfigError, match="module 'no_such_pkg.app' does not import"):
        load_deployment("no_such_pkg.app:X")
    with pytest.raises(ConfigError, match="module 'user_apps.shop' has no 'Nope'"):
        load_deployment("user_apps.shop:Nope")
    with pytest.raises(ConfigError, match="is a class, not a Ray Serve deployment"):
        load_deployment("user_apps.shop:NOT_A_DEPLOYMENT")
    with pytest.raises(ValueError, match="not an import path"):
        UserAppArgs(model="m", deployment="user_apps.shop.TextClassifier")
    slo = faro_serve.SLO(name="m", slo_ms=300)
    with pytest.raises(ConfigError, match="is a bound application; name the deployment"):
        faro_serve.scaled(TextClassifier.bind(), slo)
    with pytest.raises(ConfigError, match="Faro scales deployment classes"):
        faro_serve.scaled(serve.deployment(lambda r: 1, name="f"), slo)
    with pytest.raises(ConfigError, match="names deployment 'Other'"):
        faro_serve.scaled(TextClassifier, slo.model_copy(update={"deployment": "Other"}))
    with pytest.raises(ConfigError, match="application 'shop', which is not among"):
        faro_serve.run(
            {}, [faro_serve.SLO(name="s", app="shop", deployment="D", slo_ms=300)], faro_serve.Cluster(cpus=1)
        )


def test_faro_serve_init_writes_a_config_that_validates(cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "c.yaml"
    code, _, err = cli(
        "init",
        "user_apps.shop:TextClassifier",
        "--name",
        "clf",
        "--slo-ms",
        "250",
        "--cpus",
        "0.5",
        "--gpus",
        "1",
        "--cluster-cpus",
        "4",
        "-o",
        str(out),
    )
    assert code == 0, err
    doc = yaml.safe_load(out.read_text())
    faro, app = doc["applications"]
    cfg = parse_config({k: faro["args"][k] for k in ("cluster", "models")})
    assert cfg.models[0].deployment == "TextClassifier" and cfg.models[0].gpus == 1
    args = UserAppArgs.model_validate(app["args"])
    assert (args.model, args.deployment, args.cpus, args.gpus) == ("clf", "user_apps.shop:TextClassifier", 0.5, 1)
    assert app["import_path"] == "faro_serve.serving.user_app:build" and app["external_scaler_enabled"]
    assert cli("init", "user_apps.shop:NOT_A_DEPLOYMENT")[0] == 2
    code, _, err = cli("init", "no_such_pkg:X")
    assert code == 2 and "does not import" in err and err.count("\n") == 1
    # a bad value is named by the flag that set it, not by the config field alone
    code, _, err = cli("init", "user_apps.shop:TextClassifier", "--slo-ms", "-5", "-o", str(out))
    assert code == 2 and err == (
        "faro-serve: error: invalid configuration in the config these "
        "flags make:\n  --slo-ms (models.0.slo_ms): Input should be "
        "greater than 0 (got -5.0)\n"
    )
    code, _, err = cli("init", "user_apps.shop:TextClassifier", "--port", "99999")
    assert code == 2 and err == "faro-serve: error: --port must be in 1..65535 (got 99999)\n"


def test_a_class_without_call_keeps_none_and_its_methods_are_guarded():
    class Worker:
        async def predict(self, x):
            return x + 1

    cls = guarded_class(Worker, "w", 1)
    assert "__call__" not in cls.__dict__
    assert asyncio.run(cls(_faro_meter=None).predict(1)) == 2


def test_a_pipeline_scales_its_stages_meters_its_ingress_and_names_a_wrong_stage():
    """``scaled`` with a pipeline: a stage gets its model's resources and Faro's scaling; the
    ingress keeps its own replicas and concurrency, metered under the pipeline's name;
    ``run`` would plan the stages where scaled() put them."""
    from user_apps.shop import Clean, Gallery, Tag

    from faro_serve import Pipeline, Stage
    from faro_serve.serving.user import _located

    p = Pipeline(
        name="gal", slo_ms=400, stages=[Stage(name="clean", cpus=0.1), Stage(name="tag", after=["clean"], cpus=0.2)]
    )
    tag = faro_serve.scaled(Tag, p, stage="tag")
    assert tag.model == "tag" and tag.cpus == 0.2
    assert tag._deployment.num_replicas == 1 and tag._deployment.max_ongoing_requests == 2
    faro_serve.scaled(Clean, p, stage="clean")
    ingress = faro_serve.scaled(
        Gallery.options(max_ongoing_requests=100, num_replicas=2, ray_actor_options={"num_cpus": 0.05}), p
    )
    assert ingress.model == "gal" and ingress.cpus == 0.05
    assert ingress._deployment.num_replicas == 2  # the user's, not Faro's
    assert ingress._deployment.max_ongoing_requests == 101  # its 100 + the one held
    located = _located(p)
    assert located.ingress == "Gallery"
    assert {m.name: m.deployment for m in located.stage_models()} == {"clean": "Clean", "tag": "Tag"}
    with pytest.raises(ConfigError, match=r"pipeline 'gal' has no stage 'tagg' \(stages: clean, tag\)"):
        faro_serve.scaled(Tag, p, stage="tagg")
    with pytest.raises(ConfigError, match="needs a pipeline"):
        faro_serve.scaled(Tag, faro_serve.SLO(name="t", slo_ms=100), stage="tag")
    with pytest.raises(ConfigError, match="its ingress is 'Api' but the deployment is 'Gallery'"):
        faro_serve.scaled(Gallery, p.model_copy(update={"ingress": "Api"}))


def test_faro_serve_init_writes_the_batching_a_serve_batch_method_declares(cli, monkeypatch, tmp_path):
    """Issue 47: a deployment whose method is @serve.batch gets the decorator's largest
    batch and wait in its SLO (its curve measured live), and the config validates."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "b.yaml"
    code, _, err = cli("init", "user_apps.batcher:Batcher", "--name", "b", "--gpus", "0.5", "-o", str(out))
    assert code == 0 and "Batcher.infer is @serve.batch(max_batch_size=16" in err
    faro = yaml.safe_load(out.read_text())["applications"][0]
    cfg = parse_config({k: faro["args"][k] for k in ("cluster", "models")})
    b = cfg.models[0].batching
    assert (b.max_batch_size, b.batch_wait_s, b.measured) == (16, 0.004, True)


def test_a_serve_batch_method_is_found_with_its_settings_and_checked_against_the_slo():
    """What scaled() reads of a @serve.batch method, the batching it gives the SLO, and the
    mistakes it names: an SLO that declares batching over a deployment that does not batch,
    and a batching deployment asked for concurrency > 1."""
    from user_apps.batcher import Batcher
    from user_apps.shop import TextClassifier

    from faro_serve.config import Batching, ConfigError
    from faro_serve.serving.batch_method import batch_methods, is_serve_batch
    from faro_serve.serving.user import detected_batching

    (m,) = batch_methods(Batcher.func_or_class)
    assert (m.attr, m.max_batch_size, m.wait_s, m.concurrent) == ("infer", 16, 0.004, 1)
    assert is_serve_batch(Batcher.func_or_class.infer) and not batch_methods(TextClassifier.func_or_class)
    got = detected_batching("Batcher", [m], None, 1)
    assert (got.max_batch_size, got.batch_wait_s) == (16, 0.004)
    mine = Batching(latency_ms={1: 10, 16: 12}, max_batch_size=8)
    assert detected_batching("Batcher", [m], mine, 1) is mine  # the SLO's wins
    with pytest.raises(ConfigError, match="declares batching but the deployment has no @serve.batch"):
        detected_batching("TextClassifier", [], mine, 1)
    with pytest.raises(ConfigError, match="give its SLO concurrency 1"):
        detected_batching("Batcher", [m], None, 4)


def test_the_gpu_like_example_sleeps_the_h200_resnet50_curve():
    """examples/gpu_batch: its table is the H200 profile's ResNet50 curve (the breakpoints
    the planner reads from profiles/h200-resnet50.json), interpolated as the planner does."""
    from conftest import ROOT

    from examples.gpu_batch.app import H200_RESNET50_MS, batch_ms
    from faro_serve.config import Batching

    planned = Batching(profile=str(ROOT / "profiles" / "h200-resnet50.json"), max_batch_size=64)
    assert H200_RESNET50_MS == pytest.approx(planned.latency_ms, abs=1e-3)
    curve = planned.curve()
    for b in (1, 3, 16, 20, 64, 100):
        assert batch_ms(b) == pytest.approx(float(curve.latency(b)) * 1e3, rel=1e-3)


def _trickle(first: bytes, then_wait: bool):
    """An ASGI receive: one chunk of the body, then either the rest or nothing ever (a slow
    client that sent a few bytes and waits)."""
    sent = []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": first, "more_body": True}
        if then_wait:
            await asyncio.sleep(3600)
        return {"type": "http.request", "body": b"-rest", "more_body": False}

    return receive


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_takes_no_slot():
    """Issue 50: a request whose body has not all come within the bound is answered 408
    (reason body_timeout) without reaching the user's code or holding a slot; a body that
    comes in pieces reaches the user whole, as sent."""
    g = ReplicaGuard(None, "m", 1, body_timeout_s=0.2)
    g.seen = []
    g._event = g.seen.append
    called, got = [], []

    async def app(scope, receive, send):
        called.append(1)
        msg = await receive()
        body = msg["body"]
        while msg.get("more_body"):
            msg = await receive()
            body += msg["body"]
        got.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def run(receive):
        sent = []

        async def send(m):
            sent.append(m)

        scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
        asyncio.run(g.asgi(app, scope, receive, send))
        return sent

    slow = run(_trickle(b"abc", then_wait=True))
    assert slow[0]["status"] == 408 and b'"reason":"body_timeout"' in slow[1]["body"]
    assert called == [] and g.slots._value == 1 and g.seen[0].reason == "body_timeout"
    fine = run(_trickle(b"abc", then_wait=False))
    assert fine[0]["status"] == 200 and got == [b"abc-rest"]

    async def hangs():
        await asyncio.sleep(3600)

    req = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}, hangs)
    resp = asyncio.run(g.request(lambda r: 1, req))
    assert resp.status_code == 408 and b"within 0.2 s" in resp.body


def test_the_direct_paths_body_read_has_the_same_bound():
    from faro_serve.serving.payload import read_payload

    async def hangs():
        await asyncio.sleep(3600)

    req = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}, hangs)
    resp = asyncio.run(read_payload(req, "m", 1 << 20, 0.2))
    assert resp.status_code == 408 and b'"reason":"body_timeout"' in resp.body
    assert asyncio.run(read_payload(request(b"xyz"), "m", 1 << 20, 0.2)) == b"xyz"


def test_one_slow_body_per_replica_the_next_is_refused_at_once_and_fast_ones_pass():
    """uploads.py: a body that stalls after a piece that said more follows takes the
    replica's one place for partial bodies; a second one is refused (503 uploads) after the
    50 ms grace, not after the deadline; a body in one piece never counts, however late it
    comes (a replica busy under load), nor one whose pieces come together."""
    from faro_serve.serving.uploads import TooManyUploads, Uploads

    async def pieces(*steps):
        for step in steps:
            if isinstance(step, float):
                await asyncio.sleep(step)
            else:
                yield step

    async def main():
        up = Uploads(limit=1, grace_s=0.05, start_s=1.0)
        slow = asyncio.ensure_future(up.read(pieces(b"a", 0.5, b"b"), 2.0))
        await asyncio.sleep(0.1)
        assert up.active == 1
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(TooManyUploads):
            await up.read(pieces(b"c", 0.5, b"d"), 2.0)
        assert asyncio.get_running_loop().time() - t0 < 0.2
        assert await up.read(pieces(0.3, b"late but whole"), 2.0) == b"late but whole"
        assert await up.read(pieces(b"x", b"y"), 2.0) == b"xy"
        assert await slow == b"ab" and up.active == 0
        with pytest.raises(asyncio.TimeoutError):
            await up.read(pieces(b"e", 5.0, b"f"), 0.2)
        assert up.active == 0

    asyncio.run(main())


def test_the_users_own_batch_setters_set_the_gate_and_rays_queue():
    """Ray's docs set the batch from a config with ``self.infer.set_max_batch_size(n)`` and
    ``set_batch_wait_timeout_s(s)``: under Faro they reach the replica's gate and Ray's
    queue (the wait is the gate's; Ray's queue waits 0 behind it)."""
    from user_apps.batcher import Batcher

    from faro_serve.serving.batch_method import batch_methods

    cls = Batcher.func_or_class
    methods = batch_methods(cls)
    faro_cls = guarded_class(cls, "b", 32, {"methods": methods, "max_batch_size": 16, "concurrent": 1, "wait_s": 0.004})
    obj = faro_cls()
    g = obj._faro_guard
    assert (g.batch_size, g.gate.batch_size, g.gate.wait_s) == (16, 16, 0.004)
    obj.infer.set_batch_wait_timeout_s(0.1)
    obj.infer.set_max_batch_size(4)
    assert (g.batch_size, g.gate.batch_size, g.gate.wait_s) == (4, 4, 0.1)
    assert obj.infer._get_max_batch_size() == 4 and obj.infer._get_batch_wait_timeout_s() == 0.1
    assert g.batching["wrappers"][0]._get_max_batch_size() == 4  # Ray's queue
    assert g.batching["wrappers"][0]._get_batch_wait_timeout_s() == 0.0


def test_a_draining_user_deployment_refuses_new_http_requests_and_serves_handle_calls():
    """Issue 50, the drain on a user's deployment under Faro: new HTTP requests get 503
    shutting_down (counted), an admitted streaming answer stays busy until its last chunk,
    and handle calls (a pipeline's stages) are still served: an admitted request is seen
    through."""
    import json

    from faro_serve.serving.replica_report import ReplicaReporter

    g = guard()
    g.reporter = ReplicaReporter(None, "m", lambda ans: None)

    def stream(_req):
        async def chunks():
            yield b"a"
            await asyncio.sleep(0.02)
            yield b"b"

        return StreamingResponse(chunks())

    async def main():
        first = await g.request(stream, request())
        busy_while_streaming = g.reporter.busy
        g.reporter.draining = True
        refused = await g.request(lambda req: {"ok": True}, request())
        body = [c async for c in first.body_iterator]
        via_handle = await g.call(lambda: "served")
        return busy_while_streaming, refused, body, via_handle

    busy, refused, body, via_handle = asyncio.run(main())
    assert busy == 1 and body == [b"a", b"b"] and g.reporter.busy == 0
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    assert json.loads(refused.body)["reason"] == "shutting_down"
    assert via_handle == "served"
    assert [e.reason for e in g.seen if isinstance(e, DroppedEvent)] == ["shutting_down"]
