"""Request bodies that arrive slowly must not stall a model (issue 50).

Ray Serve's proxy hands a request to a replica as soon as its headers are in, and the
replica pulls the body from the proxy as the client sends it: a client that sends its
headers and a few bytes and then waits holds a replica slot for as long as it likes (two
such clients held every slot of a model; the model came back 0.2 s after they closed).
Ray's API gives no place to read the body before a replica is taken (its request router
sees no body), so the bound is kept where the body is read, in the replica:

* a **deadline**: a body not all arrived within ``body_timeout_s`` (5 s by default, per
  model) is answered 408 (``body_timeout``) and frees its slot;
* a **cap on partial uploads**: a body that has begun but stalls (no further piece within
  ``grace_s``, 50 ms, after one that said more would follow), or that has not begun within
  ``start_s`` (1 s), while ``limit`` other such bodies are arriving at this replica, is
  answered 503 at once (``uploads``): one slow client per replica at most holds a slot, the
  replica's other slot keeps serving, and 100 slow clients queued ahead cost a slot 50 ms
  each instead of 5 s. A body that comes in one piece never counts, however late the
  replica gets to it under load.

A client on a link too slow for its body is refused: with a large body over a slow link,
raise ``body_timeout_s`` for its model. Pure asyncio.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

GRACE_S = 0.05  # a body stalled this long after a piece that said more follows: partial
START_S = 1.0  # a body with no piece at all after this long: partial
LIMIT = 1  # partial bodies at one replica at once; the next is refused


class TooManyUploads(Exception):
    """This replica already receives ``limit`` partial bodies: refuse the next at once."""


class Uploads:
    """One per replica: how many request bodies are partial (begun, or due, and stalled)."""

    def __init__(self, limit: int = LIMIT, grace_s: float = GRACE_S, start_s: float = START_S):
        self.limit, self.grace_s, self.start_s = int(limit), float(grace_s), float(start_s)
        self.active = 0

    async def read(self, chunks: AsyncIterator[bytes], timeout_s: float | None) -> bytes:
        """The body from ``chunks`` (its pieces, as ``Request.stream()`` gives them),
        bounded: ``asyncio.TimeoutError`` past ``timeout_s``, :class:`TooManyUploads` when
        it stalls while the cap is reached (module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        it, parts, counted = chunks.__aiter__(), [], False
        try:
            while True:
                nxt = asyncio.ensure_future(it.__anext__())
                while not nxt.done():
                    left = None if deadline is None else deadline - loop.time()
                    patience = left if counted else (self.grace_s if parts else self.start_s)
                    if left is not None:
                        patience = min(patience, left)
                    await asyncio.wait({nxt}, timeout=max(patience, 0.0))
                    if nxt.done():
                        break
                    if deadline is not None and loop.time() >= deadline:
                        nxt.cancel()
                        raise asyncio.TimeoutError
                    if not counted:  # it stalls: a partial body, within the cap or refused
                        if self.active >= self.limit:
                            nxt.cancel()
                            raise TooManyUploads()
                        self.active += 1
                        counted = True
                try:
                    parts.append(nxt.result())
                except StopAsyncIteration:
                    return b"".join(parts)
        finally:
            if counted:
                self.active -= 1
