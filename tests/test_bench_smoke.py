"""Every module of bench/ still runs (issue: bench/ keeps the benchmarks that docs cite and
that still run, each with a smoke test that runs it on a tiny input).

Three checks, cheapest first:

* ``python -m bench.<name> --help``, every command bench run as ``__main__`` in one fresh
  interpreter from the repository's root (``runpy``, as ``-m`` does; one process, not 34,
  for the suite's time): the module imports and its parser names every option it defines
  (read from its ``add_argument`` calls). The helper modules, imported by other benches and
  not commands, are imported instead.
* Its first-party imports, read from the source, those inside functions included (and the
  scripts a bench hands a child process as a string): each module exists and has each name
  imported. A renamed module or class shows here, not only when the bench runs.
* A run on a tiny input, in this process, for the benches that run without Ray: a small
  synthetic trace (3 jobs, 60 minutes a day, days 1-10) or a few minutes of the shared one,
  one seed, one capacity, a couple of training steps, output into ``tmp_path``.

Checked by ``--help`` and imports only:

* live, each starts Ray or Ray Serve (30-60 s and more, beyond this file's budget of two
  minutes; the suite is at its time limit): flood, gpu_live, pipeline_live, proxy_bench,
  replica_hold, replica_start, router_bench, sponge_live, surge_live, user_batch_bench,
  user_router_bench, whatif_live;
* run on a tiny input by their own tests already: gpu_cluster (tests/test_gpu_cluster_bench.py:
  a short run of each kind of policy and the report), pipeline_suite (tests/test_sim_pipelines.py:
  ``main --quick --minutes 8``), whatif_scale (tests/test_whatif.py: ``main`` on 4 deployments x
  90 minutes);
* helpers: procstat (what the live benches read of /proc), plain_app (the plain Ray Serve
  application whatif_live serves), ray_nodes (two Ray nodes; tests/test_multinode.py starts
  them); scale_report and scale_parts are run by scale_bench's tiny run, gpu_cluster_sim by
  gpu_cluster's test and replan_variants' policies by a tiny simulation here.

Where the input is the shared traces' (``../shared/traces``: compare_slices, daily_context,
batched_faro), the run is skipped without them.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"
FIRST_PARTY = ("faro_serve", "autoscaler", "forecasting", "deployments", "bench", "examples")
MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")

HELPERS = {"procstat", "scale_report", "scale_parts", "gpu_cluster_sim", "plain_app", "ray_nodes", "replan_variants"}
LIVE = {
    "flood",
    "gpu_live",
    "pipeline_live",
    "proxy_bench",
    "replica_hold",
    "replica_start",
    "router_bench",
    "sponge_live",
    "surge_live",
    "user_batch_bench",
    "user_router_bench",
    "whatif_live",
}
COVERED = {"gpu_cluster", "pipeline_suite", "whatif_scale"}
TINY = {
    "batched_faro",
    "capacity_need",
    "compare_slices",
    "concurrency_check",
    "daily_context",
    "ensemble_seeds",
    "forecast_bench",
    "gpu_slices",
    "inferline_paper",
    "oracle_bounds",
    "pipeline_composition",
    "pipeline_plans",
    "policy_fingerprint",
    "retrain_eval",
    "scale_bench",
    "short_history",
    "sim_bench",
    "solver_bench",
    "sponge_setting",
    "train_shipped_forecaster",
}
COMMANDS = sorted(set(MODULES) - HELPERS)
PARSER_OF = {"user_router_bench": "router_bench"}  # its parser is router_bench.start's
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="../shared/traces is not here")


def _tree(name: str) -> ast.Module:
    return ast.parse((ROOT / "bench" / f"{name}.py").read_text())


def test_every_bench_is_a_command_or_a_helper_and_is_sorted_into_one_kind_of_check():
    kinds = [HELPERS, LIVE, COVERED, TINY]
    assert sorted(set().union(*kinds)) == MODULES, "a bench added or removed: sort it into one kind"
    assert sum(len(k) for k in kinds) == len(MODULES), "a bench sorted twice"
    for name in MODULES:
        has_main = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in _tree(name).body)
        assert has_main == (name not in HELPERS), name


def _options(name: str) -> list[str]:
    """The option strings ``name``'s parser defines (not those it hides from --help)."""
    out = []
    for node in ast.walk(_tree(PARSER_OF.get(name, name))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            hidden = any(k.arg == "help" and "SUPPRESS" in ast.unparse(k.value) for k in node.keywords)
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
            if not hidden:
                out += flags
    return out


HELP_SCRIPT = """
import contextlib, io, json, runpy, sys
names, out = sys.argv[1:], {}
for name in names:
    sys.argv = [f"bench.{name}", "--help"]
    so, se, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        try:
            runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
        except BaseException as e:  # an import or a parser that fails: that bench's failure
            code = repr(e)
    out[name] = {"code": code, "stdout": so.getvalue(), "stderr": se.getvalue()[-3000:]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict:
    """Each command bench's ``--help`` run, from one fresh interpreter."""
    r = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT, *COMMANDS], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", COMMANDS)
