"""Restart-safe policy state (autoscaler.contract.state): every policy, stopped mid-run, saved as JSON
and restored into a freshly built policy, makes exactly the decisions the uninterrupted
policy makes on the same observations; and a policy changes nothing between decisions
that its state does not hold."""

import copy
import json
import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from conftest import with_batching

from autoscaler import make_policy, policy_names
from autoscaler.catalogue.registry import needs_batching
from autoscaler.contract.state import decode, encode
from autoscaler.policies.common import Timers
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.sim import SimConfig, simulate
from faro_serve.traces import load_trace

TRACE = Path(__file__).parent / "data" / "guard_day9.csv"  # real minutes, bundled (data/README.md)


@pytest.fixture(scope="module")
def observations():
    """The observations of a real simulated hour (day 9, 4 jobs, a binding capacity),
    recorded once per policy from its own run."""
    tr = load_trace(TRACE, days=9, sample=0).select(["job0", "job1", "job2", "job3"]).window(60, 120)
    models = [ModelSLO(name=n, slo_ms=720, processing_ms=154) for n in tr.names]
    cluster = ClusterSpec(cpus=12, cold_start_s=10)
    out = {}
    for name in policy_names():
        mods = with_batching(models) if needs_batching(name) else models  # Sponge: profiles
        pol = make_policy(name, mods, cluster)
        seen = []
        decide = pol.decide
        pol.decide = lambda obs, decide=decide: (seen.append(copy.deepcopy(obs)), decide(obs))[1]
        simulate(tr.counts * 0.5, mods, pol, SimConfig(capacity_cpus=12, cold_start_s=10, seed=2))
        out[name] = (mods, cluster, seen)
    return out


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (a.settings, a.kind) == (b.settings, b.kind)


@pytest.mark.parametrize("name", policy_names())
def test_a_restored_policy_decides_as_the_uninterrupted_one(name, observations):
    models, cluster, seen = observations[name]
    whole = make_policy(name, models, cluster)
    want = [whole.decide(o) for o in seen]
    assert any(d is not None for d in want)
    for k in (len(seen) // 3, 2 * len(seen) // 3):
        first = make_policy(name, models, cluster)
        for o in seen[:k]:
            first.decide(o)
        saved = json.loads(json.dumps(first.get_state()))  # through JSON, as it is stored
        again = make_policy(name, models, cluster)
        again.set_state(saved)
        got = [again.decide(o) for o in seen[k:]]
        bad = [i + k for i, (a, b) in enumerate(zip(got, want[k:])) if not _same(a, b)]
        assert not bad, f"{name}: restored at tick {k}, first different decision at tick {bad[0]}"


def _config_attrs(pol) -> dict:
    return {
        k: copy.deepcopy(v)
        for k, v in vars(pol).items()
        if k not in pol.state_fields and k not in ("forecaster", "fallback", "cluster", "models", "slo", "decide")
    }


@pytest.mark.parametrize("name", policy_names())
def test_only_declared_state_changes_between_decisions(name, observations):
    models, cluster, seen = observations[name]
    pol = make_policy(name, models, cluster)
    before = _config_attrs(pol)
    for o in seen:
        pol.decide(o)
    after = _config_attrs(pol)
    changed = [k for k in before if not _equal(before[k], after[k])]
    assert not changed, f"{name} keeps state in {changed}, not in its state_fields"


def _equal(a, b) -> bool:
    try:
        return bool(np.all(a == b)) if isinstance(a, np.ndarray) else a == b
    except Exception:
        return repr(a) == repr(b)


def test_state_of_another_policy_or_model_set_is_refused():
    models = [ModelSLO(name="a", slo_ms=500)]
    faro = make_policy("faro-fairsum", models, ClusterSpec(cpus=4))
    with pytest.raises(ValueError, match="not 'aiad'"):
        make_policy("aiad", models, ClusterSpec(cpus=4)).set_state(faro.get_state())
    other = make_policy("faro-fairsum", [ModelSLO(name="b", slo_ms=500)], ClusterSpec(cpus=4))
    with pytest.raises(ValueError, match="over"):
        other.set_state(faro.get_state())


def test_codec_round_trips_the_types_policies_keep():
    t = Timers()
    t.update("a", True, 3.0)
    value = {
        "inf": -math.inf,
        "q": deque([(1.0, 2), (3.0, 4)], maxlen=5),
        "arr": np.arange(3.0),
        "none": None,
        "list": [1, 2.5, "x"],
        "t": (1, 2),
    }
    back = decode(json.loads(json.dumps(encode(value))))
    assert back["inf"] == -math.inf and back["q"] == value["q"] and back["q"].maxlen == 5
    assert back["arr"].dtype == np.float64 and np.array_equal(back["arr"], value["arr"])
    assert back["none"] is None and back["list"] == [1, 2.5, "x"] and back["t"] == (1, 2)
    fresh = Timers()
    assert decode(json.loads(json.dumps(encode(t))), fresh) is fresh and fresh.since == {"a": 3.0}
    with pytest.raises(TypeError, match="cannot save"):
        encode(object())
