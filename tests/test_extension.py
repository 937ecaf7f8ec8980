"""Extension without editing faro-serve (issue 33): a user's policy and forecaster by import
path (tests/user_plugins/my_policies.py, written as a user would) in the simulator, through
the command line and live on Ray Serve with its state kept over a restart; installed
plug-ins found by entry point from a real distribution on disk; bad import paths named with
their problem."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from live_helpers import day_trace, free_port, wait_for

from autoscaler import ModelObservation, Observation, make_policy, policy_names
from autoscaler.catalogue.plugins import PluginError, make_forecaster
from autoscaler.catalogue.registry import policy_factory
from faro_serve.config import ClusterSpec, ConfigError, ModelSLO
from faro_serve.serving.schema import parse_autoscaler_config
from faro_serve.sim.scenario import Scenario, run_scenario
from tests.user_plugins import my_policies

ROOT = Path(__file__).resolve().parents[1]
USER = "tests.user_plugins.my_policies"
MODELS = [ModelSLO(name="a", slo_ms=720, processing_ms=154), ModelSLO(name="b", slo_ms=720, processing_ms=154)]


def faro_args(**extra) -> dict:
    return {"cluster": {"cpus": 4}, "models": [m.model_dump() for m in MODELS], **extra}


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Two jobs, 8 minutes of steady load on day 1."""
    return day_trace(tmp_path_factory.mktemp("trace") / "t.csv", {"a": [300] * 8, "b": [120] * 8})


# -- by import path ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", [f"{USER}:MyPolicy", f"{USER}.MyPolicy", f"{USER}:make_my_policy"])
def test_make_policy_builds_a_user_class_or_factory_by_import_path(path):
    pol = make_policy(path, MODELS, ClusterSpec(cpus=4))
    assert type(pol).__name__ == "MyPolicy" and pol.name == "my-policy"
    obs = Observation(0.0, 4, None, {m.name: ModelObservation(m.name, 1, 1, np.zeros(3)) for m in MODELS})
    d = pol.decide(obs)
    assert d.replicas == {"a": 1, "b": 1} and d.info == {"decisions": 1} and d.kind == "my-policy"


def test_a_class_taking_a_forecaster_gets_it_and_a_default_name_becomes_the_path():
    fc = my_policies.MyForecaster()
    pol = make_policy("autoscaler.faro.hybrid:FaroPolicy", MODELS, ClusterSpec(cpus=4), forecaster=fc)
    assert pol.forecaster is fc
    mine = make_policy(f"{USER}:MyPolicy", MODELS, ClusterSpec(cpus=4), forecaster=fc)
    assert not hasattr(mine, "forecaster")  # its __init__ takes none: built without


def test_the_user_policy_decides_in_the_simulator(trace):
    sc = Scenario(trace=str(trace), day=1, sample=0, warmup_minutes=0).validate()
    res = run_scenario(sc, f"{USER}:MyPolicy", 8, seed=0)
    ticks = res.targets.shape[0]
    assert ticks == 8 * 6 and res.decisions == {"my-policy": ticks}
    # every tick's target is the one the policy's counter gives: 1, 2, 3, 1, ...
    want = [my_policies.target(k + 1) for k in range(ticks)]
    assert res.targets[:, 0].tolist() == want and res.targets[:, 1].tolist() == want


def test_simulate_runs_a_policy_given_by_import_path(cli, trace):
    code, out, err = cli(
        "simulate",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--warmup-minutes",
        "0",
        "--capacity",
        "8",
        "--policy",
        f"{USER}:MyPolicy",
        "--forecaster",
        "fallback",
        "--json",
        "-",
    )
    assert code == 0, err
    d = json.loads(out)
    assert d["policy"] == "my-policy" and d["decisions"] == {"my-policy": 48}


