"""``faro-serve init IMPORT_PATH``: a Serve config that puts the user's own deployment under
Faro (issue 34): the ``faro`` application with the model's SLO, and the model's application
through ``faro_serve.serving.user_app:build``. Written for the user to edit, then
``serve run`` it. The import path is checked: it must import and be a deployment."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from ._output import check_output_file
from .errors import UsageError

HEAD = """\
# faro-serve: {path} under Faro. Run with `serve run {out}` (or `serve deploy`).
# The SLO lives in the faro application's models; the model's application repeats what one
# replica reserves (cpus, gpus, resources, concurrency), which must agree with its SLO.
# Every field: docs/own-models.md.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "init",
        help="write a Serve config that puts your deployment under Faro",
        description="Write a Serve config (YAML) with the faro autoscaler and "
        "your deployment, named by import path (package.module:Name, the class "
        "decorated with @serve.deployment), under Faro with a latency SLO. The "
        "path must import from here (the current directory is on the path).",
    )
    p.add_argument("import_path", help="your deployment: package.module:Name")
    p.add_argument("--name", help="the model's name (default: the deployment's, lower-cased)")
    p.add_argument("--slo-ms", type=float, default=500.0, help="latency target, ms (default 500)")
    p.add_argument("--percentile", type=float, default=99.0, help="SLO percentile (default 99)")
    p.add_argument("--cpus", type=float, default=1.0, help="CPUs per replica (default 1)")
    p.add_argument("--gpus", type=float, default=0.0, help="GPUs per replica (default 0)")
    p.add_argument("--concurrency", type=int, default=1, help="requests one replica serves at once (default 1)")
    p.add_argument("--max-replicas", type=int, default=4, help="default 4")
    p.add_argument("--cluster-cpus", type=float, default=None, help="the CPUs Faro may use (default: this machine's)")
    p.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (default 8000)")
    p.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    p.set_defaults(func=run)


# the config's fields that init's flags set, for an error to name the flag
FLAG_OF = {
    "models.0.slo_ms": "--slo-ms",
    "models.0.percentile": "--percentile",
    "models.0.cpus": "--cpus",
    "models.0.gpus": "--gpus",
    "models.0.concurrency": "--concurrency",
    "models.0.max_replicas": "--max-replicas",
    "models.0.name": "--name",
    "cluster.cpus": "--cluster-cpus",
}


def config_for(path: str, dep_name: str, args, batching: dict | None = None) -> dict:
    """The Serve config; ``batching``: what the deployment's ``@serve.batch`` method says
    (issue 47), written into its SLO (the curve is measured live until given)."""
    import os

    name = args.name or dep_name.lower().replace("_", "-")
    cpus = args.cluster_cpus if args.cluster_cpus is not None else float(os.cpu_count() or 1)
    slo = {
        "name": name,
        "deployment": dep_name,
        "slo_ms": args.slo_ms,
        "percentile": args.percentile,
        "cpus": args.cpus,
        "max_replicas": args.max_replicas,
    }
    if batching:
        slo["batching"] = batching
    app_args = {"model": name, "deployment": path, "init_kwargs": {}, "cpus": args.cpus}
    for key, default in (("gpus", 0.0), ("concurrency", 1)):
        if getattr(args, key) != default:
            slo[key] = app_args[key] = getattr(args, key)
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": args.port},
        "applications": [
            {
                "name": "faro",
                "route_prefix": "/faro",
                "import_path": "faro_serve.serving.app:autoscaler_app",
                "args": {"cluster": {"cpus": cpus, "objective": "fair_sum"}, "models": [slo]},
            },
            {
                "name": name,
                "route_prefix": f"/{name}",
                "import_path": "faro_serve.serving.user_app:build",
                "external_scaler_enabled": True,
                "args": app_args,
            },
        ],
    }


def _batching(dep) -> dict | None:
    """The SLO's batching for a deployment with a ``@serve.batch`` method: the decorator's
    largest batch and wait (``faro_serve.serving.batch_method``)."""
    from faro_serve.serving.batch_method import batch_methods

    found = batch_methods(dep.func_or_class) if not isinstance(dep.func_or_class, str) else []
    if not found:
        return None
    m = max(found, key=lambda x: x.max_batch_size)
    print(
        f"{dep.name}.{m.attr} is @serve.batch(max_batch_size={m.max_batch_size}, "
        f"batch_wait_timeout_s={m.wait_s:g}): the SLO declares that batching; its latency "
        "curve is measured live (or give one: faro-serve profile --deployment)",
        file=sys.stderr,
    )
    return {"max_batch_size": min(m.max_batch_size, 64), "batch_wait_s": min(m.wait_s, 1.0)}


def run(args) -> int:
    from faro_serve.config import ConfigError, parse_config

    sys.path.insert(0, str(Path.cwd()))
    from faro_serve.serving.user_app import load_deployment

    if args.import_path.count(":") != 1 or not all(args.import_path.split(":")):
        raise UsageError(f"{args.import_path!r} is not an import path: write 'package.module:Name'")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535 (got {args.port})")
    check_output_file(args.output, "-o")
    dep = load_deployment(args.import_path)  # a ConfigError names what is wrong
    doc = config_for(args.import_path, dep.name, args, _batching(dep))
    faro = doc["applications"][0]["args"]
    try:
        parse_config(faro, "the config these flags make")
    except ConfigError as err:  # named by the flag that set the field
        text = str(err)
        for field, flag in FLAG_OF.items():
            text = text.replace(f"{field}:", f"{flag} ({field}):")
        raise UsageError(text) from None
    text = HEAD.format(path=args.import_path, out=args.output if args.output != "-" else "config.yaml")
    text += yaml.safe_dump(doc, sort_keys=False)
    if args.output == "-":
        print(text, end="")
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}: serve run {args.output}", file=sys.stderr)
    return 0
