"""``faro-serve demo`` (``make run``): the whole system on this machine, end to end.

Starts Ray locally and `serve run serve_config.yaml` (the models and the Faro autoscaler),
waits until every model answers, replays a real trace slice against the endpoints (by
default the bundled six minutes of four jobs of the Faro workload, rates scaled to a 2-core
machine) with a live table per model (arrival rate, p99 against the SLO, replicas), then
writes report.md and timeline.png (arrivals, replicas and p99 vs SLO over time, per model)
plus the replay's records.csv and result.json, prints the report's path, and shuts the
deployment down. Ctrl-C stops the replay, writes a partial report and shuts down (exit 130).
With --url (or --no-start) it replays against a deployment that is already running.
"""

from __future__ import annotations

import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import _args
from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="start the deployment, replay a real trace slice with a live table, write a report (make run)",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--config", default="serve_config.yaml", help="Serve config to `serve run` (serve_config.yaml)")
    p.add_argument("--url", help="replay against the deployment already running at URL (implies --no-start)")
    p.add_argument(
        "--no-start", action="store_true", help="do not start anything; use --url (default http://127.0.0.1:8000)"
    )
    p.add_argument(
        "--keep-serving", action="store_true", help="leave the started deployment running after a complete replay"
    )
    p.add_argument(
        "--startup-timeout", type=float, default=420.0, help="seconds to wait for every model to answer (420)"
    )
    g = p.add_argument_group("load (as in `faro-serve replay`; default: the bundled slice)")
    g.add_argument("--trace", help="trace file (default: the bundled slice faro_serve/data/demo_trace.csv)")
    g.add_argument("--day", help="day to replay (CSV with a 'day' column)")
    g.add_argument("--sample", type=int, help="sample of that day (CSV with a 'sample' column)")
    g.add_argument("--jobs", help="comma-separated trace jobs to replay (default: all, or --map's)")
    g.add_argument(
        "--map",
        metavar="JOB=MODEL,...",
        help="send a job's load to a model (bundled slice: "
        "job2=resnet18,job8=resnet34,job7=synth-a,job1=synth-b; else the job's name)",
    )
    g.add_argument("--start", type=int, default=0, help="first trace minute to replay (0)")
    g.add_argument("--minutes", type=int, help="trace minutes to replay (default: to the end)")
    g.add_argument("--time-scale", type=float, default=1.0, help="a trace minute lasts 60 x X seconds (1)")
    g.add_argument("--rate-scale", type=float, help="multiply every count by Y (bundled slice: 0.3, else 1)")
    g.add_argument("--seed", type=_args.seed, default=0, help="random seed of the schedule (0)")
    g.add_argument("--max-requests", type=int, default=100_000, help="refuse a larger schedule (100000)")
    g.add_argument("--max-in-flight", type=int, default=500, help="open requests at most (500)")
    g.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds (30)")
    p.add_argument("--out", help="output directory (runs/demo-<UTC time>)")
    p.add_argument("--no-live", action="store_true", help="no live table (a table per trace minute instead)")
    p.add_argument(
        "--no-fit",
        action="store_true",
        help="keep the rate scale even if the warm-up finds this machine too slow for it "
        "(default: a lighter load on a slower machine; docs/demo.md)",
    )
    p.set_defaults(func=run)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM: shut down as for Ctrl-C


