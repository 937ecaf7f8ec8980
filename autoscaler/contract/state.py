"""Policy state as JSON, so that a restarted autoscaler carries on where it stopped (ours).

A policy's state is what it keeps between decisions: timers ("over the SLO since"), the
time of its last plan, counters that seed its forecasts, Ray's delay bookkeeping. Each
policy names those attributes (``Policy.state_fields``); everything else is configuration,
rebuilt from the config on a restart. Ray Serve's own ``autoscaling_policy`` passes its
``policy_state`` in and out the same way, and Knative keeps its scale across restarts.

:func:`encode` turns a state value into JSON-able data and :func:`decode` back: dicts with
string keys, lists, tuples and deques (of numbers and tuples), non-finite floats (a timer
that never ran is ``-inf``), numpy scalars and arrays, and :class:`Timers`-like objects that
declare their own ``state_fields``. Decoding restores the types, so a restored policy
decides exactly as the one that saved it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

_TAGS = ("__float__", "__tuple__", "__deque__", "__array__", "__fields__")


def encode(x: Any) -> Any:
    """JSON-able form of ``x`` (raises ``TypeError`` for a type it cannot restore)."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else {"__float__": repr(float(x))}
    if isinstance(x, np.ndarray):
        return {"__array__": [encode(v) for v in x.tolist()], "dtype": str(x.dtype)}
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v) for v in x]}
    if isinstance(x, deque):
        return {"__deque__": [encode(v) for v in x], "maxlen": x.maxlen}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if isinstance(x, dict):
        bad = [k for k in x if not isinstance(k, str) or k in _TAGS]
        if bad:
            raise TypeError(f"state dict keys must be plain strings (got {bad[:3]})")
        return {k: encode(v) for k, v in x.items()}
    fields = getattr(type(x), "state_fields", None)
    if fields is not None:
        return {"__fields__": {f: encode(getattr(x, f)) for f in fields}}
    raise TypeError(f"cannot save a {type(x).__name__} in policy state")


def decode(data: Any, like: Any = None) -> Any:
    """The value :func:`encode` made ``data`` from. ``like`` (the attribute's current value)
    gives an object with ``state_fields`` its class: the restored fields go into it."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__float__" in data:
        return float(data["__float__"])
    if "__tuple__" in data:
        return tuple(decode(v) for v in data["__tuple__"])
    if "__deque__" in data:
        return deque((decode(v) for v in data["__deque__"]), maxlen=data.get("maxlen"))
    if "__array__" in data:
        return np.asarray([decode(v) for v in data["__array__"]], dtype=data.get("dtype"))
    if "__fields__" in data:
        if like is None or getattr(type(like), "state_fields", None) is None:
            raise TypeError("saved object state needs an object of its class to restore into")
        for f, v in data["__fields__"].items():
            setattr(like, f, decode(v, getattr(like, f, None)))
        return like
    return {k: decode(v) for k, v in data.items()}
