"""Simulate `faro-serve compare` slices: each policy on each slice, as `compare` simulates the
live runs (``faro_serve.validation.matched.simulate_policy``: every model new at one replica,
clients that give up after 60 s, Ray's queue behind the Ray policies), several draws of the
per-request randomness at the slice's counts; lost cluster utility, SLO violations and the
share of the loss in the first five minutes.

    python -m bench.compare_slices                        # report slices, today's settings
    python -m bench.compare_slices --slices tune          # the day-8 slices tuned on
    python -m bench.compare_slices --spec '{"surge_plan": false, "surge_new": false}'

The tuning slices (day 8: inside the shipped forecaster's training days 1-8) were drawn at
random (numpy seed 8) among 6-job, 30-minute slices whose mean minute needs 12-22 replicas
and whose jobs' busiest minutes together need at least 1.25x that
(``faro_serve.validation.headtohead.contention``); capacity: the mean minute's need + 1. The
report slices are docs/compare.md's two and a third drawn the same way on day 9 (numpy
seed 9; the first one not overlapping the default slice's minutes), named before any live
run on it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

SLICES = {
    # docs/compare.md: the default slice, the second, and the third (named before its live run)
    "default": dict(day=9, start=310, jobs="job9,job0,job3,job1,job6,job5", capacity=16),
    "day10": dict(day=10, start=130, jobs="job7,job9,job2,job0,job3,job4", capacity=19),
    "third": dict(day=9, start=42, jobs="job9,job2,job7,job5,job8,job3", capacity=16),
    # tuning slices, day 8
    "t1": dict(day=8, start=84, jobs="job0,job5,job2,job1,job6,job7", capacity=18),
    "t2": dict(day=8, start=326, jobs="job5,job2,job1,job6,job4,job0", capacity=19),
    "t3": dict(day=8, start=19, jobs="job0,job6,job3,job5,job7,job8", capacity=17),
    "t4": dict(day=8, start=196, jobs="job1,job8,job9,job7,job6,job5", capacity=18),
}
GROUPS = {"report": ["default", "day10", "third"], "tune": ["t1", "t2", "t3", "t4"]}
TRACE = "../shared/traces/faro10_days1-10.csv"
OVERHEAD = "lognorm:0.5,0.008,0.003"  # docs/validation.md's measured router overhead


def simulate_slice(name: str, policy: str, spec: dict, draws: int, cold_start_s: float, forecaster) -> dict:
    from faro_serve.distributions import parse_dist
    from faro_serve.metrics import utility_from_latency
    from faro_serve.validation import matched as run
    from faro_serve.validation.comparison import Workload

    s = SLICES[name]
    wl = Workload(
        trace=TRACE,
        day=s["day"],
        sample=0,
        jobs=tuple(s["jobs"].split(",")),
        start=s["start"],
        minutes=30,
        rate_scale=1 / 3,
        slowdown=3,
    )
    lost, viol, first = [], [], []
    for d in range(draws):
        r = run.simulate_policy(
            policy, wl, s["capacity"], parse_dist(OVERHEAD), cold_start_s, forecaster, draw=d, cluster=spec
        )
        lost.append(r.summary.lost_cluster_utility)
        viol.append(r.summary.cluster_slo_violation_rate)
        u = utility_from_latency(r.table.p_all, np.full(len(r.names), wl.slo_ms * wl.slowdown / 1e3))
        first.append(float((1 - u[:, :5]).sum() / r.table.minutes))
    return {
        "slice": name,
        "policy": policy,
        "lost": float(np.mean(lost)),
        "lost_draws": [round(x, 3) for x in lost],
        "slo_violations": float(np.mean(viol)),
        "first5_lost": float(np.mean(first)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slices", default="report", help="report, tune, or names: " + ",".join(SLICES))
    ap.add_argument("--policies", default="faro-fairsum,ray-serve-tuned,oracle")
    ap.add_argument("--spec", default="{}", help="ClusterSpec fields over the defaults (JSON)")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--cold-start-s", type=float, default=10.0)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    from forecasting.shipped import load_shipped

    names = [n for part in a.slices.split(",") for n in GROUPS.get(part, [part])]
    unknown = [n for n in names if n not in SLICES]
    if unknown:
        ap.error(f"--slices: unknown {', '.join(unknown)} (known: report, tune, {', '.join(SLICES)})")
    spec = json.loads(a.spec)
    fc = load_shipped()
    rows = []
    print(f"{'slice':8s} {'policy':18s} {'lost':>6s}  draws                 SLO viol.  first 5 min")
    for n in names:
        for p in a.policies.split(","):
            r = simulate_slice(n, p, spec, a.draws, a.cold_start_s, fc)
            rows.append(r)
            print(
                f"{n:8s} {p:18s} {r['lost']:6.3f}  {str(r['lost_draws']):22s} {r['slo_violations']:7.1%}"
                f"  {r['first5_lost']:.3f}",
                flush=True,
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"spec": spec, "draws": a.draws, "cold_start_s": a.cold_start_s, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
