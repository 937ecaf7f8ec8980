"""Batching-aware Faro against Faro in the simulator (issue 20, item 4): ``python -m bench.batched_faro``.

The suite's day-10 scenario (``faro10_days1-10.csv`` day 10 sample 0, 10 jobs, the paper's
ResNet34 processing time and 720 ms p99 SLO, N-HiTS trained on days 1-8, cached), the
same Faro-FairSum policy twice per capacity and seed: its replicas serving one request at
a time (Faro as the paper has it), and batching with a measured profile (``--profile``,
``faro-serve profile``'s JSON; the planner picks each model's largest batch with its
replicas; the simulated replica serves a batch of ``b`` in one drawn processing time x
``s b + 1 - s``, ``s`` the profile's per-request share at 1 core).

The issue's targets: at the same capacity, at least 30 % less lost utility; or the same
utility as Faro with at least 20 % fewer replicas. Both are read from one run: the table
per capacity, and the smallest capacity at which batching-aware Faro loses no more than
Faro at the largest. Writes ``--out`` (docs/results/batched-faro.md by default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--profile",
        default=str(ROOT / "profiles" / "resnet34.json"),
        help="saved batch profile (profiles/resnet34.json)",
    )
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--capacities", default="36,32,28,24,20,16")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--policy", default="faro-fairsum")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "batched-faro.md"))
    ap.add_argument(
        "--minutes", type=int, default=None, help="replay only day 10's first N minutes (default: the whole day)"
    )
    ap.add_argument(
        "--forecaster-dir",
        default=None,
        help="a trained N-HiTS to plan with (default: the one trained on days 1-8, cached under runs/forecasters)",
    )
    args = ap.parse_args(argv)

    from faro_serve.config import Batching
    from faro_serve.sim.forecaster import ensure_forecaster
    from faro_serve.sim.policy_suite import aggregate, run_suite
    from faro_serve.sim.scenario import Scenario

    batching = Batching(profile=args.profile, max_batch_size=args.max_batch)
    caps = [float(c) for c in args.capacities.split(",")]
    seeds = list(range(args.seeds))
    fc_dir = args.forecaster_dir or str(
        ensure_forecaster(
            str(TRACE),
            days="1-8",
            sample=0,
            before_day=None,
            cache_dir=str(ROOT / "runs" / "forecasters"),
            max_steps=None,
            log=print,
        )
    )
    base = dict(trace=str(TRACE), day=10, sample=0, minutes=args.minutes)
    t0 = time.perf_counter()
    agg = {}
    for label, sc in (("faro", Scenario(**base)), ("batching", Scenario(**base, batching=batching))):
        rows, _ = run_suite(sc, [args.policy], caps, seeds, args.workers, fc_dir)
        for a in aggregate(rows):
            agg[(label, a["capacity"])] = a
        print(f"{label}: {len(rows)} runs, {time.perf_counter() - t0:.0f} s", flush=True)
    lines = [
        "# Batching-aware Faro against Faro (simulated, day 10)",
        "",
        f"`python -m bench.batched_faro --profile {Path(args.profile).name} --max-batch "
        f"{args.max_batch}`; {args.policy}, {len(seeds)} seeds per cell, "
        + (f"N-HiTS {args.forecaster_dir}" if args.forecaster_dir else "N-HiTS trained on days 1-8")
        + (f", the first {args.minutes} minutes" if args.minutes else "")
        + f"; {platform.machine()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.perf_counter() - t0:.0f} s.",
        "",
        f"Profile: gamma {batching.gamma * 1e3:.2f} ms, eps {batching.eps * 1e3:.2f} ms, delta "
        f"{batching.delta * 1e3:.2f} ms, eta {batching.eta * 1e3:.2f} ms; per-request share at "
        f"1 core s = {batching.share(1.0):.3f} (a batch of 16 serves {16 / (batching.share(1.0) * 16 + 1 - batching.share(1.0)):.2f}x "
        f"the requests of one at a time).",
        "",
        "| replicas | Faro lost utility (SD) | batching-aware (SD) | change | Faro SLO violations | batching-aware |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    doc = {"profile": args.profile, "share": batching.share(1.0), "cells": []}
    for c in sorted(caps, reverse=True):
        f, b = agg[("faro", c)], agg[("batching", c)]
        change = (b["lost_utility"] - f["lost_utility"]) / f["lost_utility"] if f["lost_utility"] > 0 else np.nan
        lines.append(
            f"| {c:g} | {f['lost_utility']:.3f} ({f['lost_utility_sd']:.3f}) | "
            f"{b['lost_utility']:.3f} ({b['lost_utility_sd']:.3f}) | {100 * change:+.0f} % | "
            f"{f['slo_violation_rate']:.2%} | {b['slo_violation_rate']:.2%} |"
        )
        doc["cells"].append({"capacity": c, "faro": f, "batching": b, "change": change})
    top = max(caps)
    ref = agg[("faro", top)]["lost_utility"]
    fewer = [c for c in caps if agg[("batching", c)]["lost_utility"] <= ref]
    least = min(fewer) if fewer else None
    if least is not None:
        verdict = f"loses no more from {least:g} replicas on ({100 * (1 - least / top):.0f} % fewer)."
    else:
        verdict = (
            f"loses that little at none of the capacities measured (at {top:g} it loses "
            f"{agg[('batching', top)]['lost_utility']:.3f})."
        )
    lines += ["", f"Faro at {top:g} replicas loses {ref:.3f}; batching-aware Faro {verdict}"]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
