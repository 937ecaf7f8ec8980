"""What Faro adds inside each replica of a user's deployment (issue 34), apart from the
user's code: the drop rate in force (503 ``drop_rate`` over HTTP, :class:`Dropped` over a
handle), at most ``concurrency`` requests in the user's code at once (the next waits here,
so that a freed slot is refilled without a round trip to the proxy, as on the direct path),
and what the meter needs: each request's processing time and each failure (a raised
exception or a 5xx answer, counted as ``error``). The user's request and answer are never
parsed: HTTP goes through as ASGI messages, of which only the status line is read.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from contextlib import asynccontextmanager

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from .messages import Dropped as DroppedEvent
from .messages import MeterAnswer, Processed
from .replica_report import ReplicaReporter

# set while a request runs in the user's code: a method the user's route calls on ``self``
# is then part of that request, not a request of its own
_IN_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar("faro_in_request", default=False)


class Dropped(RuntimeError):
    """Raised to a :class:`~ray.serve.handle.DeploymentHandle` caller whose request Faro
    dropped (the autoscaler's drop rate, paper section 4.4): the caller may answer 503."""


def refusal(model: str, drop_rate: float) -> JSONResponse:
    return JSONResponse({"error": f"dropped by the autoscaler (drop rate {drop_rate:.3f})",
                         "reason": "drop_rate", "model": model}, status_code=503)


class ReplicaGuard:
    """One per replica of a user's deployment under Faro."""

    def __init__(self, meter, name: str, concurrency: int = 1):
        self.name = name
        self.drop_rate = 0.0
        self.slots = asyncio.Semaphore(max(1, int(concurrency)))
        self.reporter = ReplicaReporter(meter, name, self._apply) if meter is not None else None
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
        """A slot in the user's code; the time in it is the request's processing time."""
        async with self.slots:
            t0 = time.perf_counter()
            try:
                yield
            except Exception:
                self.failed()
                raise
            self._event(Processed(time.time(), time.perf_counter() - t0))

    # -- HTTP --------------------------------------------------------------------------------
    async def asgi(self, call, scope, receive, send) -> None:
        """An ASGI ingress (FastAPI via ``serve.ingress``): the answer streams through;
        a 5xx status counts the request as failed."""
        if self.drops():
            await refusal(self.name, self.drop_rate)(scope, receive, send)
            return
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        async with self.serving():
            await run_user(call, scope, receive, watch)
        if status.get("code", 200) >= 500:
            self.failed()

    async def request(self, call, request: Request):
        """A plain deployment's ``__call__(request)``: its answer, or 503 for a drop. A
        streaming answer holds its slot until the last chunk is sent."""
        if self.drops():
            return refusal(self.name, self.drop_rate)
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


async def _release_after(body, slot):
    try:
        async for chunk in body:
            yield chunk
    except BaseException as err:
        await slot.__aexit__(type(err), err, err.__traceback__)
        raise
    await slot.__aexit__(None, None, None)
