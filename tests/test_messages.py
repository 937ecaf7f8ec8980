"""Typed messages at the router's edge (issue 33): the router's and replicas' reports to the
meter and its answer (faro_serve/serving/messages.py), the meter's report to the autoscaler
(faro_serve/meter_report.py), and the check that a model's replicas reserve the CPUs its SLO
plans with. No Ray cluster: the meter is constructed as tests/test_direct_units.py does."""

import logging
import pickle
import time

import numpy as np
import pytest
from meter_reports import FakeCluster, meter_report

from autoscaler.driving.driver import MeterSnapshot
from autoscaler.driving.loop import AutoscalerLoop
from faro_serve.config import ConfigError
from faro_serve.meter_report import MeterReportError, decode_meter_report
from faro_serve.serving.direct import Meter
from faro_serve.serving.messages import (
    VERSION,
    Answered,
    Arrival,
    Dropped,
    GaveUp,
    MessageError,
    MeterAnswer,
    NetworkTime,
    Processed,
    ReplicaReport,
    RouterReport,
    decode,
)
from faro_serve.serving.rayservice import load_serve_config
from faro_serve.serving.schema import parse_autoscaler_config

NOW = 1_700_000_000.0
MESSAGES = [
    RouterReport((Arrival(NOW), Answered(NOW + 1, 0.25), GaveUp(NOW + 2)), waiting=3, dispatched=2, replicas=4),
    RouterReport((), waiting=0, dispatched=0, replicas=1, waiting_since=(NOW - 1, NOW - 0.5)),
    ReplicaReport((Processed(NOW, 0.15), Processed(NOW, 0.3, 4), Dropped(NOW, "drop_rate"), NetworkTime(NOW, 0.02))),
    ReplicaReport((), batch_size=4, threads=2, variant="resnet18"),
    ReplicaReport((), draining=True, busy=3),
    MeterAnswer(drop_rate=0.25, batch_in_force=1),
    MeterAnswer(drop_rate=0.0, batch_in_force=1, draining=True),
    MeterAnswer(drop_rate=0.0, batch_in_force=8, batch_size=8, threads=2, variant="v", refused="why"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_its_wire_form(msg):
    wire = msg.wire()
    assert wire["v"] == VERSION and decode(wire) == msg
    # what Ray ships: builtins only, so a pickle names no class of ours
    assert b"faro_serve" not in pickle.dumps(wire)
    assert decode(pickle.loads(pickle.dumps(wire)), type(msg)) == msg


GOOD = RouterReport((Arrival(NOW), Answered(NOW, 0.5)), waiting=1, dispatched=1, replicas=2).wire()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"waiting": None}, "router report v3: missing field 'waiting'"),
        ({"waiting": "2"}, "router report v3: field 'waiting' must be an integer >= 0 (got '2')"),
        ({"waiting": True}, "field 'waiting' must be an integer"),
        ({"waiting_since": [NOW, "x"]}, "field 'waiting_since' must be a finite number or null"),
        ({"events": [("q", NOW)]}, "events[0] has unknown kind 'q'"),
        ({"events": [("f", NOW)]}, "events[0] (Answered) missing field 'latency_s'"),
        (
            {"events": [("a", NOW), ("f", NOW, float("nan"))]},
            "events[1] (Answered) field 'latency_s' must be a finite number",
        ),
        ({"events": [("a", NOW, 1.0)]}, "events[0] (Arrival) has 2 fields, at most 1"),
        ({"events": [("d", NOW, 3)]}, "events[0] (Dropped) field 'reason' must be a string"),
        ({"events": ["a"]}, "events[0] must be a tuple"),
        ({"v": 1}, "router report: version 1 is not supported (this side speaks v3)"),
        ({"v": None}, "router report: version None is not supported"),
        ({"type": "telegram"}, "message: unknown type 'telegram'"),
        ({"type": "meter-answer"}, "meter answer: not expected here (expected RouterReport or ReplicaReport)"),
        ({"color": "red"}, "router report v3: unknown field 'color'"),
    ],
)
def test_a_malformed_report_is_refused_naming_the_field_and_the_meter_reads_the_next(change, message):
    raw = {k: v for k, v in {**GOOD, **change}.items() if v is not None or k in ("v", "waiting_since")}
    with pytest.raises(MessageError) as err:
        decode(raw, RouterReport, ReplicaReport)
    assert message in str(err.value)
    m = Meter.func_or_class("m")
    ans = decode(m.ingest("router-1", raw), MeterAnswer)
    assert message in ans.refused and m.refused == 1
    snap = m.metrics(reset_mean=False)
    assert snap["arrivals_total"] == 0 and snap["waiting"] == 0  # nothing of it was counted
    now = time.time()
    ans = decode(m.ingest("router-1", RouterReport((Arrival(now - 0.2), Answered(now, 0.2)), 1, 1, 2).wire()))
    assert ans.refused is None and ans.drop_rate == 0.0
    snap = m.metrics(reset_mean=False)
    assert (snap["arrivals_total"], snap["completed_total"], snap["waiting"]) == (1, 1, 1)


