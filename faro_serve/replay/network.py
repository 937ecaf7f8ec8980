"""The network time a replayed request spent before it reached the cluster (issue 20, Sponge).

Sponge (EuroMLSys '24, section 3) serves clients on mobile networks: a request arrives with
part of its SLO already spent in transit, and its *remaining budget* (SLO minus that time)
is what the server must meet. A replay on loopback has no such network, so it can attach
one per request: the request is sent at its instant as before, carries the network time it
is taken to have spent in the header ``x-faro-network-ms``
(:data:`faro_serve.serving.names.NETWORK_HEADER`), and the replay counts its end-to-end
latency as that time plus the measured answer time. Nothing sleeps: the load on the server
is the schedule's.

Specs (:func:`parse_network`):

* ``none``: no network time (the default);
* a distribution of seconds, as elsewhere (``const:0.1``, ``lognorm:SHAPE,LOC,SCALE``,
  ``expon:LOC,SCALE``), drawn independently per request;
* ``bandwidth[:PAYLOAD_MB[,RTT_S]]``: Sponge's setting as the simulator has it
  (``faro_serve/sim/batched_runner.py``): a per-second bandwidth walk in 0.5-7 MB/s, and a
  request spends ``PAYLOAD_MB / bandwidth + RTT_S`` (default 0.2 MB and 0.02 s: 29-420 ms).

The draw uses its own stream (the third child of ``SeedSequence(seed)``), so attaching a
network leaves the schedule's counts and instants exactly as without one. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..distributions import TimeDist, parse_dist
from ..sim.batched_runner import bandwidth_trace

MAX_NETWORK_S = 60.0  # more than any SLO: a spec that draws more is a mistake


@dataclass(frozen=True)
class NetworkSpec:
    """``kind`` is "none", "dist" (``dist`` per request) or "bandwidth"."""

    kind: str = "none"
    dist: TimeDist | None = None
    payload_mb: float = 0.2
    rtt_s: float = 0.02

    def __str__(self) -> str:
        if self.kind == "dist":
            return str(self.dist)
        if self.kind == "bandwidth":
            return f"bandwidth:{self.payload_mb:g},{self.rtt_s:g}"
        return "none"


def parse_network(text: str | None) -> NetworkSpec:
    """``None``/``"none"``, a distribution spec, or ``"bandwidth[:PAYLOAD_MB[,RTT_S]]"``;
    ``ValueError`` naming the problem otherwise."""
    t = (text or "none").strip()
    if t.lower() == "none":
        return NetworkSpec()
    kind, _, rest = t.partition(":")
    if kind.strip().lower() == "bandwidth":
        vals = [v for v in rest.split(",") if v.strip()] if rest else []
        try:
            nums = [float(v) for v in vals]
        except ValueError:
            raise ValueError(f"--network-delay {t!r}: bandwidth takes PAYLOAD_MB[,RTT_S] as numbers") from None
        if len(nums) > 2 or not all(np.isfinite(nums)) or (nums and nums[0] <= 0) or (len(nums) == 2 and nums[1] < 0):
            raise ValueError(
                f"--network-delay {t!r}: bandwidth takes PAYLOAD_MB > 0 and RTT_S >= 0 (e.g. bandwidth:0.2,0.02)"
            )
        return NetworkSpec("bandwidth", payload_mb=nums[0] if nums else 0.2, rtt_s=nums[1] if len(nums) > 1 else 0.02)
    try:
        dist = parse_dist(t)
    except ValueError as err:
        raise ValueError(f"--network-delay {t!r}: {err} (or none, or bandwidth[:PAYLOAD_MB[,RTT_S]])") from None
    return NetworkSpec("dist", dist=dist)


def draw_network(spec: NetworkSpec, send_s: np.ndarray, seed: int = 0) -> np.ndarray:
    """Seconds of network time per request sent at wall offsets ``send_s``; zeros for none.
    ``ValueError`` when the spec draws times beyond :data:`MAX_NETWORK_S`."""
    send_s = np.asarray(send_s, dtype=float)
    if spec.kind == "none":
        return np.zeros(send_s.size)
    stream = np.random.SeedSequence(seed).spawn(3)[2]
    if spec.kind == "dist":
        out = spec.dist.sample(np.random.default_rng(stream), send_s.size)
    else:
        seconds = int(np.ceil(send_s.max())) + 1 if send_s.size else 1
        bw = bandwidth_trace(seconds, int(stream.generate_state(1)[0]))
        out = spec.payload_mb / bw[np.clip(send_s.astype(np.int64), 0, seconds - 1)] + spec.rtt_s
    out = np.maximum(out, 0.0)
    if out.size and out.max() > MAX_NETWORK_S:
        raise ValueError(
            f"--network-delay {spec}: draws up to {out.max():.0f} s of network time, more than {MAX_NETWORK_S:.0f} s"
        )
    return out
