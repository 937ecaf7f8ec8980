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
from collections import deque
from collections.abc import Callable

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

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


class InFlightRouter(RequestRouter):
    """A request router that counts requests in flight per replica itself.

    It counts from the choice to Ray's completion report (``on_request_completed``), by
    request id. Ray's own signals come too late: over the gRPC data plane a replica's
    acceptance (``on_request_routed``) and its queue report arrive with its answer, so a
    count kept from them is zero while the request runs. ``choose_replicas`` offers only the
    replica it counts the request on, so the choice is the send; if that replica refuses,
    Ray asks again and the count moves with the request. Subclasses decide which replica.
    """

    def initialize_state(self, **kwargs):
        self._load: dict = {}  # replica id -> requests in flight
        self._given: dict[str, tuple] = {}  # internal request id -> (replica id, request)

    def update_replicas(self, replicas: list[RunningReplica]):
        super().update_replicas(replicas)
        alive = {r.replica_id for r in replicas}
        self._load = {rid: n for rid, n in self._load.items() if rid in alive}
        self._given = {req: g for req, g in self._given.items() if g[0] in alive}

    def _release_cancelled(self) -> None:
        """Uncount requests cancelled between the choice and the send: Ray reports no
        completion for a request it never sent."""
        for req, (_, pr) in list(self._given.items()):
            if pr.future.cancelled():
                self._forget(req)

    def _give(self, replica: RunningReplica, pending_request: PendingRequest) -> None:
        req = pending_request.metadata.internal_request_id
        self._given[req] = (replica.replica_id, pending_request)
        self._load[replica.replica_id] = self._load.get(replica.replica_id, 0) + 1

    def _completed(self, replica_id, internal_request_id) -> bool:
        """Uncount a completed request; False for a completion of a refused earlier attempt."""
        given = self._given.get(internal_request_id)
        if given is None or given[0] != replica_id:
            return False
        self._forget(internal_request_id)
        return True

    def on_request_completed(self, replica_id, internal_request_id):
        self._completed(replica_id, internal_request_id)

    def in_flight(self) -> dict:
        """Requests in flight by replica id, as this router counts them."""
        return dict(self._load)

    def _forget(self, req: str) -> None:
        given = self._given.pop(req, None)
        if given is not None:
            n = self._load.get(given[0], 0) - 1
            if n > 0:
                self._load[given[0]] = n
            else:
                self._load.pop(given[0], None)


class IdleFirstRouter(InFlightRouter):
    """Sends each request to a replica with the fewest requests in flight, idle ones first.

    Without ``FIFOMixin`` a choice goes to the request it was made for (the front's gate
    keeps the FIFO order).
    """

    def update_replicas(self, replicas: list[RunningReplica]):
        super().update_replicas(replicas)
        _running()[self.app_name] = len(replicas)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        self._release_cancelled()
        if pending_request is not None:
            self._forget(pending_request.metadata.internal_request_id)  # asked again
        best = min(candidate_replicas, key=lambda r: (self._load.get(r.replica_id, 0), random.random()))
        if pending_request is not None:
            self._give(best, pending_request)
        return [[best]]


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