def test_the_meter_answers_a_report_that_is_not_a_dict():
    m = Meter.func_or_class("m")
    assert decode(m.ingest("replica-x", [("a", NOW)])).refused == "message: expected a dict, got list"


def test_the_meters_report_round_trips_and_a_missing_key_is_named():
    m = Meter.func_or_class("synth-a", replica_cpus=0.25)
    now = time.time()
    m.ingest("router-1", RouterReport((Arrival(now - 0.3), Answered(now, 0.3)), 0, 0, 1).wire())
    raw = m.metrics(reset_mean=False)
    report = decode_meter_report(raw, "synth-a")
    assert report.wire() == raw and report.replica_cpus == 0.25 and report.latency_ms == pytest.approx(300)
    snap = MeterSnapshot.from_meter(raw)
    assert snap.latency_ms == pytest.approx(300) and snap.percentile == 99.0
    for key in ("queue_length", "processing", "arrivals_per_min", "replica_cpus"):
        broken = {k: v for k, v in raw.items() if k != key}
        with pytest.raises(MeterReportError, match=f"front report of 'synth-a' v4: missing field '{key}'"):
            MeterSnapshot.from_meter(broken, model="synth-a")
    with pytest.raises(MeterReportError, match="field 'queue_length' must be a finite number"):
        MeterSnapshot.from_meter({**raw, "queue_length": "3"})
    with pytest.raises(MeterReportError, match="field 'processing' must be a mapping with 'n'"):
        MeterSnapshot.from_meter({**raw, "processing": {"mean_ms": 1.0, "p50_ms": 1.0, "p99_ms": 1.0}})
    with pytest.raises(MeterReportError, match="version None is not supported"):
        MeterSnapshot.from_meter({k: v for k, v in raw.items() if k != "v"})
    with pytest.raises(MeterReportError, match="unknown field 'latency'"):
        MeterSnapshot.from_meter({**raw, "latency": 3})


# --- the autoscaler loop with one malformed or mismatched model ---------------------------
def config():
    return parse_autoscaler_config(
        {
            "cluster": {"cpus": 2, "objective": "fair_sum"},
            "models": [
                {"name": n, "slo_ms": 720, "processing_ms": 154, "cpus": 0.25, "max_replicas": 4} for n in ("a", "b")
            ],
        }
    )


def _busy(name, **fields):
    return meter_report(
        name,
        **{
            "arrivals_per_min": [900] * 20,
            "arrival_rate": 15.0,
            "replica_cpus": 0.25,
            "processing": {"mean_ms": 154.0},
            **fields,
        },
    )


@pytest.mark.parametrize(
    "bad_b, error",
    [
        ({k: v for k, v in _busy("b").items() if k != "arrival_rate"}, "missing field 'arrival_rate'"),
        (
            _busy("b", replica_cpus=1.0),
            "model 'b': each replica reserves 1 CPUs (the model application's args) but its SLO entry says 0.25",
        ),
    ],
)
def test_the_loop_leaves_out_a_bad_report_and_keeps_deciding_for_the_others(bad_b, error, caplog):
    cluster = FakeCluster({"a": 1, "b": 1}, {"a": _busy("a"), "b": bad_b})
    loop = AutoscalerLoop(config(), cluster, clock=lambda: 0.0)
    with caplog.at_level(logging.ERROR, logger="faro_serve.autoscaler"):
        rec = loop.step()
    assert rec["decision"]["kind"] == "long_term"
    assert cluster.running["a"] >= 3  # a's load was read and planned for
    assert cluster.running["b"] == 1  # b planned as a model whose front did not answer
    assert set(loop.meter_errors) == {"b"} and error in loop.meter_errors["b"]
    assert loop.status()["meter_errors"] == loop.meter_errors  # GET /faro/status, faro-serve status
    assert any(error in r.getMessage() and "'b'" in r.getMessage() for r in caplog.records)
    cluster.fronts["b"] = _busy("b")  # fixed: read again at the next tick
    loop.clock = lambda: 10.0
    loop.step()
    assert loop.meter_errors == {}


