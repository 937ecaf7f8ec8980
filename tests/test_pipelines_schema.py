"""Pipelines in the schema (issue 35 item 1): declared in Python and YAML beside single
models, validated with errors that name the problem; their stages become models of the
cluster; the Python API scales stages and meters the ingress; the live loop observes a
pipeline end to end (fake cluster, no Ray)."""

from pathlib import Path

import pytest
import yaml
from meter_reports import meter_report

from autoscaler import make_policy
from autoscaler.driving.loop import AutoscalerLoop
from autoscaler.driving.loop_config import parse_autoscaler_config
from faro_serve import Pipeline, Stage
from faro_serve.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parent.parent


def doc(**pipeline) -> dict:
    p = {
        "name": "shop",
        "slo_ms": 900,
        "stages": [
            {"name": "det", "processing_ms": 100},
            {"name": "cls", "after": ["det"], "fraction": 0.5, "cpus": 2},
        ],
        **pipeline,
    }
    return {"cluster": {"cpus": 8}, "models": [{"name": "solo", "slo_ms": 300}], "pipelines": [p]}


def test_a_pipelines_stages_are_models_of_the_cluster_with_the_equal_split():
    cfg = parse_config(doc())
    ms = {m.name: m for m in cfg.all_models}
    assert list(ms) == ["solo", "det", "cls"] and [m.name for m in cfg.models] == ["solo"]
    assert ms["det"].slo_ms == ms["cls"].slo_ms == 450  # 900 over a path of two stages
    assert ms["cls"].cpus == 2 and ms["cls"].pipeline == "shop" and ms["solo"].pipeline is None
    assert ms["det"].app_name == "shop"  # a stage runs in its pipeline's application
    p = cfg.pipelines[0]
    assert p.order() == ["det", "cls"] and p.entries == ["det"] and p.sinks == ["cls"]


def test_a_fan_out_has_two_paths_and_its_split_follows_the_longest():
    p = Pipeline(
        name="f",
        slo_ms=600,
        stages=[
            Stage(name="a"),
            Stage(name="b", after=["a"]),
            Stage(name="c", after=["a"], fraction=0.3),
            Stage(name="d", after=["b"]),
        ],
    )
    assert sorted(p.paths()) == [["a", "b", "d"], ["a", "c"]] and p.depth == 3
    assert {m.name: m.slo_ms for m in p.stage_models()} == {"a": 200, "b": 200, "c": 200, "d": 200}
    assert Stage(name="x", slo_ms=50).slo_ms == 50  # a stage's own target wins
    assert p.stage_model("c").slo_ms == 200


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"stages": [{"name": "a", "after": ["b"]}, {"name": "b", "after": ["a"]}]},
            "pipelines.0: pipeline 'shop': its stages form a cycle through a, b",
        ),
        (
            {"stages": [{"name": "a", "after": ["zz"]}]},
            "pipeline 'shop': stage 'a' comes after unknown stage 'zz' (stages: a)",
        ),
        (
            {"stages": [{"name": "a", "fraction": 1.5}]},
            "pipelines.0.stages.0.fraction: Input should be less than or equal to 1 (got 1.5)",
        ),
        (
            {"stages": [{"name": "a", "fraction": 0}]},
            "pipelines.0.stages.0.fraction: Input should be greater than 0 (got 0)",
        ),
        ({"stages": [{"name": "a", "cpuz": 1}]}, "stage 'a': unknown field(s) cpuz"),
        ({"stages": [{"name": "a", "percentile": 90}]}, "stage 'a': percentile belong(s) to the pipeline"),
        (
            {"stages": [{"name": "a", "fraction": 0.5}, {"name": "b", "after": ["a"]}]},
            "stage 'b' has fraction 1, above its parents' (0.5)",
        ),
        ({"stages": [{"name": "a"}, {"name": "a"}]}, "stage 'a' appears twice"),
        ({"stages": [{"name": "solo"}]}, "stage 'solo' has the name of another model"),
        ({"name": "solo"}, "pipeline 'solo' has the name of a model"),
        ({"stages": [{"name": "a", "processing_ms": 1000}]}, "processing_ms (1000) must be below slo_ms (900)"),
    ],
)
def test_a_bad_pipeline_is_refused_naming_the_problem(change, message):
    with pytest.raises(ConfigError) as err:
        parse_config(doc(**change))
    assert message in str(err.value), str(err.value)


