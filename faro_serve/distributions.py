"""Per-request time distributions shared by the live synthetic model and the simulator (paper 6.4).

The paper-matched defaults are the measured ResNet34-on-1-vCPU processing time and the
router overhead, both lognormal in scipy's ``lognorm(shape, loc, scale)`` form:
``x = loc + scale * exp(shape * N(0, 1))``. A constant distribution gives the M/D/c queue
the estimators model; an exponential one gives M/M/c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS = ("lognorm", "const", "expon")


@dataclass(frozen=True)
class TimeDist:
    """A distribution of seconds: ``lognorm(shape, loc, scale)``, ``const(value)`` or
    ``expon(loc, scale)``."""

    kind: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        need = {"lognorm": 3, "const": 1, "expon": 2}
        if self.kind not in need:
            raise ValueError(f"unknown distribution {self.kind!r}; choose one of {', '.join(KINDS)}")
        if len(self.params) != need[self.kind]:
            raise ValueError(f"{self.kind} takes {need[self.kind]} parameter(s), got {len(self.params)}")
        if not all(math.isfinite(p) for p in self.params):
            raise ValueError(f"{self.kind} parameters must be finite numbers")
        if self.kind == "lognorm" and (self.params[0] < 0 or self.params[2] <= 0 or self.params[1] < 0):
            raise ValueError("lognorm needs shape >= 0, loc >= 0 and scale > 0")
        if self.kind == "const" and self.params[0] < 0:
            raise ValueError("const needs a value >= 0")
        if self.kind == "expon" and (self.params[0] < 0 or self.params[1] <= 0):
            raise ValueError("expon needs loc >= 0 and scale > 0")

    @property
    def mean(self) -> float:
        if self.kind == "lognorm":
            s, loc, scale = self.params
            return loc + scale * math.exp(s * s / 2.0)
        if self.kind == "const":
            return self.params[0]
        return self.params[0] + self.params[1]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "lognorm":
            s, loc, scale = self.params
            return loc + scale * np.exp(s * rng.standard_normal(n))
        if self.kind == "const":
            return np.full(n, self.params[0])
        return self.params[0] + rng.exponential(self.params[1], n)

    def scaled_to_mean(self, mean_s: float) -> "TimeDist":
        """The same shape with every time multiplied so that the mean is ``mean_s``."""
        f = mean_s / self.mean if self.mean > 0 else 0.0
        if self.kind == "lognorm":
            s, loc, scale = self.params
            return TimeDist("lognorm", (s, loc * f, scale * f))
        if self.kind == "const":
            return TimeDist("const", (mean_s,))
        return TimeDist("expon", (self.params[0] * f, self.params[1] * f))

    def __str__(self) -> str:
        return f"{self.kind}:{','.join(f'{p:g}' for p in self.params)}"


# Paper-matched defaults (faro-parameters.md): ResNet34 on 1 vCPU, mean about 154 ms.
PAPER_PROCESSING = TimeDist("lognorm", (0.4225, 0.0793, 0.0686))
PAPER_ROUTER_OVERHEAD = TimeDist("lognorm", (0.481, 0.00349, 0.000988))
NO_OVERHEAD = TimeDist("const", (0.0,))


def parse_dist(text: str) -> TimeDist:
    """``"lognorm:0.4225,0.0793,0.0686"``, ``"const:0.154"``, ``"expon:0,0.154"`` (seconds)."""
    kind, _, rest = str(text).partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS or not rest.strip():
        raise ValueError(
            f"cannot read distribution {text!r}: use lognorm:SHAPE,LOC,SCALE, const:SECONDS or expon:LOC,SCALE"
        )
    try:
        params = tuple(float(x) for x in rest.split(","))
    except ValueError:
        raise ValueError(f"cannot read distribution {text!r}: parameters must be numbers") from None
    return TimeDist(kind, params)
