"""A GPU cluster, simulated on the measured H200 profiles (issue 47, item 4):
``python -m bench.gpu_cluster``.

The Faro workload's ten jobs (the suite's trace, per-minute counts x ``--rate-scale``: GPU
rates, up to a few thousand requests/s per job; the middle two hours of each day, the
hours before as history), each a torchvision ResNet (jobs 0-3 ResNet18, 4-6 ResNet34, 7-9
ResNet50) whose batch of ``b`` takes the H200's measured forward pass ``l(b)``
(``profiles/h200-<arch>.json``, fp32: 1.45 / 2.18 / 3.33 ms alone; a little lognormal
noise); a GPU-era SLO (``--slo-ms``, p99, the proxy's overhead included); a fixed number of
GPUs. Each replica holds a quarter of a GPU (Ray's fractional ``num_gpus``; ``--gpus-per-
replica 1``: whole GPUs), as Ray users share a large GPU among small models; four replicas
on one GPU each run slower than alone, by the factor measured with four processes on the
H200 (``profiles/h200-sharing.json``: at batch 1 and 8, interpolated between, held beyond;
ResNet34 the mean of the other two), and never faster than a quarter of what one replica
alone serves at its best batch (the GPU's own ceiling). Compared in one run, each on the
same arrivals:

* ``faro``: batching-aware Faro-FairSum (the planner chooses each model's batch, up to 64,
  with its replicas; a replica takes what is queued when it frees, Faro's gate);
* ``faro-batch1``: Faro-FairSum as the paper has it, one request at a time;
* ``ray-tuned-b16`` / ``ray-tuned-b32``: Ray Serve's request-based autoscaler as its guide
  tunes it for latency, on a deployment with a fixed ``@serve.batch(max_batch_size=16 or
  32, batch_wait_timeout_s=0.004)`` as a user writes it (``RAY_TUNED_BATCH``): target
  ongoing requests one batch per replica, batches formed as Ray's decorator forms them (a
  batch closes 4 ms after its first request);
* ``inferline``: InferLine's planner choosing each model's batch and replicas for its
  peak, and its tuner;
* ``sponge``: Sponge, every second the smallest batch that meets the queued budgets and the
  rate, on one replica per model (it scales vertically only; a GPU has no cores to add);
* ``oracle``: batching-aware Faro told the true arrivals.

The forecasting policies plan with N-HiTS trained on days 1-8 of the trace (cached under
runs/forecasters). Writes a markdown table and the rows as JSON; what the numbers mean is
in docs/batching.md ("A GPU cluster"). One run of the scenario: ``bench/gpu_cluster_sim.py``.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.gpu_cluster_sim import FORECASTING, POLICIES, ROOT, TRACE, Run, run_one


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def aggregate(rows: list[dict]) -> dict:
    """(policy, gpus) -> mean and SD of lost utility and SLO violations over days and seeds."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["policy"], r["gpus"]), []).append(r)
    agg = {}
    for k, rs in out.items():
        lost = np.array([r["lost_cluster_utility"] for r in rs])
        agg[k] = {
            "lost": float(lost.mean()),
            "sd": float(lost.std()),
            "runs": len(rs),
            "viol": float(np.mean([r["slo_violation_rate"] for r in rs])),
            "gpus_used": float(np.mean([r["mean_gpus"] for r in rs])),
        }
    return agg


def gpus_for(agg: dict, policy: str, lost: float) -> int | None:
    """The fewest GPUs at which ``policy`` loses at most ``lost`` (None: at none run)."""
    ok = sorted(g for (p, g), a in agg.items() if p == policy and a["lost"] <= lost + 1e-12)
    return ok[0] if ok else None


def _table(agg: dict, caps: list[int], pols: list[str], cell) -> list[str]:
    out = ["| GPUs | " + " | ".join(pols) + " |", "|---:|" + "---:|" * len(pols)]
    for g in caps:
        out.append(f"| {g} | " + " | ".join("" if (p, g) not in agg else cell(agg[(p, g)]) for p in pols) + " |")
    return out


