"""The engine's command line (faro-serve estimate, plan) through the real entry point."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_estimate_reproduces_the_paper_example(cli):
    code, out, _ = cli(
        "estimate", "--rate", "40", "--proc-ms", "150", "--slo-ms", "600", "--percentile", "99.99", "--json"
    )
    assert code == 0 and json.loads(out)["replicas"] == 8
    code, out, _ = cli(
        "estimate",
        "--rate",
        "40",
        "--proc-ms",
        "150",
        "--slo-ms",
        "600",
        "--percentile",
        "99.99",
        "--estimator",
        "upper",
        "--json",
    )
    res = json.loads(out)
    assert code == 0 and res["replicas"] == 10 and res["latency_ms"] == pytest.approx(600)


def test_estimate_rejects_impossible_slo(cli):
    code, out, err = cli("estimate", "--rate", "5", "--proc-ms", "150", "--slo-ms", "100")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "below the processing time" in err


@pytest.mark.parametrize(
    "flag, value", [("--rate", "inf"), ("--rate", "nan"), ("--slo-ms", "nan"), ("--proc-ms", "inf")]
)
def test_estimate_names_a_flag_that_is_not_a_finite_number(cli, flag, value):
    args = {"--rate": "5", "--proc-ms": "150", "--slo-ms": "600", flag: value}
    code, out, err = cli("estimate", *[x for kv in args.items() for x in kv])
    assert (code, out) == (2, "") and err == f"faro-serve: error: {flag} must be a finite number (got {value})\n"


def test_plan_demo_spec_json(cli):
    code, out, err = cli("plan", "--spec", str(ROOT / "examples" / "plan_demo.yaml"), "--json")
    assert code == 0, err
    alloc = json.loads(out)
    assert alloc["objective"] == "fair_sum"
    assert alloc["cpus_used"] <= 12
    assert {d["name"] for d in alloc["decisions"]} == {"resnet34-a", "resnet34-b", "resnet18", "synthetic"}
    assert all(d["replicas"] >= 1 for d in alloc["decisions"])


def test_plan_table_output(cli):
    code, out, _ = cli("plan", "--spec", str(ROOT / "examples" / "plan_demo.yaml"))
    assert code == 0 and "resnet34-a" in out and "objective value" in out


@pytest.mark.parametrize(
    "body, needle",
    [
        ("cluster: {cpus: 4}\nmodels: [{name: a, slo_ms: -1, rate: 1}]", "models.0.slo_ms"),
        ("cluster: {cpus: 4}\nmodels: [{name: a, slo_ms: 500, processing_ms: 100}]", "exactly one of 'rate'"),
        ("cluster: {cpus: 4}\nmodels: [{name: a, slo_ms: 500, processing_ms: 100, rate: -2}]", "negative"),
        (
            "cluster: {cpus: 1}\nmodels: [{name: a, slo_ms: 500, processing_ms: 100, rate: 1, min_replicas: 2}]",
            "min_replicas need 2 CPUs",
        ),
        ("cluster: {cpus: 4, objective: best}\nmodels: [{name: a, slo_ms: 500, rate: 1}]", "cluster.objective"),
        (
            "cluster: {cpus: 4}\nmodels: [{name: a, slo_ms: 500, rate: 1}, {name: a, slo_ms: 500, rate: 1}]",
            "appears twice",
        ),
        ("cluster: {cpus: 4}\nmodels: [{name: a, slo_ms: 500, rate: 1}]", "no processing time"),
        ("cluster: {cpus: 4}\nmodels: [{name: a, slo_ms: 500, rate: 1, bogus: 3}]", "bogus"),
        ("cluster: [1, 2\n", "cannot parse"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_plan_bad_specs_exit_2_with_a_clear_message(cli, tmp_path, body, needle):
    spec = tmp_path / "spec.yaml"
    spec.write_text(body)
    code, out, err = cli("plan", "--spec", str(spec))
    assert code == 2 and out == ""
    assert err.startswith("faro-serve: error:") and needle in err
    assert "Traceback" not in err


def test_plan_missing_file(cli, tmp_path):
    code, _, err = cli("plan", "--spec", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read" in err


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "faro-serve"
    res = subprocess.run(
        [str(exe), "estimate", "--rate", "1", "--proc-ms", "10", "--slo-ms", "50", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and json.loads(res.stdout)["replicas"] == 1


def test_policies_lists_every_policy_with_a_summary(cli):
    import json

    from autoscaler import make_policy, policy_names
    from autoscaler.catalogue.registry import needs_batching
    from faro_serve.config import Batching, ClusterSpec, ModelSLO

    code, out, _ = cli("policies")
    assert code == 0
    lines = {line.split()[0]: line for line in out.strip().splitlines()}
    assert sorted(lines) == policy_names() and "faro-fairsum" in lines and "ray-serve" in lines
    code, out, _ = cli("policies", "--json")
    rows = json.loads(out)
    assert sorted(rows) == policy_names() and all(len(s) > 20 for s in rows.values())
    batching = Batching(gamma=0.1, eps=0.05)
    for name in rows:  # every listed name builds (Sponge on a model with a batch profile)
        m = ModelSLO(name="m", slo_ms=720, batching=batching if needs_batching(name) else None)
        make_policy(name, [m], ClusterSpec(cpus=4))
    with pytest.raises(ValueError, match="declare no batching"):
        make_policy("sponge", [ModelSLO(name="m", slo_ms=720)], ClusterSpec(cpus=4))


def test_estimate_counts_replicas_of_concurrency_k(cli):
    """--concurrency 4: each replica is 4 servers (docs/concurrency.md): the paper's example
    (40 req/s of 150 ms under 600 ms at p99) needs at most a quarter of the replicas."""
    code, out, _ = cli("estimate", "--rate", "40", "--proc-ms", "150", "--slo-ms", "600", "--json")
    one = json.loads(out)
    code4, out4, _ = cli(
        "estimate", "--rate", "40", "--proc-ms", "150", "--slo-ms", "600", "--concurrency", "4", "--json"
    )
    four = json.loads(out4)
    assert code == code4 == 0 and four["concurrency"] == 4
    # 4k servers pool at least as well as k: never more than a quarter of the replicas
    assert 1 <= four["replicas"] <= math.ceil(one["replicas"] / 4) and four["latency_ms"] <= 600
    assert cli("estimate", "--rate", "40", "--proc-ms", "150", "--slo-ms", "600", "--concurrency", "0")[0] == 2


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost:8000"])
def test_status_names_a_url_without_its_scheme(cli, url):
    """Not "cannot reach ... is serve running?": the server may be up; the URL is wrong."""
    code, out, err = cli("status", "--url", url)
    assert (code, out) == (2, "")
    assert err == f"faro-serve: error: --url must look like http://127.0.0.1:8000 (got {url!r})\n"


def _serve_once(body: bytes, content_type: str, status: int = 200):
    """A one-thread HTTP server on a free loopback port answering every GET with ``body``."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_status_of_something_else_or_of_a_fresh_autoscaler_says_so(cli):
    """Issue 50's rough edges: another server on that address is named in one line, not
    printed (it printed that server's whole HTML page); an autoscaler that has not ticked
    yet (just started or restarted) says so and exits 1 (it printed 'capacity None CPUs' and
    an empty table, exit 0)."""
    page = b"<html><body>" + b"welcome " * 500 + b"</body></html>"
    srv, url = _serve_once(page, "text/html")
    code, out, err = cli("status", "--url", url)
    srv.shutdown()
    assert code == 2 and out == "" and err.count("\n") == 1 and "welcome" not in err
    assert f"(text/html, {len(page)} bytes), not a faro-serve status" in err
    srv, url = _serve_once(
        b'{"policy": "faro-fairsum", "models": {}, "ticks": 0, "restored": true}', "application/json"
    )
    code, out, _ = cli("status", "--url", url)
    srv.shutdown()
    assert code == 1 and "has not observed the cluster yet since it restarted" in out
    srv, url = _serve_once(
        b'{"policy": "faro-fairsum", "models": {}, "ticks": 0, "restored": '
        b'{"from": "the previous configuration", "age_s": 0.1}}',
        "application/json",
    )
    code, out, _ = cli("status", "--url", url)  # a redeploy with a new config: not a restart
    srv.shutdown()
    assert code == 1 and "has not observed the cluster yet since its config changed" in out
