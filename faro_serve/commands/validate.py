"""``faro-serve validate``: matched validation, live Ray Serve against the simulator (paper 6.5).

Runs the same trace slice live (a local Ray cluster on loopback, synthetic models with the
paper's processing-time distribution, one policy at a time, about --minutes of wall time per
policy) and in the matched simulator, then reports per policy the live and simulated cluster
utility, lost utility and SLO violation rate, their relative difference, and whether the
policies rank the same (Kendall tau). The simulated side is the mean of --sim-draws
simulations at the live run's per-minute counts. The simulator takes this machine's overhead, cold
start and replica hold between queued requests from a calibration before the first run.
--resimulate (with --out DIR) compares a changed simulator against the live runs saved in
DIR, without running them again.
"""

from __future__ import annotations

from ._live import add_live_args, run_validation


def register(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="live vs simulated runs of the same workload, per policy",
        description=__doc__.split("\n\n", 1)[1],
    )
    add_live_args(
        p,
        day=10,
        jobs="job1,job5,job7,job8",
        start=180,
        minutes=20,
        capacity=12,
        slowdown=1.0,
        rate_scale=1.0,
        policies="faro-fairsum,aiad,fairshare",
        out="runs/validate",
    )
    p.add_argument(
        "--sim-draws",
        type=int,
        default=None,
        help="simulations per policy, compared by their mean: the same per-minute counts, "
        "other draws of each request's arrival offset and times (5: validation.compare.SIM_DRAWS)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    out, doc, _ = run_validation(args)
    print((out / "validation.md").read_text())
    print(f"files: {out / 'validation.md'}, validation.json, validation.png, <policy>/records.csv")
    return 0
