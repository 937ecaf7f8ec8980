"""The solver's child process (``python -m faro_serve.engine.sandbox_child``), started by
``sandbox.py``: it answers (problem, rhobeg, maxeval, maxtime) with NLopt's relaxed solution. Apart
from ``sandbox.py`` because it runs the solver, whose "nlopt" backend calls the sandbox:
one module for each direction, so the two do not import each other."""

from __future__ import annotations

import os
import signal
import sys

from .sandbox import _read, _write
from .solver import solve_relaxed


def _serve() -> None:
    """The child: answer (problem, rhobeg, maxeval, maxtime) with NLopt's relaxed solution."""
    # a terminal's Ctrl-C reaches the whole process group: the parent handles it (and kills
    # this child, or this child reads the end of its pipe), so the child prints no traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the channel is a private copy of fd 1; fd 1 itself (Python's and any C library's
    # stdout) goes to stderr, so nothing else can write into the channel
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _write(out, "ready")
    fd = sys.stdin.buffer.fileno()
    while True:
        try:
            prob, rhobeg, maxeval, maxtime = _read(fd, None)
        except EOFError:  # the parent went away
            return
        try:
            _write(
                out,
                ("ok", solve_relaxed(prob, rhobeg=rhobeg, backend="nlopt-inline", maxeval=maxeval, maxtime=maxtime)),
            )
        except Exception as err:  # noqa: BLE001 - reported to the parent, which falls back
            _write(out, ("error", repr(err)))


if __name__ == "__main__":
    _serve()