# --- the static check where a whole serve config is loaded --------------------------------
def test_a_serve_config_whose_model_cpus_differ_from_the_slo_is_refused():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "serve_config.yaml").read_text()
    load_serve_config(text)  # the default config agrees
    bad = text.replace(
        "args: {name: synth-b, model: {kind: synthetic}, cpus: 0.25}",
        "args: {name: synth-b, model: {kind: synthetic}, cpus: 0.5}",
    )
    assert bad != text
    with pytest.raises(
        ConfigError,
        match="model 'synth-b' has cpus 0.5 in its application's args but 0.25 in the faro application's models",
    ):
        load_serve_config(bad)


def test_the_demo_refuses_the_same_mismatch(tmp_path):
    from pathlib import Path

    from faro_serve.demo.deployment import read_config

    text = (Path(__file__).parents[1] / "serve_config.yaml").read_text()
    p = tmp_path / "serve_config.yaml"
    p.write_text(
        text.replace(
            "args: {name: resnet18, model: {kind: vision, arch: resnet18}, cpus: 0.25}",
            "args: {name: resnet18, model: {kind: vision, arch: resnet18}}",
        )
    )
    with pytest.raises(ValueError, match="model 'resnet18' has cpus 1 in its application's args but 0.25"):
        read_config(p)


def test_decoding_a_busy_second_of_reports_is_linear(report):
    """The meter reads up to thousands of events a second. Speed is reported, not asserted
    (a shared CI machine failed a 0.25 s bound for 5,000); what is asserted is the shape:
    4x the events cost well under 16x the time, so a quadratic decoder would fail."""

    def timed(n: int) -> float:
        events = tuple(Arrival(NOW + i * 1e-4) if i % 2 else Answered(NOW + i * 1e-4, 0.1) for i in range(n))
        wire = RouterReport(events, 10, 2, 2).wire()
        best = float("inf")
        for _ in range(3):  # the best of three: the machine's noise only ever adds
            t0 = time.perf_counter()
            decoded = decode(wire)
            best = min(best, time.perf_counter() - t0)
        assert len(decoded.events) == n and np.isfinite([e.t for e in decoded.events]).all()
        return best

    small, large = timed(5000), timed(20000)
    report(f"decoding router reports: 5,000 events {small * 1e3:.1f} ms, 20,000 {large * 1e3:.1f} ms")
    assert large < 8 * small, (small, large)


def test_the_meter_echoes_the_setting_it_was_told_and_refuses_one_it_cannot_enforce():
    """The loop resends a setting until the meter's report echoes it (issue 33): the echo
    is the record itself, so a new actuator needs no new report field; a field the meter
    has no handler for is refused by name, not dropped."""
    from autoscaler.contract.setting import Setting

    m = Meter.func_or_class("synth-a", replica_cpus=0.25)
    snap = MeterSnapshot.from_meter(m.metrics(reset_mean=False))
    want = Setting(replicas=3, drop_rate=0.25, batch_size=4)
    assert snap.told == Setting() and not snap.enforces(want, 99.0)
    m.control(percentile=99.0, **want.to_json())
    snap = MeterSnapshot.from_meter(m.metrics(reset_mean=False))
    assert snap.told == want and snap.enforces(want, 99.0)
    assert m.drop_rate == 0.25 and m.metrics(reset_mean=False)["drop_rate"] == 0.25  # enforced
    assert not snap.enforces(want.merged(Setting(drop_rate=0.5)), 99.0)
    assert not snap.enforces(want, 95.0)
    with pytest.raises(ValueError, match=r"cannot enforce \['cores'\]"):
        m.control(cores=4)
    with pytest.raises(ValueError, match=r"setting: unknown field\(s\) \['cores'\]"):
        MeterSnapshot.from_meter({**m.metrics(reset_mean=False), "setting": {"cores": 4}})


def test_a_model_that_is_not_running_is_named_and_the_others_are_planned_without_it():
    """b is in the config but not running (a typo in its app or deployment): the status says
    why; the first MISSING_GRACE_S the loop waits for it, then plans a alone."""
    from autoscaler.driving.loop import MISSING_GRACE_S

    cluster = FakeCluster({"a": 1}, {"a": _busy("a")})
    cluster.absent = {"b": "application 'b' has no deployment 'Nope' (it has Model)"}
    t = [0.0]
    loop = AutoscalerLoop(config(), cluster, clock=lambda: t[0])
    assert loop.step()["decision"] is None and cluster.scaled == []
    assert loop.status()["not_running"] == {"b": cluster.absent["b"]}
    t[0] = MISSING_GRACE_S + 1
    rec = loop.step()
    assert rec["decision"]["kind"] == "long_term" and set(rec["decision"]["replicas"]) == {"a"}
    assert cluster.running["a"] >= 3  # a's load planned for
    cluster.running["b"], cluster.fronts["b"] = 1, _busy("b")  # b deployed after all
    t[0] += 400
    assert set(loop.step()["decision"]["replicas"]) == {"a", "b"} and loop.status()["not_running"] == {}
