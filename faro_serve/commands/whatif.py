"""``faro-serve whatif``: what Faro would have done on a plain Ray Serve cluster's own traffic.

Reads the cluster's recorded minutes from the Prometheus that scrapes it (with Serve's
configs from Ray's dashboard) or from an export saved before (--save), and replays them
twice in the matched simulator: as the cluster ran (Ray's rule with each deployment's own
autoscaling_config, or its fixed num_replicas) and under Faro within --capacity. Writes
report.md, whatif.json and a plot per deployment to --out (docs/whatif.md).
"""

from __future__ import annotations

import math
import sys
from datetime import datetime, timezone

from . import _args
from ._output import check_output_dir, check_output_file
from .errors import UsageError


def register(sub) -> None:
    from ..sim.history_replay import DEFAULT_POLICY

    p = sub.add_parser(
        "whatif",
        help="replay a Ray Serve cluster's recorded traffic as it ran and under Faro",
        description=__doc__.split("\n\n", 1)[1],
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="the Prometheus that scrapes the Ray cluster")
    src.add_argument("--export", metavar="FILE", help="a history saved with --save")
    p.add_argument(
        "--dashboard",
        metavar="URL",
        help="Ray's dashboard, for each deployment's Serve "
        "config (without it a deployment stays at its median recorded replicas)",
    )
    p.add_argument(
        "--minutes", type=int, help="with --prometheus: the minutes to read, up to --end (1440; at most 10,999)"
    )
    p.add_argument(
        "--end",
        help="with --prometheus: the range's end, ISO time (UTC unless it says) or epoch seconds (default: now)",
    )
    p.add_argument("--save", metavar="FILE", help="write the history read from Prometheus as an export")
    p.add_argument("--capacity", type=float, required=True, help="CPUs Faro may plan within (also the as-run replay's)")
    p.add_argument("--capacity-gpus", type=float, help="GPUs, where replicas take GPUs (num_gpus)")
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="DEPLOYMENT=MS[@PERCENTILE]",
        help="a deployment's SLO (app/deployment or a unique deployment name; percentile "
        "99 unless given); repeatable. Default: its application's measured p99",
    )
    p.add_argument("--deployments", help="comma-separated deployments to replay (default: all)")
    p.add_argument(
        "--policy", default=DEFAULT_POLICY, help=f"Faro's policy ({DEFAULT_POLICY}), a plug-in's name or an import path"
    )
    p.add_argument(
        "--forecaster",
        metavar="NAME|IMPORT_PATH",
        help="the policy's forecaster: 'shipped' (default), 'fallback' (the fallback "
        "predictor, quicker on weeks of many deployments), a plug-in or import path",
    )
    p.add_argument(
        "--service-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="replay every service time read back times F (1): how much the figures hang on it",
    )
    p.add_argument("--cold-start-s", type=float, default=60.0, help="a new replica's start (60)")
    p.add_argument("--no-plots", action="store_true", help="write report.md and whatif.json only")
    p.add_argument("--seed", type=_args.seed, default=0, help="random seed of the replayed requests (0)")
    p.add_argument("--out", default="runs/whatif", help="report directory (runs/whatif)")
    p.set_defaults(func=run)


def parse_slo(text: str) -> tuple[str, float, float]:
    """``DEPLOYMENT=MS[@PERCENTILE]`` -> (deployment, ms, percentile)."""
    name, eq, rest = text.partition("=")
    ms, _, pct = rest.partition("@")
    try:
        v, p = float(ms), float(pct) if pct else 99.0
    except ValueError:
        v = p = math.nan
    if not (eq and name.strip() and math.isfinite(v) and v > 0 and 0 < p < 100):
        raise UsageError(
            f"--slo {text!r}: write DEPLOYMENT=MS or DEPLOYMENT=MS@PERCENTILE, e.g. "
            f"app/Model=500@99 (MS > 0, PERCENTILE in (0, 100))"
        )
    return name.strip(), v, p