# -- bad import paths -------------------------------------------------------------------------
BAD = [
    (
        f"{USER.rpartition('.')[0]}.nope:MyPolicy",
        f"policy '{USER.rpartition('.')[0]}.nope:MyPolicy': module 'tests.user_plugins.nope' does "
        f"not import (No module named 'tests.user_plugins.nope')",
    ),
    (f"{USER}:Nope", f"policy '{USER}:Nope': module '{USER}' has no attribute 'Nope'"),
    (
        f"{USER}:MyForecaster",
        f"policy '{USER}:MyForecaster': {USER}.MyForecaster is not a Policy "
        f"subclass (autoscaler.contract.policy.Policy) or a factory",
    ),
    (f"{USER}:PERIOD", f"policy '{USER}:PERIOD': a int object is not a Policy subclass or a factory"),
]


@pytest.mark.parametrize("path, message", BAD)
def test_a_bad_import_path_fails_config_validation_naming_it(path, message):
    with pytest.raises(ConfigError) as err:
        parse_autoscaler_config(faro_args(policy=path))
    assert str(err.value) == f"invalid configuration in faro application args: {message}"


@pytest.mark.parametrize(
    "path, message",
    BAD
    + [
        (
            f"{USER}:not_a_policy",
            f"policy '{USER}:not_a_policy': the factory returned a dict, not a "
            f"Policy (autoscaler.contract.policy.Policy)",
        )
    ],
)
def test_a_bad_import_path_is_one_error_line_and_exit_2(cli, trace, path, message):
    code, out, err = cli(
        "simulate",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--warmup-minutes",
        "0",
        "--capacity",
        "8",
        "--policy",
        path,
        "--forecaster",
        "fallback",
    )  # no N-HiTS to load before the error
    assert code == 2 and err == f"faro-serve: error: {message}\n" and out == ""


def test_the_faro_application_args_with_a_bad_policy_path_exit_2(cli, tmp_path):
    doc = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    faro = next(a for a in doc["applications"] if a["name"] == "faro")
    faro["args"]["policy"] = f"{USER}:Nope"
    bad = tmp_path / "serve_config.yaml"
    bad.write_text(yaml.safe_dump(doc))
    code, _, err = cli("kuberay", "--config", str(bad), "--out", str(tmp_path / "rs.yaml"))
    assert code == 2 and err.count("\n") == 1 and err.startswith("faro-serve: error: ")
    assert f"module '{USER}' has no attribute 'Nope'" in err
    faro["args"]["policy"] = f"{USER}:MyPolicy"  # the good path passes the same check
    bad.write_text(yaml.safe_dump(doc))
    assert cli("kuberay", "--config", str(bad), "--out", str(tmp_path / "rs.yaml"))[0] == 0


def test_a_factory_returning_something_else_is_named_when_built():
    assert policy_factory(f"{USER}:not_a_policy")  # a callable: accepted until it is called
    with pytest.raises(PluginError, match="the factory returned a dict, not a Policy"):
        make_policy(f"{USER}:not_a_policy", MODELS, ClusterSpec(cpus=4))
    with pytest.raises(PluginError, match=r"cannot be called as factory\(models, cluster"):
        make_policy(f"{USER}:target", MODELS, ClusterSpec(cpus=4))


# -- forecasters ------------------------------------------------------------------------------
def test_a_forecaster_by_import_path_reaches_the_faro_plan():
    cfg = parse_autoscaler_config(faro_args(forecaster=f"{USER}:MyForecaster"))
    fc = make_forecaster(cfg.forecaster)
    assert isinstance(fc, my_policies.MyForecaster)
    pol = make_policy(cfg.policy_name(), cfg.models, cfg.cluster, fc)
    obs = Observation(0.0, 4, None, {m.name: ModelObservation(m.name, 1, 1, np.full(20, 60.0)) for m in MODELS})
    d = pol.decide(obs)
    assert d.kind == "long_term"
    assert {n: p.predictor for n, p in d.plan.items()} == {"a": "my-forecaster", "b": "my-forecaster"}
    assert d.info["models"]["a"]["forecast_mean_rps"] == pytest.approx(my_policies.MyForecaster.RATE)


