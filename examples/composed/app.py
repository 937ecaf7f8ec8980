"""A composed Ray Serve application: a FastAPI ingress calls a preprocessor and the text
classifier through handles. Faro scales the classifier (its SLO is in config.yaml); the
ingress and the preprocessor stay as the user deployed them.

The only faro-serve line is ``faro_serve.scaled(...)`` around the deployment Faro scales:
its queue and measurements then sit wherever it is called from (here, the ingress's handle).
"""

# (no `from __future__ import annotations` here: Serve's FastAPI class-based views would
# then read the string annotation `Review` as a query parameter: a 422 for every request)
from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve

import faro_serve
from examples.text_classifier.app import SentimentClassifier

api = FastAPI(title="reviews")

# what one classifier replica takes and serves at once: the same as its SLO in config.yaml
CLASSIFIER = faro_serve.SLO(name="review-sentiment", app="reviews", slo_ms=300, cpus=0.5, max_replicas=4)


class Review(BaseModel):
    text: str


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=100)
class Preprocess:
    def clean(self, text: str) -> str:
        return " ".join(text.lower().replace(".", " ").replace(",", " ").split())


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=100)
@serve.ingress(api)
class Reviews:
    def __init__(self, preprocess, classifier):
        self.preprocess, self.classifier = preprocess, classifier

    @api.post("/score")
    async def score(self, review: Review) -> dict:
        cleaned = await self.preprocess.clean.remote(review.text)
        try:
            result = await self.classifier.classify.remote(cleaned)
        except faro_serve.Dropped:  # the cluster is overloaded and Faro shed this request
            return {"label": None, "dropped": True}
        return {"text": cleaned, **result}


app = Reviews.bind(Preprocess.bind(), faro_serve.scaled(SentimentClassifier, CLASSIFIER).bind(seed=0))
