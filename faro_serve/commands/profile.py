"""``faro-serve profile``: measure a model's batch latency on Ray Serve, on the device it
will serve on (docs/batching.md): faro-serve's ResNets over batch size x threads, fitting
Sponge's ``l(b, c) = gamma b / c + eps / c + delta b + eta`` (issue 20), or a user's
``@serve.batch`` deployment by import path, its batch curve (issue 47)."""

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
    p = sub.add_parser(
        "profile",
        help="profile a model's batch latency (ResNets, or your @serve.batch deployment)",
        description="Deploy each torchvision ResNet on a local Ray Serve (loopback "
        "only), time its forward passes over a grid of batch sizes and thread counts "
        "inside the replica (on the GPU with --gpus), fit Sponge's latency model "
        "l(b, c) = gamma b / c + eps / c + delta b + eta and save the profile "
        "(measurements and fit) as OUT/<arch>.json for the planner and the "
        "simulator. With --deployment: your @serve.batch deployment, deployed under "
        "Faro with its CPUs and GPUs, its batches timed at each size, saved as "
        "OUT/<name>.json with its batch curve (batching: {profile: ...} in its SLO).",
    )
    p.add_argument("--arch", default="resnet18", help="comma-separated: resnet18, resnet34, resnet50 (resnet18)")
    p.add_argument(
        "--deployment",
        default=None,
        help="your deployment by import path, package.module:Name, with a @serve.batch method (instead of --arch)",
    )
    p.add_argument("--init-kwargs", default="{}", help="with --deployment: its init arguments, JSON")
    p.add_argument(
        "--body", default=None, help="with --deployment: a file whose bytes each request POSTs (default: empty)"
    )
    p.add_argument("--content-type", default=None, help="with --deployment: the body's type")
    p.add_argument(
        "--name",
        default=None,
        help="with --deployment: the model's name and file name (default: the deployment's, lower-cased)",
    )
    p.add_argument("--cpus", type=float, default=1.0, help="with --deployment: CPUs per replica (1)")
    p.add_argument("--gpus", type=float, default=0.0, help="GPUs per replica: the device it will serve on (0: the CPU)")
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
    med = [float(np.median([r["latency_s"] for r in rows if (r["batch"], r["threads"]) == pt])) for pt in points]
    fit = fit_profile([b for b, _ in points], [c for _, c in points], med)
    return points, med, fit


def run(args) -> int:
    if args.deployment:
        return run_deployment(args)
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
        _check_gpus(args.gpus)
        serve.start(http_options={"host": "127.0.0.1", "port": 0})
        for arch in archs:
            handle = serve.run(
                profile_app(arch, max(threads), args.checkpoint, args.gpus), name=f"profile-{arch}", route_prefix=None
            )
            t0 = time.time()
            rows = handle.profile.remote(batches, threads, args.repeats, args.image_size).result(timeout_s=3600)
            points, med, fit = summarize(rows)
            doc = {
                "arch": arch,
                "image_size": args.image_size,
                "repeats": args.repeats,
                "device": rows[0].get("device", "cpu") if rows else "cpu",
                "machine": {"cores": os.cpu_count(), "processor": platform.processor() or platform.machine()},
                "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "profile": fit.to_dict(),
                "rows": rows,
            }
            (out / f"{arch}.json").write_text(json.dumps(doc, indent=1))
            print(
                f"{arch}: gamma {fit.gamma * 1e3:.2f} ms, eps {fit.eps * 1e3:.2f} ms, "
                f"delta {fit.delta * 1e3:.2f} ms, eta {fit.eta * 1e3:.2f} ms, R^2 {fit.r2:.4f} "
                f"({len(points)} points, {time.time() - t0:.0f} s) -> {out / f'{arch}.json'}"
            )
            print("  batch threads  measured ms  model ms")
            for (b, c), m in zip(points, med):
                print(f"  {b:5d} {c:7d} {m * 1e3:12.1f} {float(fit.latency(b, c)) * 1e3:9.1f}")
            serve.delete(f"profile-{arch}")
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


def _check_gpus(gpus: float) -> None:
    import ray

    have = ray.cluster_resources().get("GPU", 0.0)
    if gpus > have:
        raise UsageError(
            f"--gpus {gpus:g}: Ray sees {have:g} GPU(s) on this machine; profile on the machine the model will serve on"
        )


def run_deployment(args) -> int:
    """``--deployment``: a user's @serve.batch deployment's batch curve (module docstring)."""
    import sys

    import numpy as np

    from ..batch_curve import BatchCurve, fit_hinge
    from ..config import ConfigError
    from ..ports import free_port

    sys.path.insert(0, str(Path.cwd()))
    from ..serving.user_app import load_deployment

    batches = _ints(args.batches, "--batches")
    if len(batches) < 2:
        raise UsageError("--batches: give at least 2 batch sizes")
    if not 1 <= args.repeats <= 100:
        raise UsageError("--repeats must be in 1..100")
    try:
        init_kwargs = json.loads(args.init_kwargs)
        if not isinstance(init_kwargs, dict):
            raise ValueError("not an object")
    except ValueError as err:
        raise UsageError(f"--init-kwargs must be a JSON object ({err})") from None
    body = b""
    if args.body:
        if not Path(args.body).is_file():
            raise UsageError(f"--body {args.body} does not exist")
        body = Path(args.body).read_bytes()
    try:
        dep = load_deployment(args.deployment)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    name = args.name or dep.name.lower().replace("_", "-")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import ray
    from ray import serve

    from ..serving.profiler import deploy_for_profile, time_batches

    port = free_port()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        _check_gpus(args.gpus)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            path = deploy_for_profile(dep, name, init_kwargs, args.cpus, args.gpus, max(batches))
        except ValueError as err:
            raise UsageError(str(err)) from None
        t0 = time.time()
        print(
            f"{args.deployment}: {len(batches)} batch sizes x {args.repeats + 1} rounds "
            f"({args.cpus:g} CPUs, {args.gpus:g} GPUs per replica)"
        )
        headers = {"content-type": args.content_type} if args.content_type else {}
        rows = time_batches(f"http://127.0.0.1:{port}", path, name, dep.name, batches, args.repeats, body, headers)
    finally:
        serve.shutdown()
        ray.shutdown()
    if len({r["batch"] for r in rows}) < 2:
        print(f"faro-serve: error: fewer than 2 batch sizes were timed ({rows})", file=sys.stderr)
        return 1
    b = np.array([r["batch"] for r in rows], float)
    t = np.array([r["latency_s"] for r in rows])
    curve, hinge = BatchCurve.from_points(b, t), fit_hinge(b, t)
    doc = {
        "deployment": args.deployment,
        "name": name,
        "cpus": args.cpus,
        "gpus": args.gpus,
        "repeats": args.repeats,
        "machine": {"cores": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "curve": curve.to_dict(),
        "hinge": hinge.to_dict(),
        "rows": rows,
    }
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    print(
        f"{name}: {len(rows)} batch sizes, {time.time() - t0:.0f} s -> {out / f'{name}.json'} "
        f"(batching: {{profile: {out / f'{name}.json'}}} in its SLO)"
    )
    print("  batch  measured ms  per request ms  hinge ms")
    for r in rows:
        print(
            f"  {r['batch']:5d} {r['latency_s'] * 1e3:12.2f} {r['latency_s'] * 1e3 / r['batch']:15.2f} "
            f"{float(hinge.latency(r['batch'])) * 1e3:9.2f}"
        )
    print(f"  hinge fit: R^2 {hinge.r2:.4f}, largest error {hinge.max_rel_err:.1%}")
    return 0
