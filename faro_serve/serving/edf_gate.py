"""A batching replica's own queue: earliest deadline first, one batch let through at a time
(issue 20, Sponge's EDF queue and dynamic batches, live).

Why it exists: Ray Serve's ``serve.batch`` forms a batch the moment its first request comes
(with ``batch_wait_timeout_s=0``, from whatever is queued then) and only afterwards waits for
the batch before it to finish. Under a steady stream the requests arrive one by one while a
batch runs, so each forms a batch of one that queues behind the running one: measured on the
live Sponge test, 10 requests held at a replica with batch 8 in force were served one at a
time. Sponge's dynamic batching takes what is queued *when the replica frees*.

:class:`EDFGate` holds the replica's requests until the batch running ends, then lets
through up to the batch size in force, earliest deadline first, all in one step, so
``serve.batch`` (which still runs the batch) finds them queued together. The deadline is the
instant the request left its client: its arrival here minus the network time its client
declared (``x-faro-network-ms``); one model has one SLO, so that order is the order of the
remaining budgets. Pure asyncio: no Ray.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class EDFGate:
    """``async with gate.slot(deadline):`` around one request's share of a batch."""

    def __init__(self, batch_size: int = 1):
        self.batch_size = max(1, int(batch_size))
        self._heap: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()
        self._running = 0  # requests of the batch let through and not yet done
        self.batches: list[int] = []  # sizes let through (the last 1000): what the tests check

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._heap if not f.done())

    def slot(self, deadline: float) -> "_Slot":
        return _Slot(self, deadline)

    async def _enter(self, deadline: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (float(deadline), next(self._seq), fut))
        self._release()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # let through, then cancelled: give it back
                self._exit()
            raise

    def _exit(self) -> None:
        self._running -= 1
        self._release()

    def _release(self) -> None:
        """When no batch runs: up to ``batch_size`` waiting requests, earliest deadline first."""
        if self._running > 0:
            return
        n = 0
        while self._heap and n < self.batch_size:
            _, _, fut = heapq.heappop(self._heap)
            if fut.done():  # its client went away while it waited
                continue
            fut.set_result(None)
            n += 1
        self._running = n
        if n:
            self.batches.append(n)
            del self.batches[:-1000]


class _Slot:
    def __init__(self, gate: EDFGate, deadline: float):
        self.gate, self.deadline = gate, deadline

    async def __aenter__(self):
        await self.gate._enter(self.deadline)

    async def __aexit__(self, *exc):
        self.gate._exit()
        return False
