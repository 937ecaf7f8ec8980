"""A task's model variants in one replica (INFaaS, ATC '21; issue 20): the task's route
serves the variant in force, and a switch loads the next variant beside it.

:class:`VariantModel` holds the variants a replica has loaded. ``switch(name)`` starts
loading ``name`` in a thread; the variant in force keeps answering until the new one is
ready, then requests go to it: the route answers throughout a switch, and the switch costs
the variant's real loading time on the replica (INFaaS's ``T_load``). Variants once loaded
stay loaded (memory for speed: switching back is immediate).
"""

from __future__ import annotations

import asyncio
import logging
import threading

log = logging.getLogger("faro_serve.serving")


class VariantModel:
    def __init__(self, variants: dict[str, tuple[type, dict]], initial: str):
        if initial not in variants:
            raise ValueError(f"initial variant {initial!r} is not among {sorted(variants)}")
        self.specs = dict(variants)
        self.loaded = {initial: self._build(initial)}
        self.current = initial
        self.loading: str | None = None
        self._lock = threading.Lock()

    def _build(self, name: str):
        cls, kwargs = self.specs[name]
        return cls(**kwargs)

    @property
    def model(self):
        return self.loaded[self.current]

    def switch(self, name: str) -> None:
        """Serve ``name`` once it is loaded (at once if it is); ValueError for an unknown one."""
        if name not in self.specs:
            raise ValueError(f"unknown variant {name!r}; this task has {sorted(self.specs)}")
        with self._lock:
            if name in self.loaded:
                self.current = name
                return
            if self.loading == name:
                return
            self.loading = name
        threading.Thread(target=self._load, args=(name,), daemon=True, name=f"load-{name}").start()

    def _load(self, name: str) -> None:
        try:
            model = self._build(name)
        except Exception:
            log.exception("loading variant %s failed; %s keeps serving", name, self.current)
            with self._lock:
                self.loading = None
            return
        with self._lock:
            self.loaded[name] = model
            if self.loading == name:  # not overtaken by another switch meanwhile
                self.current = name
                self.loading = None

    async def predict(self, payload: bytes):
        model, name = self.model, self.current
        out = await _call(model.predict, payload)
        return {**out, "variant": name} if isinstance(out, dict) and "error" not in out else out

    async def predict_batch(self, payloads: list[bytes]) -> list:
        model, name = self.model, self.current
        if not hasattr(model, "predict_batch"):
            raise ValueError(f"variant {name!r} does not serve batches")
        out = await _call(model.predict_batch, payloads)
        return [{**a, "variant": name} if isinstance(a, dict) and "error" not in a else a for a in out]

    def set_threads(self, threads: int) -> None:
        if not hasattr(self.model, "set_threads"):
            raise ValueError(f"variant {self.current!r} has no thread count to set")
        self.model.set_threads(threads)


async def _call(fn, arg):
    """A model method: awaited when it is a coroutine, else run off the event loop (a
    CPU-bound forward pass must not block the replica's other requests)."""
    if asyncio.iscoroutinefunction(fn):
        return await fn(arg)
    return await asyncio.to_thread(fn, arg)
