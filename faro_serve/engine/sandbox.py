"""NLopt's COBYLA with a deadline: the relaxed solve in a child process (paper section 4.2).

NLopt's COBYLA can spin forever inside its trust-region subproblem, ignoring ``maxeval``
and ``maxtime`` and holding the GIL (NLopt issues #118 and #370). It did so here on a
12-job penalty problem of the Azure Functions suite, which froze that simulation; in the
live autoscaler it would freeze the autoscaler's replica. No thread or signal can stop a C
loop that holds the GIL, so the solve runs in a long-lived child process
(``python -m faro_serve.engine.sandbox_child``, no ``multiprocessing``, so nothing depends on
the parent's ``__main__``) and the parent waits at most :func:`deadline_s`. On a stall the child
is killed and restarted at the next solve, and the caller falls back to SciPy's COBYLA
(PRIMA), which solved the same problem in 0.5 s. A solve costs a pickle of the problem
each way (about 0.2 ms for 10 jobs): the problem without its jobs' forecast samples
(:func:`_wire`), which the relaxed solve does not read and which were nine tenths of it.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .problem import Problem


def deadline_s(n_jobs: int) -> float:
    """How long a relaxed solve of ``n_jobs`` jobs may take: it takes milliseconds for 10
    jobs and 7.5 s for 100 ungrouped (docs/engine.md, decision time), so 2 s + 0.2 s per job."""
    return 2.0 + 0.2 * n_jobs


START_TIMEOUT_S = 120.0  # importing numpy/scipy/nlopt in the child, on a loaded machine

_lock = threading.Lock()
_child: subprocess.Popen[bytes] | None = None
_owner = 0  # pid that started _child: a forked process (a suite worker) starts its own
stalls = 0  # solves given up on since this process started (tests, status)


def _write(stream: IO[bytes], obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    import time

    out = bytearray()
    while len(out) < n:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            raise TimeoutError
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError("the solver process exited")
        out += chunk
    return bytes(out)


def _read(fd: int, deadline: float | None) -> Any:
    (n,) = struct.unpack("<Q", _read_exact(fd, 8, deadline))
    return pickle.loads(_read_exact(fd, n, deadline))


def _kill() -> None:
    global _child
    if _child is not None and _owner == os.getpid():
        _child.kill()
        _child.wait()
    _child = None


def _start() -> subprocess.Popen[bytes]:
    import time

    child = subprocess.Popen(
        [sys.executable, "-m", "faro_serve.engine.sandbox_child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdin is not None  # both PIPEs
        if _read(child.stdout.fileno(), time.monotonic() + START_TIMEOUT_S) != "ready":
            raise EOFError("unexpected greeting")
    except BaseException:
        child.kill()
        child.wait()
        raise
    return child


def _wire(prob: Problem) -> Problem:
    """What the child needs of ``prob``: a plain problem's relaxed objective reads its
    tables, never its jobs' rate samples (10 jobs x 100 samples x 7 steps, 56 KB: past a
    pipe's buffer, so each write waited on the child), so they travel empty. A pipeline's
    problem scores its end-to-end term from the rates and travels whole."""
    import numpy as np

    from .problem import Problem

    if type(prob) is not Problem:
        return prob
    slim = copy.copy(prob)
    none = np.zeros((0, 0))
    slim.jobs = [dataclasses.replace(j, rates=none) for j in prob.jobs]
    return slim


def relaxed(
    prob: Problem, rhobeg: float, maxeval: int | None, timeout_s: float | None = None, maxtime: float | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], int] | None:
    """``solve_relaxed(prob, rhobeg, "nlopt-inline", maxeval, maxtime)`` in the child
    process; None when it did not answer within ``timeout_s`` (default :func:`deadline_s`,
    or ``maxtime`` + 1 s where that is shorter; the child is then killed) or could not run."""
    import time

    global _child, _owner, stalls
    if timeout_s is None:
        timeout_s = deadline_s(prob.n) if maxtime is None else min(deadline_s(prob.n), maxtime + 1.0)
    with _lock:
        try:
            if _owner != os.getpid():  # forked: the inherited child belongs to the parent
                _child, _owner = None, os.getpid()
            if _child is None or _child.poll() is not None:
                _child = _start()
            assert _child.stdout is not None and _child.stdin is not None  # both PIPEs
            _write(_child.stdin, (_wire(prob), rhobeg, maxeval, maxtime))
            status, value = _read(_child.stdout.fileno(), time.monotonic() + timeout_s)
        except TimeoutError:
            stalls += 1
            _kill()
            return None
        except (EOFError, OSError, pickle.PickleError):
            _kill()
            return None
        return cast("tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], int]", value) if status == "ok" else None


atexit.register(_kill)
