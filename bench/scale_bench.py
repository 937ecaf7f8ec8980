"""A thousand models (issue 36, item 3): planner, simulator and autoscaler loop at scale.

Usage: ``python -m bench.scale_bench [--parts planner,sim,loop] [--reps 5] [--minutes 360]``

* planner: ``plan(...)`` decision time (median, p90) and objective at 300 models / 1,000
  replicas and 1,000 models / 3,000 replicas, for the default grouping (G = 10, groups
  above ``group_max`` nested, hierarchy.py) and alternatives, each decision's objective
  against the best any configuration reached on the very same input. Two input sets:
  "trace" (the suite's models, 720 ms / 154 ms, forecasts as bench/solver_bench.py: 100
  Gaussian samples x 7 steps around the Faro trace's rates) and "mixed" (SLOs, processing
  times, priorities and rates drawn per model). Slow configurations run on one input only.
* sim: the matched simulator on 1,000 jobs duplicated from the trace as ``faro-serve suite
  --n-jobs`` does (day 10, 10 % jitter), Faro-FairSum on 3,000 replicas with the fallback
  forecaster (as bench/sim_bench.py): wall time, time inside the policy, peak RSS.
* loop: ``AutoscalerLoop`` over a fake cluster adapter (no Ray) with 1,000 models: tick
  time, RSS, and the JSON size of its saved state, its status and a decision record.

Each part runs in a child process (its own peak RSS). Writes ``scale-bench.md`` and
``scale-bench.json`` to ``--out`` (default docs/results). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench.scale_parts import PARTS

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"


def _child(part: str, args, argv) -> dict:
    """Run one part in a child process (nice 10 is inherited from the caller)."""
    out = Path(args.out) / f".scale-bench-{part}.json"
    cmd = [sys.executable, "-m", "bench.scale_bench", *argv, "--only", part, "--part-json", str(out)]
    la0 = os.getloadavg()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    res = json.loads(out.read_text())
    out.unlink()
    res["part_wall_s"] = round(time.perf_counter() - t0, 1)
    res["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    res["loadavg_before"] = [round(x, 2) for x in la0]
    res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return res


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="planner,sim,loop")
    ap.add_argument("--reps", type=int, default=5, help="decisions per fast planner config")
    ap.add_argument("--sets", default="trace,mixed", help="planner input sets")
    ap.add_argument("--jobs", type=int, default=1000, help="sim and loop: models")
    ap.add_argument("--capacity", type=int, default=3000, help="sim and loop: replicas (CPUs)")
    ap.add_argument("--minutes", type=int, default=360, help="sim: minutes of day 10")
    ap.add_argument("--sim-policy", default="faro-fairsum")
    ap.add_argument("--ticks", type=int, default=96, help="loop: 10 s ticks (4 plans in 96)")
    ap.add_argument(
        "--loop-forecasters",
        default="shipped,fallback",
        help="loop: run once per forecaster (shipped N-HiTS, fallback predictor)",
    )
    ap.add_argument("--loop-forecaster", default="shipped", help=argparse.SUPPRESS)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the parts of the existing scale-bench.json that this run does not repeat",
    )
    ap.add_argument("--only", help=argparse.SUPPRESS)
    ap.add_argument("--part-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.only:
        Path(args.part_json).write_text(json.dumps(PARTS[args.only](args), default=float))
        return 0
    from bench.scale_report import write

    Path(args.out).mkdir(parents=True, exist_ok=True)
    results, commands = {}, []
    old = Path(args.out) / "scale-bench.json"
    if args.merge and old.exists():
        kept = json.loads(old.read_text())
        commands = kept.pop("env")["commands"]
        results = {p: kept[p] for p in PARTS if p in kept}
    for p in args.parts.split(","):
        if p == "loop":  # once per forecaster: N-HiTS's stack dominates the memory
            results[p] = [_child(p, args, [*argv, "--loop-forecaster", f]) for f in args.loop_forecasters.split(",")]
        else:
            results[p] = _child(p, args, argv)
    env = {
        "commands": commands + [f"nice -n 10 .venv/bin/python -m bench.scale_bench {' '.join(argv)}".strip()],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        + " + working tree",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    write(Path(args.out), env, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
