"""The demo's deployment (and ``faro-serve run``'s, with a Ray other shells can find):
``serve run <config>`` on a local Ray, started and stopped as child process groups.

``serve run`` alone starts Ray with the dashboard on the first free port from 8265, while the
autoscaler reaches the dashboard's external scaling API at its config's ``dashboard_url``
(default ``http://127.0.0.1:8265``); they would disagree silently if 8265 were taken. So the
demo starts Ray itself, ``ray start --head --block``, with the dashboard exactly on the
config's port (free ports for everything else, a private ``--temp-dir`` so no other Ray
program on the machine finds this cluster), then ``serve run --address <it> <config>``.
Each runs in its own process group with its output in a log file. Stopping: SIGINT to
``serve run`` (it deletes the applications and exits), SIGTERM to ``ray start`` (it stops
every Ray process it started), each bounded, then SIGKILL to whatever is left of either
process group. Nothing else is ever signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..ports import bindable, free_port
from .serve_target import ServeTarget, read_config


@contextmanager
def sigint_not_ignored():
    """Children spawned inside get SIGINT's default action, even if this process ignores it.

    A background job of a non-interactive shell (``faro-serve demo &`` in a script) starts with
    SIGINT ignored, and an ignored signal stays ignored across exec: ``serve run`` would then sleep through the
    SIGINT that asks it to delete the applications, and only the bounded SIGTERM would end it.
    A handler, unlike an ignore, is reset to the default at exec, so one is held while spawning.
    """
    try:
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        if ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: signals cannot be changed here
        ignored = False
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class DeploymentError(RuntimeError):
    """The deployment did not start or did not become ready; the message says why."""


def _tool(name: str) -> str:
    """``ray``/``serve`` of this Python environment (the venv), else from PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise DeploymentError(
            f"`{name}` not found next to {sys.executable} nor on PATH; install faro-serve with `make install`"
        )
    return found


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


_PGRP, _SESSION = 2, 3  # fields of /proc/<pid>/stat after the command name


def _members(ids, field: int = _SESSION) -> list[int]:
    """Live processes (not zombies) whose process group (``_PGRP``) or session (``_SESSION``)
    is one of ``ids`` (Linux /proc; elsewhere [])."""
    ids = {int(i) for i in ([ids] if isinstance(ids, int) else ids)}
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for d in entries:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and fields[0] != "Z" and int(fields[field]) in ids:
            out.append(int(d))
    return out


def session_members(sids) -> list[int]:
    """Live processes in the sessions ``sids``. Each child starts its own session, and
    everything it starts stays in it (Ray's workers get process groups of their own, but not
    sessions), so this finds whatever is left of them."""
    return _members(sids, _SESSION)


