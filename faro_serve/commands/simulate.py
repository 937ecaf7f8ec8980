"""``faro-serve simulate``: one policy on a trace in the matched simulator (paper 6.4).

Replays per-minute counts (tidy CSV or JSON lines; one point = one minute, Poisson arrivals
inside it) through a cluster of CAPACITY one-CPU replicas and reports the paper's metrics:
lost cluster utility, SLO violation rates, drops, per job. Defaults are the paper-matched
setup: 720 ms p99 SLO, 154 ms processing (measured lognormal), cold start 60 s, router
queue 50. Forecasting policies (faro-*, mark) plan with the N-HiTS shipped with faro-serve,
with N-HiTS trained on --history, or with --forecaster (fallback: the fallback predictor).
"""

from __future__ import annotations

import json
import sys

from . import _args
from ._output import check_output_file
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
    p.add_argument("--warmup-minutes", type=int, default=None,
                   help="arrival history from before the day given to the policies (default: a "
                        "day and an hour, the forecaster's daily context; 0 = none)")
    p.add_argument("--daily-weight", type=float, default=None,
                   help="how far the N-HiTS forecast moves towards yesterday's same minutes, for "
                        "a job with a day of history (default 0.25; 0 = off; "
                        "docs/forecasting.md, 'Daily context')")
    p.add_argument("--recurrence-share", type=float, default=None,
                   help="the share of the N-HiTS forecast's samples raised to a job's recurring "
                        "peak where its history shows a cycle (default 0.25; 0 = off; "
                        "docs/forecasting.md, 'Recurring peaks')")
    p.add_argument("--slo-ms", type=float, default=720.0, help="p99 latency SLO of every job (720)")
    p.add_argument("--percentile", type=float, default=99.0, help="SLO percentile (99)")
    p.add_argument("--processing-ms", type=float, default=154.0,
                   help="processing prior (154); also the mean of the simulated lognormal")
    p.add_argument("--processing-dist", help="simulated processing time, seconds: lognorm:S,LOC,SCALE | "
                   "const:X | expon:LOC,SCALE (default: the paper's lognormal)")
    p.add_argument("--overhead-dist", help="router overhead, same forms (default: the paper's lognormal)")
    p.add_argument("--cold-start-s", type=float, default=60.0, help="replica cold start (60)")
    p.add_argument("--queue-limit", type=int, default=50, help="router tail-drop threshold (50)")
    p.add_argument("--replica-hold-ms", type=float, default=0.0,
                   help="a replica's idle gap between queued requests, e.g. the one `validate` "
                        "calibrates (0: the paper's model)")
    p.add_argument("--batch-profile", metavar="PATH",
                   help="every job's replicas serve dynamic batches with this saved profile "
                        "(faro-serve profile's JSON); Faro plans batch sizes with the replicas")
    p.add_argument("--max-batch", type=int, default=16,
                   help="largest batch with --batch-profile (16)")
    p.add_argument("--gpus-per-replica", type=float, default=0.0,
                   help="GPUs every job's replica takes, fractions allowed (0)")
    p.add_argument("--capacity-gpus", type=float,
                   help="GPUs the jobs share, besides the --capacity CPUs (default: not binding)")
    p.add_argument("--history", help="CSV to train the N-HiTS forecaster on (cached)")
    p.add_argument("--history-days", help="days of --history to train on (default: days before --day)")
    p.add_argument("--history-sample", type=int, default=0, help="sample of --history (0)")
    p.add_argument("--forecaster-cache", default="runs/forecasters",
                   help="where trained forecasters are kept (runs/forecasters)")
    p.add_argument("--history-max-steps", type=int,
                   help="training steps of the forecaster (default: forecasting.train's; small = quick trial)")


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
    return Scenario(trace=args.trace, day=args.day, sample=args.sample, jobs=jobs,
                    minutes=args.minutes, rescale=rescale, n_jobs=args.n_jobs, jitter=args.jitter,
                    warmup_minutes=args.warmup_minutes, slo_ms=args.slo_ms,
                    **({} if args.daily_weight is None else {"daily_weight": args.daily_weight}),
                    **({} if args.recurrence_share is None
                       else {"recurrence_share": args.recurrence_share}),
                    percentile=args.percentile, processing_ms=args.processing_ms,
                    processing_dist=args.processing_dist, overhead_dist=args.overhead_dist,
                    cold_start_s=args.cold_start_s, queue_limit=args.queue_limit,
                    replica_hold_ms=args.replica_hold_ms, batching=_batching(args),
                    gpus_per_replica=getattr(args, "gpus_per_replica", 0.0),
                    capacity_gpus=getattr(args, "capacity_gpus", None)).validate()


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
    path), else the N-HiTS shipped with faro-serve (``autoscaler.forecasters``)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    spec = getattr(args, "forecaster", None)
    if spec and args.history:
        raise UsageError("give --forecaster (a name or an import path) or --history (train N-HiTS), not both")
    if not args.history:
        from autoscaler.forecasters import choose_forecaster

        return choose_forecaster(spec)
    from ..sim.forecaster import history_forecaster

    warn_if_trained_on_the_day(args, log)
    fc = history_forecaster(args.history, days=args.history_days, sample=args.history_sample,
                            before_day=args.day if args.history_days is None else None,
                            cache_dir=args.forecaster_cache, max_steps=args.history_max_steps, log=log)
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
        log(f"note: --history-days {args.history_days} includes day {args.day}, the day replayed: "
            f"the forecaster is trained on the minutes it forecasts (use the days before it)")


