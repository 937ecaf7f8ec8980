"""``faro-serve replay``: replay a trace against a running deployment (paper section 6).

Sends open-loop Poisson arrivals from the trace's per-minute counts to
<url>/<model>/predict (each request on its own, never slowed by slow answers; a 503 is a
dropped request and is not resent), records every request, and reports the simulator's
metrics through the same code: lost cluster utility, SLO violation rates, per-minute p99.
SLOs come from GET <url>/faro/status unless --slo-ms is given. A trace minute lasts
60 x --time-scale seconds; --rate-scale multiplies the counts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import _args
from ._live import slos_of
from ._output import check_output_dir
from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="send a trace's load to a running deployment and measure it",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--trace", required=True, help="trace file: tidy CSV or JSON lines")
    p.add_argument("--day", help="day to replay (CSV with a 'day' column)")
    p.add_argument("--sample", type=int, help="sample of that day (CSV with a 'sample' column)")
    p.add_argument("--jobs", help="comma-separated trace jobs to replay (default: all, or --map's)")
    p.add_argument("--map", metavar="JOB=MODEL,...", help="send a job's load to a model (default: same name)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="Serve HTTP address (loopback unless --allow-remote)")
    p.add_argument("--allow-remote", action="store_true", help="allow a --url that is not a loopback address")
    p.add_argument("--start", type=int, default=0, help="first trace minute to replay (0)")
    p.add_argument("--minutes", type=int, help="trace minutes to replay (default: to the end)")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="a trace minute lasts 60 x X seconds (1; 0.5 = twice as fast, so twice the "
        "request rate unless --rate-scale compensates)",
    )
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every count by Y (1)")
    p.add_argument("--max-requests", type=int, default=100_000, help="refuse a schedule with more requests (100000)")
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=500,
        help="open requests at most; a request due beyond it is not sent, and counted (500)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds (30)")
    p.add_argument(
        "--path",
        default="/{model}/predict",
        metavar="TEMPLATE",
        help="each request's route, {model} standing for its model (default "
        "/{model}/predict; your own deployment's: e.g. /{model} or /{model}/classify)",
    )
    p.add_argument(
        "--body",
        metavar="TEXT|@FILE",
        help="each request's body: the text, or a "
        "file's bytes with @FILE (default: empty); JSON text is sent as application/json",
    )
    p.add_argument("--slo-ms", type=float, help="SLO of every model (default: from /faro/status)")
    p.add_argument("--percentile", type=float, default=99.0, help="SLO percentile with --slo-ms (99)")
    p.add_argument("--seed", type=_args.seed, default=0, help="random seed of the schedule (0)")
    p.add_argument(
        "--network-delay",
        default="none",
        metavar="SPEC",
        help="network time each request is taken to have spent before it arrived, "
        "sent in the x-faro-network-ms header and added to its latency "
        "(Sponge's remaining budgets): none (default), a distribution of "
        "seconds (const:0.1, lognorm:SHAPE,LOC,SCALE, expon:LOC,SCALE) or "
        "bandwidth[:PAYLOAD_MB[,RTT_S]] (Sponge's 0.5-7 MB/s walk; 0.2 MB, 0.02 s)",
    )
    p.add_argument("--out", default="runs/replay", help="directory for records.csv and result.json (runs/replay)")
    p.add_argument("--json", metavar="OUT", help="also write the result JSON to OUT ('-' = stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--step-at",
        type=float,
        metavar="SECONDS",
        help="a load step at this second of the replayed slice (trace clock): add each "
        "model's recovery time and the requests dropped or over the SLO in the "
        "step's first 2 minutes ('surge' in the JSON)",
    )
    p.set_defaults(func=run)


def _body(spec: str | None) -> tuple[bytes, str | None]:
    """``--body``: (bytes, content type): a file's bytes with @FILE, else the text; JSON is
    sent as application/json."""
    if spec is None:
        return b"", None
    if spec.startswith("@"):
        try:
            data = Path(spec[1:]).read_bytes()
        except OSError as err:
            raise UsageError(f"--body {spec}: cannot read ({err.strerror})") from None
    else:
        data = spec.encode()
    try:
        json.loads(data)
        return data, "application/json"
    except ValueError:
        return data, None


def run(args) -> int:
    import asyncio

    from ..replay.client import send_schedule
    from ..replay.loadgen import build_schedule, check_url, parse_map, select_trace
    from ..replay.network import parse_network
    from ..replay.replay_report import replay_document, replay_result, replay_step, write_json, write_records
    from ..traces import load_trace

    url = check_url(args.url, args.allow_remote)
    for flag, v in (("--max-requests", args.max_requests), ("--max-in-flight", args.max_in_flight)):
        if v < 1:
            raise UsageError(f"{flag} must be >= 1 (got {v})")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 (got {args.timeout:g})")
    mapping = parse_map(args.map)
    jobs = _args.job_list(args.jobs)
    trace = load_trace(args.trace, days=args.day, sample=args.sample)
    trace, names = select_trace(trace, jobs, mapping, args.start, args.minutes)
    try:
        network = parse_network(args.network_delay)
    except ValueError as err:
        raise UsageError(str(err)) from None
    sched = build_schedule(
        trace, names, args.time_scale, args.rate_scale, args.seed, args.max_requests, network=network
    )
    if args.step_at is not None and not 0 <= args.step_at < 60 * sched.minutes:
        raise UsageError(f"--step-at {args.step_at:g} s is outside the replayed {60 * sched.minutes} s")
    if "{model}" not in args.path or not args.path.startswith("/"):
        raise UsageError(f"--path {args.path!r} must start with / and contain {{model}}")
    body, content_type = _body(args.body)
    slo_ms, pct, st = slos_of(args, url, names)
    check_output_dir(args.out, "--out")
    out_dir = Path(args.out)

    print(
        f"replaying {sched.size:,} requests of {len(names)} job(s) over {sched.minutes} trace "
        f"minute(s) in {sched.duration_s:.0f} s to {url}",
        file=sys.stderr,
    )

    def send(on_done=None):
        return asyncio.run(
            send_schedule(
                sched,
                url,
                max_in_flight=args.max_in_flight,
                timeout_s=args.timeout,
                body=body,
                path=args.path,
                content_type=content_type,
                on_done=on_done,
            )
        )

    if args.no_progress:
        rec = send()
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
        ) as bar:
            task = bar.add_task("replay", total=sched.size)
            rec = send(lambda k: bar.advance(task, k))

    policy = (st or {}).get("policy") or "live"
    for _, s in rec.status_polls:
        policy = s.get("policy") or policy
    res = replay_result(sched, rec, slo_ms, pct, policy=policy)
    doc = replay_document(res, sched, rec, url)
    if args.step_at is not None:
        doc["surge"] = replay_step(sched, rec, slo_ms, pct, args.step_at)
    write_records(out_dir / "records.csv", sched, rec)
    write_json(out_dir / "result.json", doc)
    if args.json:
        write_json(args.json, doc)
    if args.json != "-":
        _print(res, doc, out_dir)
        if args.step_at is not None:
            from ._scenario import print_step

            print_step(doc["surge"])
    a = doc["accounting"]
    if a["sent"] and not a["answered"]:  # nothing reached a server: not a measurement
        why = ", ".join(f"{k} {v:,}" for k, v in doc["failures"].items()) or "no answer"
        print(
            f"faro-serve: error: no request was answered ({why}); is faro-serve serving at "
            f"{url}? (records kept in {out_dir})",
            file=sys.stderr,
        )
        return 1
    return 0


def _print(res, doc: dict, out_dir: Path) -> None:
    from ._scenario import print_result

    print_result(res, None)
    a = doc["accounting"]
    by = ", ".join(f"{k}: {v:,}" for k, v in a["by_status"].items()) or "none"
    print(
        f"sent {a['sent']:,} = answered {a['answered']:,} ({by}) + errors {a['errors']:,}"
        f" | not sent (in-flight cap) {a['not_sent']:,}"
    )
    if doc["failures"]:
        print("failures: " + ", ".join(f"{k} {v:,}" for k, v in doc["failures"].items()))
    print(f"records: {out_dir / 'records.csv'} | result: {out_dir / 'result.json'}")
