"""A pipeline on Ray Serve under Faro: one SLO end to end (docs/pipelines.md).

A review goes through ``Clean`` (normalise the text), then, side by side, the sentiment
classifier of examples/text_classifier and, for long reviews only, a ``Spam`` check (about
half of them: the stage's ``fraction``). The ingress ``Moderate`` calls the stages through
handles and answers when both are done.

The faro-serve lines: the ``Pipeline`` declaration (the same as in config.yaml) and
``faro_serve.scaled(...)`` around the ingress (measured end to end, not scaled) and each
stage (scaled by Faro, its queue and measurements where the ingress calls it).

    curl -X POST http://127.0.0.1:8000/moderate/check -d '{"text": "a wonderful film"}'
"""

# (no `from __future__ import annotations`: Serve's FastAPI views read string annotations
# as query parameters, examples/composed/app.py)
import asyncio

from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve

import faro_serve
from examples.text_classifier.app import SentimentClassifier

api = FastAPI(title="moderation")

MODERATION = faro_serve.Pipeline(
    name="moderation",
    app="moderate",
    ingress="Moderate",
    slo_ms=500,
    stages=[
        faro_serve.Stage(name="clean", deployment="Clean", cpus=0.1, max_replicas=2),
        faro_serve.Stage(name="sentiment", deployment="SentimentClassifier", after=["clean"], cpus=0.5, max_replicas=4),
        faro_serve.Stage(name="spam", deployment="Spam", after=["clean"], fraction=0.5, cpus=0.1, max_replicas=2),
    ],
)
LONG = 6  # words: a review this long is checked for spam too


class Review(BaseModel):
    text: str


@serve.deployment
class Clean:
    def run(self, text: str) -> str:
        return " ".join(text.lower().replace(".", " ").replace(",", " ").split())


@serve.deployment
class Spam:
    def run(self, text: str) -> bool:
        words = text.split()
        return sum(w.startswith("http") or w in ("buy", "free", "win") for w in words) >= 2


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=100)
@serve.ingress(api)
class Moderate:
    def __init__(self, clean, sentiment, spam):
        self.clean, self.sentiment, self.spam = clean, sentiment, spam

    @api.post("/check")
    async def moderate(self, review: Review) -> dict:
        cleaned = await self.clean.run.remote(review.text)
        long = len(cleaned.split()) >= LONG
        calls = [self.sentiment.classify.remote(cleaned)] + ([self.spam.run.remote(cleaned)] if long else [])
        try:
            done = await asyncio.gather(*calls)
        except faro_serve.Dropped:  # the cluster is overloaded and Faro shed this review
            return {"label": None, "dropped": True}
        return {"text": cleaned, **done[0], "spam": done[1] if long else None}


def stage(deployment, name: str):
    return faro_serve.scaled(deployment, MODERATION, stage=name)


app = faro_serve.scaled(Moderate, MODERATION).bind(
    stage(Clean, "clean").bind(), stage(SentimentClassifier, "sentiment").bind(seed=0), stage(Spam, "spam").bind()
)
