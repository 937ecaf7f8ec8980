"""Serving pieces that need no Ray cluster: router statistics, the autoscaler loop (with a
fake cluster), the schema and serve_config.yaml, and the model classes themselves."""

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from meter_reports import FakeCluster, meter_report
from ray.serve.request_router import PendingRequest

from autoscaler.contract.setting import Setting
from autoscaler.driving.loop import AutoscalerLoop
from faro_serve.config import ConfigError
from faro_serve.serving.routing import DispatchGate, IdleFirstRouter
from faro_serve.serving.schema import parse_autoscaler_config, parse_model_args
from faro_serve.serving.stats import MeterStats

ROOT = Path(__file__).resolve().parent.parent


# --- the front's queue ----------------------------------------------------------------
def test_dispatch_gate_is_fifo_within_capacity_and_follows_scaling():
    async def run():
        cap = [2]
        gate = DispatchGate(lambda: cap[0])
        order = []

        async def req(k):
            await gate.acquire()
            order.append(k)

        tasks = [asyncio.create_task(req(k)) for k in range(6)]
        await asyncio.sleep(0.01)
        assert order == [0, 1] and gate.in_flight == 2 and gate.waiting == 4
        gate.release()
        await asyncio.sleep(0.01)
        assert order == [0, 1, 2] and gate.waiting == 3
        cap[0] = 4  # a replica came up: the timer's wake admits two more, oldest first
        gate.wake()
        await asyncio.sleep(0.01)
        assert order == [0, 1, 2, 3, 4] and gate.in_flight == 4 and gate.waiting == 1
        cap[0] = 1  # scaled down: releases admit nothing until in flight is below 1
        for _ in range(3):
            gate.release()
        await asyncio.sleep(0.01)
        assert order == [0, 1, 2, 3, 4] and gate.in_flight == 1
        gate.release()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3, 4, 5] and gate.in_flight == 1 and gate.waiting == 0

    asyncio.run(run())


def test_dispatch_gate_cancelled_waiter_leaves_and_passes_its_turn_on():
    async def run():
        gate = DispatchGate(lambda: 1)
        await gate.acquire()
        first = asyncio.create_task(gate.acquire())
        second = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        assert gate.waiting == 2
        first.cancel()  # the client went away while queued
        await asyncio.sleep(0.01)
        assert gate.waiting == 1 and gate.in_flight == 1
        gate.release()
        await asyncio.wait_for(second, 1)
        assert gate.in_flight == 1 and gate.waiting == 0
        # admitted, then cancelled before it could run: the slot comes back
        third = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        gate.release()  # admits third ...
        third.cancel()  # ... which is cancelled before it resumes
        await asyncio.gather(third, return_exceptions=True)
        assert gate.in_flight == 0 and gate.waiting == 0

    asyncio.run(run())


# --- the replica choice behind the gate -------------------------------------------------
def _router():
    """The real router class, its counting hooks called as Ray's router calls them (the
    live test covers the wiring); replicas are stand-ins with the one attribute it reads."""
    router = IdleFirstRouter(
        deployment_id=SimpleNamespace(app_name="m", name="Model"), handle_source=SimpleNamespace(value="test")
    )
    router.initialize_state()
    return router, [SimpleNamespace(replica_id=k) for k in "abc"]


def _request(k):
    return PendingRequest(args=[], kwargs={}, metadata=SimpleNamespace(internal_request_id=k))


def test_router_counts_in_flight_from_the_choice_to_the_completion():
    async def run():
        router, reps = _router()
        reqs = [_request(f"r{i}") for i in range(3)]
        chosen = [(await router.choose_replicas(reps, pr))[0][0].replica_id for pr in reqs]
        assert sorted(chosen) == ["a", "b", "c"]  # nothing completed yet: one each
        router.on_request_completed(chosen[1], "r1")
        assert (await router.choose_replicas(reps, _request("r3")))[0][0].replica_id == chosen[1]
        assert router.in_flight() == {"a": 1, "b": 1, "c": 1}
        for k, rid in [("r0", chosen[0]), ("r2", chosen[2]), ("r3", chosen[1])]:
            router.on_request_completed(rid, k)
        assert router.in_flight() == {}

    asyncio.run(run())


