"""A user's own Ray Serve applications, written as a user writes them: nothing here knows
of faro-serve (the tests put them under Faro through its Python API and its YAML builder).
Shipped to Ray's workers as ``py_modules`` under the name ``user_apps``."""

import asyncio
import json
import threading

from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse


def label(text: str) -> dict:
    """The 'model': a deterministic answer the test can predict byte for byte."""
    words = text.split()
    score = round(sum(w in ("good", "great", "fine") for w in words) / max(1, len(words)), 4)
    return {"label": "pos" if score > 0 else "neg", "score": score, "words": len(words)}


@serve.deployment
class TextClassifier:
    """JSON in, JSON out; waits on a 'backend' for ``delay_s`` (I/O-bound)."""

    def __init__(self, delay_s: float = 0.05):
        self.delay_s = delay_s
        self.inside = 0  # requests in this replica's code right now
        self.most = 0  # the most there ever were at once

    async def __call__(self, request: Request):
        body = await request.json()
        if body.get("fail"):
            raise RuntimeError("the user's model failed on purpose")
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            await asyncio.sleep(float(body.get("delay_s", self.delay_s)))
        finally:
            self.inside -= 1
        if body.get("stream"):

            async def chunks():
                for i in range(3):
                    yield f"chunk-{i};"
                    await asyncio.sleep(0.01)

            return StreamingResponse(chunks(), media_type="text/plain")
        if body.get("text") is None:
            return PlainTextResponse("text missing", status_code=422)
        return JSONResponse(label(body["text"]))

    def most_at_once(self) -> int:
        """Over a handle: the most requests this replica ever served at once."""
        return self.most


class Query(BaseModel):
    text: str


api = FastAPI()


@serve.deployment
@serve.ingress(api)
class ClassifierAPI:
    """A FastAPI ingress: the user's routes, the user's errors."""

    def __init__(self):
        self.lock = threading.Lock()

    @api.post("/classify")
    def classify(self, q: Query) -> dict:
        with self.lock:
            return self.helper(q.text)

    @api.post("/boom")
    def boom(self) -> dict:
        raise ValueError("boom")

    def helper(self, text: str) -> dict:  # a public method the route calls on self
        return label(text)


@serve.deployment
class Preprocess:
    def clean(self, text: str) -> str:
        return " ".join(text.lower().split())


@serve.deployment
class Sentiment:
    """The inner model of the composed app, reached through a handle only."""

    async def predict(self, text: str) -> dict:
        await asyncio.sleep(0.05)
        return label(text)


@serve.deployment
class Shop:
    """A composed app: an ingress calling a preprocessor and a model through handles."""

    def __init__(self, pre, model):
        self.pre, self.model = pre, model

    async def __call__(self, request: Request):
        text = (await request.json())["text"]
        cleaned = await self.pre.clean.remote(text)
        try:
            return await self.model.predict.remote(cleaned)
        except Exception as err:  # e.g. Faro dropped it: the ingress keeps answering
            return JSONResponse({"error": type(err).__name__}, status_code=503)


@serve.deployment
def plain_function(request: Request) -> str:
    return json.dumps({"ok": True})


NOT_A_DEPLOYMENT = TextClassifier.func_or_class


# A pipeline (issue 35), as a user composes one: the ingress cleans the text, then labels it
# and, when asked, captions it at the same time (a fan-out). Faro is told its shape in the
# tests' Pipeline declaration; this code does not know of faro-serve.


@serve.deployment
class Clean:
    async def run(self, text: str) -> str:
        await asyncio.sleep(0.02)
        return " ".join(text.lower().split())


@serve.deployment
class Tag:
    """The slow stage: 80 ms a query."""

    async def run(self, text: str) -> dict:
        await asyncio.sleep(0.08)
        return label(text)


@serve.deployment
class Caption:
    async def run(self, text: str) -> str:
        await asyncio.sleep(0.03)
        return text[:12]


@serve.deployment
class Gallery:
    def __init__(self, clean, tag, caption):
        self.clean, self.tag, self.caption = clean, tag, caption

    async def __call__(self, request: Request):
        body = await request.json()
        try:
            cleaned = await self.clean.run.remote(body["text"])
            calls = [self.tag.run.remote(cleaned)]
            if body.get("caption"):
                calls.append(self.caption.run.remote(cleaned))
            done = await asyncio.gather(*calls)
        except Exception as err:  # e.g. Faro dropped it at a stage
            return JSONResponse({"error": type(err).__name__}, status_code=503)
        return {**done[0], **({"caption": done[1]} if len(done) > 1 else {})}
