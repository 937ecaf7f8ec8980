"""INFaaS's model variants and its model-autoscaler's choices (INFaaS, ATC '21, sections 4.1
and 4.2.1; issue 20), pure and Ray-free.

A task's variants are architectures (``config.Variant``: accuracy, time alone, batch
profile); each batch size of a variant that batches is a variant of its own, as INFaaS's
variants are architecture x batch x hardware (one CPU type here). A variant option has an
inference latency ``T_inf = p (s b + 1 - s)`` (a whole batch of ``b``), a saturation
throughput ``Q = b / T_inf`` per instance and a loading latency ``T_load``. The options of a
task are those that reach its accuracy target and whose ``T_inf`` is within the SLO
(constraint #2 of INFaaS's program).

* Selection (4.1): with nothing loaded, the option with the lowest ``T_load + T_inf``.
* Scale up (4.2.1), when the headroom ``n Q / load`` falls below the slack threshold (1.05):
  *replicate* the running option to ``ceil(slack load / Q)`` instances, or *upgrade* to an
  option of the same architecture with a higher ``Q``, with its own instance count; the one
  with the lower cost ``C = delta + w T_load max(delta, 0)`` (``delta``: instances added;
  every instance costs the same on one CPU type, so the hardware cost is the count), ties
  to replicate.
* Scale down: one instance fewer if the load still fits with the slack, else a *downgrade*
  to a lower batch of the same architecture that fits the load on no more instances (lower
  latency at no cost); the caller waits ``T_v`` (the option's loading latency) first.

[gap] INFaaS's ``lambda`` weight of the loading latency is not given; ``w`` is per second of
loading, 1/60 by default (a minute of loading costs as much as one instance more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..config import ModelSLO

SLACK = 1.05  # INFaaS's slack threshold (section 5)
LOAD_WEIGHT = 1.0 / 60.0  # [gap] w: instances per second of loading latency


@dataclass(frozen=True)
class Option:
    variant: str
    batch: int
    accuracy: float
    latency_s: float  # T_inf: a whole batch
    throughput: float  # Q: saturation requests/s of one instance
    load_s: float  # T_load


def options(model: ModelSLO, default_load_s: float) -> list[Option]:
    """Every variant option of ``model``'s task that meets its accuracy target and SLO."""
    if not model.variants:
        raise ValueError(f"model {model.name!r} declares no variants")
    target = model.min_accuracy if model.min_accuracy is not None else model.variants[0].accuracy
    out = []
    for v in model.variants:
        if v.accuracy < target:
            continue
        p = v.processing_ms / 1e3
        bmax = 1 if v.batching is None else v.batching.max_batch_size
        shape = np.arange(2.0) if v.batching is None else v.batching.shape(model.cpus)
        batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64) if b < bmax} | {bmax})
        for b in batches:
            lat = p * float(shape[b])
            if lat <= model.slo_ms / 1e3:
                # a replica of concurrency k serves k at once (batching refuses k > 1)
                out.append(
                    Option(
                        v.name,
                        b,
                        v.accuracy,
                        lat,
                        b * model.concurrency / lat,
                        default_load_s if v.load_s is None else v.load_s,
                    )
                )
    if not out:
        raise ValueError(f"model {model.name!r}: no variant reaches the accuracy target within the SLO")
    return out


def select(opts: list[Option]) -> Option:
    """INFaaS's choice with nothing loaded: the lowest loading plus inference latency."""
    return min(opts, key=lambda o: (o.load_s + o.latency_s, -o.accuracy))


def instances(opt: Option, load: float, slack: float = SLACK) -> int:
    """Instances whose saturation throughput covers ``load`` with the slack (at least 1)."""
    return max(1, math.ceil(slack * load / opt.throughput - 1e-9))


def scale_up(
    opts: list[Option], cur: Option, n: int, load: float, slack: float = SLACK, weight: float = LOAD_WEIGHT
) -> tuple[Option, int, str]:
    """Replicate or upgrade, whichever costs less: ``(option, instances, "replicate" |
    "upgrade")``."""

    def cost(o: Option, k: int) -> float:
        delta = k - n
        return delta + weight * o.load_s * max(delta, 0)

    best = (cur, instances(cur, load, slack), "replicate")
    best_cost = cost(best[0], best[1])
    for o in opts:
        if o.variant == cur.variant and o.throughput > cur.throughput:
            k = instances(o, load, slack)
            if cost(o, k) < best_cost - 1e-12:
                best, best_cost = (o, k, "upgrade"), cost(o, k)
    return best


def scale_down(
    opts: list[Option], cur: Option, n: int, load: float, slack: float = SLACK
) -> tuple[Option, int, str] | None:
    """One instance fewer if the load fits, else a downgrade to the lowest batch of the same
    architecture that fits on no more instances; None when neither applies."""
    if n > 1 and (load <= 0 or (n - 1) * cur.throughput / load >= slack):
        return cur, n - 1, "remove"
    lower = [o for o in opts if o.variant == cur.variant and o.batch < cur.batch and instances(o, load, slack) <= n]
    if lower:
        o = min(lower, key=lambda o: o.batch)
        return o, instances(o, load, slack), "downgrade"
    return None
