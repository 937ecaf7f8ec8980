"""``faro-serve compare``: faro-serve live against plain Ray Serve under Ray's own autoscaler.

The same trace slice is replayed live, one run after the other, against faro-serve (any
policy) and plain Ray Serve: ``ray-native`` (each model a plain Ray Serve deployment with
Ray's defaults; Ray's controller decides; replicas past the CPU budget stay pending) and
``ray-tuned`` (the same with the settings Ray's advanced-autoscaling guide gives
latency-sensitive users: target_ongoing_requests 1, upscale_delay_s 3, downscale_delay_s 60,
metrics_interval_s 2, look_back_period_s 10, max_ongoing_requests 2, max_queued_requests 50),
each on freshly deployed models on a local Ray cluster, and in the matched simulator
(``ray-serve`` beside ``ray-native``, ``ray-serve-tuned`` beside ``ray-tuned``). Writes
compare.md (lost cluster utility, SLO violation rate, per-minute p99 against the SLO, the
accounting sent = answered + errors, the machine's load around each run, the simulated
counterparts, Ray's settings in force per Ray run), compare.png (replicas over
time and per-minute p99 per model) and validate's files. The default slice is contended:
six jobs whose busiest minutes together need more replicas than the cluster has, slowed
down 3x (processing and SLO x3, counts /3) so that the 2-core machine is not the bottleneck.
"""

from __future__ import annotations

from ._live import add_live_args, run_validation

DEFAULT_JOBS = "job9,job0,job3,job1,job6,job5"


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="faro-serve live against plain Ray Serve (ray-native, ray-tuned), same slice",
        description=__doc__.split("\n\n", 1)[1],
    )
    add_live_args(
        p,
        day=9,
        jobs=DEFAULT_JOBS,
        start=310,
        minutes=30,
        capacity=16,
        slowdown=3.0,
        rate_scale=1 / 3,
        policies="faro-fairsum,ray-native,ray-tuned",
        out="runs/compare",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..validation.headtohead import plot, report

    out, doc, state = run_validation(args)
    text = report(state, doc)
    (out / "compare.md").write_text(text)
    plot(state, out / "compare.png")
    print(text)
    print(f"files: {out / 'compare.md'}, compare.png, validation.md, <run>/records.csv")
    return 0
