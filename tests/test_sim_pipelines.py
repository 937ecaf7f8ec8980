"""Pipelines in the matched simulator (issue 35): how queries move through the stages, what
is measured end to end, what policies observe, and the pipeline suite's quick run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoscaler import make_policy
from autoscaler.contract.policy import Decision, Policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.pipelines import PipelineSLO, expand
from faro_serve.sim import NO_OVERHEAD, SimConfig, TimeDist, simulate

CONST = TimeDist("const", (0.1,))


class Fixed(Policy):
    """Sets given targets and drop rates at its first tick, then holds; records what it saw."""

    name = "fixed"

    def __init__(self, models, cluster, targets=None, drops=None):
        super().__init__(models, cluster)
        self.targets, self.drops, self.seen = targets or {}, drops or {}, []

    def decide(self, obs):
        self.seen.append(obs)
        if len(self.seen) > 1 or not (self.targets or self.drops):
            return None
        return Decision(dict(self.targets), dict(self.drops))


def chain(name="chain", slo_ms=600.0, p=(100.0, 50.0)):
    stages = [
        dict(name=f"{name}-s{i}", processing_ms=ms, **({"after": [f"{name}-s{i - 1}"]} if i else {}))
        for i, ms in enumerate(p)
    ]
    return PipelineSLO(name=name, slo_ms=slo_ms, stages=stages)


def fan(fraction=0.5):
    return PipelineSLO(
        name="fan",
        slo_ms=800.0,
        stages=[
            dict(name="e", processing_ms=100.0),
            dict(name="x", after=["e"], processing_ms=50.0),
            dict(name="y", after=["e"], processing_ms=200.0, fraction=fraction),
        ],
    )


def run(
    singles,
    pipes,
    rate_per_min,
    minutes=10,
    capacity=40,
    targets=None,
    drops=None,
    processing=None,
    overhead=NO_OVERHEAD,
    seed=3,
    initial=None,
    **cfg,
):
    models = expand(singles, pipes)
    pol = Fixed(models, ClusterSpec(cpus=capacity), targets, drops)
    pol.attach_pipelines(pipes)
    counts = np.tile(np.asarray(rate_per_min, float)[:, None], (1, minutes))
    stage_proc = {m.name: TimeDist("const", (m.processing_ms / 1e3,)) for m in models[len(singles) :]}
    sc = SimConfig(
        capacity_cpus=capacity,
        processing=processing or CONST,
        router_overhead=overhead,
        cold_start_s=0.0,
        initial_replicas=initial,
        seed=seed,
        keep_records=True,
        **cfg,
    )
    return simulate(counts, singles, pol, sc, pipelines=pipes, stage_processing=stage_proc), pol


def job(res, name):
    i = res.names.index(name)
    r = res.records
    sel = r["model"] == i
    return {k: v[sel] for k, v in r.items()}


def stage(res, name):
    i = res.stage_table.names.index(name)
    r = res.stage_records
    sel = r["stage"] == i
    return {k: v[sel] for k, v in r.items()}


def test_light_chain_latency_is_the_sum_of_the_stages():
    """No queueing: every query takes processing + router overhead at each stage."""
    ovh = TimeDist("const", (0.002,))
    res, _ = run([], [chain()], [60.0], initial=8, overhead=ovh)
    r = job(res, "chain")
    assert r["latency_s"].size > 400 and not r["dropped"].any()
    assert np.allclose(r["latency_s"], 0.1 + 0.05 + 2 * 0.002)
    # the second stage gets each query when the first is done with it
    a, b = stage(res, "chain-s0"), stage(res, "chain-s1")
    assert np.allclose(b["arrival_s"], a["arrival_s"] + a["latency_s"])
    assert res.summary.job_slo_violation_rate[0] == 0.0


def test_starved_stage_makes_its_pipeline_violate_not_a_single_model_beside_it():
    single = [ModelSLO(name="m", slo_ms=600.0, processing_ms=100.0)]
    p = chain(p=(100.0, 100.0))
    # 8 queries/s: stage 2 with one replica is at rho 0.8; the single model has 4
    res, _ = run(
        single,
        [p],
        [480.0, 480.0],
        minutes=15,
        capacity=12,
        initial=1,
        targets={"m": 4, "chain-s0": 4, "chain-s1": 1},
        queue_limit=10**6,
    )
    s = res.summary
    im, ip = res.names.index("m"), res.names.index("chain")
    assert s.job_slo_violation_rate[im] < 0.01
    assert s.job_slo_violation_rate[ip] > 0.10
    assert s.job_lost_utility[ip] > s.job_lost_utility[im] + 0.2
    # the stage row shows where: stage 2's latency, not stage 1's
    st = res.to_dict()["stages"]
    assert st["chain-s1"]["latency_ms_median_minute"] > 3 * st["chain-s0"]["latency_ms_median_minute"]


def test_fraction_half_sees_half_the_queries():
    res, _ = run([], [fan(0.5)], [300.0], minutes=20, initial=6)
    n_e, n_y = stage(res, "e")["arrival_s"].size, stage(res, "y")["arrival_s"].size
    assert n_y / n_e == pytest.approx(0.5, abs=0.02)
    assert stage(res, "x")["arrival_s"].size == n_e


def test_fan_out_latency_is_the_slowest_branch():
    res, _ = run([], [fan(0.5)], [120.0], minutes=10, initial=8)
    lat = job(res, "fan")["latency_s"]
    long_ = np.isclose(lat, 0.1 + 0.2)  # visited y (200 ms) beside x (50 ms)
    short = np.isclose(lat, 0.1 + 0.05)
    assert (long_ | short).all()
    assert long_.mean() == pytest.approx(0.5, abs=0.05)


def test_a_join_waits_for_its_last_branch():
    """a -> {b, c} -> d: d starts when the slower of b and c is done; every query visits d."""
    p = PipelineSLO(
        name="diamond",
        slo_ms=1000.0,
        stages=[
            dict(name="a", processing_ms=100.0),
            dict(name="b", after=["a"], processing_ms=50.0),
            dict(name="c", after=["a"], processing_ms=200.0, fraction=0.5),
            dict(name="d", after=["b", "c"], processing_ms=100.0),
        ],
    )
    res, _ = run([], [p], [120.0], minutes=10, initial=8)
    lat = job(res, "diamond")["latency_s"]
    via_c = np.isclose(lat, 0.1 + 0.2 + 0.1)
    assert (via_c | np.isclose(lat, 0.1 + 0.05 + 0.1)).all()
    assert via_c.mean() == pytest.approx(0.5, abs=0.06)
    assert stage(res, "d")["arrival_s"].size == lat.size


def test_drop_at_the_second_stage_drops_the_query():
    res, _ = run([], [chain()], [120.0], minutes=10, initial=4, drops={"chain-s1": 0.5})
    r, b = job(res, "chain"), stage(res, "chain-s1")
    assert not stage(res, "chain-s0")["dropped"].any()
    assert r["dropped"].sum() == b["dropped"].sum() > 300
    assert res.summary.job_dropped[0] == b["dropped"].sum()
    assert np.isinf(res.summary.job_lost_utility[0]) is np.False_


def test_refused_at_a_full_queue_is_dropped_end_to_end():
    # stage 2 has one replica and no queue: a query arriving while it is busy is refused
    res, _ = run([], [chain(p=(50.0, 200.0))], [600.0], minutes=5, initial=1, targets={"chain-s0": 4}, queue_limit=0)
    r, a, b = job(res, "chain"), stage(res, "chain-s0"), stage(res, "chain-s1")
    assert b["dropped"].sum() > 100
    # (stage 1 has no queue either: the few it refuses never reach stage 2)
    assert b["arrival_s"].size == r["arrival_s"].size - a["dropped"].sum()
    assert r["dropped"].sum() == a["dropped"].sum() + b["dropped"].sum()


def test_observations_of_stages_and_pipelines():
    p = fan(0.5)
    res, pol = run([ModelSLO(name="m", slo_ms=600.0, processing_ms=100.0)], [p], [120.0, 240.0], minutes=6, initial=6)
    obs = pol.seen[-1]  # the last tick, minute 5
    assert set(obs.models) == {"m", "e", "x", "y"} and set(obs.pipelines) == {"fan"}
    po = obs.pipelines["fan"]
    e2e = job(res, "fan")
    per_min = np.bincount(np.floor(e2e["arrival_s"] / 60).astype(int), minlength=6)
    assert np.array_equal(po.arrivals_per_min, per_min[:5])  # the completed minutes
    assert 0.15 <= po.latency_ms / 1e3 <= 0.3 + 1e-9
    assert po.arrival_rate == pytest.approx(240 / 60, rel=0.6)
    # a stage reports what reached it, as a model does
    for n in ("e", "y"):
        got = np.bincount(np.floor(stage(res, n)["arrival_s"] / 60).astype(int), minlength=6)
        assert np.array_equal(obs.models[n].arrivals_per_min, got[:5])
    assert obs.models["y"].latency_ms == pytest.approx(200.0)
    assert obs.models["y"].processing_ms == pytest.approx(200.0)
    # the oracle's future: the pipeline's own, and each stage's at its fraction
    fut = obs.future_arrivals_per_min
    assert np.allclose(fut["y"], fut["fan"] * 0.5) and np.allclose(fut["e"], fut["fan"])
    assert fut["fan"][0] == per_min[5]


def test_make_policy_takes_the_pipelines_and_the_oracle_runs_them():
    p = chain()
    models = expand([], [p])
    pol = make_policy("oracle", models, ClusterSpec(cpus=10), pipelines=[p])
    assert pol.pipelines == (p,)
    counts = np.full((1, 8), 300.0)
    res = simulate(counts, [], pol, SimConfig(capacity_cpus=10, seed=1), pipelines=[p])
    assert res.names == ["chain"] and res.model_names == ["chain-s0", "chain-s1"]
    assert res.targets.shape[1] == 2 and res.summary.job_requests[0] > 2000


def test_finer_time_step_changes_nothing_and_seeds_are_deterministic():
    single = [ModelSLO(name="m", slo_ms=600.0, processing_ms=100.0)]
    kw = dict(minutes=6, capacity=8, initial=2, processing=TimeDist("expon", (0.0, 0.1)))
    a, _ = run(single, [fan(0.5)], [300.0, 840.0], **kw)
    b, _ = run(single, [fan(0.5)], [300.0, 840.0], max_step_s=0.25, **kw)
    c, _ = run(single, [fan(0.5)], [300.0, 840.0], seed=4, **kw)
    for k in a.records:
        assert np.array_equal(a.records[k], b.records[k])
    for k in a.stage_records:
        assert np.array_equal(a.stage_records[k], b.stage_records[k])
    assert not np.array_equal(a.records["latency_s"], c.records["latency_s"])
    # queries waited at the stages, so the check means something
    waited = stage(a, "e")["latency_s"] > 0.1 + 1e-9
    assert 0.1 < waited.mean() < 1 and not stage(a, "e")["dropped"].any()


def test_counts_need_a_row_per_pipeline():
    p = chain()
    pol = Fixed(expand([ModelSLO(name="m", slo_ms=600.0)], [p]), ClusterSpec(cpus=10))
    with pytest.raises(ValueError, match=r"models=1 \+ pipelines=1"):
        simulate(np.ones((1, 3)), [ModelSLO(name="m", slo_ms=600.0)], pol, SimConfig(capacity_cpus=10), pipelines=[p])


def test_pipeline_suite_quick_runs(tmp_path):
    from bench.pipeline_suite import main

    out = tmp_path / "suite.md"
    rows = main(
        [
            "--quick",
            "--minutes",
            "8",
            "--seeds",
            "1",
            "--policies",
            "fairshare,oracle,no-such-policy",
            "--out",
            str(out),
        ]
    )
    assert {r["policy"] for r in rows} == {"fairshare", "oracle"}
    text = out.read_text()
    assert "no-such-policy" in text and "skipped" in text
    assert "e2e SLO violations" in text


def _trace(path, jobs, minutes=6, rate=240):
    with open(path, "w") as f:
        f.write("day,sample,minute,job,requests\n")
        for d in (1, 2):
            for j in jobs:
                for m in range(minutes):
                    f.write(f"{d},0,{m},{j},{rate}\n")
    return path


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pipeline_sim.yaml"


def test_simulate_command_runs_a_config_with_pipelines(cli, tmp_path):
    trace = _trace(tmp_path / "t.csv", ["resnet", "detect-classify", "tag-caption"])
    out = tmp_path / "out.json"
    code, stdout, err = cli(
        "simulate",
        "--trace",
        str(trace),
        "--day",
        "2",
        "--sample",
        "0",
        "--config",
        str(EXAMPLE),
        "--policy",
        "fairshare",
        "--json",
        str(out),
    )
    assert code == 0, err
    res = json.loads(out.read_text())
    assert res["capacity"] == 16  # the config's cluster
    assert set(res["jobs"]) == {"resnet", "detect-classify", "tag-caption"}
    assert set(res["stages"]) == {"detect", "classify", "embed", "caption", "tag"}
    assert res["jobs"]["detect-classify"]["requests"] == pytest.approx(240 * 6, rel=0.1)
    assert res["stages"]["tag"]["requests"] == pytest.approx(0.4 * res["stages"]["embed"]["requests"], rel=0.15)
    assert "pipeline, end to end" in stdout and "pipeline stages" in stdout


def test_simulate_config_names_the_pipeline_missing_from_the_trace(cli, tmp_path):
    trace = _trace(tmp_path / "t.csv", ["resnet", "detect-classify"])
    code, _, err = cli(
        "simulate",
        "--trace",
        str(trace),
        "--day",
        "2",
        "--sample",
        "0",
        "--config",
        str(EXAMPLE),
        "--policy",
        "fairshare",
    )
    assert code == 2
    assert "pipeline 'tag-caption' has no job 'tag-caption'" in err
    assert "queries at the entry" in err
