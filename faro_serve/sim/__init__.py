"""The matched simulator (paper section 6.4): Ray-free, numba kernels, same policies as live.

``simulate(counts, models, policy, SimConfig(...))`` replays per-minute trace counts through
a fixed-capacity cluster of routers and replicas and returns the paper's metrics.
"""

from autoscaler.driving.driver import CapacityExceeded

from ..distributions import NO_OVERHEAD, PAPER_PROCESSING, PAPER_ROUTER_OVERHEAD, TimeDist, parse_dist
from .runner import SimConfig, SimResult, simulate

__all__ = [
    "CapacityExceeded",
    "NO_OVERHEAD",
    "PAPER_PROCESSING",
    "PAPER_ROUTER_OVERHEAD",
    "SimConfig",
    "SimResult",
    "TimeDist",
    "parse_dist",
    "simulate",
]
