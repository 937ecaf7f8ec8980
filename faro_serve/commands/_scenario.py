"""What ``simulate``, ``suite`` and ``replay`` share: a scenario's flags and how they become
a :class:`faro_serve.sim.scenario.Scenario`, the forecaster the flags name, and how a run's
result and a load step's recovery are printed (issue 49: commands share helpers through a
module meant for it, not another command's names)."""

from __future__ import annotations

import sys

from . import _args
from .errors import UsageError


def add_scenario_args(p) -> None:
    """Trace and setup flags shared with ``faro-serve suite``."""
    p.add_argument("--trace", required=True, help="trace file: tidy CSV or JSON lines")
    p.add_argument("--day", type=int, help="day to replay (CSV with a 'day' column)")
    p.add_argument("--sample", type=int, help="sample of that day (CSV with a 'sample' column)")
    p.add_argument("--jobs", help="comma-separated jobs to keep (default: all)")
    p.add_argument("--minutes", type=int, help="replay only the first N minutes")
    p.add_argument("--rescale", metavar="LOW,HIGH", help="map counts linearly onto LOW..HIGH requests/min")
    p.add_argument("--n-jobs", type=int, help="duplicate jobs (with jitter) up to N jobs")
    p.add_argument("--jitter", type=float, default=0.1, help="relative noise of duplicated jobs (0.1)")
    p.add_argument(
        "--warmup-minutes",
        type=int,
        default=None,
        help="arrival history from before the day given to the policies (default: a "
        "day and an hour, the forecaster's daily context; 0 = none)",
    )
    p.add_argument(
        "--daily-weight",
        type=float,
        default=None,
        help="how far the N-HiTS forecast moves towards yesterday's same minutes, for "
        "a job with a day of history (default 0.25; 0 = off; "
        "docs/forecasting.md, 'Daily context')",
    )
    p.add_argument(
        "--recurrence-share",
        type=float,
        default=None,
        help="the share of the N-HiTS forecast's samples raised to a job's recurring "
        "peak where its history shows a cycle (default 0.25; 0 = off; "
        "docs/forecasting.md, 'Recurring peaks')",
    )
    p.add_argument("--slo-ms", type=float, default=720.0, help="p99 latency SLO of every job (720)")
    p.add_argument("--percentile", type=float, default=99.0, help="SLO percentile (99)")
    p.add_argument(
        "--processing-ms",
        type=float,
        default=154.0,
        help="processing prior (154); also the mean of the simulated lognormal",
    )
    p.add_argument(
        "--processing-dist",
        help="simulated processing time, seconds: lognorm:S,LOC,SCALE | "
        "const:X | expon:LOC,SCALE (default: the paper's lognormal)",
    )
    p.add_argument("--overhead-dist", help="router overhead, same forms (default: the paper's lognormal)")
    p.add_argument("--cold-start-s", type=float, default=60.0, help="replica cold start (60)")
    p.add_argument("--queue-limit", type=int, default=50, help="router tail-drop threshold (50)")
    p.add_argument(
        "--replica-hold-ms",
        type=float,
        default=0.0,
        help="a replica's idle gap between queued requests, e.g. the one `validate` calibrates (0: the paper's model)",
    )
    p.add_argument(
        "--batch-profile",
        metavar="PATH",
        help="every job's replicas serve dynamic batches with this saved profile "
        "(faro-serve profile's JSON); Faro plans batch sizes with the replicas",
    )
    p.add_argument("--max-batch", type=int, default=16, help="largest batch with --batch-profile (16)")
    p.add_argument(
        "--gpus-per-replica", type=float, default=0.0, help="GPUs every job's replica takes, fractions allowed (0)"
    )
    p.add_argument(
        "--capacity-gpus", type=float, help="GPUs the jobs share, besides the --capacity CPUs (default: not binding)"
    )
    p.add_argument("--history", help="CSV to train the N-HiTS forecaster on (cached)")
    p.add_argument("--history-days", help="days of --history to train on (default: days before --day)")
    p.add_argument("--history-sample", type=int, default=0, help="sample of --history (0)")
    p.add_argument(
        "--forecaster-cache", default="runs/forecasters", help="where trained forecasters are kept (runs/forecasters)"
    )
    p.add_argument(
        "--history-max-steps",
        type=int,
        help="training steps of the forecaster (default: forecasting.train's; small = quick trial)",
    )


def scenario_from_args(args):
    from ..sim.scenario import Scenario

    rescale = None
    if args.rescale:
        try:
            lo, hi = (float(x) for x in args.rescale.split(","))
        except ValueError:
            raise ValueError(f"--rescale takes LOW,HIGH (got {args.rescale!r})") from None
        rescale = (lo, hi)
    jobs = _args.job_list(args.jobs)
    jobs = tuple(jobs) if jobs else None
    return Scenario(
        trace=args.trace,
        day=args.day,
        sample=args.sample,
        jobs=jobs,
        minutes=args.minutes,
        rescale=rescale,
        n_jobs=args.n_jobs,
        jitter=args.jitter,
        warmup_minutes=args.warmup_minutes,
        slo_ms=args.slo_ms,
        **({} if args.daily_weight is None else {"daily_weight": args.daily_weight}),
        **({} if args.recurrence_share is None else {"recurrence_share": args.recurrence_share}),
        percentile=args.percentile,
        processing_ms=args.processing_ms,
        processing_dist=args.processing_dist,
        overhead_dist=args.overhead_dist,
        cold_start_s=args.cold_start_s,
        queue_limit=args.queue_limit,
        replica_hold_ms=args.replica_hold_ms,
        batching=_batching(args),
        gpus_per_replica=getattr(args, "gpus_per_replica", 0.0),
        capacity_gpus=getattr(args, "capacity_gpus", None),
    ).validate()


