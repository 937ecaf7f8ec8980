"""No blind start (issue 32): how N-HiTS should forecast a model with less than its input
window of history, measured in the simulator.

Faro-FairSum on the Faro 10-job trace at 32 replicas, with the N-HiTS trained on days 1-8
(sample 0, cached in runs/forecasters) and NO warm-up history (``--warmup-minutes 0``): its
plans at minutes 5 and 10 see 5 and 10 minutes of history. Each ``short_history`` rule of
:mod:`forecasting.nhits` (the fallback predictor is ``fallback``) runs on the same arrivals
(same seeds); the table gives the lost cluster utility over the first 15 minutes and over
the run. Choose the rule on day 8 (tuning), report on days 9 and 10.

    .venv/bin/python -m bench.short_history [--days 8,9,10] [--seeds 0,1,2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.short_history", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--days", default="8,9,10")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--capacity", type=float, default=32.0)
    p.add_argument("--rules", default="fallback,pad-mean,pad-edge,pad-tile,mask")
    p.add_argument("--first-minutes", type=int, default=15)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument(
        "--minutes", type=int, default=None, help="replay only each day's first N minutes (default: the whole day)"
    )
    p.add_argument(
        "--forecaster-dir",
        default=None,
        help="a trained N-HiTS (default: the one trained on days 1-8 of --trace, cached under runs/forecasters)",
    )
    return p.parse_args(argv)


def lost(result, first: int) -> tuple[float, float]:
    """Lost cluster utility over the first ``first`` minutes and over the whole run."""
    cu = result.summary.cluster_utility
    n = len(result.summary.names)
    return float(n - cu[:first].mean()), float(n - cu.mean())


def main(argv=None) -> int:
    from faro_serve.sim.forecaster import history_forecaster
    from faro_serve.sim.scenario import Scenario, run_scenario
    from forecasting.io import load_forecaster

    a = parse_args(argv)
    if a.forecaster_dir:
        fc = load_forecaster(a.forecaster_dir)
    else:
        fc = history_forecaster(a.trace, days="1-8", sample=0, cache_dir=ROOT / "runs" / "forecasters")
    rules = a.rules.split(",")
    rows = []
    for day in (int(d) for d in a.days.split(",")):
        sc = Scenario(trace=a.trace, day=day, sample=0, warmup_minutes=0, minutes=a.minutes).validate()
        loaded = sc.load()
        for seed in (int(s) for s in a.seeds.split(",")):
            for rule in rules:
                fc.short_history = rule
                t0 = time.time()
                res = run_scenario(sc, "faro-fairsum", a.capacity, seed, fc, loaded=loaded)
                first, run = lost(res, a.first_minutes)
                rows.append(
                    {
                        "day": day,
                        "seed": seed,
                        "rule": rule,
                        "lost_first": round(first, 4),
                        "lost_run": round(run, 4),
                        "wall_s": round(time.time() - t0, 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "short_history.json").write_text(json.dumps(rows, indent=1))
    lines = [
        f"| day | rule | lost, first {a.first_minutes} min (mean of seeds) | lost, run | per seed, first |",
        "|---:|---|---:|---:|---|",
    ]
    for day in sorted({r["day"] for r in rows}):
        for rule in rules:
            rs = [r for r in rows if r["day"] == day and r["rule"] == rule]
            lines.append(
                f"| {day} | {rule} | {np.mean([r['lost_first'] for r in rs]):.3f} | "
                f"{np.mean([r['lost_run'] for r in rs]):.4f} | "
                + " / ".join(f"{r['lost_first']:.3f}" for r in rs)
                + " |"
            )
    (out / "short_history.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