def test_router_moves_a_refused_request_and_drops_a_cancelled_one():
    async def run():
        router, reps = _router()
        pr = _request("r0")
        first = (await router.choose_replicas(reps, pr))[0][0].replica_id
        others = [r for r in reps if r.replica_id != first]  # say the replicas changed
        again = (await router.choose_replicas(others, pr))[0][0].replica_id  # Ray asks again
        assert router.in_flight() == {again: 1}
        router.on_request_completed(first, "r0")  # the refused attempt's completion
        assert router.in_flight() == {again: 1}
        gone = _request("r1")
        await router.choose_replicas(reps, gone)
        gone.future.cancel()  # the caller left before the request was sent
        await router.choose_replicas(reps, _request("r2"))
        assert sum(router.in_flight().values()) == 2 and "r1" not in router._given

    asyncio.run(run())


# --- router statistics ---------------------------------------------------------------
def test_router_stats_counts_rates_and_percentiles():
    s = MeterStats(window_s=30, start=0.0)
    for k in range(120):  # 1 request/s for two minutes, then 5/s for 20 s
        s.arrival(k + 0.5)
        s.completed(k + 0.6, latency_s=0.1 + (k % 10) / 100, processing_s=0.05)
    assert s.latency_percentile(119.7, 50) == pytest.approx(0.145, abs=0.011)
    assert s.processing(119.7)["mean_ms"] == pytest.approx(50.0)
    for k in range(100):
        s.arrival(120 + k * 0.2)
    s.drop(125.0, "drop_rate")
    snap = s.snapshot(140.0, percentile=99, replicas=2)
    assert snap["arrivals_per_min"] == [60, 60]
    assert snap["current_minute_count"] == 100 and snap["current_minute_elapsed_s"] == pytest.approx(20)
    assert s.arrival_rate(140.0, over_s=10) == pytest.approx(5.0)
    assert snap["dropped"] == {"drop_rate": 1}
    # completions older than 30 s have left the window: none left at t = 160
    assert s.latency_percentile(160.0, 99) is None
    assert snap["processing"]["mean_ms"] == pytest.approx(50.0)  # completions from 110-120 s
    assert s.processing(160.0)["mean_ms"] is None  # ... which have left the 30 s window by 160 s


def test_router_stats_queue_is_in_flight_beyond_replicas():
    s = MeterStats(start=0.0)
    for _ in range(7):
        s.started(0.0)
    s.finished(0.5)
    assert s.snapshot(1.0, replicas=2)["queue_length"] == 4


def test_router_stats_mean_in_flight_is_time_weighted_per_period():
    """The simulator's "ongoing requests" over a tick: the time average, not a sample."""
    s = MeterStats(start=0.0)
    s.started(0.0)
    s.started(5.0)  # 1 in flight for 5 s, then 2 for 5 s
    assert s.snapshot(10.0, reset_mean=True)["mean_in_flight"] == pytest.approx(1.5)
    s.finished(12.0)
    s.finished(12.0)  # 2 in flight for 2 s, then none for 8 s
    assert s.mean_in_flight(20.0) == pytest.approx(0.4)
    assert s.mean_in_flight(20.0) == pytest.approx(0.4)  # reading alone does not reset


# --- the autoscaler loop with a fake cluster ------------------------------------------
def config(**cluster):
    return parse_autoscaler_config(
        {
            "cluster": {"cpus": 2, "objective": "fair_sum", "reactive_trigger_s": 20, **cluster},
            "models": [
                {"name": "a", "slo_ms": 720, "processing_ms": 154, "cpus": 0.25},
                {"name": "b", "slo_ms": 720, "processing_ms": 154, "cpus": 0.25},
            ],
        }
    )


def test_loop_moves_replicas_to_load_and_resumes_from_running_state():
    cluster = FakeCluster({"a": 1, "b": 4})
    clock = iter(np.arange(0, 1000, 10.0))
    loop = AutoscalerLoop(config(), cluster, clock=lambda: next(clock))
    cluster.fronts["a"].update(arrivals_per_min=[900] * 20)  # 15 req/s on a, b idle
    rec = loop.step()
    assert rec["decision"]["kind"] == "long_term"
    assert cluster.running["a"] >= 3 and cluster.running["b"] == 1
    assert 0.25 * sum(cluster.running.values()) <= 2.0
    # a restarted autoscaler resumes from what runs: no scale-down to the minimum first
    loop2 = AutoscalerLoop(config(), cluster, clock=lambda: 5000.0)
    loop2._observe(5000.0)
    assert loop2.targets == cluster.running


