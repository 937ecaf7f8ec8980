"""``faro-serve suite``: every policy x capacity x seed in the simulator, in parallel.

Runs on ``--workers`` processes (2) with a progress bar and writes into ``--out``:
results.csv (one row per run), timeline.csv (cluster utility per minute), summary.md
(mean and SD over seeds, policies ranked per capacity, as the paper's Table 7) and the
plots lost_utility.png and timeline.png. Trace and setup flags are those of ``simulate``.
"""

from __future__ import annotations

import sys
import time

from ._output import check_output_dir
from .errors import UsageError


def register(sub) -> None:
    from ._scenario import add_scenario_args

    p = sub.add_parser(
        "suite", help="compare policies x capacities x seeds in the simulator", description=__doc__.split("\n\n", 1)[1]
    )
    add_scenario_args(p)
    p.add_argument(
        "--forecaster",
        metavar="NAME|IMPORT_PATH",
        help="the forecasting policies' forecaster: 'fallback' (the fallback predictor), "
        "'shipped' (the N-HiTS shipped with faro-serve, the default), a plug-in name "
        "or the import path of a forecaster class or factory (my_pkg.fc:MyForecaster); "
        "not with --history",
    )
    p.add_argument("--capacities", default="36,32,16", help="comma-separated replica counts (36,32,16)")
    p.add_argument(
        "--policies",
        default="all",
        help="comma-separated policy names or import "
        "paths (my_pkg.policies:MyPolicy), or 'all' (the default: every built-in and "
        "installed policy; Sponge only with --batch-profile)",
    )
    p.add_argument("--seeds", default="3", help="a count N (seeds 0..N-1) or a list like 0,1,2 (3)")
    p.add_argument("--workers", type=int, default=2, help="parallel processes (2)")
    p.add_argument("--out", default="runs/suite", help="output directory (runs/suite)")
    p.add_argument("--timeline-capacity", type=float, help="capacity of the timeline plot (default: the middle one)")
    p.add_argument("--title", default="", help="title of the summary and plots")
    p.set_defaults(func=run)


def _numbers(text: str, what: str, cast=float) -> list:
    try:
        vals = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated numbers (got {text!r})") from None
    if not vals:
        raise ValueError(f"{what} is empty")
    return vals


