"""Requests of a simulated run, drawn minute by minute from a seeded generator (paper 6, 6.4).

One trace point is one minute. The number of arrivals of a job in a minute is Poisson with
the trace count as its mean, and the arrival instants are uniform in the minute (a Poisson
process at that minute's rate, as the paper's load generator). All per-minute counts are
drawn up front (the oracle and the arrival history need them); the requests themselves,
with their processing time, router overhead and drop draw, are drawn when their minute
starts, so memory stays proportional to the minutes in flight, not to the run.

Two child streams of one ``SeedSequence`` keep counts and per-request draws apart, so the
same seed gives every policy the very same requests (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..distributions import TimeDist


@dataclass
class MinuteBatch:
    """The requests of one minute for every job, concatenated job after job."""

    counts: np.ndarray  # (jobs,) requests per job
    arrival: np.ndarray  # seconds since the start of the run, sorted within each job
    proc: np.ndarray  # processing time, s
    overhead: np.ndarray  # router overhead, s
    u: np.ndarray  # uniform draw compared with the drop rate in force

    def job_slices(self) -> list[slice]:
        ends = np.cumsum(self.counts)
        return [slice(int(e - c), int(e)) for c, e in zip(self.counts, ends)]


def draw_counts(expected_counts: np.ndarray, seed: int = 0):
    """Per-minute arrival counts, Poisson with the trace count as mean, drawn from the first
    child stream of ``SeedSequence(seed)``; returns them and the second child stream for the
    per-request draws. The simulator and the live replay (``faro_serve.replay``) both draw
    their counts here, so one seed gives both the very same per-minute load."""
    lam = np.asarray(expected_counts, dtype=float)
    if lam.ndim != 2:
        raise ValueError("expected counts must be a (jobs, minutes) array")
    if not np.all(np.isfinite(lam)) or (lam < 0).any():
        raise ValueError("trace counts must be finite and >= 0")
    count_ss, request_ss = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(count_ss).poisson(lam).astype(np.int64), request_ss


class Workload:
    """Realised per-minute counts of a trace and the generator of each minute's requests."""

    def __init__(
        self,
        expected_counts: np.ndarray,
        processing: TimeDist | list[TimeDist],
        overhead: TimeDist,
        seed: int = 0,
        draw: int = 0,
    ):
        """``draw`` > 0: the same per-minute counts with another draw of each request's
        arrival offset, processing time and overhead (a sibling of draw 0's stream), for a
        simulator's expected value over the per-request randomness at one realised load."""
        if draw < 0:
            raise ValueError(f"draw must be >= 0 (got {draw})")
        self.counts, req_ss = draw_counts(expected_counts, seed)
        if draw:
            req_ss = np.random.SeedSequence(req_ss.entropy, spawn_key=req_ss.spawn_key + (draw,))
        self.rng = np.random.default_rng(req_ss)
        n_jobs = self.counts.shape[0]
        self.processing = processing if isinstance(processing, list) else [processing] * n_jobs
        if len(self.processing) != n_jobs:
            raise ValueError(f"{len(self.processing)} processing distributions for {n_jobs} jobs")
        self.overhead = overhead

    @property
    def jobs(self) -> int:
        return int(self.counts.shape[0])

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    def minute(self, m: int) -> MinuteBatch:
        """Draw the requests of minute ``m`` (call in increasing ``m`` for reproducibility)."""
        counts = self.counts[:, m]
        n = int(counts.sum())
        rng = self.rng
        job = np.repeat(np.arange(self.jobs), counts)
        # One float sort keyed by job * 60 + offset sorts within jobs and keeps jobs in order;
        # the clip keeps rounding from pushing an arrival onto the next minute's boundary.
        offset = np.sort(job * 60.0 + rng.uniform(0.0, 60.0, n)) - job * 60.0
        offset = np.clip(offset, 0.0, np.nextafter(60.0, 0.0))
        arrival = 60.0 * m + offset
        if len({id(d) for d in self.processing}) == 1:
            proc = self.processing[0].sample(rng, n)
        else:
            proc = np.empty(n)
            ends = np.cumsum(counts)
            for j, d in enumerate(self.processing):
                proc[ends[j] - counts[j] : ends[j]] = d.sample(rng, int(counts[j]))
        overhead = self.overhead.sample(rng, n)
        u = rng.uniform(0.0, 1.0, n)
        return MinuteBatch(counts, arrival, proc, overhead, u)