def test_help(name, helps):
    """``python -m bench.<name> --help``: it imports, and the help names its options."""
    got = helps[name]
    assert got["code"] in (0, None), f"{got['code']}\n{got['stderr']}"
    assert got["stdout"].startswith("usage:"), got["stdout"][:500] + got["stderr"]
    missing = [o for o in _options(name) if o not in got["stdout"]]
    assert not missing, f"--help does not name {missing}:\n{got['stdout']}"


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helper_imports(name):
    importlib.import_module(f"bench.{name}")


def _scripts(tree: ast.Module):
    """(line, parsed) of the Python a bench hands a child process as a string constant
    (bench.proxy_bench's deployment script)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                yield node.lineno - 1, ast.parse(node.value)
            except SyntaxError:
                continue  # prose


def _first_party_imports(name: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of every first-party import in ``name``."""
    tree = _tree(name)
    out = []
    for offset, t in [(0, tree), *_scripts(tree)]:
        for node in ast.walk(t):
            if isinstance(node, ast.Import):
                out += [(offset + node.lineno, a.name, []) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = ".".join(filter(None, ["bench" if node.level else None, node.module]))
                out.append((offset + node.lineno, mod, [a.name for a in node.names if a.name != "*"]))
    return [(line, mod, names) for line, mod, names in out if mod.split(".")[0] in FIRST_PARTY]


@pytest.mark.parametrize("name", MODULES)
def test_first_party_imports_resolve(name):
    """Every first-party import of the bench, those inside its functions too, names a module
    that exists and names that module has (or its submodules)."""
    bad = []
    for line, mod, names in _first_party_imports(name):
        try:
            m = importlib.import_module(mod)
        except ImportError as err:
            bad.append(f"line {line}: import {mod}: {err}")
            continue
        for n in names:
            if hasattr(m, n):
                continue
            try:
                importlib.import_module(f"{mod}.{n}")
            except ModuleNotFoundError:
                bad.append(f"line {line}: from {mod} import {n}: {mod} has no {n}")
    assert not bad, f"bench/{name}.py:\n" + "\n".join(bad)


# ---- tiny runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """A folder with tiny stand-ins of the shared traces: ``faro10_days1-10.csv`` (3 jobs,
    samples 0-1, days 1-10 of 60 minutes) and ``azure12_days8-12.csv`` (2 functions, no
    sample column, days 8-12)."""
    d = tmp_path_factory.mktemp("traces")
    rng = np.random.default_rng(0)
    m = np.arange(60)
    rows = [
        f"{day},{s},{t},job{j},{int(c)}"
        for day in range(1, 11)
        for s in (0, 1)
        for j in range(3)
        for t, c in zip(m, rng.poisson(200 + 80 * j + 100 * np.sin(m / 9 + day + j)))
    ]
    (d / "faro10_days1-10.csv").write_text("day,sample,minute,job,requests\n" + "\n".join(rows) + "\n")
    rows = [
        f"{day},{t},fn{j},{int(c)}"
        for day in range(8, 13)
        for j in range(2)
        for t, c in zip(m, rng.poisson(40 + 20 * np.sin(m / 7 + j)))
    ]
    (d / "azure12_days8-12.csv").write_text("day,minute,job,requests\n" + "\n".join(rows) + "\n")
    return d


@pytest.fixture
def trace(traces) -> str:
    return str(traces / "faro10_days1-10.csv")


def run(name: str, *argv) -> object:
    """``bench.<name>``'s main on ``argv``; it must succeed (0 or None). What a bench sets for
    its process (torch's threads, ``OMP_NUM_THREADS``: the simulator suite's worker setup) is
    put back for the tests after it."""
    import torch  # the tiny runs load it anyway

    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    try:
        code = importlib.import_module(f"bench.{name}").main([str(a) for a in argv])
    finally:
        torch.set_num_threads(threads)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp
    assert code in (0, None), f"bench.{name} {' '.join(map(str, argv))}: exit {code}"
    return code


def test_capacity_need(trace, capsys):
    run("capacity_need", "--trace", trace, "--day", 10, "--sample", 0)
    assert "3 jobs x 60 minutes" in capsys.readouterr().out


def test_concurrency_check(capsys):
    run("concurrency_check", "--requests", 2000, "--seeds", 1)
    assert "| 720 | 2 | 6 |" in capsys.readouterr().out


def test_pipeline_composition(capsys):
    run("pipeline_composition", "--requests", 2000, "--seeds", 1)
    assert "3 stages, rho .7 each" in capsys.readouterr().out


def test_pipeline_plans(capsys):
    run("pipeline_plans")
    assert "fan-out a -> (b, c)" in capsys.readouterr().out


def test_sponge_setting(capsys):
    run("sponge_setting", "--seeds", 1, "--seconds", 10)
    out = capsys.readouterr().out
    assert "| sponge |" in out and "| static-16 |" in out


@needs_shared
def test_gpu_slices(tmp_path):
    out = tmp_path / "slices.md"
    run("gpu_slices", "--jobs", "job7", "--slices", "90-93", "--slos", "800:0.1", "--out", out)
    row = next(line for line in out.read_text().splitlines() if line.startswith("| job7 |"))
    assert row.startswith("| job7 | 90-93 | 800 |") and " % |" in row


def test_inferline_paper(trace, capsys):
    run("inferline_paper", "--trace", trace, "--job", "job0", "--start", 0, "--minutes", 8, "--peak", 5)
    out = capsys.readouterr().out
    assert "| InferLine |" in out and "| CG-Peak |" in out


def test_oracle_bounds(trace, capsys):
    run("oracle_bounds", "--trace", trace, "--n-jobs", 6, "--capacity", 10, "--seeds", 0)
    assert "| 0 |" in capsys.readouterr().out


def test_solver_bench(tmp_path):
    run("solver_bench", "--reps", 1, "--cases", "a", "--out", tmp_path)
    rows = json.loads((tmp_path / "solver.json").read_text())["rows"]
    assert [r["models"] for r in rows] == [10, 10, 10]


def test_sim_bench(trace, tmp_path):
    run("sim_bench", "--trace", trace, "--minutes", 3, "--out", tmp_path)
    rows = json.loads((tmp_path / "sim_bench.json").read_text())["rows"]
    assert [(r["jobs"], r["minutes"]) for r in rows] == [(10, 3), (10, 3), (100, 3), (100, 3)]


def test_scale_bench_sim_and_loop(trace, tmp_path):
    """The simulator and the autoscaler loop over its fake cluster adapter (the meters'
    reports), each in its child process, and the report (bench.scale_report)."""
    run(
        "scale_bench",
        "--parts",
        "sim,loop",
        "--jobs",
        6,
        "--capacity",
        12,
        "--minutes",
        3,
        "--ticks",
        3,
        "--loop-forecasters",
        "fallback",
        "--trace",
        trace,
        "--out",
        tmp_path,
    )
    res = json.loads((tmp_path / "scale-bench.json").read_text())
    assert res["sim"]["jobs"] == 6 and res["loop"][0]["ticks"] == 3
    assert "## Autoscaler loop" in (tmp_path / "scale-bench.md").read_text()


def test_replan_variants_run_as_policies_by_import_path(trace):
    from faro_serve.sim.scenario import Scenario, run_scenario

    sc = Scenario(trace=trace, day=10, sample=0, minutes=6).validate()
    for variant in ("plain", "both"):
        res = run_scenario(sc, f"bench.replan_variants:{variant}", 8, 0)
        assert res.summary.job_requests.sum() > 0


def test_policy_fingerprint(trace, tmp_path):
    out = tmp_path / "fp.json"
    run("policy_fingerprint", "--trace", trace, "--minutes", 4, "--capacity", 8, "--out", out)
    run("policy_fingerprint", "--compare", out, out)
    fp = json.loads(out.read_text())
    assert "faro-fairsum" in fp["policies"] and fp["batched"]


def test_forecast_bench(trace, tmp_path):
    run("forecast_bench", "--trace", trace, "--max-steps", 2, "--out", tmp_path)
    res = json.loads((tmp_path / "forecast_bench.json").read_text())
    assert set(res["results"]) == {"nhits-normal", "nhits-point", "last", "mean", "max"}


def test_retrain_eval(trace, tmp_path, capsys):
    run(
        "retrain_eval",
        "--trace",
        trace,
        "--days",
        "8-9",
        "--sample",
        0,
        "--holdout",
        30,
        "--max-steps",
        2,
        "--out",
        tmp_path / "candidate",
    )
    doc = json.loads(capsys.readouterr().out)
    assert {"swap", "candidate", "current"} <= set(doc) and Path(doc["saved_to"]).exists()


def test_ensemble_seeds(trace, tmp_path, capsys):
    run(
        "ensemble_seeds",
        "--trace",
        trace,
        "--net-seeds",
        1,
        "--mixes",
        1,
        "--capacities",
        6,
        "--seeds",
        1,
        "--max-steps",
        2,
        "--cache",
        tmp_path,
    )
    out = capsys.readouterr().out
    assert "| seed 1 |" in out and "| seeds 1 |" in out


def test_train_shipped_forecaster(traces, tmp_path, capsys):
    run("train_shipped_forecaster", "--traces", traces, "--out", tmp_path / "fc", "--mlp-width", 16, "--max-steps", 2)
    meta = json.loads((tmp_path / "fc" / "meta.json").read_text())
    assert [d["file"] for d in meta["train_data"]] == ["faro10_days1-10.csv", "azure12_days8-12.csv"]


def test_short_history(trace, tmp_path):
    run(
        "short_history",
        "--trace",
        trace,
        "--days",
        10,
        "--seeds",
        0,
        "--rules",
        "fallback,pad-mean",
        "--minutes",
        12,
        "--first-minutes",
        10,
        "--forecaster-dir",
        ROOT / "faro_serve" / "data" / "forecaster",
        "--out",
        tmp_path,
    )
    rows = json.loads((tmp_path / "short_history.json").read_text())
    assert [r["rule"] for r in rows] == ["fallback", "pad-mean"]


@needs_shared
def test_batched_faro(tmp_path):
    out = tmp_path / "batched.md"
    run(
        "batched_faro",
        "--capacities",
        16,
        "--seeds",
        1,
        "--workers",
        1,
        "--minutes",
        4,
        "--forecaster-dir",
        ROOT / "faro_serve" / "data" / "forecaster",
        "--out",
        out,
    )
    assert "| 16 |" in out.read_text() and json.loads(out.with_suffix(".json").read_text())["cells"]


@needs_shared
def test_compare_slices(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the slices' trace is ../shared/traces, from the repository's root
    out = tmp_path / "rows.json"
    run("compare_slices", "--slices", "t1", "--policies", "faro-fairsum", "--draws", 1, "--out", out)
    assert [r["slice"] for r in json.loads(out.read_text())["rows"]] == ["t1"]


@needs_shared
def test_daily_context(tmp_path):
    out = tmp_path / "daily.md"
    run("daily_context", "--weights", 0, "--out", out)
    assert "| Azure 12 functions | held out (12) |" in out.read_text()
