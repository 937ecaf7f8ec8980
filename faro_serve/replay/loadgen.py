"""The replay's request schedule: open-loop Poisson arrivals from per-minute counts (paper 6).

The paper's load generator replays a trace as a Poisson process: one trace point is one
minute, and the requests of that minute arrive at random instants at the minute's rate.
:func:`build_schedule` draws them exactly as the matched simulator does
(``faro_serve/sim/workload.py``), so a live run and a simulated run of the same trace slice
and seed see statistically the same load:

* the minute's count is Poisson with mean ``rate_scale x trace count``;
* its arrival instants are uniform in the minute;
* counts come from the simulator's own ``draw_counts`` (first child stream of
  ``SeedSequence(seed)``), the instants from its second stream, so a seed fixes the whole
  schedule and a live and a simulated run of one seed get the same per-minute counts.

Time compression (``time_scale``): a trace minute lasts ``60 x time_scale`` wall seconds, so
the request at trace second ``t`` is sent at wall offset ``t x time_scale``, and the wall
request rate is the trace's divided by ``time_scale`` (0.25: four times the rate; combine
with ``rate_scale`` to keep it the same, e.g. 0.25 and 0.25). Metrics keep
the *trace* time as the arrival time (a trace minute stays one metric minute) and the real
measured latency. This module is pure (numpy only): it never touches the network.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from ..sim.workload import draw_counts
from ..traces import Trace, TraceError
from .network import NetworkSpec, draw_network


@dataclass
class Schedule:
    """Every request of a replay, sorted by send time."""

    names: list[str]  # served model per trace job (after --map), in trace job order
    jobs: list[str]  # trace jobs
    model: np.ndarray  # int64 index into ``names`` per request
    trace_s: np.ndarray  # arrival instant in trace seconds (the metric's arrival time)
    send_s: np.ndarray  # wall offset from the start of the replay: trace_s * time_scale
    counts: np.ndarray  # (jobs, minutes) realised counts
    time_scale: float
    rate_scale: float
    seed: int
    network: str = "none"  # the --network-delay spec (replay/network.py)
    network_s: np.ndarray | None = field(default=None)  # network time per request, s (None: zeros)

    def __post_init__(self) -> None:
        if self.network_s is None:
            self.network_s = np.zeros(self.model.size)

    @property
    def size(self) -> int:
        return int(self.model.size)

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    @property
    def duration_s(self) -> float:
        """Wall seconds the sending takes: every trace minute lasts ``60 x time_scale``."""
        return 60.0 * self.minutes * self.time_scale


def parse_map(spec: str | None) -> dict[str, str]:
    """``"job0=synth-a,job1=synth-b"`` -> ``{"job0": "synth-a", "job1": "synth-b"}``."""
    if not spec:
        return {}
    out: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        job, sep, model = part.partition("=")
        job, model = job.strip(), model.strip()
        if not sep or not job or not model:
            raise ValueError(f"--map takes JOB=MODEL pairs separated by commas (got {part.strip()!r})")
        if job in out:
            raise ValueError(f"--map names job {job!r} twice")
        out[job] = model
    if len(set(out.values())) != len(out):
        raise ValueError("--map sends two jobs to the same model; give each job its own model")
    return out


def check_url(url: str, allow_remote: bool = False) -> str:
    """The base URL without a trailing slash; refuses non-loopback hosts unless allowed.

    A load generator aimed at the wrong address is a denial of service, so only loopback
    (127.0.0.0/8, ::1, localhost) is accepted by default.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url must look like http://127.0.0.1:8000 (got {url!r})")
    host = parts.hostname
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback and not allow_remote:
        raise ValueError(
            f"refusing to send load to {host}: not a loopback address "
            f"(pass --allow-remote to replay against another machine)"
        )
    return url.rstrip("/")


def select_trace(
    trace: Trace, jobs: list[str] | None, mapping: dict[str, str], start: int = 0, minutes: int | None = None
) -> tuple[Trace, list[str]]:
    """The jobs and minutes to replay, and the model each job goes to (default: its name)."""
    if jobs is None and mapping:
        jobs = list(mapping)
    if jobs is not None:
        if not jobs:
            raise TraceError("--jobs names no job")
        trace = trace.select(jobs)
    unknown = [j for j in mapping if j not in trace.names]
    if unknown:
        raise TraceError(f"--map names job(s) not replayed: {', '.join(unknown)} (replaying {', '.join(trace.names)})")
    if start < 0:
        raise TraceError(f"--start must be >= 0 (got {start})")
    if start >= trace.minutes:
        raise TraceError(f"--start {start} is beyond the trace's {trace.minutes} minutes")
    if minutes is not None:
        if minutes < 1:
            raise TraceError(f"--minutes must be >= 1 (got {minutes})")
        if start + minutes > trace.minutes:
            raise TraceError(f"--start {start} + --minutes {minutes} is beyond the trace's {trace.minutes} minutes")
    trace = trace.window(start, None if minutes is None else start + minutes)
    names = [mapping.get(j, j) for j in trace.names]
    if len(set(names)) != len(names):
        raise TraceError(f"two jobs would go to the same model: {names}")
    return trace, names


def build_schedule(
    trace: Trace,
    names: list[str] | None = None,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    seed: int = 0,
    max_requests: int | None = None,
    network: NetworkSpec | None = None,
) -> Schedule:
    """Draw the open-loop schedule of ``trace`` (see the module docstring); with ``network``,
    each request's network time (replay/network.py: its own stream, the rest unchanged).

    Raises ``ValueError`` for a non-positive time scale, a negative rate scale, or a schedule
    larger than ``max_requests`` (the replay refuses rather than silently truncating load).
    """
    if not (np.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"--time-scale must be > 0 (got {time_scale:g})")
    if not (np.isfinite(rate_scale) and rate_scale >= 0):
        raise ValueError(f"--rate-scale must be >= 0 (got {rate_scale:g})")
    lam = np.asarray(trace.counts, dtype=float) * rate_scale
    if lam.ndim != 2 or lam.shape[1] == 0:
        raise TraceError("the trace slice has no minutes")
    names = list(names or trace.names)
    counts, time_ss = draw_counts(lam, seed)  # the simulator's own draw
    total = int(counts.sum())
    if max_requests is not None and total > max_requests:
        raise ValueError(
            f"the replay would send {total:,} requests, above --max-requests "
            f"{max_requests:,}; lower --rate-scale or --minutes, or raise the cap"
        )
    rng = np.random.default_rng(time_ss)
    n_jobs, n_min = counts.shape
    flat = counts.T.ravel()  # minute-major: minute 0 of every job, then minute 1, ...
    job = np.tile(np.arange(n_jobs), n_min).repeat(flat)
    minute = np.repeat(np.arange(n_min), n_jobs).repeat(flat)
    offset = np.clip(rng.uniform(0.0, 60.0, total), 0.0, np.nextafter(60.0, 0.0))
    trace_s = 60.0 * minute + offset
    order = np.argsort(trace_s, kind="stable")
    trace_s = trace_s[order]
    send_s = trace_s * time_scale
    network = network or NetworkSpec()
    return Schedule(
        names=names,
        jobs=list(trace.names),
        model=job[order].astype(np.int64),
        trace_s=trace_s,
        send_s=send_s,
        counts=counts,
        time_scale=float(time_scale),
        rate_scale=float(rate_scale),
        seed=int(seed),
        network=str(network),
        network_s=draw_network(network, send_s, seed),
    )
