"""``faro-serve run``: ``serve run`` with a graceful stop (issue 50).

Ray Serve's ``serve run`` on Ctrl-C deletes the applications and kills its HTTP proxy at
once, disconnecting what the proxy holds; on SIGTERM it dies without deleting them and
leaves Ray's stack dump in its log. ``faro-serve run CONFIG`` starts Ray (``ray start
--head``, the dashboard on the faro app's ``dashboard_url`` port) and ``serve run`` as child
process groups, shows Serve's log, and on Ctrl-C or SIGTERM first drains faro-serve's models
(``faro-serve drain``: admitted requests answered, new ones 503 ``shutting_down``), then
stops ``serve run`` and Ray, and exits 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="serve a config like `serve run`, and on Ctrl-C/SIGTERM drain before stopping",
        description="Starts Ray and `serve run CONFIG`, shows Serve's log, and on Ctrl-C or "
        "SIGTERM drains faro-serve's models (requests already admitted are answered, new ones get "
        "503 shutting_down with Retry-After) before Serve and Ray stop; exits 0. Ray's dashboard "
        "listens on the port of the faro app's dashboard_url, its GCS on 6379 when free.",
    )
    p.add_argument("config", help="a Serve config with a faro application (serve_config.yaml)")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds a stop waits for admitted requests to be answered (30)",
    )
    p.add_argument(
        "--log-dir",
        default=None,
        help="where Ray's and Serve's output go (default: a new directory under ~/.cache/faro-serve/run)",
    )
    p.add_argument("--ray-temp-dir", default=None, help="Ray's session directory (default: Ray's own, /tmp/ray)")
    p.set_defaults(func=run)


def _follow(path: Path, stop: threading.Event) -> None:
    """Print what is written to ``path`` until ``stop``."""
    while not path.exists() and not stop.is_set():
        time.sleep(0.2)
    with path.open("r", errors="replace") as f:
        while True:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif stop.is_set():
                return
            else:
                time.sleep(0.2)


def run(args) -> int:
    from ..demo.deployment import DeploymentError, LocalDeployment, read_config

    if not args.drain_timeout > 0:
        raise UsageError(f"--drain-timeout must be > 0 seconds (got {args.drain_timeout:g})")
    target = read_config(args.config, loopback_only=False)
    log_dir = Path(
        args.log_dir or Path.home() / ".cache" / "faro-serve" / "run" / time.strftime("%Y%m%d-%H%M%S")
    ).expanduser()
    dep = LocalDeployment(target, log_dir, private=False, temp_dir=args.ray_temp_dir)
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum, frame):
        got.append(signum)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    follower = threading.Thread(target=_follow, args=(dep.serve_log, stop), daemon=True)
    code = 0
    try:
        try:
            dep.start()
        except DeploymentError as err:
            raise UsageError(f"{err}\n{dep.log_tails()}") from None
        print(
            f"faro-serve run: Ray at {dep.gcs_address} (dashboard http://127.0.0.1:"
            f"{target.dashboard_port}), serving {target.config} at {target.url}; logs in "
            f"{log_dir}. Ctrl-C or SIGTERM drains, then stops.",
            flush=True,
        )
        follower.start()
        while not stop.wait(1.0):
            try:
                dep.check_alive()
            except DeploymentError as err:
                print(f"faro-serve run: {err}", file=sys.stderr)
                code = 1
                break
        if got:
            name = signal.Signals(got[0]).name
            print(f"faro-serve run: {name}: draining (up to {args.drain_timeout:g} s)", flush=True)
            drained = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "faro_serve",
                    "drain",
                    "--address",
                    dep.gcs_address,
                    "--timeout",
                    str(args.drain_timeout),
                ],
                env=dep._env(),
                timeout=args.drain_timeout + 120,
                start_new_session=True,
            )  # a second Ctrl-C must not cut the drain short
            if drained.returncode != 0:
                print("faro-serve run: the drain did not finish; stopping anyway", file=sys.stderr)
    finally:
        stop.set()
        for line in dep.stop():
            print(f"faro-serve run: {line}", flush=True)
        for s, h in old.items():
            signal.signal(s, h)
    return code