def register(sub) -> None:
    p = sub.add_parser("simulate", help="run one policy on a trace in the matched simulator",
                       description=__doc__.split("\n\n", 1)[1])
    add_scenario_args(p)
    p.add_argument("--capacity", type=float, help="replicas (1 CPU, 1 GiB each); with --config, "
                   "its cluster's cpus by default")
    p.add_argument("--config", metavar="YAML",
                   help="simulate a faro-serve config's models and pipelines (the faro "
                        "application's args, or a Serve config like serve_config.yaml, whose "
                        "faro application is read; their SLOs, "
                        "processing times, bounds, its cluster's settings) instead of one "
                        "paper job per trace job: the trace needs a job named as each single "
                        "model and each pipeline (its queries at the entry); --slo-ms, "
                        "--percentile and --processing-ms are then the config's")
    p.add_argument("--policy", default="faro-fairsum",
                   help="policy name, e.g. faro-fairsum, oracle, mark, aiad (a wrong name lists "
                        "all), a plug-in's name, or an import path my_pkg.policies:MyPolicy")
    p.add_argument("--forecaster", metavar="NAME|IMPORT_PATH",
                   help="the policy's forecaster: 'fallback' (the fallback predictor), 'shipped' "
                        "(the N-HiTS shipped with faro-serve, the default), a plug-in name or the "
                        "import path of a forecaster class or factory (my_pkg.fc:MyForecaster); "
                        "not with --history")
    p.add_argument("--seed", type=_args.seed, default=0, help="random seed of arrivals and times (0)")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON to OUT ('-' = stdout)")
    p.add_argument("--step-at", type=float, metavar="SECONDS",
                   help="a load step at this run second: add each model's recovery time and the "
                        "requests dropped or over the SLO in the step's first 2 minutes ('surge' in "
                        "the JSON and the table)")
    p.set_defaults(func=run)


def run(args) -> int:
    from autoscaler.registry import policy_factory

    from ..sim.scenario import run_scenario

    try:
        policy_factory(args.policy)  # a bad name or import path fails before the trace loads
    except ValueError as err:
        raise UsageError(str(err)) from None
    check_output_file(args.json, "--json")
    if args.config:
        return run_config(args)
    if args.capacity is None:
        raise UsageError("give --capacity (or --config, whose cluster's cpus it defaults to)")
    _args.check_capacity(args.capacity)
    sc = scenario_from_args(args)
    loaded = sc.load()
    names = loaded[0]
    if len(names) > args.capacity:
        raise UsageError(f"{len(names)} jobs need at least {len(names)} replicas; --capacity is {args.capacity:g}")
    if args.step_at is not None and not 0 <= args.step_at < 60 * loaded[1].shape[1]:
        raise UsageError(f"--step-at {args.step_at:g} s is outside the run's "
                         f"{60 * loaded[1].shape[1]} s")
    from ..sim.suite import policy_failures, uses_forecaster

    forecasting = uses_forecaster(args.policy)
    fc, kind = forecaster_from_args(args) if forecasting else (None, "none")
    if kind.startswith("fallback: forecaster failed"):
        print(f"note: {args.policy} forecasts with the fallback predictor: {kind}", file=sys.stderr)
    with policy_failures(args.policy):
        res = run_scenario(sc, args.policy, args.capacity, args.seed, forecaster=fc, loaded=loaded,
                           keep_records=args.step_at is not None)
    out = res.to_dict() | {"forecaster": kind}
    if args.step_at is not None:
        out["surge"] = step_report(res.names, res.records, sc.models(res.names), args.step_at)
    write_json(args.json, out)
    if args.json != "-":
        print_result(res, sc)
        if args.step_at is not None:
            print_step(out["surge"])
    return 0


def write_json(where: str | None, out: dict) -> None:
    """``--json``: the result to a file, or to stdout for ``-``."""
    if not where:
        return
    text = json.dumps(out, indent=2)
    if where == "-":
        print(text)
    else:
        with open(where, "w") as f:
            f.write(text + "\n")