def test_the_live_autoscaler_loads_the_forecaster_of_its_args():
    from autoscaler.driving.loop_retraining import forecaster_of

    cfg = parse_autoscaler_config(faro_args(forecaster=f"{USER}:MyForecaster"))
    assert isinstance(forecaster_of(cfg)[0], my_policies.MyForecaster)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"forecaster": f"{USER}:MyForecaster", "forecaster_dir": "runs/fc"},
            "give forecaster (an import path) or forecaster_dir (a trained directory), not both",
        ),
        ({"forecaster": f"{USER}:Gone"}, f"forecaster '{USER}:Gone': module '{USER}' has no attribute 'Gone'"),
        (
            {"forecaster": "flat"},
            "forecaster 'flat': not an import path (module:attribute) and no forecaster plug-in of that name",
        ),
    ],
)
def test_bad_forecaster_args_are_config_errors(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_autoscaler_config(faro_args(**args))


def test_an_object_that_is_not_a_forecaster_is_named():
    with pytest.raises(PluginError, match=r"NoHorizon is not a forecaster: no input_size, horizon"):
        make_forecaster(f"{USER}:NoHorizon")
    with pytest.raises(PluginError, match=r"MyPolicy\(\)|cannot be built with no arguments"):
        make_forecaster(f"{USER}:MyPolicy")


def test_simulate_takes_a_forecaster_by_import_path(cli, trace):
    code, out, err = cli(
        "simulate",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--warmup-minutes",
        "0",
        "--capacity",
        "8",
        "--policy",
        "faro-fairsum",
        "--forecaster",
        f"{USER}:MyForecaster",
        "--json",
        "-",
    )
    assert code == 0, err
    assert json.loads(out)["forecaster"] == f"{USER}:MyForecaster" and "fallback" not in err
    code, _, err = cli("simulate", "--trace", str(trace), "--capacity", "8", "--forecaster", f"{USER}:NoHorizon")
    assert code == 2 and err.startswith("faro-serve: error: forecaster") and err.count("\n") == 1


def test_suite_gives_its_forecaster_to_faro_and_to_a_user_policy(cli, trace, tmp_path):
    """``suite --forecaster``: the forecasting policies plan with it, and so is a policy
    named by import path given it (its rows say which forecaster); a bad one is refused."""
    out = tmp_path / "suite"
    code, _, err = cli(
        "suite",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--warmup-minutes",
        "0",
        "--capacities",
        "8",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--policies",
        f"faro-fairsum,aiad,{USER}:MyPolicy",
        "--forecaster",
        f"{USER}:MyForecaster",
        "--out",
        str(out),
    )
    assert code == 0, err
    rows = {r["policy"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert rows["faro-fairsum"]["forecaster"] == f"{USER}:MyForecaster"
    assert rows[f"{USER}:MyPolicy"]["forecaster"] == f"{USER}:MyForecaster"
    assert rows["aiad"]["forecaster"] == ""  # a built-in that does not forecast
    code, _, err = cli("suite", "--trace", str(trace), "--capacities", "8", "--forecaster", f"{USER}:Gone")
    assert code == 2 and err.startswith("faro-serve: error: forecaster") and err.count("\n") == 1
    # one whose forecast raises: one error line from the first run, not each worker's
    # traceback and a broken process pool
    code, _, err = cli(
        "suite",
        "--trace",
        str(trace),
        "--day",
        "1",
        "--sample",
        "0",
        "--warmup-minutes",
        "0",
        "--capacities",
        "8",
        "--seeds",
        "1",
        "--workers",
        "2",
        "--policies",
        "faro-fairsum",
        "--forecaster",
        f"{USER}:BrokenForecaster",
        "--out",
        str(tmp_path / "bad"),
    )
    assert (
        code == 2
        and err.splitlines()[-1]
        == (
            f"faro-serve: error: forecaster '{USER}:BrokenForecaster': BrokenForecaster.predict("
            "history, n_samples=2, seed=0) failed (KeyError: 'rate'); the suite stopped before any "
            "run finished (of 1)"
        )
        and "Traceback" not in err
    )
    assert not (tmp_path / "bad" / "results.csv").exists()


def test_a_suite_of_workers_runs_a_torch_forecaster_given_by_import_path(trace, tmp_path):
    """Its own process, as a user runs it: a torch forecaster by import path reaches forked
    workers. (The parent only imports it: building it there and making a check forecast
    before the fork hung both workers with one of our trained networks, not with this one.)"""
    import subprocess

    out = tmp_path / "suite"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "faro_serve",
            "suite",
            "--trace",
            str(trace),
            "--day",
            "1",
            "--sample",
            "0",
            "--warmup-minutes",
            "0",
            "--capacities",
            "8",
            "--seeds",
            "2",
            "--workers",
            "2",
            "--policies",
            "faro-fairsum",
            "--forecaster",
            f"{USER}:shipped_nhits",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["forecaster"] for r in rows] == [f"{USER}:shipped_nhits"] * 2


# -- entry points -----------------------------------------------------------------------------
ACME = '''"""An installed plug-in distribution's module."""
from autoscaler import Decision, Policy


class AcmePolicy(Policy):
    name = "acme-fixed"

    def decide(self, obs):
        return Decision({m: 2 for m in obs.models}, kind="acme")


class AcmeForecaster:
    input_size, horizon = 10, 5

    def predict(self, history, n_samples=100, seed=None):
        import numpy as np
        from forecasting.base import Forecast
        names = list(history)
        return Forecast(names, np.ones((len(names), n_samples, 5)), {n: "acme" for n in names})
'''


@pytest.fixture
def acme(tmp_path, monkeypatch):
    """A distribution 'acme-faro' installed on sys.path: its module and its *.dist-info
    with METADATA and entry_points.txt (a good policy, a broken one, one named like a
    built-in, and a forecaster)."""
    site = tmp_path / "site"
    info = site / "acme_faro-1.2.dist-info"
    info.mkdir(parents=True)
    (site / "acme_faro.py").write_text(ACME)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-faro\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(
        "[faro_serve.policies]\nacme-fixed = acme_faro:AcmePolicy\n"
        "acme-broken = acme_gone:Policy\naiad = acme_faro:AcmePolicy\n\n"
        "[faro_serve.forecasters]\nacme-flat = acme_faro:AcmeForecaster\n"
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("acme_faro", None)


def test_an_installed_plugin_is_listed_and_built(acme, cli, caplog):
    with caplog.at_level(logging.WARNING, logger="autoscaler.catalogue.registry"):
        names = policy_names()
    assert {"acme-fixed", "acme-broken"} <= set(names) and names.count("aiad") == 1
    assert any(
        "'aiad'" in r.message
        and "acme_faro:AcmePolicy (acme-faro 1.2)" in r.message
        and "the built-in wins" in r.message
        for r in caplog.records
    )
    assert type(make_policy("aiad", MODELS, ClusterSpec(cpus=4))).__name__ == "AIADPolicy"
    pol = make_policy("acme-fixed", MODELS, ClusterSpec(cpus=4))
    assert type(pol).__name__ == "AcmePolicy" and pol.name == "acme-fixed"
    assert parse_autoscaler_config(faro_args(policy="acme-fixed", forecaster="acme-flat")).policy == "acme-fixed"
    fc = make_forecaster("acme-flat")
    assert type(fc).__name__ == "AcmeForecaster" and fc.horizon == 5

    code, out, _ = cli("policies")
    rows = {line.split()[0]: line.split(None, 2) for line in out.splitlines() if line.strip()}
    assert rows["acme-fixed"][1] == "plug-in" and "acme_faro:AcmePolicy (acme-faro 1.2)" in rows["acme-fixed"][2]
    assert rows["aiad"][1] == "built-in" and "forecaster plug-ins:" in out
    assert "acme-flat  acme_faro:AcmeForecaster (acme-faro 1.2)" in out
    code, out, _ = cli("policies", "--json", "--details")
    doc = json.loads(out)
    kinds = {r["name"]: (r["kind"], r["source"]) for r in doc["policies"]}
    assert kinds["acme-fixed"] == ("plug-in", "acme_faro:AcmePolicy (acme-faro 1.2)")
    assert kinds["faro-fairsum"] == ("built-in", "autoscaler.catalogue.builtin")
    assert doc["forecasters"] == [
        {"name": "acme-flat", "kind": "plug-in", "source": "acme_faro:AcmeForecaster (acme-faro 1.2)"}
    ]
    assert set(json.loads(cli("policies", "--json")[1])) == set(policy_names())


def test_a_broken_plugin_fails_only_where_it_is_named(acme, cli, trace):
    with pytest.raises(
        PluginError,
        match=r"policy plug-in 'acme-broken' = acme_gone:Policy "
        r"\(acme-faro 1.2\): module 'acme_gone' does not import",
    ):
        make_policy("acme-broken", MODELS, ClusterSpec(cpus=4))
    with pytest.raises(ConfigError, match="policy plug-in 'acme-broken'"):
        parse_autoscaler_config(faro_args(policy="acme-broken"))
    code, _, err = cli(
        "simulate", "--trace", str(trace), "--day", "1", "--sample", "0", "--capacity", "8", "--policy", "acme-broken"
    )
    assert code == 2 and "module 'acme_gone' does not import" in err and err.count("\n") == 1
    assert cli("policies")[0] == 0  # listing does not import the plug-ins


# -- live -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_user_policy_runs_live_and_keeps_its_state_over_a_restart(tmp_path):
    """The faro application's ``policy:`` is the user's import path. Ray's worker processes
    get the module as a user ships one: ``py_modules`` in the job's runtime_env (serve.run
    gives it to the applications), under the name ``user_plugins``."""
    import httpx
    import ray
    from ray import serve
    from ray.util.state import list_actors

    from faro_serve.serving.app import deploy

    dash, http = free_port(), free_port()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dash,
        log_to_driver=False,
        runtime_env={"py_modules": [str(ROOT / "tests" / "user_plugins")]},
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http})
        base, dashboard = f"http://127.0.0.1:{http}", f"http://127.0.0.1:{dash}"
        spec = ClusterSpec(cpus=2, reactive_interval_s=1, cold_start_s=5)
        model = ModelSLO(name="user-a", slo_ms=720, processing_ms=20, cpus=0.25, max_replicas=4)
        deploy(
            [(model, {"model": {"kind": "synthetic", "processing": "const:0.02"}})],
            spec,
            policy="user_plugins.my_policies:MyPolicy",
            dashboard_url=dashboard,
            forecaster="fallback",
        )

        def get(path: str) -> dict:  # {} while the autoscaler is away
            try:
                r = httpx.get(f"{base}/faro/{path}", timeout=5)
                return r.json() if r.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                return {}

        def running():
            dep = serve.status().applications["user-a"].deployments["Model"]
            return dep.replica_states.get("RUNNING", 0)

        # it decides, and its targets reach the cluster: 2, then 3 replicas running
        assert wait_for(lambda: running() >= 2, 60), running()
        assert wait_for(lambda: running() >= 3, 60), running()
        saved = wait_for(
            lambda: (s := get("state")).get("policy", {}).get("fields", {}).get("decisions", 0) >= 20 and s, 60
        )
        assert saved and saved["policy"]["policy"] == "my-policy", saved
        # the autoscaler replica dies; Serve starts another, which carries on counting
        [actor] = [
            a
            for a in list_actors(address=dashboard, filters=[("state", "=", "ALIVE")])
            if a.class_name == "ServeReplica:faro:FaroAutoscaler"
        ]
        ray.kill(ray.get_actor(actor.name, namespace="serve"), no_restart=True)
        st = wait_for(lambda: (s := get("status")).get("restored") and s, 90)
        assert st and st["restored"]["from"].startswith("the state saved"), st
        before = saved["policy"]["fields"]["decisions"]
        # restored at once; it carries on counting from its next tick (a fresh-clone run read
        # the state between the restore and that tick once: 21 and 21)
        now = wait_for(
            lambda: (s := get("state")).get("policy", {}).get("fields", {}).get("decisions", 0) > before and s, 60
        ) or get("state")
        after = now["policy"]["fields"]["decisions"]
        assert now["start"] == saved["start"] and after > before, (saved, now)
    finally:
        serve.shutdown()
        ray.shutdown()