class LocalDeployment:
    """A private Ray and ``serve run <config>``; see the module docstring."""

    def __init__(self, target: ServeTarget, log_dir: Path, private: bool = True, temp_dir: str | None = None):
        """``private``: Ray in a temporary directory of its own, found by no other Ray
        program (the demo's); otherwise in ``temp_dir`` (default: Ray's own), on port 6379
        when free, so that ``ray``/``serve`` commands in other shells find it
        (``faro-serve run``)."""
        self.private = private
        self.ray_temp_dir = temp_dir
        self.target = target
        self.log_dir = Path(log_dir)
        self.ray_log = self.log_dir / "ray.log"
        self.serve_log = self.log_dir / "serve.log"
        self.ray_proc: subprocess.Popen | None = None
        self.serve_proc: subprocess.Popen | None = None
        self.temp_dir: str | None = None
        self.gcs_address = ""

    @property
    def pgids(self) -> list[int]:
        """Process groups of the children (each child leads its own group)."""
        return [p.pid for p in (self.ray_proc, self.serve_proc) if p is not None]

    def check_ports(self) -> None:
        t = self.target
        for port, what in (
            (t.http_port, "HTTP (http_options.port)"),
            (t.dashboard_port, "Ray dashboard (the faro app's dashboard_url)"),
        ):
            if not bindable(port, reuse=True):  # as Ray's proxy and dashboard bind
                raise DeploymentError(
                    f"port {port} for the {what} of {t.config} is in use: is a deployment "
                    f"already running? Replay against it with --url, stop it, or give a config "
                    f"with other ports"
                )

    def _env(self) -> dict[str, str]:
        """The children's environment: one authentication mode for both.

        Ray 2.60 is inconsistent here: ``ray start`` turns token authentication on when a
        token exists (``~/.ray/auth_token``), but a driver given an explicit ``--address``
        does not, and then cannot connect. Unless RAY_AUTH_MODE is set, both get ``token``
        (what ``serve run`` alone uses), with a token generated as ``serve run`` would.
        """
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
        if not env.get("RAY_AUTH_MODE"):
            env["RAY_AUTH_MODE"] = "token"
            path = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
            if not env.get("RAY_AUTH_TOKEN") and not path.is_file():
                subprocess.run(
                    [_tool("ray"), "get-auth-token", "--generate"],
                    env=env,
                    check=False,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=60,
                )
        return env

    def _spawn(self, cmd: list[str], log: Path) -> subprocess.Popen:
        env = self._env()
        with log.open("ab") as f:
            f.write(("$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            # own session: a Ctrl-C in the terminal reaches the demo only, which stops these
            with sigint_not_ignored():
                return subprocess.Popen(
                    cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
                )

    def start(self, timeout_s: float = 120.0) -> None:
        """Start Ray (wait for its dashboard) and ``serve run``; returns once both run."""
        import httpx

        self.check_ports()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.private:  # short: Ray puts unix sockets under it (108-byte path limit)
            self.temp_dir = tempfile.mkdtemp(prefix="faro-ray-", dir="/tmp")
        temp_dir = self.temp_dir or self.ray_temp_dir
        gcs = 6379 if not self.private and bindable(6379) else free_port()
        self.gcs_address = f"127.0.0.1:{gcs}"
        self.ray_proc = self._spawn(
            [
                _tool("ray"),
                "start",
                "--head",
                "--block",
                "--node-ip-address=127.0.0.1",
                f"--port={gcs}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.target.dashboard_port}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                *([f"--temp-dir={temp_dir}"] if temp_dir else []),
                "--disable-usage-stats",
            ],
            self.ray_log,
        )
        dash = f"http://127.0.0.1:{self.target.dashboard_port}/api/version"
        end = time.monotonic() + timeout_s
        while True:
            if self.ray_proc.poll() is not None:
                raise DeploymentError(f"`ray start` exited with code {self.ray_proc.returncode}")
            try:  # any answer will do: with token authentication it is a 401
                httpx.get(dash, timeout=2.0, trust_env=False)
                break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise DeploymentError(f"Ray's dashboard did not answer at {dash} within {timeout_s:.0f} s")
            time.sleep(0.5)
        self.serve_proc = self._spawn(
            [_tool("serve"), "run", "--address", self.gcs_address, str(self.target.config)], self.serve_log
        )

    def check_alive(self) -> None:
        for proc, what, log in (
            (self.ray_proc, "ray start", self.ray_log),
            (self.serve_proc, "serve run", self.serve_log),
        ):
            if proc is not None and proc.poll() is not None:
                raise DeploymentError(f"`{what}` exited with code {proc.returncode}; see {log}")

    def log_tails(self, lines: int = 20) -> str:
        out = []
        for log in (self.serve_log, self.ray_log):
            t = tail(log, lines)
            if t:
                out.append(f"--- last lines of {log} ---\n{t}")
        return "\n".join(out)

    def stop(self, grace_s: float = 30.0) -> list[str]:
        """Stop both children and everything in their process groups; returns what it did."""
        done = []
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
        try:
            for proc, sig in ((self.serve_proc, signal.SIGINT), (self.ray_proc, signal.SIGTERM)):
                if proc is not None:
                    done.append(self._stop_group(proc, sig, grace_s))
            left = session_members(self.pgids)  # e.g. Ray workers whose raylet died first
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + 5.0
            while left and time.monotonic() < end:
                time.sleep(0.2)
                left = session_members(self.pgids)
            if left:
                done.append(f"processes still alive: {left}")
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                self.temp_dir = None
        finally:
            signal.signal(signal.SIGINT, old)
        return done

    @staticmethod
    def _stop_group(proc: subprocess.Popen, sig: int, grace_s: float) -> str:
        pgid, name = proc.pid, Path(str(proc.args[0])).name
        if proc.poll() is None:
            try:
                os.kill(proc.pid, sig)
                proc.wait(timeout=grace_s)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        how = (
            f"{name} (pid {pgid}) exited on {signal.Signals(sig).name}"
            if proc.poll() is not None
            else f"{name} (pid {pgid}) still running after {grace_s:.0f} s"
        )
        # the leader is gone or stuck: end what is left of its group for good
        for s, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            left = len(_members(pgid, _PGRP))
            if not left:
                break
            try:
                os.killpg(pgid, s)
            except ProcessLookupError:
                break
            how += f"; {left} process(es) left in its group sent {signal.Signals(s).name}"
            end = time.monotonic() + wait_s
            while _members(pgid, _PGRP) and time.monotonic() < end:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
                time.sleep(0.05)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            how += " (it survives!)"
        return how


def wait_ready(
    url: str, names: list[str], body: bytes, timeout_s: float, deployment: LocalDeployment | None = None, note=None
) -> dict:
    """Wait until ``GET /faro/status`` lists every model of ``names`` and each answers one
    request with 200; returns the status. Raises :class:`DeploymentError` after ``timeout_s``
    or as soon as a child of ``deployment`` exits."""
    import httpx

    end = time.monotonic() + timeout_s
    ready: set[str] = set()
    st: dict | None = None
    last_note = time.monotonic()
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        while True:
            if deployment is not None:
                deployment.check_alive()
            try:
                known = set((st or {}).get("models") or {})
                if not set(names) <= known:
                    r = client.get(f"{url}/faro/status", timeout=5.0)
                    st = r.json() if r.status_code == 200 else None
                    known = set((st or {}).get("models") or {})
                if set(names) <= known:
                    for n in [n for n in names if n not in ready]:
                        left = max(1.0, min(30.0, end - time.monotonic()))
                        if client.post(f"{url}/{n}/predict", content=body, timeout=left).status_code == 200:
                            ready.add(n)
                    if ready == set(names):
                        return st or {}
            except (httpx.HTTPError, ValueError):
                pass
            now = time.monotonic()
            if now > end:
                where = (
                    "the autoscaler's status does not answer"
                    if st is None
                    else f"the status lists {', '.join(sorted((st.get('models') or {}))) or 'no model'}"
                )
                raise DeploymentError(
                    f"not ready within {timeout_s:.0f} s: {where}; answering: "
                    f"{', '.join(sorted(ready)) or 'none'} of {', '.join(names)}"
                )
            if note is not None and now - last_note >= 15.0:
                last_note = now
                note(
                    f"waiting for the deployment: status {'up' if st else 'not up yet'}, "
                    f"models answering {len(ready)}/{len(names)}"
                )
            time.sleep(1.0)


__all__ = [
    "DeploymentError",
    "LocalDeployment",
    "ServeTarget",
    "read_config",
    "session_members",
    "sigint_not_ignored",
    "tail",
    "wait_ready",
]
