"""The model's queue at the router front and the replica choice behind it (paper section 5).

The paper's router keeps one FIFO queue per model and gives a request to a replica only
when that replica is free (the M/D/c model of section 4.2). The front keeps that queue
itself in a :class:`DispatchGate` and hands Ray Serve a request only when a replica is free,
so Ray's own router never sits in its retry backoff and never probes a full replica: a
freed replica gets the next request as soon as its answer reaches the front, whatever the
load on the machine (docs/serving.md has the measured replica hold before and after).

:class:`IdleFirstRouter`, a public ``ray.serve.request_router`` extension, then sends that
request to a replica with nothing in flight, and tells the gate how many replicas run.
"""

from __future__ import annotations

import asyncio
import importlib
import random
import time
from collections import deque
from collections.abc import Callable

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

# running replicas per application, as the router in this process last saw them
_RUNNING: dict[str, int] = {}


def _running() -> dict[str, int]:
    """This process's table. Ray may ship the front's class with its globals pickled by
    value, which would give the front a copy of ``_RUNNING``; the imported module holds
    the one the router writes."""
    return importlib.import_module(__name__)._RUNNING


def running_replicas(app: str) -> int | None:
    """Replicas the router of ``app``'s model deployment sees in this process (None before
    the router's first replica update)."""
    return _running().get(app)


class IdleFirstRouter(FIFOMixin, RequestRouter):
    """Sends each request to a replica with the fewest requests in flight, idle ones first.

    It counts in flight itself, from acceptance (``on_request_routed``) to completion
    (``on_request_completed``), by request id: a replica's own report of its queue can
    predate the request just sent. Several routing tasks choose at once, so the replica a
    choice hands out is also reserved until its request is accepted (or for ``RESERVE_S``
    if the choice goes unused), and the next choice passes it over.
    """

    RESERVE_S = 0.1

    def initialize_state(self, **kwargs):
        self._reserved: dict = {}  # replica id -> time reserved
        self._load: dict = {}  # replica id -> requests in flight
        self._where: dict[str, object] = {}  # internal request id -> replica id

    def update_replicas(self, replicas: list[RunningReplica]):
        super().update_replicas(replicas)
        _running()[self.app_name] = len(replicas)
        alive = {r.replica_id for r in replicas}
        self._load = {rid: n for rid, n in self._load.items() if rid in alive}
        self._where = {req: rid for req, rid in self._where.items() if rid in alive}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        now = time.monotonic()
        reserved = {rid for rid, t in self._reserved.items() if now - t < self.RESERVE_S}
        ranked = sorted(candidate_replicas, key=lambda r: (self._load.get(r.replica_id, 0)
                                                           + (r.replica_id in reserved),
                                                           random.random()))
        self._reserved[ranked[0].replica_id] = now
        return [[r] for r in ranked]  # one per rank: the first is the one taken

    def on_request_routed(self, pending_request, replica_id, result):
        self._reserved.pop(replica_id, None)
        self._where[pending_request.metadata.internal_request_id] = replica_id
        self._load[replica_id] = self._load.get(replica_id, 0) + 1

    def on_request_completed(self, replica_id, internal_request_id):
        rid = self._where.pop(internal_request_id, None)
        if rid is not None:
            n = self._load.get(rid, 0) - 1
            if n > 0:
                self._load[rid] = n
            else:
                self._load.pop(rid, None)


class DispatchGate:
    """A FIFO queue with at most ``capacity()`` requests in flight past it.

    ``capacity`` is read at every admission: a scale-down takes effect as requests
    finish, a scale-up when :meth:`wake` runs (the front calls it on a short timer).
    Pure asyncio, no Ray.
    """

    def __init__(self, capacity: Callable[[], int]):
        self.capacity = capacity
        self.in_flight = 0
        self.waiting = 0
        self._queue: deque[asyncio.Future] = deque()

    async def acquire(self) -> None:
        """Wait for a free slot, first come first served; cancellation leaves the queue."""
        if not self.waiting and self.in_flight < self.capacity():
            self.in_flight += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        self.waiting += 1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted just as the caller left
                self.release()
            else:
                self.waiting -= 1
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self.wake()

    def wake(self) -> None:
        cap = self.capacity()
        while self._queue and self.in_flight < cap:
            fut = self._queue.popleft()
            if not fut.done():
                self.waiting -= 1
                self.in_flight += 1
                fut.set_result(None)