def targets(agg: dict, violations: float = 0.01) -> list[str]:
    """Issue 47's three targets, from the aggregate: GPUs for the same loss against Faro at
    batch 1, the loss against Ray tuned at equal GPUs, against the oracle."""
    out = []
    ok = sorted(g for (p, g), a in agg.items() if p == "faro" and a["viol"] <= violations)
    if ok and any(p == "faro-batch1" for p, _ in agg):
        g = ok[0]
        lost = agg[("faro", g)]["lost"]
        g1 = gpus_for(agg, "faro-batch1", lost)
        most = max(gg for p, gg in agg if p == "faro-batch1")
        out.append(
            f"- Batching-aware Faro meets the SLO (violations at most {100 * violations:g} %) "
            f"from {g} GPUs, losing {lost:.3f}; Faro at batch 1 loses at most that "
            + (
                f"from {g1} GPUs: **{g / g1:.2f}x the GPUs** (target: at most 0.4x)"
                if g1
                else f"at none of the counts run (up to {most}, where it loses "
                f"{agg[('faro-batch1', most)]['lost']:.3f}): **below {g / most:.2f}x the GPUs** "
                "(target: at most 0.4x)"
            )
        )
    for ray in ("ray-tuned-b16", "ray-tuned-b32"):
        pairs = [
            (g, agg[("faro", g)]["lost"], a["lost"])
            for (p, g), a in sorted(agg.items())
            if p == ray and ("faro", g) in agg
        ]
        if pairs:
            out.append(
                f"- Against {ray} at equal GPUs: "
                + ", ".join(
                    f"{g} GPUs {f:.3f} vs {r:.3f} (**{f / r:.2f}x**)" if r > 0 else f"{g} GPUs {f:.3f} vs 0"
                    for g, f, r in pairs
                )
                + " (target: at most 0.5x)"
            )
    pairs = [
        (g, agg[("faro", g)]["lost"], a["lost"])
        for (p, g), a in sorted(agg.items())
        if p == "oracle" and ("faro", g) in agg
    ]
    if pairs:
        out.append(
            "- Against the oracle: "
            + ", ".join(
                f"{g} GPUs {f:.3f} vs {o:.3f} (**{f / o:.2f}x**)" if o > 0 else f"{g} GPUs {f:.3f} vs 0"
                for g, f, o in pairs
            )
            + " (target: within 1.5x)"
        )
    return out


def report(agg: dict, args, wall: float, when: str | None = None) -> str:
    caps = sorted({g for _, g in agg})
    pols = [p for p in POLICIES if any(k[0] == p for k in agg)]
    share = args.gpus_per_replica
    lines = [
        "# A GPU cluster, simulated on the measured H200 profiles (issue 47)",
        "",
        f"`python -m bench.gpu_cluster --days {args.days} --seeds {args.seeds} --rate-scale "
        f"{args.rate_scale:g} --slo-ms {args.slo_ms:g} --minutes {args.minutes} "
        f"--gpus-per-replica {share:g} --gpus {args.gpus} --batch1-gpus {args.batch1_gpus} "
        f"--few-gpus {args.few_gpus}` ({when or time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{wall / 60:.0f} min on this 2-core machine). Ten jobs of the Faro trace (per-minute "
        f"counts x {args.rate_scale:g}, minutes {args.minutes} of each day, the minutes before as "
        "history), jobs 0-3 ResNet18, 4-6 ResNet34, 7-9 ResNet50 on H200s (fp32 forward pass, "
        f"profiles/h200-*.json), {share:g} GPU per replica; SLO {args.slo_ms:g} ms at p99, "
        "proxy overhead included; cold start 60 s. Lost cluster utility, mean (SD) over days "
        "and seeds (runs per cell: " + str(max(a["runs"] for a in agg.values())) + "):",
        "",
    ]
    lines += _table(agg, caps, pols, lambda a: f"{a['lost']:.3f} ({a['sd']:.3f})")
    lines += ["", "SLO violations (share of requests late or dropped) / GPUs held on average:", ""]
    lines += _table(agg, caps, pols, lambda a: f"{100 * a['viol']:.2f} % / {a['gpus_used']:.2f}")
    lines += ["", "Issue 47's targets:", "", *targets(agg)]
    return "\n".join(lines) + "\n"