def _load(args):
    """The schedule and what describes it, from the flags (all input errors before any start)."""
    import numpy as np

    from ..demo import DEMO_MAP, DEMO_RATE_SCALE, DEMO_TRACE
    from ..replay.loadgen import build_schedule, parse_map, select_trace
    from ..traces import load_trace

    for flag, v in (("--max-requests", args.max_requests), ("--max-in-flight", args.max_in_flight)):
        if v < 1:
            raise UsageError(f"{flag} must be >= 1 (got {v})")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 (got {args.timeout:g})")
    bundled = args.trace is None
    path = DEMO_TRACE if bundled else Path(args.trace)
    jobs = _args.job_list(args.jobs)
    mapping = parse_map(args.map if args.map is not None else (DEMO_MAP if bundled else None))
    if bundled and args.map is None and jobs is not None:
        mapping = {j: m for j, m in mapping.items() if j in jobs}
    rate = args.rate_scale if args.rate_scale is not None else (DEMO_RATE_SCALE if bundled else 1.0)
    trace = load_trace(path, days=args.day, sample=args.sample)
    trace, names = select_trace(trace, jobs, mapping, args.start, args.minutes)
    sched = build_schedule(trace, names, args.time_scale, rate, args.seed, args.max_requests)
    # busiest minute per model at rate scale 1, for the warm-up's sizing (faro_serve.demo.warmup)
    args.peak_rps = {n: float(np.max(c)) / (60.0 * args.time_scale) for n, c in zip(names, trace.counts)}
    args.base_rate_scale = rate
    pairs = ", ".join(f"{j} -> {n}" for j, n in zip(sched.jobs, names))
    where = "".join(f", {k} {v}" for k, v in (("day", args.day), ("sample", args.sample)) if v is not None)
    desc = (
        f"`{path}`{' (bundled slice)' if bundled else ''}{where}, trace minutes "
        f"{args.start + 1}-{args.start + sched.minutes} of the selection; {pairs}"
    )
    return sched, names, desc


def run(args) -> int:
    from ..demo.deployment import DeploymentError, LocalDeployment, read_config, wait_ready
    from ..demo.live import demo_image
    from ..replay.loadgen import check_url

    start = not (args.no_start or args.url)
    if not start and args.keep_serving:
        raise UsageError("--keep-serving is for a deployment the demo starts, not with --url/--no-start")
    if not args.startup_timeout > 0:
        raise UsageError(f"--startup-timeout must be > 0 (got {args.startup_timeout:g})")
    explicit_rate = args.rate_scale is not None
    sched, names, trace_desc = _load(args)
    target = None
    if start:
        target = read_config(args.config)
        missing = [n for n in names if n not in target.models]
        if missing:
            raise UsageError(
                f"{args.config} has no model {', '.join(missing)} (it has {', '.join(target.models)}); use --map"
            )
        url = target.url
    else:
        url = args.url or "http://127.0.0.1:8000"
        try:
            url = check_url(url)
        except ValueError as err:
            if "loopback" not in str(err):
                raise
            raise UsageError(
                f"--url {url}: not a loopback address; the demo sends load to this "
                f"machine only (`faro-serve replay --allow-remote` can replay against "
                f"another)"
            ) from None
    when = datetime.now(timezone.utc)
    out = Path(args.out or f"runs/demo-{when:%Y%m%d-%H%M%S}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out {out}: cannot create ({err.strerror})") from None
    body = demo_image()

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    dep = LocalDeployment(target, out) if start else None
    rec = view = None
    interrupted = reported = False
    t0 = time.monotonic()
    prev_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            if dep is not None:
                note(
                    f"starting Ray (dashboard 127.0.0.1:{target.dashboard_port}) and `serve run "
                    f"{target.config}`; logs in {out}/ray.log and {out}/serve.log"
                )
                dep.start()
                note(
                    f"started ray start (pid {dep.ray_proc.pid}) and serve run (pid "
                    f"{dep.serve_proc.pid}), each in its own process group"
                )
            else:
                from ._live import fetch_status

                known = fetch_status(url, timeout=10.0).get("models") or {}  # nothing there: exit 2
                missing = [n for n in names if n not in known]
                if missing:
                    raise UsageError(
                        f"{url}/faro/status has no model {', '.join(missing)} (it "
                        f"knows {', '.join(known) or 'none yet'}); use --map"
                    )
            wait_ready(url, names, body, args.startup_timeout, dep, note)
        except DeploymentError as err:
            if dep is not None:
                note(dep.log_tails())
            note(f"faro-serve: error: {err}")
            return 1
        fit = None
        if dep is not None:
            keep = "--no-fit" if args.no_fit else ("--rate-scale" if explicit_rate else None)
            fit = _fit(args, target, names, url, body, note, keep)
            if fit["scale"] != args.base_rate_scale:
                args.rate_scale = fit["scale"]
                sched, names, trace_desc = _load(args)
        note(
            f"ready after {time.monotonic() - t0:.0f} s: replaying {sched.size:,} requests over "
            f"{sched.minutes} trace minute(s) in {sched.duration_s:.0f} s to {url}"
        )
        rec, interrupted, view = _replay(args, sched, names, url, body)
        if fit is not None:
            view.warmup_note, view.baseline_ms = fit["note"], fit["baseline_ms"]
        _finish(args, out, sched, rec, view, url, names, interrupted, trace_desc, when, t0, dep, target)
        reported = True
    except KeyboardInterrupt:
        interrupted = True
        note("interrupted")
        if rec is not None and view is not None and not reported:  # stopped while writing it
            _finish(args, out, sched, rec, view, url, names, True, trace_desc, when, t0, dep, target)
    finally:
        if dep is not None and (interrupted or not args.keep_serving or rec is None):
            note("stopping the deployment (serve run, then Ray)...")
            for line in dep.stop():
                note(f"  {line}")
        elif dep is not None:
            note(f"still serving at {url}: stop with `kill -INT {dep.serve_proc.pid}; kill -TERM {dep.ray_proc.pid}`")
        signal.signal(signal.SIGTERM, prev_term)
    return 130 if interrupted else 0


