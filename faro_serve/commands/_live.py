"""What the commands that talk to a running deployment share: its status (``GET
/faro/status``), the SLOs to measure a replay against, and the live runs ``validate`` and
``compare`` both make (issue 49: commands share helpers through a module meant for it)."""

from __future__ import annotations

import sys
from pathlib import Path

from . import _args
from ._args import check_capacity
from .errors import UsageError


def fetch_status(url: str, app: str = "faro", timeout: float = 10.0, path: str = "status"):
    from urllib.parse import urlsplit

    import httpx

    if urlsplit(url).scheme not in ("http", "https"):
        raise UsageError(f"--url must look like http://127.0.0.1:8000 (got {url!r})")
    target = f"{url.rstrip('/')}/{app.strip('/')}/{path}"
    host = httpx.URL(target).host
    # a loopback address never goes through a proxy from the environment
    loopback = host in ("localhost", "::1") or host.startswith("127.")
    try:
        r = httpx.get(target, timeout=timeout, trust_env=not loopback)
    except httpx.HTTPError as err:
        raise UsageError(f"cannot reach {target}: {err}. Is `serve run serve_config.yaml` running?") from None
    kind = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    if r.status_code != 200 or kind != "application/json":
        # another server on that address (an HTML page, a 404): say what, not its page
        raise UsageError(
            f"{target} answered HTTP {r.status_code} ({kind}, {len(r.content)} bytes), "
            f"not a faro-serve status: is the faro application deployed there, with "
            f"route_prefix /{app.strip('/')} (--app)?"
        )
    try:
        return r.json()
    except ValueError:
        raise UsageError(f"{target} answered JSON that does not parse: not a faro-serve status") from None


def slos_of(args, url: str, names: list[str]) -> tuple[dict, dict, dict | None]:
    """(slo_ms, percentile, status or None) per model: --slo-ms, else GET /faro/status."""
    if args.slo_ms is not None:
        if not args.slo_ms > 0:
            raise UsageError(f"--slo-ms must be > 0 (got {args.slo_ms:g})")
        if not 0 < args.percentile < 100:
            raise UsageError(f"--percentile must lie in (0, 100) (got {args.percentile:g})")
        st = None
        try:
            st = fetch_status(url, timeout=5.0)
        except Exception:
            pass  # the SLOs are given; the status only adds the policy and capacity
        return {n: args.slo_ms for n in names}, {n: args.percentile for n in names}, st
    st = fetch_status(url, timeout=10.0)
    models = st.get("models") or {}
    missing = [n for n in names if n not in models]
    if missing:
        raise UsageError(
            f"{url}/faro/status has no SLO for {', '.join(missing)} (it knows "
            f"{', '.join(models) or 'no model yet'}); use --map, or give --slo-ms"
        )
    return (
        {n: float(models[n]["slo_ms"]) for n in names},
        {n: float(models[n].get("percentile", 99.0)) for n in names},
        st,
    )


def add_live_args(
    p,
    *,
    day: int,
    jobs: str,
    start: int,
    minutes: int,
    capacity: float,
    slowdown: float,
    rate_scale: float,
    policies: str,
    out: str,
) -> None:
    """The flags of a live-vs-simulated run (``validate`` and ``compare``), with defaults."""
    p.add_argument(
        "--trace",
        default="../shared/traces/faro10_days1-10.csv",
        help="trace file (default: ../shared/traces/faro10_days1-10.csv)",
    )
    p.add_argument("--day", type=int, default=day, help=f"day ({day})")
    p.add_argument("--sample", type=int, default=0, help="sample (0)")
    p.add_argument("--jobs", default=jobs, help=f"trace jobs, one model each ({jobs})")
    p.add_argument("--start", type=int, default=start, help=f"first trace minute ({start})")
    p.add_argument("--minutes", type=int, default=minutes, help=f"trace minutes, one wall minute each ({minutes})")
    p.add_argument("--rate-scale", type=float, default=rate_scale, help=f"multiply the counts ({rate_scale:g})")
    p.add_argument(
        "--slowdown",
        type=float,
        default=slowdown,
        help="processing times, SLO and prior x K: with --rate-scale 1/K the same queueing "
        f"at 1/K of the requests per second, for small machines ({slowdown:g})",
    )
    p.add_argument("--capacity", type=float, default=capacity, help=f"replicas of 1 CPU ({capacity:g})")
    p.add_argument(
        "--policies",
        default=policies,
        help=f"comma-separated policies, or ray-native / ray-tuned: plain Ray Serve "
        f"under Ray's own autoscaler at its defaults / as its guide tunes it for "
        f"latency, simulated as ray-serve / ray-serve-tuned ({policies})",
    )
    p.add_argument(
        "--data-path",
        choices=("direct", "front"),
        default="direct",
        help="the live models' data path: the direct path with the queue in Serve's "
        "proxy, or the router front (docs/serving.md) (direct)",
    )
    p.add_argument(
        "--forecaster",
        help="the forecaster of both sides: 'fallback' (the fallback "
        "predictor), 'shipped' (the N-HiTS shipped with faro-serve) or a trained "
        "forecaster directory (default: shipped)",
    )
    p.add_argument("--seed", type=_args.seed, default=0, help="workload seed (0)")
    p.add_argument("--out", default=out, help=f"output directory ({out})")
    p.add_argument(
        "--resimulate", action="store_true", help="reuse the live runs saved in --out; only simulate and compare again"
    )
    p.add_argument(
        "--again",
        action="store_true",
        help="run --policies live again and keep the other policies saved in --out (same workload flags)",
    )
    p.add_argument(
        "--overhead-dist", help="simulator overhead instead of the calibrated one, e.g. lognorm:0.5,0.008,0.003"
    )
    p.add_argument("--cold-start-s", type=float, help="simulator cold start instead of the calibrated one")
    p.add_argument(
        "--hold-ms",
        type=float,
        help="simulator replica hold between queued requests instead of the calibrated one (0 = the paper's model)",
    )


