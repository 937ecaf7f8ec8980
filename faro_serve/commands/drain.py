"""``faro-serve drain``: drain faro-serve's models before Serve stops (issue 50,
``faro_serve/serving/draining.py``): admitted requests are answered, new ones get 503."""

from __future__ import annotations

import os

from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "drain",
        help="before Serve stops: answer what was admitted, refuse new requests with 503",
        description="Tells every faro-serve model on a running Ray cluster to refuse new HTTP "
        "requests (503, reason shutting_down, Retry-After) and waits until each has answered the "
        "requests it admitted and its queue is empty (or --timeout). Run it before `serve "
        "shutdown` (a Kubernetes pre-stop hook, a script); `faro-serve run` runs it by itself on "
        "Ctrl-C or SIGTERM. Exit 0: drained (or nothing to drain); 1: not drained in time.",
    )
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "auto"),
        help="the Ray cluster (its GCS address host:port; default $RAY_ADDRESS or auto)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the models to drain (30)")
    p.set_defaults(func=run)


def run(args) -> int:
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds (got {args.timeout:g})")
    import logging

    import ray

    from ..serving.draining import drain

    host, _, port = args.address.rpartition(":")
    if host and port.isdigit():  # Ray waits a minute or more for a GCS that is not there
        import socket

        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as err:
            raise UsageError(
                f"nothing answers at {args.address} ({err.strerror or err}): is Ray "
                f"running there? (`faro-serve run` prints its address)"
            ) from None
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # a second driver of a local Ray needs it
    try:
        ray.init(address=args.address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as err:  # no cluster there, or one this shell may not join
        raise UsageError(f"cannot connect to Ray at {args.address}: {str(err).splitlines()[0]}") from None
    try:
        res = drain(args.timeout, say=print)
    finally:
        ray.shutdown()
    if not res.states and not res.errors:
        print("no faro-serve model is running on this cluster: nothing to drain")
        return 0
    for line in res.lines():
        print(line)
    print(f"{'drained' if res.drained else 'NOT drained'} in {res.seconds:.1f} s")
    return 0 if res.drained else 1