def _replay(args, sched, names, url, body):
    from types import SimpleNamespace

    from ..demo.live import replay_live
    from ._live import slos_of

    slo_ms, _, _ = slos_of(SimpleNamespace(slo_ms=None, percentile=99.0), url, names)
    return replay_live(
        sched,
        url,
        slo_ms,
        body=body,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout,
        live_table=not args.no_live,
        title="faro-serve demo: ",
    )


def _finish(args, out, sched, rec, view, url, names, interrupted, trace_desc, when, t0, dep, target):
    """Write records.csv, result.json, report.md and timeline.png; print the accounting."""
    import math

    from ..demo.live import unsent_after_stop
    from ..demo.report import plot_timeline, render_markdown, trim
    from ..replay.replay_report import replay_document, replay_result, write_json, write_records

    status = {}
    for _, s in rec.status_polls:
        status = s
    models = status.get("models") or {}
    slo_ms = {n: float((models.get(n) or {}).get("slo_ms") or view.slo_ms[n]) for n in names}
    pct = {n: float((models.get(n) or {}).get("percentile") or 99.0) for n in names}
    policy = status.get("policy") or "live"
    m_sched, m_rec = sched, rec
    if interrupted:  # the metrics cover the minutes the replay reached
        reached = max(1, min(sched.minutes, math.ceil((view.stopped_at or 0) / (60 * sched.time_scale))))
        m_sched, m_rec = trim(sched, rec, reached)
    res = replay_result(m_sched, m_rec, slo_ms, pct, policy=policy)
    doc = replay_document(res, m_sched, m_rec, url)
    doc["accounting"] = rec.counts()  # every scheduled request, also those after an interrupt
    doc["interrupted"] = bool(interrupted)
    write_records(out / "records.csv", sched, rec)
    write_json(out / "result.json", doc)
    image = "timeline.png"
    try:
        plot_timeline(out / image, m_sched, m_rec, res.table.p_all, slo_ms)
    except Exception as err:  # the report is still worth having without its picture
        print(f"faro-serve: warning: no timeline plot ({type(err).__name__}: {err})", file=sys.stderr)
        image = None
    deployment = (
        f"`serve run {target.config}` started by the demo at {url} (Ray dashboard "
        f"127.0.0.1:{target.dashboard_port}; logs ray.log, serve.log)"
        if dep is not None
        else f"already running at {url}"
    )
    files = ["report.md", "records.csv (one row per scheduled request)", "result.json (the replay's JSON)"]
    files += [image] if image else []
    files += ["serve.log", "ray.log"] if dep is not None else []
    meta = {
        "when": f"{when:%Y-%m-%d %H:%M} UTC",
        "wall_s": time.monotonic() - t0,
        "deployment": deployment,
        "trace": trace_desc,
        "interrupted": interrupted,
        "stopped_at_s": view.stopped_at or 0.0,
        "full_minutes": sched.minutes,
        "unsent_after_stop": unsent_after_stop(sched, rec, view.stopped_at) if interrupted else 0,
        "files": files,
    }
    meta["sections"] = _diagnosis(url, m_sched, m_rec, view, names, res, slo_ms)
    (out / "report.md").write_text(render_markdown(doc, res, m_sched, m_rec, slo_ms, meta, image))
    a = doc["accounting"]
    by = ", ".join(f"{k}: {v:,}" for k, v in a["by_status"].items()) or "none"
    print(
        f"sent {a['sent']:,} = answered {a['answered']:,} ({by}) + errors {a['errors']:,} | not sent {a['not_sent']:,}"
    )
    print(f"{'partial report (interrupted)' if interrupted else 'report'}: {out / 'report.md'}", flush=True)


