"""Request bodies that arrive slowly must not stall a model (issue 50).

Ray Serve's proxy hands a request to a replica as soon as its headers are in, and the
replica pulls the body from the proxy as the client sends it: a client that sends its
headers and a few bytes and then waits holds a replica slot for as long as it likes (two
such clients held every slot of a model; the model came back 0.2 s after they closed).
Ray's API gives no place to read the body before a replica is taken (its request router
sees no body), so the bound is kept where the body is read, in the replica:

* a **deadline**: a body not all arrived within ``body_timeout_s`` (5 s by default, per
  model) is answered 408 (``body_timeout``) and frees its slot;
* a **cap on partial uploads**: a body still arriving after ``grace_s`` (50 ms: any
  request on a working link has sent its body by then) while ``limit`` other bodies are
  arriving at this replica is answered 503 at once (``uploads``), so that one slow client
  per replica at most holds a slot and the replica's other slot keeps serving. With 100
  slow clients in the queue ahead, each costs a slot 50 ms instead of 5 s.

A client on a link too slow for its body is refused: with a large body over a slow link,
raise ``body_timeout_s`` for its model (the cap still bounds how many such uploads a replica
holds at once). Pure asyncio.
"""

from __future__ import annotations

import asyncio

GRACE_S = 0.05  # a body still arriving after this counts against the cap
LIMIT = 1  # bodies still arriving at one replica at once, beyond which the next is refused


class TooManyUploads(Exception):
    """This replica already receives ``limit`` slow bodies: refuse the next at once."""


class Uploads:
    """One per replica: how many request bodies are still arriving."""

    def __init__(self, limit: int = LIMIT, grace_s: float = GRACE_S):
        self.limit, self.grace_s = int(limit), float(grace_s)
        self.active = 0

    async def read(self, awaitable, timeout_s: float | None):
        """``awaitable`` (what reads a whole body), bounded: ``asyncio.TimeoutError`` past
        ``timeout_s``, :class:`TooManyUploads` when it is slow and the cap is reached."""
        task = asyncio.ensure_future(awaitable)
        grace = self.grace_s if timeout_s is None else min(self.grace_s, timeout_s)
        done, _ = await asyncio.wait({task}, timeout=grace)
        if done:
            return task.result()
        if self.active >= self.limit:
            task.cancel()
            raise TooManyUploads()
        self.active += 1
        try:
            return await asyncio.wait_for(task, None if timeout_s is None else timeout_s - grace)
        finally:
            self.active -= 1