def run(args) -> int:
    from pathlib import Path

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autoscaler import policy_names
    from autoscaler.catalogue.registry import needs_batching, policy_factory

    from ..sim.policy_suite import SuiteStopped, aggregate, markdown_table, run_suite, uses_forecaster, write_outputs
    from ._args import check_capacity
    from ._scenario import scenario_from_args

    known = policy_names()
    # 'all': Sponge only with --batch-profile (it needs every model's batch profile)
    policies = (
        [p for p in known if args.batch_profile or not needs_batching(p)]
        if args.policies == "all"
        else [p.strip() for p in args.policies.split(",") if p.strip()]
    )
    if not policies:
        raise UsageError(f"no policy given; choose from {', '.join(known)}")
    for p in policies:  # a bad name or import path fails before any run starts
        try:
            policy_factory(p)
        except ValueError as err:
            raise UsageError(str(err)) from None
    capacities = _numbers(args.capacities, "--capacities")
    for c in capacities:
        check_capacity(c, "each of --capacities")
    if args.timeline_capacity is not None and args.timeline_capacity not in capacities:
        raise UsageError(f"--timeline-capacity {args.timeline_capacity:g} is not one of --capacities {args.capacities}")
    seeds = _numbers(args.seeds, "--seeds", int)
    seeds = list(range(seeds[0])) if len(seeds) == 1 and "," not in args.seeds else seeds
    if not seeds or any(s < 0 for s in seeds):
        raise UsageError("--seeds needs a count >= 1 or a list of seeds >= 0")
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    check_output_dir(args.out, "--out")
    sc = scenario_from_args(args)
    lacking = [p for p in policies if needs_batching(p) and sc.batching is None]
    if lacking:
        raise UsageError(f"{', '.join(lacking)} needs --batch-profile (a profile for every model)")
    names = sc.load()[0]
    if len(names) > min(capacities):
        raise UsageError(
            f"{len(names)} jobs need at least {len(names)} replicas; smallest capacity is {min(capacities):g}"
        )
    fc_dir = None
    if args.forecaster:
        from autoscaler.catalogue.plugins import check_forecaster_spec
        from autoscaler.driving.forecasters import is_builtin

        if args.history:
            raise UsageError("give --forecaster (a name or an import path) or --history (train N-HiTS), not both")
        try:
            if not is_builtin(args.forecaster):
                # imported here; built in the workers only (torch used before a fork hangs
                # the children), where one that fails its check stops the suite in one line
                check_forecaster_spec(args.forecaster)
        except ValueError as err:
            raise UsageError(str(err)) from None
    elif args.history and any(uses_forecaster(p) for p in policies):
        from ..sim.forecaster import ensure_forecaster
        from ._scenario import warn_if_trained_on_the_day

        warn_if_trained_on_the_day(args, lambda m: print(m, file=sys.stderr))
        fc_dir = str(
            ensure_forecaster(
                args.history,
                days=args.history_days,
                sample=args.history_sample,
                before_day=args.day if args.history_days is None else None,
                cache_dir=args.forecaster_cache,
                max_steps=args.history_max_steps,
                log=lambda m: print(m, file=sys.stderr),
            )
        )
    n = len(policies) * len(capacities) * len(seeds)
    t0 = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
        transient=False,
    ) as prog:
        bar = prog.add_task(f"suite: {len(names)} jobs", total=n, last="")

        def progress(task, row):
            prog.update(
                bar,
                advance=1,
                last=f"{task.policy} @ {task.capacity:g} seed {task.seed}: lost {row['lost_cluster_utility']:.2f}",
            )

        stopped = None
        try:
            rows, timelines = run_suite(
                sc, policies, capacities, seeds, args.workers, fc_dir, progress, forecaster=args.forecaster
            )
        except SuiteStopped as err:  # the runs that finished are written all the same
            stopped, rows, timelines = err, err.rows, err.timelines
    title = args.title or (
        f"{Path(args.trace).name}"
        + (f" day {args.day}" if args.day is not None else "")
        + (f" sample {args.sample}" if args.sample is not None else "")
        + f", {len(names)} jobs, {len(seeds)} seed(s), forecaster "
        + (
            args.forecaster
            or ("N-HiTS" if fc_dir else ", ".join(sorted({r["forecaster"] for r in rows if r["forecaster"]})) or "none")
        )
    )
    if stopped is not None:
        return _stopped(stopped, rows, timelines, n, title, args)
    paths = write_outputs(Path(args.out), rows, timelines, title, args.timeline_capacity)
    print(markdown_table(aggregate(rows)))
    print(f"{n} runs in {time.perf_counter() - t0:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _stopped(stopped, rows, timelines, n, title, args) -> int:
    """A run failed and the suite stopped: write the rows of the runs that finished, the
    summary naming those that did not, then fail with one line (a user's policy, a dead
    worker) or, for faro-serve's own bug, the traceback."""
    from pathlib import Path

    from ..sim.policy_suite import RunFailed, write_outputs

    left = ", ".join(f"{t.policy} at {t.capacity:g} (seed {t.seed})" for t in stopped.unfinished)
    if rows:
        write_outputs(
            Path(args.out),
            rows,
            timelines,
            title,
            args.timeline_capacity,
            note=f"**Incomplete**: {len(rows)} of {n} runs finished; the suite stopped "
            f"at: {stopped.error}. Not run or failed: {left}.",
        )
        kept = (
            f"the suite stopped; the {len(rows)} of {n} runs that finished are in "
            f"{Path(args.out) / 'results.csv'} (summary.md names the others)"
        )
    else:
        kept = f"the suite stopped before any run finished (of {n})"
    if isinstance(stopped.error, RunFailed):
        raise UsageError(f"{stopped.error}; {kept}")
    print(f"faro-serve: {kept}", file=sys.stderr)
    raise stopped.error