def _diagnosis(url, sched, rec, view, names, res, slo_ms) -> list[str]:
    """The report's decisions and machine sections (faro_serve.demo.diagnosis)."""
    import numpy as np

    from ..demo.diagnosis import decisions_section, machine_minutes, machine_section
    from ._live import fetch_status

    try:
        records = fetch_status(url, path="decisions?limit=500")
    except UsageError as err:  # the deployment went away: the rest of the report stands
        print(f"faro-serve: warning: no decisions for the report ({err})", file=sys.stderr)
        records = []
    minute_s = 60.0 * sched.time_scale
    mm = machine_minutes(rec.status_polls, view.load, names, minute_s, sched.minutes, baseline_ms=view.baseline_ms)
    slo_ok = {n: np.asarray(res.table.p_all[i]) <= slo_ms[n] / 1e3 for i, n in enumerate(names)}
    return decisions_section(records, view.t0_wall) + machine_section(mm, names, slo_ok, view.warmup_note)


def _fit(args, target, names, url, body, note, keep: str | None) -> dict:
    """The warm-up and the rate scale it allows (faro_serve.demo.warmup)."""
    import asyncio
    import os

    import numpy as np

    from ..demo.warmup import WARMUP_S, ModelFit, measure, size_rate

    note(f"warm-up: {WARMUP_S:g} s of one request in flight per model, to size the load to this machine")
    got = asyncio.run(measure(url, names, body))
    slo = {m.name: m for m in target.slos}
    fits = [
        ModelFit(
            n,
            slo[n].slo_ms,
            slo[n].percentile,
            slo[n].cpus,
            slo[n].max_replicas,
            got[n]["processing_ms"],
            got[n]["cpu_ms"],
            args.peak_rps[n],
        )
        for n in names
    ]
    scale, why = size_rate(fits, args.base_rate_scale, target.capacity_cpus, os.cpu_count())
    measured = ", ".join(
        f"{f.name} {f.processing_ms:.0f} ms ({f.cpu_ms:.0f} ms CPU, {got[f.name]['n']} answers)" for f in fits
    )
    if keep and scale != args.base_rate_scale:
        chosen = f"kept rate scale {args.base_rate_scale:g} ({keep}), although {why}"
        scale = args.base_rate_scale
    else:
        chosen = f"rate scale {scale:g}: {why}"
    text = (
        f"Warm-up ({WARMUP_S:g} s, one request in flight per model, all at once): processing "
        f"{measured}. Sized to this machine: {chosen}."
    )
    note(text)
    return {
        "scale": scale,
        "note": text,
        "baseline_ms": {f.name: f.processing_ms for f in fits if np.isfinite(f.processing_ms)},
    }
