"""The forecaster shipped with faro-serve and the default choice of forecaster (issue 32,
item 1): it is in the package (and in a wheel), loads through forecasting.io, serves a model
it never saw, and every driver picks it unless told ``fallback``; one that cannot be loaded
leaves the fallback predictor with the reason in each model's label and in the status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from meter_reports import FakeCluster

from autoscaler.catalogue.registry import make_policy
from autoscaler.contract.policy import ModelObservation, Observation
from autoscaler.driving.forecasters import choose_forecaster, policy_forecasts
from autoscaler.driving.loop import AutoscalerLoop
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.serving.schema import parse_autoscaler_config
from forecasting.base import FallbackForecaster
from forecasting.io import ForecasterLoadError, member_file, read_meta
from forecasting.nhits import NHitsForecaster
from forecasting.shipped import shipped_dir

ROOT = Path(__file__).parents[1]
MODELS = [
    ModelSLO(name="a", slo_ms=720, processing_ms=154, cpus=0.25),
    ModelSLO(name="b", slo_ms=720, processing_ms=154, cpus=0.25),
]


@pytest.fixture(scope="module")
def shipped():
    return choose_forecaster()


def _broken_neuralforecast(monkeypatch):
    """As on a machine whose neuralforecast does not import, and whose traced forward pass
    cannot load either: both raise."""
    import forecasting.scripted

    monkeypatch.setitem(sys.modules, "neuralforecast.models", None)

    def broken(path):
        raise RuntimeError("PytorchStreamReader failed reading zip archive")

    monkeypatch.setattr(forecasting.scripted, "load", broken)


def _plan_labels(fc, history) -> dict[str, str]:
    """Each model's predictor in a real Faro-FairSum plan with forecaster ``fc``."""
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=2), fc)
    obs = Observation(0.0, 2, None, {n: ModelObservation(n, 1, 1, np.asarray(h, float)) for n, h in history.items()})
    d = pol.decide(obs)
    assert d.kind == "long_term"
    return {n: p.predictor for n, p in d.plan.items()}


# -- what ships -----------------------------------------------------------------------------
def test_the_shipped_forecaster_is_small_and_trained_on_both_families_before_their_held_out_days():
    d = shipped_dir()
    assert d == ROOT / "faro_serve" / "data" / "forecaster"
    meta = read_meta(d)
    assert meta["loss"] == "normal" and (meta["input_size"], meta["horizon"]) == (15, 7)
    assert meta["members"] == 4  # an ensemble (docs/forecasting.md, "Ensemble")
    for i in range(4):
        assert (d / member_file("nhits.safetensors", i)).stat().st_size < 1_000_000  # 2.4 MB at width 256
    # plus each forward pass traced (forecasting/scripted.py): the same weights once more
    assert sum(f.stat().st_size for f in d.iterdir()) < 4 * 1_500_000
    minutes = meta["train_minutes"]
    faro = {s: m for s, m in minutes.items() if s.startswith("faro10_days1-10/")}
    azure = {s: m for s, m in minutes.items() if s.startswith("azure12_days8-12/")}
    assert len(faro) == 4 * 10 and set(faro.values()) == {8 * 360}  # days 1-8, 4 samples
    assert len(azure) == 12 and set(azure.values()) == {4 * 1440}  # days 8-11
    assert len(minutes) == len(faro) + len(azure)
    assert [(t["file"], t["days"]) for t in meta["train_data"]] == [
        ("faro10_days1-10.csv", "1-8"),
        ("azure12_days8-12.csv", "8-11"),
    ]


def test_by_default_the_shipped_nhits_serves_a_model_it_never_saw(shipped):
    fc, why = shipped
    assert isinstance(fc, NHitsForecaster) and fc.name == "nhits-normal" and why == "nhits-normal (shipped)"
    rng = np.random.default_rng(3)
    history = {"never-seen": rng.poisson(300, 40).astype(float), "idle-one": np.zeros(20)}
    assert not set(history) & set(fc.meta["train_series"])
    a, b = fc.predict(history, 64, seed=7), fc.predict(history, 64, seed=7)
    assert a.samples.shape == (2, 64, 7)
    assert np.isfinite(a.samples).all() and (a.samples >= 0).all()
    assert np.array_equal(a.samples, b.samples)  # seeded
    assert not np.array_equal(a.samples, fc.predict(history, 64, seed=8).samples)
    assert a.predictor == {"never-seen": "nhits-normal", "idle-one": "nhits-normal"}
    assert 2.5 < np.median(a.samples[0]) < 10  # about 300 requests/min = 5 requests/s


