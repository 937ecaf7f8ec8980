"""Free loopback ports that stay free until Ray binds them.

Asking the kernel for port 0 hands out a port from its ephemeral range, and the same range
serves every outgoing connection and every other ``bind(0)`` on the machine. Ray starts many
processes and opens many sockets before its client server or dashboard agent binds the port
we named, so an ephemeral pick can be taken in between (CI once lost ``ray start`` to exactly
that: "Failed to bind to address 127.0.0.1:36039"). Picking between Ray's worker ports and the
ephemeral range, where nothing is assigned behind our back, closes that window.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# above Ray's own defaults and its worker ports (10002-19999), below the ephemeral range
_LOW = 20000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in _RANGE_FILE.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def bindable(port: int, host: str = "127.0.0.1", reuse: bool = False) -> bool:
    """Whether ``port`` binds on ``host`` now. ``reuse``: as a server that sets SO_REUSEADDR
    will bind it (a port in TIME_WAIT after the last run counts as free)."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port that binds on ``host`` now, chosen outside the ephemeral range when there is
    room below it (else the kernel's pick)."""
    rng = rng or random.SystemRandom()
    lo, _ = ephemeral_range()
    if lo - _LOW >= 1000:
        for _ in range(200):
            port = rng.randrange(_LOW, lo)
            if bindable(port, host):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
