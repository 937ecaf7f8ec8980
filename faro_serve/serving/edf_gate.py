"""A batching replica's own queue: earliest deadline first, one batch let through at a time
(issues 20 and 47: Sponge's EDF queue and dynamic batches, live; a user's ``@serve.batch``).

Why it exists: Ray Serve's ``serve.batch`` forms a batch the moment its first request comes
(from whatever is queued then, after ``batch_wait_timeout_s``) and only afterwards waits
for the batch before it to finish. Under a steady stream the requests arrive one by one
while a batch runs, so each forms a batch of one (or of what came within the wait) that
queues behind the running one: measured on the live Sponge test, 10 requests held at a
replica with batch 8 in force were served one at a time. Dynamic batching, as the
simulator and the planner model it (``faro_serve/sim/kernels.py``), takes what is queued
*when the replica frees*.

:class:`EDFGate` holds the replica's requests while ``concurrent`` batches run (Ray's
``max_concurrent_batches``, 1 by default), then lets through up to the batch size in force,
earliest deadline first, all in one step, so ``serve.batch`` (which still runs the batch,
with no wait of its own) finds them queued together. ``wait_s``: a replica with no batch
running lets a batch that is not full through only once its first request has waited that
long (the batch wait of the model's SLO; 0: at once). The deadline orders the queue: on
faro-serve's own path the instant the request left its client (its arrival minus the network
time its client declared, ``x-faro-network-ms``), for a user's deployment its arrival.
Pure asyncio: no Ray.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time


class _Batch:
    """Requests let through together and not yet done."""

    __slots__ = ("left",)

    def __init__(self, n: int):
        self.left = n


class EDFGate:
    """``async with gate.slot(deadline):`` around one request's share of a batch."""

    def __init__(self, batch_size: int = 1, concurrent: int = 1, wait_s: float = 0.0):
        self.batch_size = max(1, int(batch_size))
        self.concurrent = max(1, int(concurrent))
        self.wait_s = max(0.0, float(wait_s))
        self._heap: list[tuple[float, int, float, asyncio.Future]] = []
        self._seq = itertools.count()
        self._running = 0  # batches let through and not yet done
        self._timer: asyncio.TimerHandle | None = None
        self.batches: list[int] = []  # sizes let through (the last 1000): what the tests check

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._heap if not f.done())

    def slot(self, deadline: float) -> "_Slot":
        return _Slot(self, deadline)

    async def _enter(self, deadline: float) -> _Batch:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (float(deadline), next(self._seq), time.monotonic(), fut))
        self._release()
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # let through, then cancelled: give it back
                self._exit(fut.result())
            raise

    def _exit(self, batch: _Batch) -> None:
        batch.left -= 1
        if batch.left == 0:
            self._running -= 1
            self._release()

    def _release(self) -> None:
        """While fewer than ``concurrent`` batches run: up to ``batch_size`` waiting
        requests, earliest deadline first (with ``wait_s``, a replica with none running
        holds a batch that is not full until its first request has waited that long)."""
        while self._running < self.concurrent:
            self._heap = [e for e in self._heap if not e[3].done()]  # clients gone while waiting
            heapq.heapify(self._heap)
            if not self._heap:
                return
            if self.wait_s > 0 and self._running == 0 and len(self._heap) < self.batch_size:
                due = min(e[2] for e in self._heap) + self.wait_s - time.monotonic()
                if due > 0:
                    if self._timer is None:
                        self._timer = asyncio.get_running_loop().call_later(due, self._wake)
                    return
            take = [heapq.heappop(self._heap) for _ in range(min(self.batch_size, len(self._heap)))]
            batch = _Batch(len(take))
            for *_, fut in take:
                fut.set_result(batch)
            self._running += 1
            self.batches.append(batch.left)
            del self.batches[:-1000]

    def _wake(self) -> None:
        self._timer = None
        self._release()


class _Slot:
    def __init__(self, gate: EDFGate, deadline: float):
        self.gate, self.deadline = gate, deadline
        self.batch: _Batch | None = None

    async def __aenter__(self):
        self.batch = await self.gate._enter(self.deadline)

    async def __aexit__(self, *exc):
        self.gate._exit(self.batch)
        return False