def run_config(args) -> int:
    """``simulate --config``: a config's single models and pipelines on the trace's jobs of
    the same names (faro_serve.sim.pipeline_scenario)."""
    from ..sim.pipeline_scenario import PipelineScenario
    from ..sim.suite import policy_failures, uses_forecaster

    for flag, given in (("--jobs", args.jobs), ("--rescale", args.rescale), ("--n-jobs", args.n_jobs),
                        ("--batch-profile", args.batch_profile), ("--step-at", args.step_at),
                        ("--gpus-per-replica", args.gpus_per_replica)):
        if given:
            raise UsageError(f"{flag} is not taken with --config (the config says which models "
                             f"and pipelines run, and how)")
    cfg = read_config(args.config)
    capacity = cfg.cluster.cpus if args.capacity is None else args.capacity
    _args.check_capacity(capacity)
    sc = PipelineScenario.from_config(
        cfg, args.trace, day=args.day, sample=args.sample, minutes=args.minutes,
        warmup_minutes=args.warmup_minutes, processing_dist=args.processing_dist,
        **({} if args.daily_weight is None else {"daily_weight": args.daily_weight}),
        **({} if args.recurrence_share is None else {"recurrence_share": args.recurrence_share}),
        overhead_dist=args.overhead_dist, cold_start_s=args.cold_start_s,
        queue_limit=args.queue_limit)
    sc.distributions()  # a bad distribution fails before the trace loads
    loaded = sc.load()
    fc, kind = forecaster_from_args(args) if uses_forecaster(args.policy) else (None, "none")
    with policy_failures(args.policy):
        res = sc.run(args.policy, capacity, args.seed, forecaster=fc, loaded=loaded)
    out = res.to_dict() | {"forecaster": kind}
    write_json(args.json, out)
    if args.json != "-":
        print_result(res, sc)
    return 0


def read_config(path: str):
    """``--config``: a faro-serve config (cluster, models, pipelines), or a Ray Serve config
    (``applications``, like serve_config.yaml), of which the faro application's args are
    read (:func:`faro_serve.config.faro_applications`, as ``kuberay`` finds it)."""
    from autoscaler.config import parse_autoscaler_config

    from ..config import faro_applications, load_document, parse_config

    doc = load_document(path)
    if not (isinstance(doc, dict) and "applications" in doc):
        return parse_config(doc, path)
    faro = faro_applications(doc)
    if len(faro) != 1:
        raise UsageError(f"--config {path}: a Ray Serve config with {len(faro)} applications of "
                         f"import_path faro_serve.serving.app:autoscaler_app; --config takes the "
                         f"faro application's args (cluster, models, pipelines) or a Serve config "
                         f"with one faro application")
    return parse_autoscaler_config(faro[0].get("args"),
                                   f"{path}: application {faro[0].get('name')!r} args")


def step_report(names, records, models, step_s: float) -> dict:
    """The surge metrics (faro_serve.recovery) of a run's request records."""
    from ..recovery import surge_report

    return surge_report(names, records["model"], records["arrival_s"], records["latency_s"],
                        records["dropped"], [m.slo_ms / 1e3 for m in models],
                        [m.percentile for m in models], step_s)


def print_step(rep: dict) -> None:
    print(f"step at {rep['step_s']:g} s: recovery (SLO-percentile over {rep['window_s']:g} s windows "
          f"back under the SLO for the rest of {rep['span_s']:g} s) and requests dropped or over "
          f"the SLO in that span")
    for n, m in rep["models"].items():
        rec = "not within the span" if m["recovery_s"] is None else f"{m['recovery_s']:g} s"
        print(f"  {n}: recovery {rec}; {m['bad']:,} of {m['requests']:,} bad "
              f"({m['dropped']:,} dropped, {m['over_slo']:,} over the SLO)")


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
        table.add_row(n + (" (pipeline, end to end)" if n in stages_of else ""),
                      f"{int(s.job_requests[i]):,}", f"{int(s.job_dropped[i]):,}",
                      f"{s.job_slo_violation_rate[i]:.2%}", f"{s.job_lost_utility[i]:.3f}",
                      f"{reps:.1f}")
    con = Console()
    con.print(table)
    if res.stage_summary is not None:
        st = Table(title="pipeline stages (each against its own slo_ms; not jobs of the cluster objective)")
        for col in ("stage", "requests", "dropped", "median minute SLO-pct latency ms",
                    "replica-minutes"):
            st.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)
        rows = res.to_dict()["stages"]
        for n, r in rows.items():
            lat = r["latency_ms_median_minute"]
            st.add_row(n, f"{r['requests']:,}", f"{r['dropped']:,}",
                       "-" if lat is None else f"{lat:.0f}", f"{r['replica_minutes']:.0f}")
        con.print(st)
    con.print(f"lost cluster utility {s.lost_cluster_utility:.3f} (effective {s.lost_effective_utility:.3f}) | "
              f"cluster SLO violation rate {s.cluster_slo_violation_rate:.2%} | "
              f"{res.table.minutes} min, {int(s.job_requests.sum()):,} requests | wall {res.wall_s:.1f} s")