def test_history_extrapolates_the_open_minute_only_at_start():
    from autoscaler.driving.driver import MeterSnapshot

    def hist(front):
        return MeterSnapshot.from_meter(meter_report(**front)).arrivals_per_min.tolist()

    assert hist({"arrivals_per_min": [], "current_minute_count": 50, "current_minute_elapsed_s": 20.0}) == [150.0]
    assert (
        hist({"arrivals_per_min": [], "current_minute_count": 5, "current_minute_elapsed_s": 5.0}) == []
    )  # too young to say
    later = {"arrivals_per_min": [60, 90, 120], "current_minute_count": 50, "current_minute_elapsed_s": 20.0}
    assert hist(later) == [60, 90, 120]  # the simulator's input exactly


def test_loop_reactive_step_and_disabled_mode_changes_nothing():
    cluster = FakeCluster({"a": 2, "b": 1})
    t = [0.0]
    loop = AutoscalerLoop(config(), cluster, clock=lambda: t[0])
    loop.step()
    cluster.fronts["a"].update(latency_ms=5000.0)
    for t[0] in (10.0, 20.0, 30.0):
        rec = loop.step()
    assert rec["decision"] == {
        "kind": "reactive",
        "replicas": {"a": cluster.running["a"]},
        "drop_rates": {},
        "info": {"scaled_up": ["a"]},
    }
    off = FakeCluster({"a": 1, "b": 1})
    AutoscalerLoop(config().model_copy(update={"enabled": False}), off, clock=lambda: 0.0).step()
    assert off.scaled == [] and off.controls == []


def test_loop_restores_a_restarted_fronts_drop_rate():
    cluster = FakeCluster({"a": 1, "b": 1})
    t = [0.0]
    loop = AutoscalerLoop(config(), cluster, clock=lambda: t[0])
    loop.step()  # long-term decision
    loop.settings["a"] = loop.settings["a"].merged(Setting(drop_rate=0.2))  # as a penalty objective might
    t[0] = 10.0
    loop.step()
    assert cluster.fronts["a"]["drop_rate"] == 0.2
    cluster.fronts["a"].update(drop_rate=0.0, replicas=1, setting={})  # restarted with defaults
    t[0] = 20.0
    loop.step()
    assert cluster.controls[-1][:2] == ("a", 0.2)
    n = len(cluster.controls)
    t[0] = 30.0
    loop.step()  # fronts already agree: nothing to send
    assert len(cluster.controls) == n


# --- schema and serve_config.yaml ------------------------------------------------------
def test_invalid_slo_names_the_field():
    with pytest.raises(ConfigError, match=r"models\.1\.slo_ms"):
        parse_autoscaler_config(
            {"cluster": {"cpus": 2}, "models": [{"name": "a", "slo_ms": 10}, {"name": "b", "slo_ms": 0}]}
        )
    with pytest.raises(ConfigError, match="policy 'nope' is unknown"):
        parse_autoscaler_config({"cluster": {"cpus": 2}, "models": [{"name": "a", "slo_ms": 10}], "policy": "nope"})
    with pytest.raises(ConfigError, match=r"model\.vision\.arch"):
        parse_model_args({"name": "x", "model": {"kind": "vision", "arch": "vgg"}})
    with pytest.raises(ConfigError, match="processing"):
        parse_model_args({"name": "x", "model": {"kind": "synthetic", "processing": "gauss:1"}})


def test_serve_config_is_a_valid_ray_serve_config_and_faro_config():
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    ServeDeploySchema.model_validate(doc) if hasattr(
        ServeDeploySchema, "model_validate"
    ) else ServeDeploySchema.parse_obj(doc)
    apps = {a["name"]: a for a in doc["applications"]}
    cfg = parse_autoscaler_config(apps["faro"]["args"])
    for m in cfg.models:
        app = apps[m.name]
        args = parse_model_args(app["args"])
        assert app["external_scaler_enabled"] is True and app["route_prefix"] == f"/{m.name}"
        assert args.name == m.name and args.cpus == m.cpus  # Ray's CPUs match the SLO's
    assert sum(m.min_replicas * m.cpus for m in cfg.models) <= cfg.cluster.cpus


# --- the model classes ------------------------------------------------------------------
def test_vision_model_top_k_and_bad_images():
    import torch
    import torchvision

    from deployments.vision import ImageClassifier

    m = ImageClassifier("resnet18", top_k=3, image_size=64)
    img = torchvision.io.encode_png(torch.randint(0, 255, (3, 80, 60), dtype=torch.uint8)).numpy().tobytes()
    out = m.predict(img)
    assert len(out["classes"]) == 3 and all(0 <= c < 1000 for c in out["classes"])
    assert out["scores"] == sorted(out["scores"], reverse=True) and out["processing_ms"] > 0
    assert m.predict(b"not an image")["status"] == 400
    assert m.predict(b"")["status"] == 400


