"""CPU time of the Ray processes on this machine, read from Linux ``/proc``: what the
benches report as the cost of a data path or of a replica start."""

import os


def ray_cpu_seconds() -> float:
    """User + system CPU seconds of every live Ray process on this machine (Linux /proc),
    this process excluded."""
    tick, total, me = os.sysconf("SC_CLK_TCK"), 0.0, os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if not (cmd.startswith(b"ray::") or b"/ray/" in cmd):  # workers; raylet, GCS, agents
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue  # exited meanwhile
    return total
