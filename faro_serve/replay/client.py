"""The open-loop HTTP sender of a replay (paper section 6: the load generator).

Each request of a :class:`~faro_serve.replay.loadgen.Schedule` is sent at its instant as its
own asyncio task, so slow answers never delay later requests (open loop: the load does not
adapt to the system, as real clients do not). A 503 is a dropped request: it is recorded
as failed and never resent. What the sender accounts for, request by request:

* ``sent``: every request handed to the HTTP client; each ends with an HTTP status
  (200, 503, 4xx, ...) or an ``error`` (connection refused, timeout, ...):
  ``sent == sum(answered by status) + errors``;
* ``not_sent``: requests whose instant came while ``max_in_flight`` requests were still
  open; they are skipped (not queued, which would turn the loop closed) and counted.

A schedule with a network (``--network-delay``, replay/network.py) sends each request's
network time in the ``x-faro-network-ms`` header; ``latency_s`` stays the measured answer
time, and the report adds the network time to it.

The HTTP client is aiohttp, not httpx: with hundreds of requests open (an overloaded model
in a replay, a flood) httpx's connection pool cost the sender 16-24 ms of CPU per request at
300 open (encode/httpx#3215), so on a small machine the load generator starved the server it
measured and its own delays showed up as latency; aiohttp costs 0.3-0.8 ms
(docs/serving.md "Under a flood").

The sender is bounded: it stops after the schedule's last instant plus ``timeout_s`` (the
per-request timeout), whatever the server does. While it runs it polls ``GET /faro/status``
every ``status_every_s`` for the replica counts (the table's "mean replicas").

A caller may watch the run (``on_result`` per finished request, ``on_status`` per status
poll) and end it early by setting ``stop_sending``: requests not yet due stay ``not_sent``,
open requests get ``stop_grace_s`` to finish and are then cancelled (``error``, reason
``Cancelled``), so the accounting stays exact for a partial run.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..serving.names import NETWORK_HEADER
from .loadgen import Schedule

NOT_SENT = "not_sent"
ERROR = "error"


@dataclass
class ReplayRecords:
    """One entry per scheduled request, in schedule order (``status`` is the outcome)."""

    model: np.ndarray  # index into names
    trace_s: np.ndarray  # arrival instant in trace seconds (the metric's arrival time)
    send_s: np.ndarray  # actual wall offset of the send from the replay start (NaN: not sent)
    status: list[str]  # "200", "503", "404", ..., "error" or "not_sent"
    latency_s: np.ndarray  # end-to-end latency (NaN: not sent or no answer)
    reason: list[str]  # 503 reason ("drop_rate", "queue_full"), error class, or ""
    wall_s: float = 0.0
    status_polls: list[tuple[float, dict]] = field(default_factory=list)  # (wall offset, status JSON)

    def counts(self) -> dict:
        """The accounting: sent = answered (by status) + errors; plus not sent."""
        by_status: dict[str, int] = {}
        errors = not_sent = 0
        for s in self.status:
            if s == NOT_SENT:
                not_sent += 1
            elif s == ERROR:
                errors += 1
            else:
                by_status[s] = by_status.get(s, 0) + 1
        answered = sum(by_status.values())
        return {
            "scheduled": len(self.status),
            "sent": answered + errors,
            "answered": answered,
            "by_status": dict(sorted(by_status.items())),
            "errors": errors,
            "not_sent": not_sent,
        }


async def _poll_status(
    client,
    url: str,
    every_s: float,
    t0: float,
    stop: asyncio.Event,
    out: list,
    on_status: Callable[[float, dict], None] | None = None,
) -> None:
    import aiohttp

    while not stop.is_set():
        try:
            async with client.get(f"{url}/faro/status", timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                body = await r.json() if r.status == 200 else None
            if body is not None:
                out.append((time.perf_counter() - t0, body))
                if on_status:
                    on_status(*out[-1])
        except Exception:  # the status is a nicety; the replay does not depend on it
            pass
        try:
            await asyncio.wait_for(stop.wait(), timeout=every_s)
        except asyncio.TimeoutError:
            pass


async def _post(client, url: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    async with client.post(url, data=body, headers=headers) as r:
        return r.status, await r.read()


async def send_schedule(
    schedule: Schedule,
    url: str,
    *,
    max_in_flight: int = 1000,
    timeout_s: float = 30.0,
    body: bytes = b"",
    status_every_s: float | None = 5.0,
    on_done: Callable[[int], None] | None = None,
    on_result: Callable[[int, str, float], None] | None = None,
    on_status: Callable[[float, dict], None] | None = None,
    stop_sending: asyncio.Event | None = None,
    stop_grace_s: float = 3.0,
    path: str = "/{model}/predict",
    content_type: str | None = None,
) -> ReplayRecords:
    """Send every request of ``schedule`` to ``<url><path>`` (``{model}`` in ``path`` is
    each request's model: faro-serve's own ``/<model>/predict``, or a user's route such as
    ``/{model}`` or ``/{model}/classify``) with ``body``; see the module docstring.

    ``on_result(i, status, latency_s)`` follows each sent request's end (latency NaN without
    an answer); ``on_status(wall_s, status_json)`` each status poll.
    """
    import aiohttp

    n = schedule.size
    status = [NOT_SENT] * n
    reason = [""] * n
    send_s = np.full(n, np.nan)
    latency = np.full(n, np.nan)
    paths = [url + path.format(model=m) for m in schedule.names]
    in_flight = 0
    # trust_env=False (aiohttp's default): no proxy from the environment, straight to --url
    connector = aiohttp.TCPConnector(limit=max_in_flight + 2)  # + the status poll
    polls: list = []
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as client:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        stop = asyncio.Event()
        poller = (
            asyncio.create_task(_poll_status(client, url, status_every_s, t0, stop, polls, on_status))
            if status_every_s
            else None
        )

        async def one(i: int) -> None:
            nonlocal in_flight
            start = time.perf_counter()
            send_s[i] = start - t0
            try:
                # wait_for bounds the whole request (connect, send, every read), so a slow
                # trickle cannot outlive --timeout
                net = float(schedule.network_s[i])
                headers = {NETWORK_HEADER: f"{net * 1e3:.3f}"} if net > 0 else {}
                if content_type:
                    headers["content-type"] = content_type
                code, answer = await asyncio.wait_for(_post(client, paths[schedule.model[i]], body, headers), timeout_s)
                latency[i] = time.perf_counter() - start
                status[i] = str(code)
                if code != 200:
                    try:
                        reason[i] = str(json.loads(answer).get("reason") or "")
                    except Exception:
                        reason[i] = ""
            except Exception as err:  # connection refused, timeout, protocol error...
                status[i] = ERROR
                reason[i] = type(err).__name__
            except asyncio.CancelledError:  # past the replay's time bound: sent, no answer
                status[i] = ERROR
                reason[i] = "Cancelled"
            finally:
                in_flight -= 1
                if on_result:
                    on_result(i, status[i], float(latency[i]))
                if on_done:
                    on_done(1)

        tasks = []
        start_loop = loop.time()
        for i in range(n):
            delay = start_loop + float(schedule.send_s[i]) - loop.time()
            if delay > 0:
                if stop_sending is None:
                    await asyncio.sleep(delay)
                else:
                    try:
                        await asyncio.wait_for(stop_sending.wait(), timeout=delay)
                    except asyncio.TimeoutError:
                        pass
            if stop_sending is not None and stop_sending.is_set():
                break  # the rest stays NOT_SENT
            if in_flight >= max_in_flight:
                if on_done:
                    on_done(1)
                continue  # stays NOT_SENT: open loop never waits for a free slot
            in_flight += 1
            tasks.append(asyncio.create_task(one(i)))
        if tasks:
            # Every request carries its own timeout; the extra seconds bound the wait anyway.
            everything = asyncio.ensure_future(asyncio.wait(tasks, timeout=timeout_s + 5.0))
            if stop_sending is not None:
                stopped = asyncio.ensure_future(stop_sending.wait())
                await asyncio.wait({everything, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not everything.done():  # stopped early: a short grace for open requests
                    await asyncio.wait({everything}, timeout=stop_grace_s)
                stopped.cancel()
            else:
                await everything
            if not everything.done():
                everything.cancel()
            pending = [t for t in tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if poller:
            stop.set()
            await poller
        wall = time.perf_counter() - t0
    return ReplayRecords(
        model=schedule.model.copy(),
        trace_s=schedule.trace_s.copy(),
        send_s=send_s,
        status=status,
        latency_s=latency,
        reason=reason,
        wall_s=wall,
        status_polls=polls,
    )


async def post_burst(
    url: str,
    n: int,
    concurrency: int,
    rate: float | None = None,
    body: bytes = b"x",
    seed: int = 0,
    stop: threading.Event | None = None,
) -> list[tuple]:
    """``n`` POSTs to ``url`` with at most ``concurrency`` open: as fast as answers come back
    (a flood), or started at Poisson instants of ``rate``/s. One (status or the error's
    name, seconds, reason) per request; the reason of a non-200 is faro-serve's JSON
    ``reason``, or "ray" for Ray's own text errors. The floods of the tests and of
    ``bench.flood`` send through here, with aiohttp for the reason in the module docstring.
    ``stop`` (set from another thread): start no more requests; those started are answered
    and returned."""
    import aiohttp

    out, sem = [], asyncio.Semaphore(concurrency)
    gaps = np.random.default_rng(seed).exponential(1 / rate, n) if rate else None
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency + 10), timeout=aiohttp.ClientTimeout(total=120)
    ) as c:

        async def one():
            async with sem:
                t0 = time.perf_counter()
                try:
                    async with c.post(url, data=body) as r:
                        answer = await r.read()
                    reason = None
                    if r.status != 200:
                        reason = json.loads(answer).get("reason") if r.content_type == "application/json" else "ray"
                    out.append((r.status, time.perf_counter() - t0, reason))
                except Exception as err:  # a lost request: callers count these
                    out.append((type(err).__name__, time.perf_counter() - t0, None))

        tasks = []
        for k in range(n):
            if stop is not None and stop.is_set():
                break
            tasks.append(asyncio.create_task(one()))
            if gaps is not None:
                await asyncio.sleep(gaps[k])
        await asyncio.gather(*tasks)
    return out
