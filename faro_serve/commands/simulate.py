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
from ._scenario import (
    add_scenario_args,
    forecaster_from_args,
    print_result,
    print_step,
    scenario_from_args,
    step_report,
)
from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "simulate", help="run one policy on a trace in the matched simulator", description=__doc__.split("\n\n", 1)[1]
    )
    add_scenario_args(p)
    p.add_argument(
        "--capacity", type=float, help="replicas (1 CPU, 1 GiB each); with --config, its cluster's cpus by default"
    )
    p.add_argument(
        "--config",
        metavar="YAML",
        help="simulate a faro-serve config's models and pipelines (the faro "
        "application's args, or a Serve config like serve_config.yaml, whose "
        "faro application is read; their SLOs, "
        "processing times, bounds, its cluster's settings) instead of one "
        "paper job per trace job: the trace needs a job named as each single "
        "model and each pipeline (its queries at the entry); --slo-ms, "
        "--percentile and --processing-ms are then the config's",
    )
    p.add_argument(
        "--policy",
        default="faro-fairsum",
        help="policy name, e.g. faro-fairsum, oracle, mark, aiad (a wrong name lists "
        "all), a plug-in's name, or an import path my_pkg.policies:MyPolicy",
    )
    p.add_argument(
        "--forecaster",
        metavar="NAME|IMPORT_PATH",
        help="the policy's forecaster: 'fallback' (the fallback predictor), 'shipped' "
        "(the N-HiTS shipped with faro-serve, the default), a plug-in name or the "
        "import path of a forecaster class or factory (my_pkg.fc:MyForecaster); "
        "not with --history",
    )
    p.add_argument("--seed", type=_args.seed, default=0, help="random seed of arrivals and times (0)")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON to OUT ('-' = stdout)")
    p.add_argument(
        "--step-at",
        type=float,
        metavar="SECONDS",
        help="a load step at this run second: add each model's recovery time and the "
        "requests dropped or over the SLO in the step's first 2 minutes ('surge' in "
        "the JSON and the table)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from autoscaler.catalogue.registry import policy_factory

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
        raise UsageError(f"--step-at {args.step_at:g} s is outside the run's {60 * loaded[1].shape[1]} s")
    from ..sim.policy_suite import policy_failures, uses_forecaster

    forecasting = uses_forecaster(args.policy)
    fc, kind = forecaster_from_args(args) if forecasting else (None, "none")
    if kind.startswith("fallback: forecaster failed"):
        print(f"note: {args.policy} forecasts with the fallback predictor: {kind}", file=sys.stderr)
    with policy_failures(args.policy):
        res = run_scenario(
            sc,
            args.policy,
            args.capacity,
            args.seed,
            forecaster=fc,
            loaded=loaded,
            keep_records=args.step_at is not None,
        )
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
    from ..sim.policy_suite import policy_failures, uses_forecaster

    for flag, given in (
        ("--jobs", args.jobs),
        ("--rescale", args.rescale),
        ("--n-jobs", args.n_jobs),
        ("--batch-profile", args.batch_profile),
        ("--step-at", args.step_at),
        ("--gpus-per-replica", args.gpus_per_replica),
    ):
        if given:
            raise UsageError(
                f"{flag} is not taken with --config (the config says which models and pipelines run, and how)"
            )
    cfg = read_config(args.config)
    capacity = cfg.cluster.cpus if args.capacity is None else args.capacity
    _args.check_capacity(capacity)
    sc = PipelineScenario.from_config(
        cfg,
        args.trace,
        day=args.day,
        sample=args.sample,
        minutes=args.minutes,
        warmup_minutes=args.warmup_minutes,
        processing_dist=args.processing_dist,
        **({} if args.daily_weight is None else {"daily_weight": args.daily_weight}),
        **({} if args.recurrence_share is None else {"recurrence_share": args.recurrence_share}),
        overhead_dist=args.overhead_dist,
        cold_start_s=args.cold_start_s,
        queue_limit=args.queue_limit,
    )
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
    from autoscaler.driving.loop_config import parse_autoscaler_config

    from ..config import faro_applications, load_document, parse_config

    doc = load_document(path)
    if not (isinstance(doc, dict) and "applications" in doc):
        return parse_config(doc, path)
    faro = faro_applications(doc)
    if len(faro) != 1:
        raise UsageError(
            f"--config {path}: a Ray Serve config with {len(faro)} applications of "
            f"import_path faro_serve.serving.app:autoscaler_app; --config takes the "
            f"faro application's args (cluster, models, pipelines) or a Serve config "
            f"with one faro application"
        )
    return parse_autoscaler_config(faro[0].get("args"), f"{path}: application {faro[0].get('name')!r} args")
