"""A user's ``@serve.batch`` method under Faro (issue 47): found, batched by Ray as the user
wrote it, gated and timed by Faro, its batch size set through Ray's own setter.

Ray Serve users batch on GPUs with ``@serve.batch``: ``__call__`` awaits ``self.infer(x)``
and ``infer(self, xs: list)`` runs the batch. Ray's wrapper recognises a method call by
finding, on ``self``, an attribute of the method's name whose ``__wrapped__`` is the
function it batches; a Faro subclass that put a guard of its own in front of the method
hid it, and every request failed (the user's ``infer`` got the list of ``self`` objects).

So Faro's subclass replaces the method with :func:`faro_method`, whose ``__wrapped__`` is the
function Ray batches, and which

* re-batches the user's function with ``serve.batch`` (Ray's decorator: same largest
  batch, concurrent batches and ``batch_size_fn`` as the user's; its batch wait is 0
  because the gate, below, forms the batch) around a thin timer: each batch's size and time
  go to the meter (``ReplicaGuard.batch_done``), where they become the model's mean batch and
  its measured batch curve (``autoscaler/policies/service.py``);
* lets requests into Ray's batch queue through the replica's :class:`EDFGate`: while a batch
  runs the next requests wait, then go in together, so a batch is what was queued when the
  replica freed (dynamic batching, the planner's and the simulator's model), not what came
  within Ray's wait after the first (under a steady stream: batches of one behind the one
  running; ``edf_gate.py``); a batch that is not full, with no batch running, waits for more
  as the user's ``batch_wait_timeout_s`` said (or the SLO's ``batching.batch_wait_s``);
* over a handle, is a request of its own: the guard's drop rate and slots, as any public
  method; called by the user's own route (``self.infer(x)`` inside a request) it is that
  request's batched call.

The batch size in force (the planner's choice) reaches Ray's queue through
``set_max_batch_size`` and the gate together (``ReplicaGuard.set_batch``). A user's own call
of ``self.infer.set_max_batch_size`` keeps working (it sets Ray's queue). Batching async
generators (streaming) are left as the user wrote them: served, not gated or timed.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable

from ray import serve


@dataclass(frozen=True)
class BatchMethod:
    """What the user's decorator said (the SLO may lower the wait or raise the batch)."""

    attr: str
    fn: Callable  # Ray's wrapper, as the class holds it
    max_batch_size: int
    wait_s: float
    concurrent: int
    size_fn: Callable | None


def is_serve_batch(fn) -> bool:
    """Whether ``fn`` is what ``@serve.batch`` returns: Ray's wrapper has ``__wrapped__``
    and the public setters ``set_max_batch_size`` / ``set_batch_wait_timeout_s``."""
    return (
        callable(fn)
        and hasattr(fn, "__wrapped__")
        and callable(getattr(fn, "set_max_batch_size", None))
        and callable(getattr(fn, "set_batch_wait_timeout_s", None))
    )


def batch_methods(cls: type) -> list[BatchMethod]:
    """The ``@serve.batch`` methods of ``cls`` and its bases (the nearest definition of
    each name), coroutine ones only (module docstring). The decorator's settings are read
    from the wrapper Ray returns: its getters, and its queue holder's ``max_concurrent_
    batches`` and ``batch_size_fn`` (read only; 1 and None where a Ray version lacks them)."""
    seen, out = set(), []
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("ray."):
            continue
        for attr, fn in vars(klass).items():
            if attr in seen or (attr.startswith("__") and attr.endswith("__")):
                continue
            seen.add(attr)
            if not is_serve_batch(fn) or not inspect.iscoroutinefunction(fn.__wrapped__):
                continue
            holder = getattr(fn.set_max_batch_size, "__self__", None)
            out.append(
                BatchMethod(
                    attr,
                    fn,
                    int(_get(fn, "_get_max_batch_size", holder, "max_batch_size", 10)),
                    float(_get(fn, "_get_batch_wait_timeout_s", holder, "batch_wait_timeout_s", 0.0)),
                    int(getattr(holder, "max_concurrent_batches", 1) or 1),
                    getattr(holder, "batch_size_fn", None),
                )
            )
    return out


def _get(fn, getter: str, holder, field: str, default):
    if callable(getattr(fn, getter, None)):
        return getattr(fn, getter)()
    return getattr(holder, field, default)


def faro_method(spec: BatchMethod, max_batch_size: int, guards: list) -> tuple[Callable, Any]:
    """The method the Faro subclass holds instead of the user's ``@serve.batch`` one, and
    the ``serve.batch`` wrapper it feeds (module docstring). ``guards``: the replica guards
    of this process (one replica a process), where the user's own calls of the setters go."""
    user_fn = spec.fn.__wrapped__

    @functools.wraps(user_fn)
    async def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = await user_fn(self, *args, **kwargs)
        batch = args[0] if args else next(iter(kwargs.values()), [])
        self._faro_guard.batch_done(len(batch), time.perf_counter() - t0)
        return out

    batched = serve.batch(
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=0.0,
        max_concurrent_batches=spec.concurrent,
        batch_size_fn=spec.size_fn,
    )(timed)

    async def method(self, *args, **kwargs):
        guard = self._faro_guard
        if guard.nested():  # the user's route calls it: part of that request
            return await guard.batched(batched, self, *args, **kwargs)
        return await guard.call(functools.partial(guard.batched, batched, self), *args, **kwargs)

    method.__name__ = method.__qualname__ = spec.attr
    method.__doc__ = user_fn.__doc__
    method.__wrapped__ = timed  # what Ray's wrapper looks for on self (module docstring)

    # The user's own code sets the batch as Ray's docs show, self.infer.set_max_batch_size(n)
    # or .set_batch_wait_timeout_s(s) (in __init__ or reconfigure): under Faro both go to the
    # replica's guard (its gate and Ray's queue together; the wait is the gate's, Ray's queue
    # waits 0 behind it), until the autoscaler sets the batch
    def set_max_batch_size(size: int) -> None:
        for g in guards:
            g.set_batch(size)

    def set_batch_wait_timeout_s(seconds: float) -> None:
        for g in guards:
            g.set_wait(seconds)

    method.set_max_batch_size = set_max_batch_size
    method.set_batch_wait_timeout_s = set_batch_wait_timeout_s
    method._get_max_batch_size = lambda: guards[-1].batch_size if guards else max_batch_size
    method._get_batch_wait_timeout_s = lambda: guards[-1].gate.wait_s if guards else spec.wait_s
    return method, batched