def _batching(args):
    if not getattr(args, "batch_profile", None):
        return None
    from pydantic import ValidationError

    from ..config import Batching

    try:
        return Batching(profile=args.batch_profile, max_batch_size=args.max_batch)
    except ValidationError as err:
        msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
        raise ValueError(f"--batch-profile/--max-batch: {msg}") from None


def forecaster_from_args(args, log=None):
    """(forecaster, how it was made): N-HiTS trained on ``--history`` ("nhits"), else the
    forecaster of ``--forecaster`` (``fallback``, ``shipped``, a plug-in name or an import
    path), else the N-HiTS shipped with faro-serve (``autoscaler.driving.forecasters``)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    spec = getattr(args, "forecaster", None)
    if spec and args.history:
        raise UsageError("give --forecaster (a name or an import path) or --history (train N-HiTS), not both")
    if not args.history:
        from autoscaler.driving.forecasters import choose_forecaster

        return choose_forecaster(spec)
    from ..sim.forecaster import history_forecaster

    warn_if_trained_on_the_day(args, log)
    fc = history_forecaster(
        args.history,
        days=args.history_days,
        sample=args.history_sample,
        before_day=args.day if args.history_days is None else None,
        cache_dir=args.forecaster_cache,
        max_steps=args.history_max_steps,
        log=log,
    )
    return fc, "nhits"


def warn_if_trained_on_the_day(args, log) -> None:
    """A note when ``--history-days`` holds the day replayed from the same file (and
    sample): the forecaster would have learnt the very minutes it forecasts, and the run
    would flatter every forecasting policy."""
    from pathlib import Path

    from ..traces import parse_days

    if args.history_days is None or args.day is None or not args.history:
        return
    try:
        same = Path(args.history).resolve() == Path(args.trace).resolve()
        days = parse_days(args.history_days) or []
    except (OSError, ValueError):
        return  # a bad spec is reported where it is read
    if same and args.day in days and (args.sample is None or args.history_sample == args.sample):
        log(
            f"note: --history-days {args.history_days} includes day {args.day}, the day replayed: "
            f"the forecaster is trained on the minutes it forecasts (use the days before it)"
        )


def step_report(names, records, models, step_s: float) -> dict:
    """The surge metrics (faro_serve.recovery) of a run's request records."""
    from ..recovery import surge_report

    return surge_report(
        names,
        records["model"],
        records["arrival_s"],
        records["latency_s"],
        records["dropped"],
        [m.slo_ms / 1e3 for m in models],
        [m.percentile for m in models],
        step_s,
    )


def print_step(rep: dict) -> None:
    print(
        f"step at {rep['step_s']:g} s: recovery (SLO-percentile over {rep['window_s']:g} s windows "
        f"back under the SLO for the rest of {rep['span_s']:g} s) and requests dropped or over "
        f"the SLO in that span"
    )
    for n, m in rep["models"].items():
        rec = "not within the span" if m["recovery_s"] is None else f"{m['recovery_s']:g} s"
        print(
            f"  {n}: recovery {rec}; {m['bad']:,} of {m['requests']:,} bad "
            f"({m['dropped']:,} dropped, {m['over_slo']:,} over the SLO)"
        )


def print_result(res, sc) -> None:
    from rich.console import Console
    from rich.table import Table

    s = res.summary
    table = Table(title=f"{res.policy} on {len(res.names)} jobs, capacity {res.capacity_cpus:g}, seed {res.seed}")
    for col in ("job", "requests", "dropped", "SLO viol.", "lost utility", "mean replicas"):
        table.add_column(col, justify="left" if col == "job" else "right", no_wrap=True)
    cols = res.model_names or res.names
    mean_reps = dict(zip(cols, res.targets.mean(axis=0)))
    stages_of = {}
    if res.pipelines:  # a pipeline's replicas: its stages'
        for m in sc.all_models():
            if m.pipeline:
                stages_of.setdefault(m.pipeline, []).append(m.name)
    for i, n in enumerate(res.names):
        reps = sum(mean_reps[x] for x in stages_of[n]) if n in stages_of else mean_reps[n]
        table.add_row(
            n + (" (pipeline, end to end)" if n in stages_of else ""),
            f"{int(s.job_requests[i]):,}",
            f"{int(s.job_dropped[i]):,}",
            f"{s.job_slo_violation_rate[i]:.2%}",
            f"{s.job_lost_utility[i]:.3f}",
            f"{reps:.1f}",
        )
    con = Console()
    con.print(table)
    if res.stage_summary is not None:
        st = Table(title="pipeline stages (each against its own slo_ms; not jobs of the cluster objective)")
        for col in ("stage", "requests", "dropped", "median minute SLO-pct latency ms", "replica-minutes"):
            st.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)
        rows = res.to_dict()["stages"]
        for n, r in rows.items():
            lat = r["latency_ms_median_minute"]
            st.add_row(
                n,
                f"{r['requests']:,}",
                f"{r['dropped']:,}",
                "-" if lat is None else f"{lat:.0f}",
                f"{r['replica_minutes']:.0f}",
            )
        con.print(st)
    con.print(
        f"lost cluster utility {s.lost_cluster_utility:.3f} (effective {s.lost_effective_utility:.3f}) | "
        f"cluster SLO violation rate {s.cluster_slo_violation_rate:.2%} | "
        f"{res.table.minutes} min, {int(s.job_requests.sum()):,} requests | wall {res.wall_s:.1f} s"
    )
