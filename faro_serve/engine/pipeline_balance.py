"""How a pipeline's replicas are split among its stages in a plan (issue 35; docs/pipelines.md).

Why: the integer post-processing (integer.py) changes one variable at a time, and a
pipeline's utility is flat in each stage when another stage is short (its end-to-end
estimate is infinite whatever the first one gets) or when it already meets its SLO. Two
failures followed, both seen in the pipeline suite (day 8, planning with the true future):

* Under the fairness objectives the integer starts could not lift a pipeline (no single
  stage's replica raises it), so the solver stayed at a start that levelled every job down
  to the pipeline's poor value: 0.45 of objective on 17 replicas where 4, 4, 4 / 2, 3 meets
  every SLO (tests/test_pipeline_balance.py). ``PipelineProblem.level_start`` is integer.level_start
  with pipelines: for a floor level each pipeline takes its cheapest split reaching it,
  from :func:`split_menu`, every split worth considering with its utility and cost.
* Shrink and the stage trades keep the objective "unchanged" while they wreck a split
  (detect 1 / classify 7 where 3 / 5 is needed). :func:`best_split` searches every split of
  the resources the pipeline holds (the stages' counts within their bounds, no resource
  beyond what the stages use now) and ranks them

  1. by the pipeline's window utility (the objective's own term, cold start included);
  2. then by its *health*: the mean over forecast samples and window steps of the
     end-to-end estimate, each capped at ``HEALTH_CAP`` x the SLO (an overloaded stage
     counts the cap), so among splits of equal utility the one nearest to meeting the SLO,
     and least overloaded, wins;
  3. then by the resources used (fewer), then by the replicas moved from the current split.

  Exhaustive over the first stages with the last one taking what is left, at most
  ``MAX_SPLITS`` candidates (beyond, the stages grow greedily by the largest health gain).

Pure numpy, no Ray.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .pipeline_term import PipelineTerm

HEALTH_CAP = 10.0  # an overloaded cell counts as this many SLOs of end-to-end latency
MAX_SPLITS = 4096
FloatArray = npt.NDArray[np.float64]


def health(term: PipelineTerm, xs: FloatArray, d: float) -> float:
    """Mean over (samples, steps) of the end-to-end estimate / SLO, capped at HEALTH_CAP."""
    e2e = term.e2e(np.asarray(xs, float), d) / term.slo_s
    return float(np.minimum(np.nan_to_num(e2e, nan=HEALTH_CAP, posinf=HEALTH_CAP), HEALTH_CAP).mean())


def _affords(budget: FloatArray, need: FloatArray, default: float) -> int:
    """How many replicas of resource row ``need`` ``budget`` buys (``default`` when the
    replica needs none of the resources)."""
    pos = need > 1e-12
    return int(np.floor(np.min(budget[pos] / need[pos]) + 1e-9)) if pos.any() else int(default)


def _candidates(lo: FloatArray, hi: FloatArray, need: FloatArray, budget: FloatArray) -> list[FloatArray] | None:
    """Stage counts within [lo, hi] using at most ``budget`` of every resource, the last
    stage as many as fit (None when more than MAX_SPLITS)."""
    m = lo.size
    ranges = [
        range(int(lo[s]), max(min(int(hi[s]), _affords(budget, need[s], hi[s])), int(lo[s])) + 1) for s in range(m - 1)
    ]
    if np.prod([len(r) for r in ranges], dtype=float) > MAX_SPLITS:
        return None
    out = []
    for head in itertools.product(*ranges):
        y = np.array(list(head) + [lo[-1]], float)
        room = budget - y @ need
        if np.any(room < -1e-9):
            continue
        y[-1] = min(lo[-1] + _affords(room, need[-1], hi[-1] - lo[-1]), hi[-1])
        out.append(y)
    return out


def _greedy(
    term: PipelineTerm, lo: FloatArray, hi: FloatArray, need: FloatArray, budget: FloatArray, d: float
) -> list[FloatArray]:
    """From the minimums, one replica at a time to the stage whose addition most lowers the
    health measure, while the budget allows."""
    y = lo.astype(float).copy()
    while True:
        best, best_h = None, health(term, y, d) - 1e-12
        for s in range(y.size):
            if y[s] + 1 > hi[s] or np.any((y @ need) + need[s] > budget + 1e-9):
                continue
            y[s] += 1
            h = health(term, y, d)
            y[s] -= 1
            if h < best_h:
                best, best_h = s, h
        if best is None:
            return [y]
        y[best] += 1


def best_split(
    term: PipelineTerm, xs: FloatArray, d: float, lo: FloatArray, hi: FloatArray, need: FloatArray
) -> FloatArray:
    """The stages' counts ranked best (module docstring) among the splits of what ``xs``
    uses; ``xs`` itself when nothing ranks above it. ``need`` is (stages, resources)."""
    xs = np.asarray(xs, float)
    budget = xs @ need
    cands = _candidates(lo, hi, need, budget)
    if cands is None:
        cands = _greedy(term, lo, hi, need, budget, d)

    # utility first (cheap, one kernel), then the rest of the ranking among the ties only
    cands = [xs] + [np.asarray(y, float) for y in cands]
    util = np.round([term.utility(y, d) for y in cands], 12)
    top = [y for y, u in zip(cands, util) if u >= util.max()]

    def key(y: FloatArray) -> tuple[float, float, float]:
        return (-round(health(term, y, d), 12), -round(float((y @ need).sum()), 9), -float(np.abs(y - xs).sum()))

    best = max(top, key=key)  # the first of equal keys: xs when it is among the best
    return best


MAX_MENU = 3000


def split_menu(
    term: PipelineTerm, lo: FloatArray, hi: FloatArray, need: FloatArray, caps: FloatArray, d: float
) -> tuple[FloatArray, FloatArray, FloatArray] | None:
    """Every split of a pipeline worth considering, with its window utility and cost:
    ``(splits (k x stages), utility (k,), cost (k,))``, cost the resources it uses as a share
    of the capacity, summed over resources. A stage's count ranges from its minimum to where
    more replicas stop lowering its latency (within 1 % of the most the tables hold) or the
    capacity ends. None when that is more than ``MAX_MENU`` splits."""
    lat = term.lat[:, 0].mean(axis=(1, 2))  # (stages, counts): latency over samples x steps
    ranges = []
    for s in range(lo.size):
        top = min(int(hi[s]), _affords(caps, need[s], hi[s]), lat.shape[1] - 1)
        row = lat[s]
        sat = np.flatnonzero(np.isfinite(row) & (row <= 1.01 * row[top]))
        top = min(top, int(sat[0])) if sat.size else top
        ranges.append(range(int(lo[s]), max(top, int(lo[s])) + 1))
    if np.prod([len(r) for r in ranges], dtype=float) > MAX_MENU:
        return None
    ys = np.array(list(itertools.product(*ranges)), float)
    util = np.array([term.utility(y, d) for y in ys])
    cost = ((ys @ need) / np.maximum(caps, 1e-12)).sum(axis=1)
    return ys, util, cost