def run_validation(args) -> tuple[Path, dict, dict]:
    """Live runs (or the saved ones), the matched simulations and validation.*: returns
    (out, the validation document, the saved live state)."""
    from ..validation.comparison import Workload
    from ..validation.matched import load_state, resimulate

    out = Path(args.out)
    if args.hold_ms is not None and not 0 <= args.hold_ms < 60000:  # before an hour of live runs
        raise UsageError(f"--hold-ms must be in [0, 60000) (got {args.hold_ms:g})")
    from ..validation.comparison import SIM_DRAWS

    # compare's report reads one simulation per run; validate compares the mean of several
    draws = getattr(args, "sim_draws", 1)
    draws = SIM_DRAWS if draws is None else draws
    if not 1 <= draws <= 100:
        raise UsageError(f"--sim-draws must be in [1, 100] (got {draws})")
    if args.resimulate:
        state = load_state(out)
    else:
        from autoscaler.catalogue.registry import UnknownPolicy, policy_factory, policy_names

        from ..validation.comparison import NATIVE

        known = policy_names() + sorted(NATIVE)
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = []
        for p in policies:  # names, plug-ins and import paths: all checked before any run
            try:
                if p not in NATIVE:
                    policy_factory(p)
            except UnknownPolicy:
                unknown.append(p)
            except ValueError as err:  # an import path that does not give a policy
                raise UsageError(f"--policies: {err}") from None
        if not policies or unknown:
            raise UsageError(
                f"--policies: unknown {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(known)} or an import path"
            )
        check_capacity(args.capacity, at_least=1)  # live replicas of 1 CPU
        wl = Workload(
            trace=args.trace,
            day=args.day,
            sample=args.sample,
            jobs=tuple(_args.job_list(args.jobs) or ()),
            start=args.start,
            minutes=args.minutes,
            rate_scale=args.rate_scale,
            slowdown=args.slowdown,
            seed=args.seed,
        )
        tr = wl.load()  # bad trace input fails here, before any cluster starts
        if len(tr.names) > args.capacity:
            raise UsageError(
                f"{len(tr.names)} jobs need at least {len(tr.names)} replicas (--capacity {args.capacity:g})"
            )
        out.mkdir(parents=True, exist_ok=True)
        print(
            f"live runs: {len(policies)} policies x {args.minutes} min on a local Ray cluster; files in {out}",
            file=sys.stderr,
        )
        previous = load_state(out) if args.again else None
        state = _live(wl, policies, args.capacity, out, args.forecaster, previous, args.data_path)
    from autoscaler.driving.forecasters import choose_forecaster, is_builtin

    # the simulated side's forecaster: the live runs' (the live autoscaler loads the same one)
    spec = args.forecaster or state.get("forecaster_dir")
    forecaster, _ = choose_forecaster(spec) if spec is None or is_builtin(spec) else choose_forecaster(None, spec)
    doc = resimulate(
        state,
        out,
        args.overhead_dist,
        args.cold_start_s,
        forecaster,
        None if args.hold_ms is None else args.hold_ms / 1e3,
        draws,
    )
    return out, doc, state


def _live(wl, policies, capacity, out, forecaster_dir, previous, data_path):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..validation.matched import run_live

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:

        def progress(policy, total):
            task = bar.add_task(f"live {policy}", total=total)
            return lambda k: bar.advance(task, k)

        return run_live(
            wl,
            policies,
            capacity,
            out,
            forecaster_dir=forecaster_dir,
            progress=progress,
            previous=previous,
            data_path=data_path,
        )
