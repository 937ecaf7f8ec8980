"""``faro-serve profile``: measure a model's batch x threads latency on Ray Serve and fit
Sponge's ``l(b, c) = gamma b / c + eps / c + delta b + eta`` (issue 20, docs/batching.md)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from .errors import UsageError


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers (got {text!r})") from None
    if not vals or vals[0] < 1 or vals[-1] > 64:
        raise UsageError(f"{flag} values must be in 1..64 (got {text!r})")
    return vals


def register(sub) -> None:
    p = sub.add_parser("profile", help="profile a model's batch x threads latency and fit Sponge's model",
                       description="Deploy each torchvision ResNet on a local Ray Serve (loopback "
                       "only), time its forward passes over a grid of batch sizes and thread counts "
                       "inside the replica, fit Sponge's latency model l(b, c) = gamma b / c + eps / c "
                       "+ delta b + eta and save the profile (measurements and fit) as "
                       "OUT/<arch>.json for the planner and the simulator.")
    p.add_argument("--arch", default="resnet18", help="comma-separated: resnet18, resnet34, resnet50 (resnet18)")
    p.add_argument("--batches", default="1,2,4,8,16", help="batch sizes (1,2,4,8,16)")
    p.add_argument("--threads", default=None, help="thread counts (default: 1 up to this machine's cores)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per point, after one warm-up (5)")
    p.add_argument("--image-size", type=int, default=224, help="input side in pixels (224)")
    p.add_argument("--checkpoint", default=None, help="local state_dict file (default: random weights)")
    p.add_argument("--out", default="profiles", help="directory for <arch>.json (profiles)")
    p.set_defaults(func=run)


def summarize(rows: list[dict]):
    """Median latency per (batch, threads) point and the fit over those medians."""
    import numpy as np

    from ..engine.batching import fit_profile

    points = sorted({(r["batch"], r["threads"]) for r in rows})
    med = [float(np.median([r["latency_s"] for r in rows if (r["batch"], r["threads"]) == pt]))
           for pt in points]
    fit = fit_profile([b for b, _ in points], [c for _, c in points], med)
    return points, med, fit


def run(args) -> int:
    from deployments.vision import ARCHS

    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad = [a for a in archs if a not in ARCHS]
    if not archs or bad:
        raise UsageError(f"--arch: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(ARCHS)}")
    batches = _ints(args.batches, "--batches")
    threads = _ints(args.threads or ",".join(map(str, range(1, (os.cpu_count() or 1) + 1))), "--threads")
    if len(batches) < 2 or len(threads) < 2:
        raise UsageError("the fit needs at least 2 batch sizes and 2 thread counts")
    if not 1 <= args.repeats <= 100 or not 16 <= args.image_size <= 1024:
        raise UsageError("--repeats must be in 1..100 and --image-size in 16..1024")
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise UsageError(f"--checkpoint {args.checkpoint} does not exist")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import ray
    from ray import serve

    from ..serving.profiler import profile_app

    ray.init(address="local", num_cpus=max(threads), include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0})
        for arch in archs:
            handle = serve.run(profile_app(arch, max(threads), args.checkpoint), name=f"profile-{arch}",
                               route_prefix=None)
            t0 = time.time()
            rows = handle.profile.remote(batches, threads, args.repeats, args.image_size).result(timeout_s=3600)
            points, med, fit = summarize(rows)
            doc = {"arch": arch, "image_size": args.image_size, "repeats": args.repeats,
                   "machine": {"cores": os.cpu_count(), "processor": platform.processor() or platform.machine()},
                   "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "profile": fit.to_dict(), "rows": rows}
            (out / f"{arch}.json").write_text(json.dumps(doc, indent=1))
            print(f"{arch}: gamma {fit.gamma * 1e3:.2f} ms, eps {fit.eps * 1e3:.2f} ms, "
                  f"delta {fit.delta * 1e3:.2f} ms, eta {fit.eta * 1e3:.2f} ms, R^2 {fit.r2:.4f} "
                  f"({len(points)} points, {time.time() - t0:.0f} s) -> {out / f'{arch}.json'}")
            print("  batch threads  measured ms  model ms")
            for (b, c), m in zip(points, med):
                print(f"  {b:5d} {c:7d} {m * 1e3:12.1f} {float(fit.latency(b, c)) * 1e3:9.1f}")
            serve.delete(f"profile-{arch}")
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
