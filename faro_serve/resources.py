"""What one replica takes and what the cluster has, by Ray's resource names (issue 34).

A model's replica reserves CPUs, memory, GPUs (fractions allowed) and any Ray custom
resource; the cluster caps some of them. One :class:`Capacity` carries every cap, so the
planner, the policies and the drivers check all of them the same way instead of threading
one scalar per resource. Names are Ray's (``CPU``, ``GPU``, custom names), except that
memory is in GiB under ``memory``. Pure Python: the engine, the policies and the config
all use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

CPU, MEMORY, GPU = "CPU", "memory", "GPU"
TOL = 1e-9


def unit(name: str) -> str:
    """How a resource reads in a message: CPUs, GiB, GPUs, or its own name."""
    return {CPU: "CPUs", MEMORY: "GiB", GPU: "GPUs"}.get(name, name)


def _order(item) -> tuple:
    """CPUs, memory and GPUs first, then custom resources by name."""
    return ({CPU: 0, MEMORY: 1, GPU: 2}.get(item[0], 3), item[0])


def demand(model) -> dict[str, float]:
    """What one replica of ``model`` (a ModelSLO) reserves, per resource; zeros left out."""
    out = {CPU: float(model.cpus), MEMORY: float(model.memory_gb)}
    if getattr(model, "gpus", 0):
        out[GPU] = float(model.gpus)
    resources = getattr(model, "resources", None)
    if resources:  # most models name none (this runs per model at every grant)
        out.update({k: float(v) for k, v in resources.items() if v})
    return out


def usage(counts: Mapping[str, float], demands: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The resources ``counts`` replicas per model take, given each model's :func:`demand`."""
    out: dict[str, float] = {}
    for n, c in counts.items():
        for r, a in demands[n].items():
            out[r] = out.get(r, 0.0) + c * a
    return out


def resource_names(demands: Mapping[str, Mapping[str, float]]) -> set[str]:
    """Every resource some model's :func:`demand` names."""
    return {r for d in demands.values() for r in d}


@dataclass(frozen=True)
class Capacity:
    """Caps per resource name. A resource not named has ``default``: infinite (a cap the
    config leaves out does not bind) or 0 (Ray's view: a resource it does not list, the
    cluster does not have). An infinite cap is no constraint."""

    items: tuple[tuple[str, float], ...] = ()
    default: float = math.inf

    @classmethod
    def of(
        cls,
        cpus: float | None = None,
        memory_gb: float | None = None,
        gpus: float | None = None,
        resources: Mapping[str, float] | None = None,
        default: float = math.inf,
    ) -> "Capacity":
        """From the config's fields; a None leaves that resource to ``default``."""
        caps = {CPU: cpus, MEMORY: memory_gb, GPU: gpus, **(resources or {})}
        return cls.from_mapping({k: v for k, v in caps.items() if v is not None}, default)

    @classmethod
    def from_mapping(cls, caps: Mapping[str, float], default: float = math.inf) -> "Capacity":
        return cls(tuple(sorted((str(k), float(v)) for k, v in caps.items())), float(default))

    @classmethod
    def of_cluster(cls, spec) -> "Capacity":
        """A ClusterSpec's caps (gpus or resources None: not binding here)."""
        return cls.of(spec.cpus, spec.memory_gb, getattr(spec, "gpus", None), getattr(spec, "resources", None))

    @property
    def limits(self) -> dict[str, float]:
        return dict(self.items)

    def __getitem__(self, name: str) -> float:
        return self.limits.get(name, self.default)

    @property
    def cpus(self) -> float:
        return self[CPU]

    @property
    def memory_gb(self) -> float | None:
        """The memory cap in GiB, None when it does not bind (the old scalar's meaning)."""
        m = self[MEMORY]
        return None if math.isinf(m) else m

    def capped_by(self, other: "Capacity") -> "Capacity":
        """Each resource at the smaller of the two caps."""
        names = set(self.limits) | set(other.limits)
        return Capacity.from_mapping({n: min(self[n], other[n]) for n in names}, min(self.default, other.default))

    def replaced(self, **caps: float) -> "Capacity":
        """This capacity with some caps set (by Ray's name; ``math.inf``: not binding)."""
        return Capacity.from_mapping({**self.limits, **caps}, self.default)

    def free(self, used: Mapping[str, float], names) -> dict[str, float]:
        """What is left of each resource in ``names`` that binds (infinite caps left out)."""
        return {r: self[r] - used.get(r, 0.0) for r in names if math.isfinite(self[r])}

    def over(self, used: Mapping[str, float]) -> list[str]:
        """'need X of R, have Y' for each resource ``used`` exceeds; empty when it fits."""
        return [
            f"{a:g} {unit(r)} (the cluster has {self[r]:g})"
            for r, a in sorted(used.items(), key=_order)
            if a > self[r] + TOL
        ]

    def fits(self, used: Mapping[str, float]) -> bool:
        return not self.over(used)

    def to_json(self) -> dict[str, float]:
        """The binding caps, JSON-able."""
        return {k: v for k, v in self.items if math.isfinite(v)}


def fits_in(free: Mapping[str, float], need: Mapping[str, float]) -> bool:
    """Whether one replica needing ``need`` fits in ``free`` (from :meth:`Capacity.free`)."""
    return all(need.get(r, 0.0) <= f + TOL for r, f in free.items())


def as_capacity(cpus_or_capacity, memory_gb: float | None = None) -> Capacity:
    """A :class:`Capacity` from the old pair of scalars (CPUs, memory or None), or as given."""
    if isinstance(cpus_or_capacity, Capacity):
        return cpus_or_capacity
    if isinstance(cpus_or_capacity, tuple):  # an adapter's capacity() of old: (cpus, memory)
        cpus_or_capacity, memory_gb = cpus_or_capacity
    return Capacity.of(float(cpus_or_capacity), memory_gb)
