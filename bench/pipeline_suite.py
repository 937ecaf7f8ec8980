"""Policies on pipelines in the matched simulator (issue 35): ``python -m bench.pipeline_suite``.

The scenario (faro_serve.sim.pipeline_scenario.suite_scenario): three single ResNet34 jobs
(720 ms p99) and three pipelines (a chain of 2, a chain of 3, a fan-out with a branch at 40 %)
whose queries come from jobs of the Faro trace (Azure Functions 2019 and the Twitter stream),
on a contended cluster of 30 replicas (chosen on day 8), 3 seeds.
Reported slice: day 10 sample 0 (the existing suite's); the capacity was chosen on day 8
sample 0 and nothing is tuned on day 10. ``--quick``: the first 30 minutes, one seed.

Per policy: lost cluster utility (jobs = the single models and the pipelines, each pipeline
measured end to end against its SLO: the suite's definition), the pipelines' mean end-to-end
SLO violation rate, each pipeline's mean utility, and replica-minutes (target replicas,
starting ones included, of every model and stage). A policy name the registry does not know
(``faro-split`` before it lands) is skipped with a message. Writes
bench/results/pipeline_suite{,-quick}.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"
DEFAULT_POLICIES = "faro-fairsum,faro-split,inferline,oracle"
CAPACITY = 30.0  # chosen on day 8 (docs/pipeline-sim.md)

_W: dict = {}


def _init(trace: str, day: int, minutes: int | None, forecaster: str | None) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from faro_serve.sim.pipeline_scenario import suite_scenario

    sc = suite_scenario(trace, day=day, minutes=minutes)
    _W.update(scenario=sc, loaded=sc.load(), forecaster_spec=forecaster, forecaster=None)


def _forecaster():
    if _W["forecaster"] is None:
        from autoscaler.driving.forecasters import choose_forecaster

        if _W["forecaster_spec"] in (None, "shipped"):
            import torch

            torch.set_num_threads(1)
        _W["forecaster"] = choose_forecaster(_W["forecaster_spec"])
    return _W["forecaster"]


def _run(task: tuple[str, float, int]) -> dict:
    from faro_serve.sim.policy_suite import uses_forecaster

    policy, capacity, seed = task
    sc = _W["scenario"]
    fc, fc_name = _forecaster() if uses_forecaster(policy) else (None, "")
    t = time.perf_counter()
    res = sc.run(policy, capacity, seed, forecaster=fc, loaded=_W["loaded"])
    s = res.summary
    pipes = res.pipelines
    idx = {n: i for i, n in enumerate(res.names)}
    rm = res.replica_minutes()
    return {
        "policy": policy,
        "capacity": capacity,
        "seed": seed,
        "lost_cluster_utility": s.lost_cluster_utility,
        "cluster_slo_violation_rate": s.cluster_slo_violation_rate,
        "e2e_slo_violation_rate": float(np.mean([s.job_slo_violation_rate[idx[p]] for p in pipes])),
        "utility": {n: 1.0 - float(s.job_lost_utility[i]) for n, i in idx.items()},
        "e2e_violation": {p: float(s.job_slo_violation_rate[idx[p]]) for p in pipes},
        "dropped": {n: int(s.job_dropped[i]) for n, i in idx.items()},
        "replica_minutes": float(sum(rm.values())),
        "replica_minutes_by_model": rm,
        "minutes": res.table.minutes,
        "requests": int(s.job_requests.sum()),
        "wall_s": time.perf_counter() - t,
        "forecaster": fc_name,
    }


def known(policies: list[str]) -> tuple[list[str], dict[str, str]]:
    """The policies the registry can build, and why each other one is skipped."""
    from autoscaler.catalogue.registry import policy_factory

    ok, skipped = [], {}
    for p in policies:
        try:
            policy_factory(p)
            ok.append(p)
        except ValueError as err:
            skipped[p] = str(err).split(";")[0]
    return ok, skipped


def aggregate(rows: list[dict]) -> list[dict]:
    out = []
    for pol in dict.fromkeys(r["policy"] for r in rows):
        rs = [r for r in rows if r["policy"] == pol]

        def ms(f):
            v = np.array([f(r) for r in rs], float)
            return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0

        pipes = list(rs[0]["e2e_violation"])
        out.append(
            {
                "policy": pol,
                "seeds": len(rs),
                "lost": ms(lambda r: r["lost_cluster_utility"]),
                "e2e_viol": ms(lambda r: r["e2e_slo_violation_rate"]),
                "cluster_viol": ms(lambda r: r["cluster_slo_violation_rate"]),
                "pipe_utility": {p: ms(lambda r, p=p: r["utility"][p])[0] for p in pipes},
                "replica_minutes": ms(lambda r: r["replica_minutes"]),
            }
        )
    out.sort(key=lambda a: a["lost"][0])
    return out


def table(agg: list[dict]) -> str:
    if not agg:
        return "(no policy ran)\n"
    pipes = list(agg[0]["pipe_utility"])
    head = (
        "| policy | lost cluster utility (SD) | e2e SLO violations | cluster SLO violations | "
        + " | ".join(f"{p} utility" for p in pipes)
        + " | replica-minutes |"
    )
    lines = [head, "|---|" + "---:|" * (4 + len(pipes))]
    for a in agg:
        lines.append(
            f"| {a['policy']} | {a['lost'][0]:.3f} ({a['lost'][1]:.3f}) | "
            f"{a['e2e_viol'][0]:.2%} | {a['cluster_viol'][0]:.2%} | "
            + " | ".join(f"{a['pipe_utility'][p]:.3f}" for p in pipes)
            + f" | {a['replica_minutes'][0]:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"comma-separated policy names ({DEFAULT_POLICIES}); unknown ones are skipped",
    )
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--day", type=int, default=10, help="day to report (10; sample 0)")
    ap.add_argument("--capacity", type=float, default=CAPACITY, help=f"replicas ({CAPACITY:g})")
    ap.add_argument("--seeds", type=int, help="seeds 0..N-1 (3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="the first --minutes (30) only, one seed")
    ap.add_argument("--minutes", type=int, help="replay only the first N minutes")
    ap.add_argument("--workers", type=int, help="processes (2; --quick: 1)")
    ap.add_argument(
        "--forecaster",
        help="the forecasting policies' forecaster: shipped (the "
        "default N-HiTS), fallback, a plug-in or an import path",
    )
    ap.add_argument("--out", help="markdown output (default bench/results/pipeline_suite[-quick].md; JSON beside it)")
    args = ap.parse_args(argv)
    minutes = args.minutes or (30 if args.quick else None)
    seeds = args.seeds or (1 if args.quick else 3)
    workers = args.workers or (1 if args.quick else 2)
    policies, skipped = known([p.strip() for p in args.policies.split(",") if p.strip()])
    for p, why in skipped.items():
        print(f"skipped {p}: {why}", file=sys.stderr)
    tasks = [(p, args.capacity, s) for p in policies for s in range(seeds)]
    init = (args.trace, args.day, minutes, args.forecaster)
    t0 = time.perf_counter()
    if workers <= 1:
        _init(*init)
        rows = [_run(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=_init, initargs=init) as pool:
            rows = list(pool.map(_run, tasks))
    wall = time.perf_counter() - t0
    agg = aggregate(rows)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
        ).stdout.strip()
    except OSError:
        commit = ""
    cmd = "python -m bench.pipeline_suite " + " ".join(argv if argv is not None else sys.argv[1:])
    fcs = sorted({r["forecaster"] for r in rows if r["forecaster"]})
    text = (
        f"# Pipeline suite: day {args.day} sample 0"
        f"{f', first {minutes} minutes' if minutes else ''}, capacity {args.capacity:g}, "
        f"{seeds} seed(s)\n\n"
        f"`{cmd.strip()}` at {commit or '?'} on {platform.machine()}, {os.cpu_count()} cores, "
        f"{workers} worker(s), {wall:.0f} s wall{f'; forecaster {fcs[0]}' if fcs else ''}.\n\n"
        + table(agg)
        + "".join(f"\nskipped {p}: {why}\n" for p, why in skipped.items())
    )
    print(text)
    out = (
        Path(args.out)
        if args.out
        else ROOT / "bench" / "results" / ("pipeline_suite-quick.md" if args.quick else "pipeline_suite.md")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps(
            {"command": cmd.strip(), "commit": commit, "wall_s": wall, "skipped": skipped, "rows": rows}, indent=1
        )
    )
    return rows


if __name__ == "__main__":
    main()
