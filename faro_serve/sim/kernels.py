"""Numba kernels of the simulator: one model's router and replicas between two instants.

The model is the router of the Faro deployment (paper section 5): one FIFO queue per
model in front of replicas that serve one request at a time; an arrival that finds
``limit`` requests waiting is tail-dropped (HTTP 503), and a fraction ``drop_rate`` of
arrivals is dropped on purpose (the drop rates Faro's penalty objectives set). A request
starts on the replica that frees first; its latency is its wait, its processing time and
the router overhead. A replica takes its next request ``hold`` seconds after it finishes one:
the live front learns that a replica is free from the answer and only then dispatches the
next request, so under a queue each request holds its replica for processing + ``hold``
(8-10 ms on Ray Serve here, idle or loaded; near saturation it decides whether a queue
drains).
Replicas added by the autoscaler appear with ``free_at`` = the end of their cold start, so
nothing is special about them here.

A replica of concurrency ``k`` (ModelSLO.concurrency, Ray's max_ongoing_requests) serves up
to ``k`` requests at once, each for its own drawn processing time: it is ``k`` consecutive
entries (its slots) of ``free_at`` and ``busy_until``, the kernel's servers. A queued
request starts on the slot that frees first, whichever replica it belongs to, as Ray's
router sends it to a replica below its limit; the slots of a replica come and go together
(state.ModelState). This is the rule the planner assumes (docs/concurrency.md), simulated
request by request, so the estimate can be checked against it.

A client may give up: with a finite ``patience`` (the load generator's per-request timeout,
60 s in a replay), a request not answered ``patience`` seconds after it arrived is a failure
(``TIMED_OUT``). With ``cancel`` the server notices: a request still queued then leaves the
queue unserved, and one in service frees its replica (faro-serve's front drops a waiter
whose client left). Without it the server serves the request anyway, for nobody, which is
what plain Ray Serve did live under a backlog (docs/compare.md): a replica at its limit
answered a tenth of what it could in time, its time going to requests already given up.

Requests live in per-model buffers (arrival, processing, overhead and drop draw, all drawn
beforehand from a seeded generator, so a run is deterministic); the kernel fills in start
time, latency and status. Status codes: ``PENDING`` (not arrived yet or queued), ``DONE``,
``DROP_RATE``, ``DROP_TAIL``, ``TIMED_OUT``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .order_stats import percentile_in_place

PENDING = 0
DONE = 1
DROP_RATE = 2
DROP_TAIL = 3
TIMED_OUT = 4

NO_SHAPE = np.arange(2, dtype=np.float64)  # f(b) = b: the default of a kernel that does not batch


@njit(cache=True)
def _argmin(a: np.ndarray) -> int:
    k = 0
    best = a[0]
    for j in range(1, a.shape[0]):
        if a[j] < best:
            best = a[j]
            k = j
    return k


@njit(cache=True)
def advance(
    t0: float,
    t1: float,
    arr: np.ndarray,
    proc: np.ndarray,
    ovh: np.ndarray,
    u: np.ndarray,
    start: np.ndarray,
    lat: np.ndarray,
    status: np.ndarray,
    nxt: int,
    nend: int,
    qbuf: np.ndarray,
    qh: int,
    nq: int,
    free_at: np.ndarray,
    busy_until: np.ndarray,
    drop_rate: float,
    limit: int,
    hold: float = 0.0,
    patience: float = np.inf,
    cancel: bool = True,
    batch: int = 1,
    shape: np.ndarray = NO_SHAPE,
    scale: float = 1.0,
    wait: float = 0.0,
    window: bool = False,
):
    """Simulate ``[t0, t1)``: serve the queue, take the arrivals ``arr[nxt:nend]`` before t1.

    ``qbuf`` is a ring of buffer indices (the FIFO queue) with head ``qh`` and length ``nq``.
    ``free_at`` and ``busy_until`` hold one entry per slot: ``k`` per replica of concurrency
    ``k`` (module docstring), one per replica of the paper's model.
    ``batch`` > 1: a replica that frees takes up to ``batch`` queued requests at once and
    serves them together for the first one's processing time x ``shape[b]`` (the batch
    curve's ``l(b) / l(1)``, faro_serve/batch_curve.py; engine/batched_latency.py's model of a
    batching replica; issues 20, 47). ``wait`` > 0: a batch that is not full starts no
    earlier than ``wait`` after its first request arrived (``@serve.batch``'s
    ``batch_wait_timeout_s``); ``window``: only the requests that arrived within that wait
    join it (Ray's own batching, which closes a batch when its wait ends), else every
    request queued when it starts (a replica that takes its backlog: Faro's gate). The
    area then counts a batch's requests from their start, but a batch that began before
    ``t0`` as one.
    ``scale`` multiplies every processing time (a model variant of another speed, INFaaS).
    Returns ``(nxt, qh, nq, arrivals, dropped, area)`` where ``area`` is the integral over
    the interval of the number of requests in the system (queued + in service), from which
    the driver reports mean ongoing requests.
    """
    cap = qbuf.shape[0]
    n_srv = free_at.shape[0]
    area = 0.0
    for k in range(n_srv):  # requests in service since before t0
        if busy_until[k] > t0:
            area += min(busy_until[k], t1) - t0
    n_arr = 0
    n_drop = 0
    i = nxt
    sel = np.empty(max(batch, 1), dtype=np.int64)
    while True:
        ta = t1
        if i < nend and arr[i] < t1:
            ta = arr[i]
        # Replicas that free up before the next arrival take the queue's head first.
        while nq > 0 and n_srv > 0:
            k = _argmin(free_at)
            f = free_at[k]
            if f > ta or f >= t1:
                break
            if batch > 1:
                if wait > 0.0 and not _batch_ready(
                    f, ta, t1, i < nend and arr[i] < t1, arr, qbuf, qh, nq, batch, wait, window
                ):
                    break  # the batch may still grow: take the next arrival first
                qh, nq, area = _serve_batch(
                    k,
                    f,
                    t0,
                    t1,
                    arr,
                    proc,
                    ovh,
                    start,
                    lat,
                    status,
                    qbuf,
                    qh,
                    nq,
                    free_at,
                    busy_until,
                    hold,
                    patience,
                    cancel,
                    batch,
                    shape,
                    scale,
                    wait,
                    window,
                    sel,
                    area,
                )
                continue
            j = qbuf[qh]
            qh = (qh + 1) % cap
            nq -= 1
            s = max(f, arr[j])
            if cancel and s - arr[j] > patience:  # its client gave up while it waited
                status[j] = TIMED_OUT
                lat[j] = np.inf
                area += max(0.0, min(arr[j] + patience, t1) - max(arr[j], t0))
                continue
            start[j] = s
            lat[j] = s - arr[j] + proc[j] * scale + ovh[j]
            end = s + proc[j] * scale
            status[j] = DONE
            if lat[j] > patience:  # answered too late: a failure, cancelled if the server notices
                status[j] = TIMED_OUT
                lat[j] = np.inf
                if cancel:
                    end = max(s, arr[j] + patience)
            busy_until[k] = end
            free_at[k] = end + hold
            area += (s - max(arr[j], t0)) + (min(end, t1) - s)
        if ta >= t1:
            break
        n_arr += 1
        if u[i] < drop_rate:
            status[i] = DROP_RATE
            lat[i] = np.inf
            n_drop += 1
        else:
            k = -1
            if nq == 0 and n_srv > 0 and not (batch > 1 and wait > 0.0):  # a batch waits
                k = _argmin(free_at)
                if free_at[k] > ta:
                    k = -1
            if k >= 0:
                start[i] = ta
                lat[i] = proc[i] * scale + ovh[i]
                end = ta + proc[i] * scale
                status[i] = DONE
                if lat[i] > patience:
                    status[i] = TIMED_OUT
                    lat[i] = np.inf
                    if cancel:
                        end = ta + patience
                busy_until[k] = end
                free_at[k] = end + hold
                area += min(end, t1) - ta
            elif nq >= limit:
                status[i] = DROP_TAIL
                lat[i] = np.inf
                n_drop += 1
            else:
                qbuf[(qh + nq) % cap] = i
                nq += 1
        i += 1
    for m in range(nq):  # still waiting at t1 (or gone: the client gave up)
        j = qbuf[(qh + m) % cap]
        gone = arr[j] + patience if cancel else np.inf
        area += max(0.0, min(t1, gone) - max(arr[j], t0))
    return i, qh, nq, n_arr, n_drop, area


@njit(cache=True)
def _batch_ready(f, ta, t1, arrival_next, arr, qbuf, qh, nq, batch, wait, window):
    """Whether a replica free at ``f`` starts its batch before the next arrival (at ``ta``;
    ``arrival_next``: one comes before ``t1``): it is full, or nothing more can join before
    it starts (its wait ends first)."""
    cap = qbuf.shape[0]
    e = arr[qbuf[qh]] + wait  # the head's wait ends
    n = 0
    for m in range(nq):
        if window and arr[qbuf[(qh + m) % cap]] > e:
            break
        n += 1
        if n >= batch:
            return True
    s = max(f, e)
    if s >= t1 and not arrival_next:
        return False  # it starts after this interval: arrivals not yet known may join
    if not arrival_next:
        return True
    return ta > (e if window else s)


@njit(cache=True)
def _serve_batch(
    k,
    f,
    t0,
    t1,
    arr,
    proc,
    ovh,
    start,
    lat,
    status,
    qbuf,
    qh,
    nq,
    free_at,
    busy_until,
    hold,
    patience,
    cancel,
    batch,
    shape,
    scale,
    wait,
    window,
    sel,
    area,
):
    """Replica ``k``, free at ``f``, takes up to ``batch`` requests from the queue's head
    (those whose clients gave up are dropped on the way, as one at a time; with ``window``
    only those within ``wait`` of the first) and serves them in the first one's processing
    time x ``shape[b]``, from ``f``, or a batch that is not full from the end of its wait.
    Returns ``(qh, nq, area)``."""
    cap = qbuf.shape[0]
    b = 0
    s = f
    e = np.inf
    while b < batch and nq > 0:
        j = qbuf[qh]
        if b > 0 and window and arr[j] > e:
            break
        qh = (qh + 1) % cap
        nq -= 1
        if cancel and max(f, arr[j]) - arr[j] > patience:
            status[j] = TIMED_OUT
            lat[j] = np.inf
            area += max(0.0, min(arr[j] + patience, t1) - max(arr[j], t0))
            continue
        if b == 0:
            e = arr[j] + wait
        sel[b] = j
        b += 1
        if arr[j] > s:
            s = arr[j]
    if b == 0:
        return qh, nq, area
    if b < batch and wait > 0.0 and e > s:
        s = e  # not full: it waited for more
    service = proc[sel[0]] * scale * shape[b]
    end = s + service
    for m in range(b):
        j = sel[m]
        start[j] = s
        lat[j] = s - arr[j] + service + ovh[j]
        status[j] = DONE
        if lat[j] > patience:  # answered too late: a failure (the batch runs on for the rest)
            status[j] = TIMED_OUT
            lat[j] = np.inf
        area += (s - max(arr[j], t0)) + (min(end, t1) - s)
    busy_until[k] = end
    free_at[k] = end + hold
    return qh, nq, area


@njit(cache=True)
def lookback(
    arr: np.ndarray,
    lat: np.ndarray,
    proc: np.ndarray,
    status: np.ndarray,
    lo: int,
    hi: int,
    t_lo: float,
    t_hi: float,
    q: float,
):
    """Over requests ``lo..hi-1`` completed in ``(t_lo, t_hi]``: the ``q`` percentile of their
    latency, their mean processing time and their number (what the router front reports
    for its look-back window). Percentile and mean are NaN when there are none."""
    buf = np.empty(max(hi - lo, 0))
    n = 0
    psum = 0.0
    finite = True
    for j in range(lo, hi):
        if status[j] == DONE:
            c = arr[j] + lat[j]
            if c > t_lo and c <= t_hi:
                buf[n] = lat[j]
                finite = finite and np.isfinite(lat[j])
                psum += proc[j]
                n += 1
    if n == 0:
        return np.nan, np.nan, 0
    if finite and 0.0 < q < 100.0:  # the usual case, without np.percentile's copies
        return percentile_in_place(buf, n, q), psum / n, n
    return np.percentile(buf[:n], q), psum / n, n