def test_a_config_of_pipelines_only_is_valid_and_one_of_nothing_is_not():
    d = doc()
    d["models"] = []
    assert [m.name for m in parse_config(d).all_models] == ["det", "cls"]
    with pytest.raises(ConfigError, match="give at least one model or pipeline"):
        parse_config({"cluster": {"cpus": 8}})
    with pytest.raises(ConfigError, match="min_replicas need 12 CPUs but the cluster has 8"):
        parse_config(doc(stages=[{"name": "a", "cpus": 1}, {"name": "b", "after": ["a"], "cpus": 10}]))


def test_the_examples_pipeline_in_python_is_the_one_in_its_config():
    """examples/pipeline declares its pipeline twice (the user's graph, the faro app's
    args): they must agree, or Faro plans another pipeline than the one that runs."""
    from examples.pipeline.app import MODERATION

    d = yaml.safe_load((ROOT / "examples/pipeline/config.yaml").read_text())
    cfg = parse_autoscaler_config(d["applications"][0]["args"])
    assert cfg.pipelines == [MODERATION]


def test_every_policy_is_told_the_pipelines_and_refuses_a_stage_it_does_not_have():
    cfg = parse_config(doc())
    pol = make_policy("aiad", cfg.all_models, cfg.cluster, pipelines=cfg.pipelines)
    assert [p.name for p in pol.pipelines] == ["shop"]
    with pytest.raises(ValueError, match=r"stage\(s\) cls are not models of this policy"):
        make_policy("aiad", cfg.all_models[:2], cfg.cluster, pipelines=cfg.pipelines)


class FakeCluster:
    """Two models' meters and the pipeline's ingress meter, as the Ray adapter reads them."""

    def __init__(self, reports):
        self.reports, self.controlled, self.scaled = reports, [], []

    def capacity(self):
        from faro_serve.resources import Capacity

        return Capacity.of(8.0, None)

    def running_replicas(self):
        return {"solo": 1, "det": 1, "cls": 1, "shop": 1}

    def meter_reports(self, names):
        return {n: self.reports[n] for n in names if n in self.reports}

    def scale(self, name, replicas):
        self.scaled.append((name, replicas))

    def control(self, name, setting, percentile):
        self.controlled.append((name, percentile))


def test_the_loop_observes_a_pipeline_at_its_ingress_and_shows_it():
    args = {**doc(ingress="Api"), "policy": "aiad", "forecaster": "fallback"}
    cfg = parse_autoscaler_config(args)
    reports = {
        n: meter_report(n, latency_ms=lat, arrival_rate=r)
        for n, lat, r in (("solo", 100.0, 2.0), ("det", 120.0, 4.0), ("cls", 300.0, 2.0), ("shop", 700.0, 4.0))
    }
    reports["shop"]["percentile"] = 95.0  # the ingress measures another percentile than the SLO's
    loop = AutoscalerLoop(cfg, FakeCluster(reports))
    seen = []
    decide = loop.policy.decide
    loop.policy.decide = lambda obs: seen.append(obs) or decide(obs)
    rec = loop.step()
    obs = seen[0]
    assert set(obs.models) == {"solo", "det", "cls"} and set(obs.pipelines) == {"shop"}
    assert obs.pipelines["shop"].latency_ms == 700.0 and obs.pipelines["shop"].arrival_rate == 4.0
    shown = rec["pipelines"]["shop"]
    assert shown["latency_ms"] == 700.0 and shown["stages"] == ["det", "cls"] and shown["measured"]
    assert shown["observed_utility"] == 1.0  # 700 ms within its 900 ms
    assert ("shop", 99.0) in loop.cluster.controlled  # told the pipeline's percentile
    assert loop.status()["pipelines"]["shop"]["latency_ms"] == 700.0
    # a malformed ingress report leaves the pipeline out, named, and the models are planned
    reports["shop"] = {"model": "shop"}
    loop.step()
    assert "shop" in loop.meter_errors and set(seen[-1].models) == {"solo", "det", "cls"}
    assert seen[-1].pipelines == {}
    assert rec["models"]["cls"]["slo_ms"] == 450
