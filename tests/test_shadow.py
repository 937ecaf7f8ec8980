"""Shadow mode (issue 48), Ray-free: a loop in ``mode: shadow`` plans every tick as the acting
loop does and publishes what it would set, but never scales or tells a front anything; on a
cluster whose own autoscaler moves replicas exactly as the acting loop did, its advice equals
the acting loop's decisions tick by tick (the same code path); switching the config to
control acts at once. The live version is in test_operations_live.py."""

import numpy as np
import pytest
from test_loop_restart import Cluster, run

from autoscaler.driving.loop import AutoscalerLoop
from faro_serve.config import ConfigError
from faro_serve.serving.schema import parse_autoscaler_config


def config(mode="control", policy=None, **extra):
    return parse_autoscaler_config(
        {
            "cluster": {"cpus": 3, "objective": "fair_sum", "reactive_trigger_s": 20},
            "policy": policy,
            "mode": mode,
            **extra,
            "models": [
                {"name": "a", "slo_ms": 720, "processing_ms": 154, "cpus": 0.25},
                {"name": "b", "slo_ms": 720, "processing_ms": 154, "cpus": 0.25},
            ],
        }
    )


class OwnScaler(Cluster):
    """A cluster whose own autoscaler moves the replicas along a timeline; faro-serve must
    neither scale it nor tell its fronts anything."""

    def __init__(self, timeline):
        super().__init__()
        self.timeline = list(timeline)
        self.told = []

    def meter_reports(self, names):
        for t, n, r in self.timeline:
            if t < self.t:  # what the acting loop did at an earlier tick has happened here too
                self.running[n] = r
        return super().meter_reports(names)

    def running_replicas(self):
        self.meter_reports([])
        return dict(self.running)

    def scale(self, name, replicas):
        raise AssertionError(f"shadow mode scaled {name} to {replicas}")

    def control(self, *args):
        self.told.append(args)


@pytest.mark.parametrize("policy", [None, "aiad"])
def test_shadow_advice_equals_the_acting_loops_decisions_and_changes_nothing(policy):
    times = np.arange(0, 900, 10.0)
    acting = Cluster()
    ref = AutoscalerLoop(config("control", policy), acting, clock=lambda: acting.t)
    want = run(ref, acting, times)
    assert sum(d is not None for d in want) >= 3

    own = OwnScaler(acting.scaled)
    shadow = AutoscalerLoop(config("shadow", policy), own, clock=lambda: own.t)
    got, advised = [], []
    for t in times:
        own.t = t
        rec = shadow.step()
        d = rec["decision"]
        got.append(None if d is None else (d["kind"], d["replicas"]))
        advised.append({n: m["advised"] for n, m in rec["models"].items()})
        assert rec["mode"] == "shadow"
    assert got == want  # same observations, same code path: same decisions
    assert own.told == []  # no front told a drop rate or setting
    # the advice published after each decision is the setting the acting loop put in force
    for k, d in enumerate(want):
        if d is not None:
            for n, r in d[1].items():
                assert advised[k][n]["replicas"] == r
    st = shadow.status()
    assert st["mode"] == "shadow" and st["models"]["a"]["advised"]["replicas"] >= 1


def test_switching_the_config_to_control_acts_at_the_next_decision():
    own = OwnScaler([])
    own.scale = Cluster.scale.__get__(own)  # this cluster accepts scaling
    shadow = AutoscalerLoop(config("shadow"), own, clock=lambda: own.t)
    for t in np.arange(0, 300, 10.0):
        own.t = t
        shadow.step()
    assert own.scaled == [] and shadow.advice
    control = AutoscalerLoop(config("control"), own, clock=lambda: own.t, previous=shadow)
    for t in np.arange(300, 900, 10.0):
        own.t = t
        control.step()
    assert own.scaled, "the loop in control mode never scaled"
    assert control.status()["mode"] == "control"


def test_observing_prometheus_needs_its_url():
    with pytest.raises(ConfigError, match="observe: prometheus needs prometheus_url"):
        config("shadow", observe="prometheus")
    with pytest.raises(ConfigError, match="mode"):
        config("advise")
    assert config("shadow", observe="prometheus", prometheus_url="http://p:9090").observe == "prometheus"


def test_faro_serve_status_shows_the_advice_beside_what_runs(cli):
    """The shadow loop's own status, served over real HTTP, read by ``faro-serve status``."""
    import json

    from test_cli_engine import _serve_once

    times = np.arange(0, 400, 10.0)
    acting = Cluster()
    run(AutoscalerLoop(config("control"), acting, clock=lambda: acting.t), acting, times)
    own = OwnScaler(acting.scaled)
    shadow = AutoscalerLoop(config("shadow"), own, clock=lambda: own.t)
    for t in times:
        own.t = t
        shadow.step()
    st = shadow.status()
    srv, url = _serve_once(json.dumps(st, default=str).encode(), "application/json")
    try:
        code, out, err = cli("status", "--url", url)
    finally:
        srv.shutdown()
    assert code == 0, err
    assert "advised" in out and "shadow mode: the autoscaler plans every tick and changes nothing" in out
    for n, m in st["models"].items():
        line = next(x for x in out.splitlines() if x.strip("│ ").startswith(n + " "))
        assert f"{m['advised']['replicas']} (" in line and f"{m['replicas']}/{m['target']}" in line
