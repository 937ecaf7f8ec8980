"""One simulated model: its request buffer, its router queue and its replicas (paper 6.4).

The buffer holds the requests of the minutes still in flight: new minutes are appended
when they start; a prefix is dropped once every request in it is settled (served or
dropped), has been handed to the metrics, and is older than the latency look-back.

Replicas are three small arrays: ``ready_at`` (end of the cold start), ``busy_until``
(end of the request in service) and ``free_at`` = max of the two, the one the kernel reads.
A replica of concurrency ``k`` has one ``ready_at`` and ``k`` slots in the other two
(kernels.py), which it gains and loses together.
Scaling down removes replicas still starting first (the latest first), then idle ones,
then busy ones (the soonest done with all of its requests first); a busy replica's
requests finish (their completions are already recorded), and the replica holds no
capacity after the decision (an approximation of under a second).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .kernels import DONE, NO_SHAPE, PENDING, advance, lookback


def _shape(shape) -> np.ndarray:
    """A batch curve's shape for the kernel (``f(b) = b`` for a model that does not batch)."""
    return NO_SHAPE if shape is None else np.ascontiguousarray(shape, dtype=np.float64)


class ModelState:
    def __init__(
        self,
        name: str,
        index: int,
        queue_limit: int,
        look_back_ticks: int,
        hold_s: float = 0.0,
        patience_s: float = float("inf"),
        cancel: bool = True,
        batch_shape: np.ndarray | None = None,
        per_replica: int = 0,
        max_replicas: int = 1,
        concurrency: int = 1,
        batch_wait_s: float = 0.0,
        batch_window: bool = False,
    ):
        self.name = name
        if concurrency > 1 and batch_shape is not None:
            raise ValueError("a replica that batches serves one batch at a time (concurrency 1)")
        self.k = int(concurrency)  # slots per replica: requests it serves at once
        # replicas that batch (kernels.advance): the largest batch in force (a decision sets
        # it), the batch curve's shape f(b) (one request's time x f(b) per batch), how long
        # a batch that is not full waits, and whether it closes when the wait ends (Ray's
        # own @serve.batch) or takes what is queued when it starts (Faro's gate)
        self.batch = 1
        self.batch_shape = _shape(batch_shape)
        self.batch_wait = float(batch_wait_s)
        self.batch_window = bool(batch_window)
        # a model with variants (INFaaS): the variant in force scales every processing time;
        # a switch to another variant waits for its loading latency (``pending``)
        self.scale = 1.0
        self.pending: tuple[float, float, np.ndarray] | None = None  # (from when, scale, batch shape)
        self.hold = float(hold_s)  # replica busy after each request (kernels.advance)
        self.patience = float(patience_s)  # the client's timeout (kernels.advance)
        self.cancel = bool(cancel)  # the server drops what its client gave up on
        self.index = index
        self.limit = int(queue_limit)
        # each serving replica holds this many more waiting requests (Ray's
        # max_ongoing_requests - 1): the ring fits them for every replica the cluster holds
        self.per_replica = int(per_replica)
        self.qbuf = np.zeros(max(self.limit + self.per_replica * max_replicas, 1), dtype=np.int64)
        self.qh = 0
        self.nq = 0
        self.base = 0  # global index of buffer position 0
        self.arr = np.empty(0)
        self.proc = np.empty(0)
        self.ovh = np.empty(0)
        self.u = np.empty(0)
        self.start = np.empty(0)
        self.lat = np.empty(0)
        self.status = np.empty(0, dtype=np.int8)
        self.nxt = 0  # buffer position of the first request not yet arrived
        self.flushed = 0  # global index: requests before it went to the metrics
        self.minutes_loaded = 0
        self.ready_at = np.zeros(1)
        self.busy_until = np.full(self.k, -np.inf)
        self.free_at = np.zeros(self.k)
        # caches of the replica arrays, kept by scale_to and run (both run per model per tick):
        # when the last replica is ready (from then on every replica serves) and the end of the
        # last request in service (None: not known since the kernel last started requests)
        self.all_ready_at = 0.0
        self.busy_end: float | None = -np.inf
        self.drop_rate = 0.0
        # global index of the queue head at each of the last ticks (look-back range)
        self.heads: deque[int] = deque([0], maxlen=look_back_ticks + 2)
        self.tick_arrivals = 0
        self.tick_dropped = 0
        self.tick_area = 0.0

    # -- replicas ----------------------------------------------------------------------
    @property
    def target(self) -> int:
        return int(self.ready_at.size)

    def serving(self, now: float) -> int:
        if now >= self.all_ready_at:  # every replica is past its cold start
            return int(self.ready_at.size)
        return int(np.count_nonzero(self.ready_at <= now))

    def scale_to(self, n: int, now: float, cold_start_s: float) -> None:
        cur = self.target
        if n > cur:
            add = n - cur
            ready = np.full(add, now + cold_start_s)
            self.ready_at = np.concatenate([self.ready_at, ready])
            self.busy_until = np.concatenate([self.busy_until, np.full(add * self.k, -np.inf)])
            self.free_at = np.concatenate([self.free_at, np.repeat(ready, self.k)])
        elif n < cur:
            starting = self.ready_at > now
            done = self.busy_until.reshape(cur, self.k).max(axis=1)  # its last request's end
            idle = ~starting & (done <= now)
            # removal order: starting (latest ready first), idle, busy (soonest done first)
            key = np.where(starting, 0, np.where(idle, 1, 2)).astype(float)
            sub = np.where(starting, -self.ready_at, np.where(idle, 0.0, done))
            order = np.lexsort((sub, key))
            keep = np.sort(order[cur - n :])
            slots = (keep[:, None] * self.k + np.arange(self.k)).ravel()
            self.ready_at = self.ready_at[keep]
            self.busy_until = self.busy_until[slots]
            self.free_at = self.free_at[slots]
        self.all_ready_at = float(self.ready_at.max()) if self.ready_at.size else -np.inf
        self.busy_end = None

    def switch_variant(self, now: float, scale: float, shape: np.ndarray | None, load_s: float) -> None:
        """Serve another variant (its processing time ``scale`` x the drawn one, its batch
        curve's ``shape``) from ``now + load_s``; the one in force serves until then."""
        if load_s <= 0:
            self.scale, self.batch_shape, self.pending = scale, _shape(shape), None
        else:
            self.pending = (now + load_s, scale, _shape(shape))

    def loaded(self, now: float) -> None:
        """A pending variant whose loading is over takes over."""
        if self.pending is not None and now >= self.pending[0]:
            _, self.scale, self.batch_shape = self.pending
            self.pending = None

    # -- requests ----------------------------------------------------------------------
    def append(self, arrival, proc, overhead, u) -> None:
        """Add the requests of the next minute (already sorted by arrival)."""
        self.extend(arrival, proc, overhead, u)
        self.minutes_loaded += 1

    def extend(self, arrival, proc, overhead, u) -> None:
        """Add requests, pending, after those held (sorted by arrival, none before them)."""
        n = arrival.size
        self.arr = np.concatenate([self.arr, arrival])
        self.proc = np.concatenate([self.proc, proc])
        self.ovh = np.concatenate([self.ovh, overhead])
        self.u = np.concatenate([self.u, u])
        self.start = np.concatenate([self.start, np.full(n, np.nan)])
        self.lat = np.concatenate([self.lat, np.full(n, np.nan)])
        self.status = np.concatenate([self.status, np.full(n, PENDING, dtype=np.int8)])

    def head(self) -> int:
        """Global index of the first request not settled yet (queued or not arrived)."""
        pos = self.qbuf[self.qh] if self.nq > 0 else self.nxt
        return self.base + int(pos)

    def run(self, t0: float, t1: float) -> None:
        if self.nq == 0 and (self.nxt >= self.arr.size or self.arr[self.nxt] >= t1):
            # nothing waits and nothing arrives before t1: the kernel would only add the time
            # the requests in service still take, which is none once the last has ended
            if self.busy_end is None:
                self.busy_end = float(self.busy_until.max()) if self.busy_until.size else -np.inf
            if self.busy_end <= t0:
                return
        self.busy_end = None  # the kernel may start requests
        self._kernel(t0, t1)

    def _kernel(self, t0: float, t1: float) -> None:
        """The queue and replicas over ``[t0, t1)`` (kernels.advance)."""
        # the waiting room at t0: the router's limit plus what the serving replicas hold
        limit = self.limit + self.per_replica * self.serving(t0) if self.per_replica else self.limit
        out = advance(
            t0,
            t1,
            self.arr,
            self.proc,
            self.ovh,
            self.u,
            self.start,
            self.lat,
            self.status,
            self.nxt,
            self.arr.size,
            self.qbuf,
            self.qh,
            self.nq,
            self.free_at,
            self.busy_until,
            self.drop_rate,
            min(limit, self.qbuf.size),
            self.hold,
            self.patience,
            self.cancel,
            self.batch,
            self.batch_shape,
            self.scale,
            self.batch_wait,
            self.batch_window,
        )
        self.nxt, self.qh, self.nq, n_arr, n_drop, area = out
        self.tick_arrivals += n_arr
        self.tick_dropped += n_drop
        self.tick_area += area

    def queued_ages(self, now: float) -> np.ndarray:
        """How long each request waiting in the queue has waited, oldest first (s)."""
        idx = (self.qh + np.arange(self.nq)) % self.qbuf.size
        return now - self.arr[self.qbuf[idx]]

    def observe(self, now: float, look_back_s: float, percentile: float):
        """(latency s, mean processing s, completed) over ``(now - look_back_s, now]``."""
        lo = max(self.heads[0] - self.base, 0)
        hi = self.nxt
        lat, proc, n = lookback(self.arr, self.lat, self.proc, self.status, lo, hi, now - look_back_s, now, percentile)
        return lat, proc * self.scale, n  # the variant in force

    def end_tick(self) -> tuple[int, int, float]:
        self.heads.append(self.head())
        out = (self.tick_arrivals, self.tick_dropped, self.tick_area)
        self.tick_arrivals = self.tick_dropped = 0
        self.tick_area = 0.0
        return out

    def settled_until_minute(self) -> int:
        """Minutes (from the start) all of whose requests are settled."""
        h = self.head() - self.base
        if h < self.arr.size:
            return int(self.arr[h] // 60.0)
        return self.minutes_loaded

    def take_settled(self, upto_minute: int):
        """Requests not yet reported whose arrival minute is below ``upto_minute``:
        (arrival, latency, dropped), then trims the buffer."""
        lo = self.flushed - self.base
        hi = int(np.searchsorted(self.arr, upto_minute * 60.0, side="left"))
        hi = max(hi, lo)
        arr = self.arr[lo:hi]
        lat = self.lat[lo:hi]
        dropped = self.status[lo:hi] != DONE
        self.flushed = self.base + hi
        self._trim(min(self.flushed, self.heads[0], self.head()))
        return arr, lat, dropped

    def _trim(self, keep_from_global: int) -> None:
        cut = keep_from_global - self.base
        if cut <= 0:
            return
        for name in ("arr", "proc", "ovh", "u", "start", "lat", "status"):
            setattr(self, name, getattr(self, name)[cut:])
        self.nxt -= cut
        for m in range(self.nq):
            self.qbuf[(self.qh + m) % self.qbuf.size] -= cut
        self.base += cut
