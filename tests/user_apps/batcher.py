"""A user's batching deployment as Ray Serve's docs write one (issue 47): ``__call__`` reads
the body and awaits ``self.infer(...)``, ``infer`` is ``@serve.batch`` and takes the list.
It knows nothing of faro-serve. A batch of ``b`` sleeps ``l(b)`` (a GPU-like flat curve),
and every answer says the batch it was served in."""

import asyncio

from ray import serve
from starlette.requests import Request


class Sizes:
    """What the batched method gets: the bodies' sizes (an object of the user's own)."""

    def __init__(self, bodies: list[bytes]):
        self.sizes = [len(b) for b in bodies]


@serve.deployment
class Batcher:
    def __init__(self, base_s: float = 0.05, per_item_s: float = 0.001):
        self.base_s, self.per_item_s = base_s, per_item_s

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def infer(self, bodies: list[bytes]) -> list[dict]:
        sizes = Sizes(bodies).sizes  # a user's own code, using its own types
        await asyncio.sleep(self.base_s + self.per_item_s * len(bodies))
        return [{"bytes": s, "batch": len(bodies)} for s in sizes]

    async def __call__(self, request: Request) -> dict:
        return await self.infer(await request.body())
