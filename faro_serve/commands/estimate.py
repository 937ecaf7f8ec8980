"""``faro-serve estimate``: the fewest replicas whose estimated latency meets an SLO (paper 3.3)."""

from __future__ import annotations

import json
import math

from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="fewest replicas that meet a latency SLO",
        description="Fewest replicas whose estimated k-th percentile latency "
        "meets the SLO, for Poisson arrivals at RATE and a constant processing time.",
    )
    p.add_argument("--rate", type=float, required=True, help="arrival rate, requests/s")
    p.add_argument("--proc-ms", type=float, required=True, help="per-request processing time, ms")
    p.add_argument("--slo-ms", type=float, required=True, help="latency target, ms")
    p.add_argument("--percentile", type=float, default=99.0, help="SLO percentile (default 99)")
    p.add_argument(
        "--estimator",
        choices=["mdc", "upper"],
        default="mdc",
        help="M/D/c queueing model (default) or the pessimistic upper bound",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests one replica serves at once (default 1; docs/concurrency.md)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine.latency import min_replicas_for_slo

    for flag, v in (
        ("--rate", args.rate),
        ("--proc-ms", args.proc_ms),
        ("--slo-ms", args.slo_ms),
        ("--percentile", args.percentile),
    ):
        if not math.isfinite(v):
            raise UsageError(f"{flag} must be a finite number (got {v:g})")
    if args.rate < 0:
        raise UsageError(f"--rate must be >= 0 (got {args.rate:g})")
    if args.proc_ms <= 0 or args.slo_ms <= 0:
        raise UsageError("--proc-ms and --slo-ms must be > 0")
    if not 0 < args.percentile < 100:
        raise UsageError(f"--percentile must be in (0, 100) (got {args.percentile:g})")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1 (got {args.concurrency})")
    p, slo, k = args.proc_ms / 1e3, args.slo_ms / 1e3, args.concurrency
    n, lat = min_replicas_for_slo(args.rate, p, slo, args.percentile / 100, args.estimator, concurrency=k)
    out = {
        "replicas": n,
        "latency_ms": round(lat * 1e3, 3),
        "utilization": round(args.rate * p / (n * k), 4),
        "estimator": args.estimator,
        "rate": args.rate,
        "proc_ms": args.proc_ms,
        "slo_ms": args.slo_ms,
        "percentile": args.percentile,
        "concurrency": k,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{n} replicas: p{args.percentile:g} latency {out['latency_ms']:.1f} ms <= SLO "
            f"{args.slo_ms:g} ms at {args.rate:g} req/s (utilisation {out['utilization']:.2f}, "
            f"{args.estimator})"
        )
    return 0
