"""Numba kernel of batched service: one model's EDF queue and replicas that serve batches
(Sponge, EuroMLSys '24, section 3; issue 20).

The counterpart of :func:`faro_serve.sim.kernels.advance` for a model whose replicas batch:

* every request carries a deadline (its arrival plus its remaining budget: the SLO minus the
  network time it already spent); the queue is earliest-deadline-first (a binary heap), so
  with equal budgets it is first come, first served;
* a replica that frees takes up to ``batch`` queued requests at once (dynamic batching: it
  does not wait for a batch to fill) and serves them together for
  ``l(b, c) = gamma b / c + eps / c + delta b + eta`` seconds on its ``cores``, times the
  batch's noise factor (the first request's ``jitter``, mean 1);
* an arrival that finds ``limit`` requests waiting is tail-dropped; a request whose deadline
  passed is still served (its latency counts against the SLO, as in the paper's metric).

A request's latency is its network time, its wait, its batch's service and the overhead.
Status codes are the unbatched kernel's (``PENDING``, ``DONE``, ``DROP_TAIL``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import DONE, DROP_TAIL, _argmin


@njit(cache=True)
def heap_push(key: np.ndarray, idx: np.ndarray, n: int, k: float, i: int) -> int:
    """Push (deadline ``k``, request ``i``) on the min-heap of size ``n``; ties by request
    index (arrival order). Returns the new size."""
    pos = n
    key[pos] = k
    idx[pos] = i
    while pos > 0:
        parent = (pos - 1) // 2
        if key[parent] < key[pos] or (key[parent] == key[pos] and idx[parent] <= idx[pos]):
            break
        key[parent], key[pos] = key[pos], key[parent]
        idx[parent], idx[pos] = idx[pos], idx[parent]
        pos = parent
    return n + 1


@njit(cache=True)
def heap_pop(key: np.ndarray, idx: np.ndarray, n: int):
    """Pop the earliest deadline: ``(request, new size)``."""
    top = idx[0]
    n -= 1
    key[0] = key[n]
    idx[0] = idx[n]
    pos = 0
    while True:
        left = 2 * pos + 1
        if left >= n:
            break
        child = left
        right = left + 1
        if right < n and (key[right] < key[left] or (key[right] == key[left] and idx[right] < idx[left])):
            child = right
        if key[pos] < key[child] or (key[pos] == key[child] and idx[pos] <= idx[child]):
            break
        key[child], key[pos] = key[pos], key[child]
        idx[child], idx[pos] = idx[pos], idx[child]
        pos = child
    return top, n


@njit(cache=True)
def batch_latency(b: int, cores: float, prof: np.ndarray) -> float:
    """Sponge's l(b, c) with ``prof = (gamma, eps, delta, eta)``."""
    return prof[0] * b / cores + prof[1] / cores + prof[2] * b + prof[3]


@njit(cache=True)
def advance_batched(
    t0: float,
    t1: float,
    arr: np.ndarray,
    deadline: np.ndarray,
    net: np.ndarray,
    jitter: np.ndarray,
    ovh: np.ndarray,
    start: np.ndarray,
    lat: np.ndarray,
    status: np.ndarray,
    nxt: int,
    nend: int,
    hkey: np.ndarray,
    hidx: np.ndarray,
    nq: int,
    free_at: np.ndarray,
    batch: int,
    cores: float,
    prof: np.ndarray,
    limit: int,
):
    """Simulate ``[t0, t1)`` for a batching model: serve the EDF queue in batches of up to
    ``batch`` on replicas of ``cores``, take the arrivals ``arr[nxt:nend]`` before ``t1``.
    Returns ``(nxt, nq, arrivals, dropped, served_batches)``."""
    n_srv = free_at.shape[0]
    n_arr = 0
    n_drop = 0
    n_batches = 0
    i = nxt
    sel = np.empty(max(batch, 1), dtype=np.int64)
    while True:
        ta = t1
        if i < nend and arr[i] < t1:
            ta = arr[i]
        # replicas that free before the next arrival take a batch from the queue's head
        while nq > 0 and n_srv > 0:
            k = _argmin(free_at)
            f = free_at[k]
            if f > ta or f >= t1:
                break
            b = 0
            while b < batch and nq > 0:
                j, nq = heap_pop(hkey, hidx, nq)
                sel[b] = j
                b += 1
            s = f
            for m in range(b):
                if arr[sel[m]] > s:
                    s = arr[sel[m]]
            service = batch_latency(b, cores, prof) * jitter[sel[0]]
            for m in range(b):
                j = sel[m]
                start[j] = s
                lat[j] = net[j] + (s - arr[j]) + service + ovh[j]
                status[j] = DONE
            free_at[k] = s + service
            n_batches += 1
        if ta >= t1:
            break
        n_arr += 1
        if nq >= limit:
            status[i] = DROP_TAIL
            lat[i] = np.inf
            n_drop += 1
        else:
            nq = heap_push(hkey, hidx, nq, deadline[i], i)
        i += 1
    return i, nq, n_arr, n_drop, n_batches
