"""What Faro adds inside each replica of a user's deployment (issue 34), apart from the
user's code: the drop rate in force (503 ``drop_rate`` over HTTP, :class:`Dropped` over a
handle), at most ``concurrency`` requests in the user's code at once (the next waits here,
so that a freed slot is refilled without a round trip to the proxy, as on the direct path),
and what the meter needs: each request's processing time and each failure (a raised
exception or a 5xx answer, counted as ``error``). The user's request and answer are never
parsed: HTTP goes through as ASGI messages, of which only the status line is read.

A deployment that batches with ``@serve.batch`` (issue 47, ``batch_method.py``): its
requests go into the batch through the replica's EDF gate, one batch at a time (or the
decorator's ``max_concurrent_batches``), the processing time reported is each batch's time
with its size, and the batch size in force is the autoscaler's (the meter's answer), set
in Ray's queue and the gate together.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from contextlib import asynccontextmanager

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from .edf_gate import EDFGate
from .messages import Dropped as DroppedEvent
from .messages import MeterAnswer, Processed
from .payload import drop_rate_refusal, read_body, refusal_reason, shutting_down
from .replica_report import ReplicaReporter
from .uploads import Uploads

# set while a request runs in the user's code: a method the user's route calls on ``self``
# is then part of that request, not a request of its own
_IN_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar("faro_in_request", default=False)


class Dropped(RuntimeError):
    """Raised to a :class:`~ray.serve.handle.DeploymentHandle` caller whose request Faro
    dropped (the autoscaler's drop rate, paper section 4.4): the caller may answer 503."""


class ReplicaGuard:
    """One per replica of a user's deployment under Faro. ``batching``: the deployment's
    ``@serve.batch`` wrappers (``batch_method.faro_method``), its largest batch, concurrent
    batches and batch wait; None: it serves requests as they come."""

    def __init__(
        self, meter, name: str, concurrency: int = 1, batching: dict | None = None, body_timeout_s: float | None = 5.0
    ):
        self.name = name
        self.drop_rate = 0.0
        self.body_timeout_s = body_timeout_s  # a body not all arrived by then: 408 (issue 50)
        self.uploads = Uploads()  # bodies still arriving at this replica (uploads.py)
        self.slots = asyncio.Semaphore(max(1, int(concurrency)))
        self.batching = batching
        self.held = self.held_peak = 0  # requests in the user's code now, most since the last report
        if batching is not None:
            self.batch_size = int(batching["max_batch_size"])  # in force until the autoscaler says
            self.gate = EDFGate(self.batch_size, batching["concurrent"], batching["wait_s"])
            self.set_batch(self.batch_size)
            batching.get("guards", []).append(self)
        fields = self._report_fields if batching is not None else None
        self.reporter = ReplicaReporter(meter, name, self._apply, fields) if meter is not None else None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started()

    def _started(self) -> None:
        """Learn the replica's event loop and start reporting, once one runs."""
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                return
        if self.reporter is not None:
            self.reporter.start()

    def _apply(self, ans: MeterAnswer) -> None:
        self.drop_rate = ans.drop_rate
        if self.batching is not None and ans.batch_size is not None and ans.batch_size != self.batch_size:
            self.set_batch(ans.batch_size)

    # -- batching (batch_method.py) -------------------------------------------------------
    def set_batch(self, size: int) -> None:
        """The batch size in force, within the deployment's largest: Ray's queue (its own
        ``set_max_batch_size``) and the gate together."""
        self.batch_size = min(max(int(size), 1), int(self.batching["max_batch_size"]))
        self.gate.batch_size = self.batch_size
        for batched in self.batching["wrappers"]:
            batched.set_max_batch_size(self.batch_size)

    def set_wait(self, seconds: float) -> None:
        """How long a batch that is not full waits, with no batch running (the gate's)."""
        self.gate.wait_s = max(0.0, float(seconds))

    async def batched(self, batched, owner, *args, **kwargs):
        """One request's share of a batch: through the gate into Ray's batch queue."""
        async with self.gate.slot(time.time()):
            return await batched(owner, *args, **kwargs)

    def batch_done(self, size: int, seconds: float) -> None:
        """A batch's size and time, reported with each of its requests (request-weighted,
        as faro-serve's own batching replicas report: ``direct.DirectModel``)."""
        now = time.time()
        for _ in range(max(int(size), 1)):
            self._event(Processed(now, seconds, int(size)))

    def _report_fields(self) -> dict:
        peak, self.held_peak = self.held_peak, self.held
        return {"batch_size": self.batch_size, "held_peak": peak}

    def _event(self, ev) -> None:
        self._started()
        if self.reporter is not None:
            self.reporter.event(ev)

    @staticmethod
    def nested() -> bool:
        """True inside a request already being served (a user's method called by its route)."""
        return _IN_REQUEST.get()

    def drops(self) -> bool:
        """Whether to drop this request; a drop is counted."""
        if self.drop_rate > 0 and random.random() < self.drop_rate:
            self._event(DroppedEvent(time.time(), "drop_rate"))
            return True
        return False

    def failed(self) -> None:
        self._event(DroppedEvent(time.time(), "error"))

    @asynccontextmanager
    async def serving(self):
        """A slot in the user's code; the time in it is the request's processing time (a
        batching deployment's: its batch's, reported by :meth:`batch_done`)."""
        async with self.slots:
            self.held += 1
            self.held_peak = max(self.held_peak, self.held)
            t0 = time.perf_counter()
            try:
                yield
            except Exception:
                self.failed()
                raise
            finally:
                self.held -= 1
            if self.batching is None:
                self._event(Processed(time.time(), time.perf_counter() - t0))

    # -- HTTP --------------------------------------------------------------------------------
    def _admit(self) -> bool:
        """False while a shutdown drains the model (``drain.py``): the request is refused
        503 ``shutting_down`` and counted; an admitted one is released when answered."""
        if self.reporter is None or self.reporter.admit():
            return True
        self._event(DroppedEvent(time.time(), "shutting_down"))
        return False

    def _release(self) -> None:
        if self.reporter is not None:
            self.reporter.release()

    async def asgi(self, call, scope, receive, send) -> None:
        """An ASGI ingress's request (:meth:`_asgi`), unless the model drains."""
        if not self._admit():
            await shutting_down(self.name)(scope, receive, send)
            return
        try:
            await self._asgi(call, scope, receive, send)
        finally:
            self._release()

    async def request(self, call, request: Request):
        """A plain deployment's request (:meth:`_request`), unless the model drains; a
        streaming answer counts as unanswered until its last chunk."""
        if not self._admit():
            return shutting_down(self.name)
        try:
            result = await self._request(call, request)
        except BaseException:
            self._release()
            raise
        if isinstance(result, StreamingResponse):
            result.body_iterator = _then(result.body_iterator, self._release)
        else:
            self._release()
        return result

    async def _asgi(self, call, scope, receive, send) -> None:
        """An ASGI ingress (FastAPI via ``serve.ingress``): the answer streams through;
        a 5xx status counts the request as failed. The body is read first, within the
        body deadline and before a slot is taken, and handed to the app as it came."""
        if self.drops():
            await drop_rate_refusal(self.name, self.drop_rate)(scope, receive, send)
            return
        messages: list = []
        body = await read_body(_pieces(receive, messages), self.name, self.body_timeout_s, self.uploads)
        if isinstance(body, JSONResponse):  # 408 or 503: the body was too slow
            self._event(DroppedEvent(time.time(), refusal_reason(body)))
            await body(scope, receive, send)
            return
        receive = _replay(messages, receive)
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        async with self.serving():
            await run_user(call, scope, receive, watch)
        if status.get("code", 200) >= 500:
            self.failed()

    async def _request(self, call, request: Request):
        """A plain deployment's ``__call__(request)``: its answer, or 503 for a drop. A
        streaming answer holds its slot until the last chunk is sent."""
        if self.drops():
            return drop_rate_refusal(self.name, self.drop_rate)
        # the body, within its deadline and before a slot; the user's code gets a request
        # that hands it the same body (body(), json(), stream(): as written)
        body = await read_body(request.stream(), self.name, self.body_timeout_s, self.uploads)
        if isinstance(body, JSONResponse):
            self._event(DroppedEvent(time.time(), refusal_reason(body)))
            return body
        request = Request(
            request.scope, _replay([{"type": "http.request", "body": body, "more_body": False}], request.receive)
        )
        slot = self.serving()
        await slot.__aenter__()
        try:
            result = await run_user(call, request)
        except BaseException as err:
            await slot.__aexit__(type(err), err, err.__traceback__)
            raise
        if isinstance(result, StreamingResponse):
            result.body_iterator = _release_after(result.body_iterator, slot)
            return result
        await slot.__aexit__(None, None, None)
        if getattr(result, "status_code", 200) >= 500:
            self.failed()
        return result

    # -- handles -------------------------------------------------------------------------
    async def call(self, call, *args, **kwargs):
        """A handle call to a user's method: its result, or :class:`Dropped`."""
        if self.drops():
            raise Dropped(f"{self.name}: dropped by the autoscaler (drop rate {self.drop_rate:.3f})")
        async with self.serving():
            return await run_user(call, *args, **kwargs)

    def call_from_sync(self, call, *args, **kwargs):
        """:meth:`call` for a synchronous method: the coroutine, to be awaited by Ray, on
        the replica's loop; from a worker thread, its result."""
        coro = self.call(call, *args, **kwargs)
        try:
            asyncio.get_running_loop()
            return coro
        except RuntimeError:
            if self.loop is None:
                coro.close()
                raise RuntimeError(f"{self.name}: no event loop to serve this call on") from None
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


async def _pieces(receive, messages: list):
    """The body's pieces from ASGI ``http.request`` messages, each message kept in
    ``messages`` to be handed to the app again (``_replay``)."""
    while True:
        msg = await receive()
        messages.append(msg)
        if msg["type"] != "http.request":
            return
        yield msg.get("body", b"")
        if not msg.get("more_body", False):
            return


def _replay(messages: list, receive):
    """A ``receive`` that gives ``messages`` first, then the real one's."""

    async def replay():
        return messages.pop(0) if messages else await receive()

    return replay


async def run_user(call, *args, **kwargs):
    """The user's method, marked as inside a request: a coroutine awaited, a synchronous
    one off the event loop (so that k of them run at once and the replica keeps reporting)."""
    if asyncio.iscoroutinefunction(call):
        token = _IN_REQUEST.set(True)
        try:
            return await call(*args, **kwargs)
        finally:
            _IN_REQUEST.reset(token)
    ctx = contextvars.copy_context()
    ctx.run(_IN_REQUEST.set, True)
    result = await asyncio.to_thread(ctx.run, call, *args, **kwargs)
    if asyncio.iscoroutine(result):  # a sync wrapper around a coroutine
        token = _IN_REQUEST.set(True)
        try:
            result = await result
        finally:
            _IN_REQUEST.reset(token)
    return result


async def _then(body, done):
    """``body``'s chunks, then ``done()``, however the stream ends."""
    try:
        async for chunk in body:
            yield chunk
    finally:
        done()


async def _release_after(body, slot):
    try:
        async for chunk in body:
            yield chunk
    except BaseException as err:
        await slot.__aexit__(type(err), err, err.__traceback__)
        raise
    await slot.__aexit__(None, None, None)
