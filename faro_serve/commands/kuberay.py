"""``faro-serve kuberay``: a KubeRay RayService manifest for a serve_config.yaml.

Beyond one machine: the Serve config goes into spec.serveConfigV2, and the RayCluster gets
a head pod (dashboard on 0.0.0.0, no model replicas) and one worker group sized so its CPUs
are the faro application's cluster.cpus. The image must have faro-serve installed.
See docs/multinode.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "kuberay",
        help="write a KubeRay RayService manifest for a Serve config",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--config", default="serve_config.yaml", help="faro-serve Serve config (serve_config.yaml)")
    p.add_argument("--out", default="-", help="manifest file ('-' = stdout, the default)")
    p.add_argument(
        "--image",
        default=None,
        help="container image with faro-serve installed "
        "(default rayproject/ray:2.60.0-py311, which lacks it: build FROM it)",
    )
    p.add_argument("--name", default="faro-serve", help="RayService name (faro-serve)")
    p.add_argument("--worker-cpus", type=float, default=2.0, help="CPUs per worker pod (2)")
    p.add_argument("--worker-memory-gb", type=float, help="memory per worker pod (default 2 GiB per CPU)")
    p.add_argument("--head-cpus", type=float, default=1.0, help="CPUs of the head pod (1)")
    p.add_argument("--head-memory-gb", type=float, default=4.0, help="memory of the head pod (4)")
    p.add_argument(
        "--in-cluster",
        action="store_true",
        help="rewrite http_options.host to 0.0.0.0 and the autoscaler's dashboard_url "
        "to the head service (otherwise serveConfigV2 is the file verbatim)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..serving.rayservice import DEFAULT_IMAGE, dump_manifest, rayservice_manifest

    path = Path(args.config)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--config {path}: cannot read ({getattr(err, 'strerror', None) or err})") from None
    image = args.image or DEFAULT_IMAGE
    manifest = rayservice_manifest(
        text,
        name=args.name,
        image=image,
        worker_cpus=args.worker_cpus,
        worker_memory_gb=args.worker_memory_gb,
        head_cpus=args.head_cpus,
        head_memory_gb=args.head_memory_gb,
        in_cluster=args.in_cluster,
        source=str(path),
    )
    out = dump_manifest(manifest, image, str(path))
    if args.out == "-":
        sys.stdout.write(out)
    else:
        try:
            Path(args.out).write_text(out)
        except OSError as err:
            raise UsageError(f"--out {args.out}: cannot write ({err.strerror})") from None
        w = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
        print(
            f"wrote {args.out}: RayService {args.name}, {w['replicas']} worker pod(s) of "
            f"{args.worker_cpus:g} CPU, image {image}",
            file=sys.stderr,
        )
    return 0
