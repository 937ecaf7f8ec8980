"""The class Faro deploys in place of a user's (issue 34): the user's class, unchanged, as a
subclass whose entry points pass through the replica's
:class:`~faro_serve.serving.replica_guard.ReplicaGuard`: ``__call__`` (HTTP, ASGI or a
handle call), every public method called over a handle, and its ``@serve.batch`` methods
(``batch_method.faro_method``, issue 47). Called from the user's own code inside a request,
a method runs exactly as written. ``faro_serve.serving.user.scaled`` builds it."""

from __future__ import annotations

import inspect

from starlette.requests import Request

from .batch_method import faro_method, is_serve_batch
from .replica_guard import ReplicaGuard, run_user

# methods a subclass must not wrap: Serve's own hooks and the object's protocol
_HOOKS = {"reconfigure", "check_health", "record_autoscaling_stats", "bind", "options"}


def _is_asgi_call(args: tuple) -> bool:
    return len(args) == 3 and isinstance(args[0], dict) and args[0].get("type") in ("http", "websocket")


def _guarded_method(name: str, fn):
    """A public method of the user's class, through the guard when called over a handle.
    Called by the user's own code inside a request (their route calling ``self.helper()``)
    it runs exactly as written, synchronous or not."""
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        return None  # streaming over a handle: served as the user wrote it (not counted)
    if inspect.iscoroutinefunction(fn):

        async def method(self, *args, **kwargs):
            guard = self._faro_guard
            if guard.nested():
                return await fn(self, *args, **kwargs)
            return await guard.call(fn.__get__(self), *args, **kwargs)
    else:

        def method(self, *args, **kwargs):
            guard = self._faro_guard
            if guard.nested():
                return fn(self, *args, **kwargs)
            # a handle call: Ray awaits the coroutine a synchronous method returns; in
            # Serve's thread-pool mode this thread waits for it on the replica's loop
            return guard.call_from_sync(fn.__get__(self), *args, **kwargs)

    method.__name__, method.__qualname__, method.__doc__ = name, name, fn.__doc__
    return method


def guarded_class(
    cls: type, name: str, concurrency: int, batching: dict | None = None, body_timeout_s: float | None = 5.0
) -> type:
    """The user's class with Faro's guard in front of its entry points; ``batching``: its
    ``@serve.batch`` methods (``BatchMethod``) under ``methods``, with the largest batch,
    concurrent batches and batch wait in force (``ScaledDeployment``)."""
    ns: dict = {"__module__": cls.__module__, "__doc__": cls.__doc__}
    guard_batching = None
    if batching is not None:
        wrappers, guards = [], []  # the replica's guard joins guards (batch_method.faro_method)
        for spec in batching["methods"]:
            ns[spec.attr], batched = faro_method(spec, batching["max_batch_size"], guards)
            wrappers.append(batched)
        guard_batching = {k: v for k, v in batching.items() if k != "methods"} | {
            "wrappers": wrappers,
            "guards": guards,
        }

    if inspect.iscoroutinefunction(cls.__init__):  # Serve's ingress classes (Ray 2.60)

        async def __init__(self, *args, _faro_meter=None, **kwargs):
            self._faro_guard = ReplicaGuard(_faro_meter, name, concurrency, guard_batching, body_timeout_s)
            await cls.__init__(self, *args, **kwargs)
    else:

        def __init__(self, *args, _faro_meter=None, **kwargs):
            self._faro_guard = ReplicaGuard(_faro_meter, name, concurrency, guard_batching, body_timeout_s)
            cls.__init__(self, *args, **kwargs)

    ns["__init__"] = __init__
    # the class's own __call__, if it has one (getattr would find the metaclass's)
    user_call = next((k.__dict__["__call__"] for k in cls.__mro__ if "__call__" in k.__dict__), None)
    if user_call is not None:

        async def __call__(self, *args, **kwargs):
            guard, call = self._faro_guard, user_call.__get__(self)
            if _is_asgi_call(args):
                if args[0]["type"] != "http":  # a websocket: served as written, unmetered
                    return await call(*args)
                return await guard.asgi(call, *args)
            if len(args) == 1 and not kwargs and isinstance(args[0], Request):
                return await guard.request(call, args[0])
            if guard.nested():
                return await run_user(call, *args, **kwargs)
            return await guard.call(call, *args, **kwargs)

        ns["__call__"] = __call__
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("ray."):
            continue
        for attr, fn in vars(klass).items():
            if (
                attr.startswith("_") or attr in _HOOKS or attr in ns or not inspect.isfunction(fn) or is_serve_batch(fn)
            ):  # a streaming batch method: as the user wrote it
                continue
            wrapped = _guarded_method(attr, fn)
            if wrapped is not None:
                ns[attr] = wrapped
    return type(cls.__name__, (cls,), ns)