def test_vision_model_batches_match_single_requests_and_profile_the_grid():
    import torch
    import torchvision

    from deployments.vision import ImageClassifier

    m = ImageClassifier("resnet18", top_k=2, image_size=64)
    imgs = [
        torchvision.io.encode_png(torch.randint(0, 255, (3, 70, 70), dtype=torch.uint8)).numpy().tobytes()
        for _ in range(3)
    ]
    out = m.predict_batch([imgs[0], b"junk", imgs[1], imgs[2]])
    assert out[1]["status"] == 400 and [o["batch"] for o in out if "batch" in o] == [3, 3, 3]
    for one, img in zip([out[0], out[2], out[3]], imgs):  # the same classes as alone
        assert one["classes"] == m.predict(img)["classes"]
    rows = m.profile([1, 2], [1, 2], repeats=2, image_size=32)
    assert sorted({(r["batch"], r["threads"]) for r in rows}) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert len(rows) == 8 and all(r["latency_s"] > 0 for r in rows)
    assert torch.get_num_threads() == 1  # restored
    with pytest.raises(ValueError, match="threads"):
        m.set_threads(0)


def test_vision_model_loads_a_local_checkpoint(tmp_path):
    import torch
    import torchvision

    from deployments.vision import ImageClassifier

    net = torchvision.models.resnet18(weights=None)
    torch.nn.init.zeros_(net.fc.weight)
    torch.nn.init.zeros_(net.fc.bias)
    net.fc.bias.data[7] = 10.0  # class 7 always wins
    torch.save(net.state_dict(), tmp_path / "w.pt")
    m = ImageClassifier("resnet18", checkpoint=str(tmp_path / "w.pt"), top_k=1, image_size=64)
    img = torchvision.io.encode_jpeg(torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8)).numpy().tobytes()
    assert m.predict(img)["classes"] == [7]
    with pytest.raises(FileNotFoundError):
        ImageClassifier("resnet18", checkpoint=str(tmp_path / "missing.pt"))


def test_synthetic_model_sleeps_its_distribution():
    from deployments.synthetic import SyntheticModel

    m = SyntheticModel("const:0.02")
    out = asyncio.run(m.predict(b""))
    assert 15 <= out["processing_ms"] < 200


def test_synthetic_model_serves_one_request_at_a_time():
    from deployments.synthetic import SyntheticModel

    async def run():
        m = SyntheticModel("const:0.05")
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(m.predict(b"") for _ in range(4)))
        return time.perf_counter() - t0, outs

    wall, outs = asyncio.run(run())
    assert wall >= 4 * 0.05 * 0.95  # back to back, not side by side
    assert all(o["processing_ms"] < 150 for o in outs)  # waiting is not processing


def test_status_explains_plans_and_shows_measured_beside_planned_utility():
    from autoscaler.driving.explain import explain

    cluster = FakeCluster({"a": 1, "b": 1})
    t = [0.0]
    loop = AutoscalerLoop(config(), cluster, clock=lambda: t[0])
    cluster.fronts["a"].update(arrivals_per_min=[2400] * 20, latency_ms=1440.0)  # 40 req/s: too many
    rec = loop.step()
    a = rec["models"]["a"]
    assert a["observed_utility"] == 0.5 and a["predicted_utility"] is not None  # 720 / 1440
    info = rec["decision"]["info"]
    assert info["bound"]["capacity"] and "a" in info["bound"]["short_of_slo"]
    q = info["models"]["a"]["forecast_rps"]
    assert 0 < q["p10"] <= q["p50"] <= q["p90"]
    text = "\n".join(explain(list(loop.history)))
    assert "long_term decision" in text and "bound by the capacity" in text
    assert "a: forecast p10/p50/p90" in text and "estimated p99" in text and "vs SLO 720 ms" in text
    # reactive and surge steps say why
    lines = explain(
        [
            {
                "t": 40,
                "decision": {
                    "kind": "surge",
                    "replicas": {"a": 4, "b": 2},
                    "info": {"scaled_up": ["b"], "surge": {"a": {"rate_rps": 30.0, "need": 6, "from": 1, "to": 4}}},
                },
            }
        ]
    )
    assert lines[1] == "  reactive: over the SLO for the trigger period: b +1"
    assert lines[2] == "  surge: a at 30.0 req/s needs 6 replicas: 1 -> 4"
    assert explain([]) == ["no decisions yet"]
