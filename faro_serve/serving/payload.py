"""The request body of ``POST <route_prefix>/predict`` and the JSON refusals, shared by
both data paths (the router front and the direct path): 413 past the size limit, 400 for
a JSON body that is not ``{"image": base64}``, 503 with the reason of a drop."""

import asyncio
import base64
import binascii
import json

from fastapi import Request
from fastapi.responses import JSONResponse

from .uploads import TooManyUploads, Uploads


def reject(status: int, model: str, reason: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": detail, "reason": reason, "model": model}, status_code=status)


def refusal_reason(response: JSONResponse) -> str:
    """The ``reason`` of a refusal made by :func:`reject` (413 ``too_large``, 400 ``bad_request``)."""
    return json.loads(response.body)["reason"]


def drop_rate_refusal(model: str, drop_rate: float) -> JSONResponse:
    return reject(503, model, "drop_rate", f"dropped by the autoscaler (drop rate {drop_rate:.3f})")


SHUTDOWN_RETRY_S = 5  # a refusal while draining asks the client to come back after this


def shutting_down(model: str) -> JSONResponse:
    """503 while the model drains for a shutdown (``drain.py``, issue 50): what was admitted
    is answered, what comes now is refused at once, with ``Retry-After`` so that a client
    that honours it does not hammer a proxy about to go away."""
    r = reject(503, model, "shutting_down", "the model is shutting down; retry later")
    r.headers["Retry-After"] = str(SHUTDOWN_RETRY_S)
    return r


def body_timeout(model: str, seconds: float) -> JSONResponse:
    """408: the request's body did not all arrive within the model's bound (issue 50: two
    clients that sent a few bytes and waited held every slot of a model)."""
    return reject(408, model, "body_timeout", f"the request's body did not arrive within {seconds:g} s")


def too_many_uploads(model: str) -> JSONResponse:
    """503: this replica already receives a slow body (``uploads.py``): try again."""
    return reject(503, model, "uploads", "this replica is receiving another slow request body; retry")


async def read_body(chunks, model: str, body_timeout_s: float | None, uploads: Uploads | None):
    """The body from ``chunks`` (an async iterator of its pieces, ``Request.stream()``),
    within the deadline and the replica's cap on partial uploads (``uploads.py``): the
    bytes, or the refusal to answer with."""
    try:
        if uploads is None:

            async def whole():
                return b"".join([c async for c in chunks])

            return await asyncio.wait_for(whole(), body_timeout_s)
        return await uploads.read(chunks, body_timeout_s)
    except asyncio.TimeoutError:
        return body_timeout(model, body_timeout_s)
    except TooManyUploads:
        return too_many_uploads(model)


async def read_payload(
    request: Request,
    model: str,
    max_body_bytes: int,
    body_timeout_s: float | None = None,
    uploads: Uploads | None = None,
) -> bytes | JSONResponse:
    """The model's input bytes, or the refusal to answer with; ``body_timeout_s``: how long
    the whole body may take to arrive (None: as long as it takes); ``uploads``: the
    replica's cap on bodies still arriving."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > max_body_bytes:
        return reject(413, model, "too_large", f"body of {length} bytes exceeds the limit of {max_body_bytes} bytes")
    body = await read_body(request.stream(), model, body_timeout_s, uploads)
    if isinstance(body, JSONResponse):
        return body
    if len(body) > max_body_bytes:
        return reject(413, model, "too_large", f"body exceeds {max_body_bytes} bytes")
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            doc = json.loads(body or b"{}")
            data = doc.get("image", "") if isinstance(doc, dict) else None
            if not isinstance(data, str):
                raise ValueError
            return base64.b64decode(data, validate=True)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return reject(400, model, "bad_request", 'JSON bodies must be {"image": "<base64 of JPEG/PNG bytes>"}')
    return body


async def run_model(model, name: str, payload: bytes) -> dict | JSONResponse:
    """The model's answer to ``payload``, or the refusal it asked for (``{"error": ...}``).
    A synchronous (CPU-bound) ``predict`` runs off the replica's event loop."""
    if asyncio.iscoroutinefunction(model.predict):
        result = await model.predict(payload)
    else:
        result = await asyncio.to_thread(model.predict, payload)
    return answer(result, name)


def answer(result, name: str) -> dict | JSONResponse:
    """A model's answer, or the refusal it asked for (``{"error": ..., "status": ...,
    "reason": ...}``; the reason defaults to ``bad_request``)."""
    if isinstance(result, dict) and "error" in result:
        return reject(int(result.get("status", 400)), name, str(result.get("reason", "bad_request")), result["error"])
    return result
