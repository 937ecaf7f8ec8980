"""Order statistics for the simulator's kernels, without the copies ``np.percentile`` makes.

``lookback`` (kernels.py) reports a model's SLO-percentile latency at every tick, for every
model: numba's ``np.percentile`` copies, masks and flattens its input first, which costs
more than the selection itself on the few dozen latencies of a look-back window.
:func:`percentile_in_place` gives the very same float (the same two order statistics, the
same interpolation), selecting in the caller's scratch buffer.

(Numba caches a kernel by its own file: after editing this module, clear the
``__pycache__`` numba files of kernels.py, or touch it, so that its kernels recompile.)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def percentile_in_place(a: np.ndarray, n: int, q: float) -> float:
    """``np.percentile(a[:n], q)`` as numba computes it (linear interpolation between the
    two closest ranks), for finite values and ``0 < q < 100``; reorders ``a[:n]``."""
    if n == 1:
        return a[0]
    rank = 1 + (n - 1) * np.true_divide(q, 100.0)
    f = math.floor(rank)
    m = rank - f
    k = int(f - 1)
    lower = _select(a, k, n)
    upper = a[k + 1]  # the next order statistic: the least of those after k
    for j in range(k + 2, n):
        if a[j] < upper:
            upper = a[j]
    return lower * (1 - m) + upper * m


@njit(cache=True)
def _select(a: np.ndarray, k: int, n: int) -> float:
    """The ``k``-th smallest of ``a[:n]`` (from 0), partitioning ``a`` in place so that
    nothing before ``k`` is larger and nothing after it smaller (quickselect)."""
    low, high = 0, n - 1
    while low < high:
        mid = (low + high) >> 1  # median of three as pivot, moved to the end
        if a[mid] < a[low]:
            a[low], a[mid] = a[mid], a[low]
        if a[high] < a[mid]:
            a[high], a[mid] = a[mid], a[high]
        if a[mid] < a[low]:
            a[low], a[mid] = a[mid], a[low]
        pivot = a[mid]
        a[high], a[mid] = a[mid], a[high]
        i, j = low, high - 1
        while True:
            while i < high and a[i] < pivot:
                i += 1
            while j >= low and pivot < a[j]:
                j -= 1
            if i >= j:
                break
            a[i], a[j] = a[j], a[i]
            i += 1
            j -= 1
        a[i], a[high] = a[high], a[i]  # the pivot at its rank i
        if i == k:
            break
        if i < k:
            low = i + 1
        else:
            high = i - 1
    return a[k]
