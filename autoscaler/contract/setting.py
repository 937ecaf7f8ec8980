"""One model's setting: everything a policy may set for it, in one record (issue 33).

The actuators: replicas (paper 3.4), the drop rate (the penalty objectives, 3.2), the batch
size and threads of a batching model (Sponge, issue 20) and the variant served (INFaaS). A
policy returns *partial* settings (a field left ``None`` keeps its value); a driver merges
them into the settings in force (:meth:`Setting.merged`), clamps them against the model's
limits (:meth:`Setting.clamp`), and carries out the difference (:meth:`Setting.changes`).
Decisions, the live loop's state, its saved state, the simulator and the status all carry
this record, so a new actuator is a field here with its clamp, the policy that sets it and
the adapter that applies it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from faro_serve.config import ModelSLO

_TYPES = {"replicas": int, "drop_rate": float, "batch_size": int, "threads": int, "variant": str}


@dataclass(frozen=True)
class Setting:
    """What one model runs with; ``None``: not set (a partial setting leaves it as it is, a
    setting in force leaves it to the model's own default)."""

    replicas: int | None = None
    drop_rate: float | None = None  # share of requests refused at once, in [0, 1]
    batch_size: int | None = None  # largest batch a replica serves (a batching model)
    threads: int | None = None  # threads inside each replica, within its CPUs
    variant: str | None = None  # the variant served (a model with variants)

    def set_fields(self) -> dict[str, Any]:
        """The fields that are set, in :data:`FIELDS` order."""
        return {f: v for f in FIELDS if (v := getattr(self, f)) is not None}

    def merged(self, change: "Setting") -> "Setting":
        """This setting with every field ``change`` sets replaced."""
        return replace(self, **change.set_fields()) if change.set_fields() else self

    def clamp(self, model: ModelSLO) -> "Setting":
        """Within ``model``'s limits: replicas to its min/max, the drop rate to [0, 1], the
        batch to 1..its largest, threads to 1..its whole CPUs (Ray cannot resize a running
        replica, so threads within the CPUs it reserved are its vertical scaling), the
        variant one it declares. ``ValueError`` names a field the model cannot take (a batch
        size for a model that does not batch, an unknown variant)."""
        out: dict[str, Any] = {}
        if self.replicas is not None:
            out["replicas"] = model.clamp(int(self.replicas))
        if self.drop_rate is not None:
            out["drop_rate"] = float(np.clip(self.drop_rate, 0.0, 1.0))
        if self.batch_size is not None:
            most = largest_batch(model)
            if most <= 1:
                raise ValueError(f"{model.name!r} does not batch (no batching in its config): it takes no batch size")
            out["batch_size"] = int(min(max(int(self.batch_size), 1), most))
        if self.threads is not None:
            out["threads"] = int(min(max(int(self.threads), 1), max(1, math.floor(model.cpus))))
        if self.variant is not None:
            out["variant"] = model.variant(self.variant).name  # ValueError names a missing one
        return Setting(**out)

    def changes(self, new: "Setting") -> dict[str, Any]:
        """The fields ``new`` sets to another value than this setting has."""
        return {f: v for f, v in new.set_fields().items() if getattr(self, f) != v}

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, JSON-able."""
        return self.set_fields()

    @classmethod
    def from_json(cls, data: Any, where: str = "setting") -> "Setting":
        """The record :meth:`to_json` made; ``ValueError`` names an unknown field or a value
        of the wrong type (a saved state from another version is refused, not guessed)."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object of {', '.join(FIELDS)} (got {data!r})")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}; a setting has {', '.join(FIELDS)}")
        out = {}
        for f, v in data.items():
            if v is None:
                continue
            kind = _TYPES[f]
            ok = (
                isinstance(v, str)
                if kind is str
                else (
                    isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or float(v).is_integer())
                )
            )
            if not ok:
                raise ValueError(f"{where}.{f}: expected {kind.__name__} (got {v!r})")
            out[f] = kind(v)
        return cls(**out)


#: the record's fields, in the order a driver applies them
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Setting))


def largest_batch(model: ModelSLO) -> int:
    """The largest batch a model's config allows: its own, or its variants' largest."""
    sizes = [model.batching.max_batch_size] if model.batching else []
    sizes += [v.batching.max_batch_size for v in model.variants or () if v.batching]
    return max(sizes, default=1)


def field_map(settings: Mapping[str, Setting], field: str) -> dict[str, Any]:
    """``{model: value}`` of one field, for the models where it is set."""
    if field not in FIELDS:
        raise ValueError(f"unknown setting field {field!r}")
    return {n: v for n, s in settings.items() if (v := getattr(s, field)) is not None}
