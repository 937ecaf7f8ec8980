"""The per-model setting record (issue 33, item 1): clamp, merge, the order a decision is
carried out in, JSON round trip, unknown fields refused; and the drivers that carry it (the
live loop's saved state, the batched simulator through the one observe/apply path)."""

import json

import numpy as np
import pytest

from autoscaler.contract.policy import Decision
from autoscaler.contract.setting import FIELDS, Setting
from autoscaler.driving.decision_log import decision_record
from autoscaler.driving.driver import CapacityExceeded, apply_decision
from faro_serve.config import Batching, ModelSLO, Variant

PROFILE = Batching(gamma=0.75, eps=0.25, max_batch_size=8)
VARIANTS = [
    Variant(name="small", accuracy=70, processing_ms=90, batching=PROFILE),
    Variant(name="large", accuracy=76, processing_ms=210, batching=PROFILE),
]


def models():
    return [
        ModelSLO(name="a", slo_ms=720, cpus=2, min_replicas=1, max_replicas=5),
        ModelSLO(name="b", slo_ms=720, variants=VARIANTS, max_replicas=8),
        ModelSLO(name="c", slo_ms=720, batching=PROFILE),
    ]


def test_clamp_keeps_every_field_within_the_models_limits():
    a, b, c = models()
    assert Setting(replicas=9, drop_rate=1.7, threads=8).clamp(a) == Setting(replicas=5, drop_rate=1.0, threads=2)
    assert Setting(replicas=0, drop_rate=-0.2, threads=0).clamp(a) == Setting(replicas=1, drop_rate=0.0, threads=1)
    assert Setting(batch_size=99).clamp(c) == Setting(batch_size=8)
    assert Setting(batch_size=99, variant="large").clamp(b) == Setting(batch_size=8, variant="large")
    assert Setting().clamp(a) == Setting()  # nothing set: nothing to clamp
    with pytest.raises(ValueError, match="'a' does not batch"):
        Setting(batch_size=2).clamp(a)
    with pytest.raises(ValueError, match="no variant 'huge'"):
        Setting(variant="huge").clamp(b)


def test_merge_and_changes_touch_only_the_fields_set():
    held = Setting(replicas=3, drop_rate=0.0, batch_size=4)
    assert held.merged(Setting(drop_rate=0.2)) == Setting(replicas=3, drop_rate=0.2, batch_size=4)
    assert held.merged(Setting()) is held
    assert held.changes(Setting(replicas=3, batch_size=2, threads=1)) == {"batch_size": 2, "threads": 1}
    assert list(Setting(variant="x", replicas=2, threads=1).set_fields()) == ["replicas", "threads", "variant"]
    assert FIELDS[0] == "replicas"


def test_json_round_trip_and_unknown_or_ill_typed_fields_refused():
    s = Setting(replicas=3, drop_rate=0.25, batch_size=4, threads=2, variant="large")
    assert Setting.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert Setting.from_json({}) == Setting()
    assert Setting.from_json({"replicas": 2.0}).replicas == 2  # JSON numbers
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['cores'\]"):
        Setting.from_json({"replicas": 2, "cores": 4})
    with pytest.raises(ValueError, match=r"saved\.replicas: expected int \(got 2\.5\)"):
        Setting.from_json({"replicas": 2.5}, "saved")
    with pytest.raises(ValueError, match="variant: expected str"):
        Setting.from_json({"variant": 3})
    with pytest.raises(ValueError, match="drop_rate: expected float"):
        Setting.from_json({"drop_rate": True})
    with pytest.raises(ValueError, match="expected an object"):
        Setting.from_json([1, 2])


def test_a_decision_is_carried_out_decreases_first_within_the_limits():
    held = {
        "a": Setting(replicas=2, drop_rate=0.0),
        "b": Setting(replicas=4, drop_rate=0.0, variant="small"),
        "c": Setting(replicas=1, drop_rate=0.0),
    }
    dec = Decision({"a": 3, "b": 1, "c": 9}, {"b": 2.0}, batch_sizes={"c": 64}, variants={"b": "large"})
    done = apply_decision(dec, held, models(), capacity_cpus=30, capacity_memory_gb=None)
    assert done.changes == [("b", 1), ("a", 3), ("c", 9)]  # b's decrease before the increases
    assert done.settings["b"] == Setting(replicas=1, drop_rate=1.0, variant="large")
    assert done.settings["c"] == Setting(replicas=9, drop_rate=0.0, batch_size=8)
    assert done.changed["a"] == Setting(replicas=3)  # what the fronts are told: the fields set
    assert held["b"].changes(done.settings["b"]) == {"replicas": 1, "drop_rate": 1.0, "variant": "large"}
    with pytest.raises(ValueError, match="unknown models \\['z'\\]"):
        apply_decision(Decision(threads={"z": 2}), held, models(), 30, None)
    with pytest.raises(CapacityExceeded, match="asked for 34 CPUs"):
        apply_decision(Decision({"a": 5, "c": 20}), held, models(), 30, None)


def test_decision_views_are_read_only_and_set_adds_fields():
    dec = Decision({"a": 2}, {"a": 0.1})
    dec.set("a", threads=2).set("b", variant="large")
    assert dict(dec.replicas) == {"a": 2} and dict(dec.field("threads")) == {"a": 2}
    assert dict(dec.field("variant")) == {"b": "large"}
    with pytest.raises(TypeError):
        dec.replicas["a"] = 3  # a write to a view would be lost: refused
    assert decision_record(dec) == {
        "kind": "long_term",
        "replicas": {"a": 2},
        "drop_rates": {"a": 0.1},
        "info": {},
        "threads": {"a": 2},
        "variants": {"b": "large"},
    }
    assert Decision(settings={"a": Setting(replicas=2, drop_rate=0.1)}) == Decision({"a": 2}, {"a": 0.1})


def test_the_batched_simulator_goes_through_the_drivers_clamps():
    """The third driver is gone: Sponge's batched simulator observes and applies as the
    simulator and the live loop do, so a model's limits bind there too."""
    from autoscaler.policies.sponge import static
    from faro_serve.config import ClusterSpec
    from faro_serve.engine.batching import BatchProfile
    from faro_serve.sim.batched_runner import BatchedSetting, simulate_batched

    prof = BatchProfile(gamma=0.4, eps=0.02, delta=0.004, eta=0.02)
    setting = BatchedSetting(profile=prof, duration_s=30, seed=1)
    cluster = ClusterSpec(cpus=16)

    def model(cpus, max_batch):
        return [
            ModelSLO(
                name="m",
                slo_ms=1000,
                processing_ms=400,
                cpus=cpus,
                max_replicas=1,
                batching=Batching(gamma=0.4, eps=0.02, delta=0.004, eta=0.02, max_batch_size=max_batch),
            )
        ]

    wide = simulate_batched(setting, static(4, model(16, 16), cluster, {"m": prof}))
    narrow = simulate_batched(setting, static(4, model(2, 2), cluster, {"m": prof}))
    assert wide.cores.max() == 4 and narrow.cores.max() == 2  # threads within the replica's CPUs
    assert wide.batch.max() > 2 and narrow.batch.max() == 2  # batches within the model's largest
    with pytest.raises(ValueError, match="declares batching"):
        simulate_batched(setting, static(16, [ModelSLO(name="m", slo_ms=1000, cpus=16)], cluster, {"m": prof}))
    assert np.isfinite(wide.p99_ms)