def _gpus_of(policy: str, args) -> list[int]:
    """The GPU counts a policy runs at: Sponge holds one replica per model whatever the
    cluster has (it scales vertically only), so one count (the fewest) says it all."""
    if policy == "faro":
        return _ints(args.gpus)
    if policy == "faro-batch1":
        return _ints(args.batch1_gpus)
    few = _ints(args.few_gpus)
    return few[:1] if policy == "sponge" else few


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", default="9,10", help="trace days to report (9,10; tune on 1-8)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--gpus", default="3,4,5,6,8", help="GPU counts for faro")
    ap.add_argument("--batch1-gpus", default="6,8,12,16,20,24", help="GPU counts for faro-batch1")
    ap.add_argument("--few-gpus", default="3,4,6", help="GPU counts for the other policies")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rate-scale", type=float, default=120.0)
    ap.add_argument("--slo-ms", type=float, default=20.0)
    ap.add_argument("--queue-limit", type=int, default=2000)
    ap.add_argument("--gpus-per-replica", type=float, default=0.25, choices=(0.25, 0.5, 1.0))
    ap.add_argument(
        "--minutes",
        default="120-240",
        help="the slice of each day simulated (120-240: the day's middle two hours; the minutes before are history)",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu-cluster.md"))
    ap.add_argument(
        "--report-only",
        default=None,
        metavar="JSON",
        help="write the report from a run's saved rows (the .json beside its report) instead of running",
    )
    args = ap.parse_args(argv)
    if args.report_only:
        saved = json.loads(Path(args.report_only).read_text())
        args = argparse.Namespace(**{**vars(args), **saved["args"], "out": args.out})
        text = report(aggregate(saved["rows"]), args, saved.get("wall_s", 0.0), saved.get("when"))
        if saved.get("rerun"):  # some policies' rows come from a later run of the same command
            r = saved["rerun"]
            text += (
                f"\nThe rows of {', '.join(r['policies'])} are from a later run of the same "
                f"command with --policies {','.join(r['policies'])} ({r['wall_s'] / 60:.0f} min): "
                f"{r['why']}.\n"
            )
        Path(args.out).write_text(text)
        print(Path(args.out).read_text())
        return 0
    pols = [p for p in args.policies.split(",") if p]
    bad = [p for p in pols if p not in POLICIES]
    if bad:
        ap.error(f"unknown policies {bad}; choose from {', '.join(POLICIES)}")
    fc_dir = None
    if any(p in FORECASTING for p in pols):
        from faro_serve.sim.forecaster import ensure_forecaster

        fc_dir = str(
            ensure_forecaster(
                str(TRACE),
                days="1-8",
                sample=0,
                before_day=None,
                cache_dir=str(ROOT / "runs" / "forecasters"),
                log=print,
            )
        )
    start, end = (int(v) for v in args.minutes.split("-"))
    runs = [
        Run(p, d, s, g, args.rate_scale, args.slo_ms, args.queue_limit, fc_dir, start, end, args.gpus_per_replica)
        for p in pols
        for g in _gpus_of(p, args)
        for d in _ints(args.days)
        for s in _ints(args.seeds)
    ]
    runs.sort(key=lambda r: (-r.gpus if r.policy == "sponge" else 0, r.policy))  # long ones first
    t0 = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for row in pool.map(run_one, runs):
            rows.append(row)
            print(
                f"{row['policy']:14s} day {row['day']} seed {row['seed']} {row['gpus']:3d} GPUs: "
                f"lost {row['lost_cluster_utility']:.4f}, violations "
                f"{100 * row['slo_violation_rate']:.2f} %, {row['mean_gpus']:.1f} GPUs held "
                f"({row['wall_s']:.0f} s)",
                flush=True,
            )
    agg = aggregate(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(agg, args, time.perf_counter() - t0))
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "rows": rows,
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "wall_s": time.perf_counter() - t0,
            },
            indent=1,
        )
    )
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