def parse_end(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--end {text!r}: give an ISO time (2025-01-31T12:00) or epoch seconds") from None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def read_history(args):
    """The ServeHistory of --export or --prometheus; every reading error as a UsageError."""
    from forecasting.prometheus import MAX_POINTS, PrometheusError
    from forecasting.rayserve import read_serve_history
    from forecasting.serve_history import ServeHistory, ServeHistoryError

    try:
        if args.export:
            for flag, v in (
                ("--dashboard", args.dashboard),
                ("--minutes", args.minutes),
                ("--end", args.end),
                ("--save", args.save),
            ):
                if v is not None:
                    raise UsageError(f"{flag} is taken with --prometheus, not with --export")
            return ServeHistory.load(args.export)
        minutes = 1440 if args.minutes is None else args.minutes
        if not 1 <= minutes < MAX_POINTS:
            raise UsageError(
                f"--minutes {minutes}: give 1 to {MAX_POINTS - 1:,} (Prometheus answers at most {MAX_POINTS:,} "
                f"points a series); replay a longer range in parts, each ending at its --end"
            )
        hist = read_serve_history(args.prometheus, minutes, parse_end(args.end), args.dashboard)
        if args.save:
            hist.save(args.save)
            print(f"saved the history to {args.save}", file=sys.stderr)
        return hist
    except (PrometheusError, ServeHistoryError) as err:
        raise UsageError(str(err)) from None


def run(args) -> int:
    from autoscaler.catalogue.registry import policy_factory

    from ..sim.history_replay import run_whatif
    from ..sim.history_replay_report import write_report
    from ..sim.policy_suite import policy_failures, uses_forecaster

    try:
        policy_factory(args.policy)
    except ValueError as err:
        raise UsageError(str(err)) from None
    _args.check_capacity(args.capacity)
    if args.capacity_gpus is not None:
        _args.check_capacity(args.capacity_gpus, "--capacity-gpus")
    if not (math.isfinite(args.cold_start_s) and args.cold_start_s >= 0):
        raise UsageError(f"--cold-start-s must be a finite number >= 0 (got {args.cold_start_s:g})")
    if not (math.isfinite(args.service_scale) and args.service_scale > 0):
        raise UsageError(f"--service-scale must be a finite number > 0 (got {args.service_scale:g})")
    slos = {}
    for text in args.slo:
        name, ms, pct = parse_slo(text)
        slos[name] = (ms, pct)
    check_output_dir(args.out, "--out", create=False)
    check_output_file(args.save, "--save")
    hist = read_history(args)
    from forecasting.serve_history import ServeHistoryError

    try:
        hist = hist.select(_args.job_list(args.deployments, "--deployments"))
    except ServeHistoryError as err:
        raise UsageError(f"--deployments: {err}") from None
    if not hist.deployments:
        raise UsageError(f"{hist.source or args.export}: no deployments in the history")
    fc, kind = None, "none"
    if uses_forecaster(args.policy):
        from autoscaler.driving.forecasters import choose_forecaster

        fc, kind = choose_forecaster(args.forecaster)
    header = (
        f"whatif: replaying {hist.minutes:,} minutes of {len(hist.deployments)} deployments, as run and under "
        f"{args.policy}; a line every tenth of a replay once it has run {ReplayProgress.QUIET_S:g} s"
    )
    with policy_failures(args.policy):
        w = run_whatif(
            hist,
            args.capacity,
            args.capacity_gpus,
            slos,
            args.policy,
            fc,
            args.seed,
            args.cold_start_s,
            service_scale=args.service_scale,
            progress=ReplayProgress(header),
        )
    f = write_report(w, args.out, {"forecaster": kind}, plots=not args.no_plots)
    print_summary(f)
    print(f"report: {args.out}/report.md (whatif.json, {len(f['plots'])} plots)")
    return 0


class ReplayProgress:
    """A replay's progress on stderr: a line at each tenth of its minutes, once it has run
    :attr:`QUIET_S` seconds (a short replay says nothing), with the time it has taken and
    what is left at that pace. A week of 100 deployments runs for many minutes
    (docs/whatif.md, Scale); this says how many, early. ``header``: said as the first
    replay starts (its inputs checked)."""

    QUIET_S = 10.0

    def __init__(self, header: str | None = None, out=None, clock=None) -> None:
        import time

        self.header = header
        self.out = out
        self.clock = clock or time.monotonic
        self.started: dict[str, float] = {}
        self.tenths: dict[str, int] = {}

    def __call__(self, replay: str, done: int, total: int) -> None:
        if self.header:
            print(self.header, file=self.out or sys.stderr, flush=True)
            self.header = None
        now = self.clock()
        t0 = self.started.setdefault(replay, now)
        tenth = 10 * done // max(total, 1)
        if tenth <= self.tenths.get(replay, 0):
            return
        self.tenths[replay] = tenth
        took = now - t0
        if took < self.QUIET_S or done <= 0:
            return
        left = took * (total - done) / done
        print(
            f"whatif: {replay}: {done:,} of {total:,} minutes ({100 * done // max(total, 1)} %) in "
            f"{_duration(took)}" + (f", about {_duration(left)} left" if done < total else ""),
            file=self.out or sys.stderr,
            flush=True,
        )


def _duration(s: float) -> str:
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def print_summary(f: dict) -> None:
    from rich.table import Table

    from ..console import console

    t = Table(
        title=f"whatif: {f['minutes']:,} minutes from {f['start']}, capacity {f['capacity_cpus']:g} "
        f"CPUs; as run (Ray's rule, simulated) against {f['policy']}"
    )
    for col in (
        "deployment",
        "requests",
        "SLO",
        "viol. as run",
        "viol. Faro",
        "replica-h recorded",
        "replica-h as run",
        "replica-h Faro",
    ):
        t.add_column(col, justify="left" if col in ("deployment", "SLO") else "right", no_wrap=True)

    def row(name, r, slo):
        t.add_row(
            name,
            f"{r['requests']:,}",
            slo,
            f"{r['as_run']['slo_violation_rate']:.2%}",
            f"{r['faro']['slo_violation_rate']:.2%}",
            f"{r['recorded']['replica_hours']:,.1f}",
            f"{r['as_run']['replica_hours']:,.1f}",
            f"{r['faro']['replica_hours']:,.1f}",
        )

    for k, r in f["deployments"].items():
        row(k, r, f"{r['slo_ms']:g} ms p{r['slo_percentile']:g}" + (" derived" if r["slo_derived"] else ""))
    row("total", f["total"], "")
    console().print(t)