def test_the_shipped_forecaster_forecasts_with_torch_alone_as_its_weights_do():
    """The autoscaler loads the traced forward pass: neuralforecast (and Lightning, Ray Tune,
    pandas) are never imported, and the forecasts are the network's own."""
    code = (
        "import sys, numpy as np\n"
        "from forecasting.shipped import default_forecaster\n"
        "fc, why = default_forecaster()\n"
        "f = fc.predict({'x': np.arange(40.0) * 10}, 8, seed=1)\n"
        "print(why, fc.model is None, sorted(m for m in ('neuralforecast', 'pytorch_lightning',"
        " 'pandas') if m in sys.modules), f.samples.shape)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "nhits-normal (shipped) True [] (1, 8, 7)"
    from forecasting.io import load_forecaster

    traced, weights = load_forecaster(shipped_dir()), load_forecaster(shipped_dir(), script=False)
    assert traced.model is None and weights.model is not None
    rng = np.random.default_rng(36)
    for n in (1, 63, 64, 65, 300):  # the trace runs in chunks of 64 windows, the last padded
        w = rng.uniform(0, 2000, (n, 15))
        k = (rng.random((n, 15)) > 0.2).astype(float)
        for masks in (None, k):
            np.testing.assert_allclose(
                traced.predict_params(w, masks), weights.predict_params(w, masks), rtol=1e-5, atol=1e-3
            )


# -- choosing ----------------------------------------------------------------------------------
def test_opting_out_gives_the_fallback_predictor_labelled_chosen():
    fc, why = choose_forecaster("fallback")
    assert isinstance(fc, FallbackForecaster) and why == "fallback: chosen"
    assert _plan_labels(fc, {"a": np.full(20, 60.0), "b": np.full(20, 30.0)}) == {
        "a": "fallback: chosen",
        "b": "fallback: chosen",
    }


def test_a_shipped_forecaster_that_cannot_load_leaves_the_fallback_and_says_why(monkeypatch, caplog):
    _broken_neuralforecast(monkeypatch)
    fc, why = choose_forecaster()
    assert isinstance(fc, FallbackForecaster)
    assert why.startswith("fallback: forecaster failed to load: ") and "N-HiTS weights" in why
    assert "the fallback predictor serves every model" in caplog.text
    assert set(_plan_labels(fc, {"a": np.full(20, 60.0), "b": np.full(20, 30.0)}).values()) == {why}
    with pytest.raises(ForecasterLoadError):  # asked for by name: an error, not a fallback
        choose_forecaster("shipped")


def test_the_live_autoscaler_chooses_from_its_args():
    from autoscaler.driving.loop_retraining import forecaster_of as live_choice

    def args(**extra):
        return parse_autoscaler_config({"cluster": {"cpus": 2}, "models": [m.model_dump() for m in MODELS], **extra})

    fc, why = live_choice(args())
    assert isinstance(fc, NHitsForecaster) and why == "nhits-normal (shipped)"
    assert live_choice(args(forecaster="fallback"))[1] == "fallback: chosen"
    assert live_choice(args(policy="aiad")) == (None, "none: aiad does not forecast")
    assert args(forecaster="shipped").forecaster == "shipped"
    assert policy_forecasts("mark") and policy_forecasts("my_pkg.p:P") and not policy_forecasts("oracle")
    # the catalogue's column, not the name: MArk at saturation forecasts, Sponge does not
    assert policy_forecasts("mark-saturation") and policy_forecasts("faro-split") and not policy_forecasts("sponge")


# -- the label in the status -----------------------------------------------------------------
def _loop(forecaster, arrivals: dict[str, list]):
    cfg = parse_autoscaler_config(
        {"cluster": {"cpus": 2, "objective": "fair_sum"}, "models": [m.model_dump() for m in MODELS]}
    )
    cluster = FakeCluster({"a": 1, "b": 1})
    for n, h in arrivals.items():
        cluster.fronts[n].update(arrivals_per_min=h)
    loop = AutoscalerLoop(cfg, cluster, forecaster, clock=lambda: 100.0)
    loop.step()
    return {n: m["predictor"] for n, m in loop.status()["models"].items()}


def test_the_status_names_each_models_predictor(shipped, monkeypatch):
    fc, _ = shipped
    assert _loop(fc, {"a": [600] * 20, "b": [60] * 20}) == {"a": "nhits-normal", "b": "nhits-normal"}
    assert _loop(choose_forecaster("fallback")[0], {"a": [600] * 20}) == {
        "a": "fallback: chosen",
        "b": "fallback: chosen",
    }
    short = choose_forecaster(None, None, short_history="fallback")[0]  # too little history
    assert _loop(short, {"a": [600] * 5, "b": [60] * 20}) == {
        "a": "fallback: short history (5 of 15 minutes)",
        "b": "nhits-normal",
    }
    _broken_neuralforecast(monkeypatch)
    labels = _loop(choose_forecaster()[0], {"a": [600] * 20, "b": [60] * 20})
    assert all(v.startswith("fallback: forecaster failed to load: ") for v in labels.values())


def test_faro_serve_status_prints_the_forecaster_of_each_model(cli):
    """``faro-serve status`` over HTTP, against a server answering a real loop's status."""
    st = {
        "policy": "faro-fairsum",
        "objective": "fair_sum",
        "capacity_cpus": 2.0,
        "ticks": 3,
        "forecaster": "fallback: forecaster failed to load: no module",
        "models": {
            "a": {
                "slo_ms": 720,
                "percentile": 99,
                "arrival_rate": 1.0,
                "latency_ms": 200,
                "processing_ms": 150,
                "replicas": 1,
                "target": 1,
                "drop_rate": 0.0,
                "observed_utility": 1.0,
                "predicted_utility": 0.99,
                "predictor": "fallback: chosen",
            },
            "b": {
                "slo_ms": 720,
                "percentile": 99,
                "arrival_rate": 0.0,
                "latency_ms": None,
                "processing_ms": None,
                "replicas": 1,
                "target": 1,
                "drop_rate": 0.0,
                "observed_utility": None,
                "predicted_utility": None,
                "predictor": None,
            },
        },
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(st).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, out, err = cli("status", "--url", f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert code == 0, err
    text = " ".join(out.split())
    assert "forecaster" in text and "fallback: chosen" in text  # a's plan
    assert "failed to load" in text  # b has no plan yet: the forecaster loaded, in the title


# -- the shells ------------------------------------------------------------------------------------
@pytest.fixture()
def trace_csv(tmp_path):
    rng = np.random.default_rng(0)
    rows = [
        (day, 0, m, f"job{j}", int(base * rng.uniform(0.7, 1.3)))
        for day in (1, 2)
        for j, base in enumerate((300, 120, 40))
        for m in range(20)
    ]
    path = tmp_path / "t.csv"
    pd.DataFrame(rows, columns=["day", "sample", "minute", "job", "requests"]).to_csv(path, index=False)
    return path


def test_simulate_plans_with_the_shipped_forecaster_unless_told_fallback(cli, trace_csv):
    base = [
        "simulate",
        "--trace",
        str(trace_csv),
        "--day",
        "2",
        "--sample",
        "0",
        "--capacity",
        "8",
        "--policy",
        "faro-fairsum",
        "--minutes",
        "8",
        "--json",
        "-",
    ]
    code, out, err = cli(*base)
    assert code == 0, err
    assert json.loads(out)["forecaster"] == "nhits-normal (shipped)"
    code, out, err = cli(*base, "--forecaster", "fallback")
    assert code == 0, err
    assert json.loads(out)["forecaster"] == "fallback: chosen"
    code, out, err = cli(*base[:-4], "--policy", "aiad", "--json", "-")
    assert code == 0 and json.loads(out)["forecaster"] == "none"


def test_suite_rows_say_which_forecaster(cli, trace_csv, tmp_path):
    import csv

    for spec, label in ((None, "nhits-normal (shipped)"), ("fallback", "fallback: chosen")):
        out = tmp_path / f"s-{spec}"
        code, _, err = cli(
            "suite",
            "--trace",
            str(trace_csv),
            "--day",
            "2",
            "--sample",
            "0",
            "--minutes",
            "6",
            "--capacities",
            "8",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--policies",
            "faro-fairsum,aiad",
            "--out",
            str(out),
            *(["--forecaster", spec] if spec else []),
        )
        assert code == 0, err
        rows = {r["policy"]: r["forecaster"] for r in csv.DictReader((out / "results.csv").open())}
        assert rows == {"faro-fairsum": label, "aiad": ""}


# -- training it -----------------------------------------------------------------------------------
def test_forecast_train_takes_several_traces_each_with_its_days_and_every_sample(cli, tmp_path):
    rng = np.random.default_rng(1)
    faro = tmp_path / "fam1.csv"
    pd.DataFrame(
        [
            (d, s, m, f"job{j}", int(rng.poisson(100 + 50 * j)))
            for d in (1, 2, 3)
            for s in (0, 1)
            for j in range(2)
            for m in range(60)
        ],
        columns=["day", "sample", "minute", "job", "requests"],
    ).to_csv(faro, index=False)
    azure = tmp_path / "fam2.csv"
    pd.DataFrame(
        [(d, m, "fn0", int(rng.poisson(20))) for d in (8, 9, 10) for m in range(60)],
        columns=["day", "minute", "job", "requests"],
    ).to_csv(azure, index=False)
    out = tmp_path / "fc"
    code, stdout, err = cli(
        "forecast",
        "train",
        "--trace",
        str(faro),
        "--days",
        "1-2",
        "--sample",
        "all",
        "--trace",
        str(azure),
        "--days",
        "8-9",
        "--max-steps",
        "3",
        "--mlp-width",
        "8",
        "--out",
        str(out),
    )
    assert code == 0, err
    meta = read_meta(out)
    assert meta["train_minutes"] == {**{f"fam1/s{s}/job{j}": 120 for s in (0, 1) for j in (0, 1)}, "fam2/fn0": 120}
    assert meta["config"]["mlp_width"] == 8
    code, _, err = cli(
        "forecast",
        "train",
        "--trace",
        str(faro),
        "--trace",
        str(azure),
        "--days",
        "1",
        "--days",
        "2",
        "--days",
        "3",
        "--out",
        str(out),
    )
    assert code == 2 and "--days given 3 times for 2 --trace" in err


# -- installed -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_wheel_carries_the_forecaster_and_it_loads_from_the_install(tmp_path):
    """``pip wheel .`` holds the files (package-data); the package imported from the
    unpacked wheel alone (not this checkout) loads it and forecasts a model it never saw."""
    src = tmp_path / "src"  # a copy: the build leaves build/ and *.egg-info/ where it runs
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    for pkg in ("faro_serve", "autoscaler", "forecasting", "deployments", "bench"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "results"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "whl"),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "whl").glob("faro_serve-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    assert {"faro_serve/data/forecaster/meta.json", "faro_serve/data/forecaster/nhits.safetensors"} <= names
    assert not any(n.startswith("bench/") for n in names)  # the benchmarks stay in the repository
    code = (
        "import json, numpy as np, faro_serve, forecasting.shipped as s\n"
        "fc, why = s.default_forecaster()\n"
        "f = fc.predict({'unseen-model': np.full(30, 120.0)}, 16, seed=1)\n"
        "print(json.dumps([faro_serve.__file__, why, float(f.samples.min()), bool(np.isfinite(f.samples).all())]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    where, why, low, finite = json.loads(run.stdout.strip().splitlines()[-1])
    assert where.startswith(str(tmp_path / "site")) and why == "nhits-normal (shipped)"
    assert low >= 0 and finite
