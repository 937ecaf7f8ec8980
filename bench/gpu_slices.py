"""Faro on the GPU-like model of ``bench.gpu_live``, simulated on many slices of the trace
(issue 47): ``python -m bench.gpu_slices``.

``bench.gpu_live`` replays one fifteen-minute slice live; the simulator alone runs the same
model (a batch of ``b`` takes 100 x the H200's ResNet50 ``l(b)``, largest batch 16, one GPU a
replica, 4 GPUs) on the slices given, with the policy and settings of the live bench, from
one replica at batch 1 as a fresh deployment starts (``gpu_live.sim_setup``). Per slice and SLO: the share of
requests late or dropped, the lost utility, the requests dropped, and whether a surge set
the batch. Writes a markdown table to ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import gpu_live

ROOT = Path(__file__).resolve().parent.parent


def run(slo_ms: float, batch_wait: float, rate: float, day: int, job: str, minutes: str, seed: int = 0) -> dict:
    from faro_serve.sim.runner import simulate

    args = argparse.Namespace(
        day=day,
        job=job,
        minutes=minutes,
        rate_scale=rate,
        slo_ms=slo_ms,
        batch_wait=batch_wait,
        gpus=4,
        plan_every=60.0,
        cold_start=10.0,
        forecaster="fallback",
        seed=seed,
    )
    tr, _ = gpu_live.schedule(args)
    # Faro as bench.gpu_live simulates it, the proxy's overhead that bench's measured 13 ms
    slo, pol, cfg = gpu_live.sim_setup(args, "faro", 13.0)
    surges: list[int | None] = []
    decide = pol.decide

    def logged(obs):  # the surges' batch, read off each decision
        d = decide(obs)
        if d is not None and d.kind == "surge":
            surges.append(d.settings["gpu"].batch_size)
        return d

    pol.decide = logged  # type: ignore[method-assign]
    s = simulate(tr.counts * rate, [slo], pol, cfg).summary
    return {
        "violations": float(s.cluster_slo_violation_rate),
        "lost": float(s.lost_cluster_utility),
        "dropped": int(s.job_dropped.sum()),
        "requests": int(s.job_requests.sum()),
        "surge_batches": surges,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--day", type=int, default=10)
    ap.add_argument("--jobs", default="job7,job4")
    ap.add_argument("--slices", default="0-15,90-105,180-195,270-285", help="trace minutes, comma-separated")
    ap.add_argument("--slos", default="800:0.1,1000:0.05", help="SLO ms:batch wait s, comma-separated")
    ap.add_argument("--rate-scale", type=float, default=2.0)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu-slices.md"))
    args = ap.parse_args(argv)
    rows = [
        "| job | minutes | SLO ms | requests | late or dropped | lost utility | dropped | surges' batch |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    t0 = time.time()
    for job in args.jobs.split(","):
        for minutes in args.slices.split(","):
            for pair in args.slos.split(","):
                slo_ms, wait = (float(x) for x in pair.split(":"))
                r = run(slo_ms, wait, args.rate_scale, args.day, job, minutes)
                rows.append(
                    f"| {job} | {minutes} | {slo_ms:g} | {r['requests']:,} | {100 * r['violations']:.2f} % | "
                    f"{r['lost']:.4f} | {r['dropped']:,} | {', '.join(str(b) for b in r['surge_batches']) or '-'} |"
                )
                print(rows[-1], flush=True)
    head = (
        f"# `python -m bench.gpu_slices` (day {args.day}, rate x {args.rate_scale:g}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.time() - t0:.0f} s)\n\n"
        "'surges' batch': the batch each surge decision set (None: left as in force).\n\n"
    )
    Path(args.out).write_text(head + "\n".join(rows) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
