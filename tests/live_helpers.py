"""What the live tests share: a free loopback port, polling, and bounded HTTP load that
records every answer (or the error that took its place)."""

import asyncio
import socket
import time

import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, every: float = 1.0):
    """``cond()``'s first truthy value within ``timeout`` s, else its last value."""
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(every)
    return cond()


async def _fire(base: str, path: str, n: int, concurrency: int, rate: float | None,
                body: bytes) -> list[tuple]:
    out, sem = [], asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120,
                                 limits=httpx.Limits(max_connections=concurrency + 10)) as c:
        async def one():
            async with sem:
                t0 = time.time()
                try:
                    r = await c.post(path, content=body)
                    reason = None
                    if r.status_code != 200:  # faro-serve answers JSON; Ray's own errors are text
                        json = r.headers.get("content-type", "").startswith("application/json")
                        reason = r.json().get("reason") if json else "ray"
                    out.append((r.status_code, time.time() - t0, reason))
                except Exception as err:  # a lost request: the tests forbid these
                    out.append((type(err).__name__, time.time() - t0, None))
        tasks = []
        for _ in range(n):
            tasks.append(asyncio.create_task(one()))
            if rate:
                await asyncio.sleep(np.random.exponential(1 / rate))
        await asyncio.gather(*tasks)
    return out


def fire(base: str, path: str, n: int, concurrency: int, rate: float | None = None,
         body: bytes = b"x") -> list[tuple]:
    """``n`` POSTs, at most ``concurrency`` in flight, open-loop at ``rate``/s if given:
    one (status or error name, seconds, 503 reason or "ray" for Ray's text errors) each."""
    return asyncio.run(_fire(base, path, n, concurrency, rate, body))
