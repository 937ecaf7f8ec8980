"""A user's text classifier on Ray Serve: JSON in, JSON out. Nothing here knows of
faro-serve; config.yaml beside it puts it under Faro.

The model is a bag-of-words logistic regression in PyTorch, trained when a replica starts on
sentences generated from two small vocabularies (there is no network to fetch a real one):
about a second on one CPU.

    curl -X POST http://127.0.0.1:8000/sentiment -d '{"text": "a wonderful film"}'
    {"label":"positive","score":0.93}
"""

from __future__ import annotations

import random

import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

POSITIVE = "good great wonderful lovely excellent fine happy brilliant enjoyable superb".split()
NEGATIVE = "bad awful terrible boring poor sad dull horrible weak broken".split()
NEUTRAL = "the a film movie plot actor story scene was is and it this".split()
VOCAB = {w: i for i, w in enumerate(POSITIVE + NEGATIVE + NEUTRAL)}


def featurize(text: str) -> torch.Tensor:
    x = torch.zeros(len(VOCAB))
    for w in text.lower().split():
        if w in VOCAB:
            x[VOCAB[w]] += 1.0
    return x


def generated(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sentences: neutral words with one to three words of one sentiment."""
    rng = random.Random(seed)
    xs, ys = [], []
    for _ in range(n):
        y = rng.random() < 0.5
        words = rng.choices(NEUTRAL, k=rng.randint(3, 8)) + rng.choices(
            POSITIVE if y else NEGATIVE, k=rng.randint(1, 3)
        )
        xs.append(featurize(" ".join(words)))
        ys.append(float(y))
    return torch.stack(xs), torch.tensor(ys)


def train(seed: int = 0, steps: int = 200) -> torch.nn.Linear:
    torch.manual_seed(seed)
    x, y = generated(2000, seed)
    model = torch.nn.Linear(len(VOCAB), 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
        loss.backward()
        opt.step()
    return model.eval()


@serve.deployment
class SentimentClassifier:
    def __init__(self, seed: int = 0, threads: int = 1):
        torch.set_num_threads(threads)
        self.model = train(seed)

    def classify(self, text: str) -> dict:
        with torch.no_grad():
            p = float(torch.sigmoid(self.model(featurize(text))).item())
        return {"label": "positive" if p >= 0.5 else "negative", "score": round(p, 2)}

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
            text = body["text"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send JSON {"text": "..."}'}, status_code=400)
        if not isinstance(text, str):
            return JSONResponse({"error": "text must be a string"}, status_code=400)
        return JSONResponse(self.classify(text))
