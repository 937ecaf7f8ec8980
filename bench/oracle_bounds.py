"""How much of the oracle's lead at 100 jobs could any forecaster take (issue 32's target)?

The 100-job workload (paper Table 8; ``faro_serve.traces.duplicate_jobs``) copies the 10
jobs, shifts each copy by up to 30 minutes and multiplies every minute by independent noise
``max(0, 1 + jitter * N(0, 1))``. The oracle plans with the realised counts, noise included,
which no forecaster can know. Two bounds between it and Faro:

* ``smooth-oracle``: the oracle told the noise-free future (each copy's shifted source), as
  one point: what knowing the trend alone is worth without hedging;
* ``noisy-oracle``: the noise-free future and the noise's law, as 100 samples: the best
  forecast of these counts there is, short of knowing the noise itself;
* ``trend-oracle``: Faro (re-plans, surge and moves on) told each job's future *trend* (the
  noise-free counts' centred ``--trend-minutes`` mean) and the law of its minutes' swings
  about it (their ratios to the trend over the whole run) as 100 samples, with the copies'
  noise law: a forecaster that knows everything about the future but when a swing falls.

Same arrivals and seeds as the oracle (Faro-FairSum with the true future); the first two
plan as the oracle does (long-term plans only), the third as Faro does.

    python -m bench.oracle_bounds --day 10 --seeds 0,1,2 [--n-jobs 100] [--capacity 320]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from autoscaler.faro.hybrid import FaroPolicy, OraclePolicy
from faro_serve.sim.runner import simulate
from faro_serve.sim.scenario import Scenario
from forecasting.base import Forecast

FARO = Path(__file__).resolve().parents[2] / "shared" / "traces" / "faro10_days1-10.csv"


class BoundOracle(OraclePolicy):
    """The oracle planning with the noise-free counts ``smooth`` (name -> the run's minutes)
    and, with ``jitter`` > 0, the copies' noise law drawn into ``n_samples`` samples."""

    def __init__(self, models, cluster, smooth: dict[str, np.ndarray], jitter: float = 0.0, n_samples: int = 100, **kw):
        super().__init__(models, cluster, **kw)
        self.smooth, self.jitter, self.n_samples = smooth, float(jitter), int(n_samples)

    def forecast(self, obs, seed=None) -> Forecast:
        names, h, m = list(obs.models), self.fallback.horizon, int(obs.now // 60)
        rng = np.random.default_rng(self.decisions if seed is None else seed)  # as Faro seeds
        rows = []
        for n in names:
            fut = self.smooth[n][m : m + h] / 60.0
            if fut.size < h:  # the run ends: the last known rate, as the oracle does
                fut = np.concatenate([fut, np.full(h - fut.size, fut[-1] if fut.size else 0.0)])
            if self.jitter > 0 and "-" in n:  # a copy: its noise's law (originals have none)
                noise = np.maximum(0.0, 1.0 + self.jitter * rng.standard_normal((self.n_samples, h)))
                rows.append(fut[None, :] * noise)
            else:
                rows.append(np.repeat(fut[None, :], self.n_samples if self.jitter > 0 else 1, 0))
        return Forecast(names, np.stack(rows), {n: self.name for n in names})


def trend_of(row: np.ndarray, minutes: int) -> np.ndarray:
    """The centred ``minutes``-wide moving mean of ``row`` (the ends padded with their value)."""
    half = max(0, int(minutes)) // 2
    padded = np.pad(np.asarray(row, float), (half, half), mode="edge")
    return np.convolve(padded, np.full(2 * half + 1, 1.0 / (2 * half + 1)), mode="valid")


def swings_of(row: np.ndarray, trend: np.ndarray) -> np.ndarray:
    """The minutes' ratios to the trend, where the trend is above zero (1.0 if none is)."""
    ok = trend > 0
    return np.asarray(row, float)[ok] / trend[ok] if ok.any() else np.ones(1)


class TrendOracle(FaroPolicy):
    """Faro whose forecast is each job's future trend (``trend``: name -> the run's minutes)
    times swings drawn from that job's law (``swings``), times the copies' noise law."""

    def __init__(
        self,
        models,
        cluster,
        trend: dict[str, np.ndarray],
        swings: dict[str, np.ndarray],
        jitter: float,
        n_samples: int = 100,
        **kw,
    ):
        super().__init__(models, cluster, n_samples=n_samples, **kw)
        self.trend, self.swings, self.jitter = trend, swings, float(jitter)

    def forecast(self, obs, seed=None) -> Forecast:
        names, h, m = list(obs.models), self.fallback.horizon, int(obs.now // 60)
        rng = np.random.default_rng(self.decisions if seed is None else seed)
        rows = []
        for n in names:
            fut = self.trend[n][m : m + h] / 60.0
            if fut.size < h:
                fut = np.concatenate([fut, np.full(h - fut.size, fut[-1] if fut.size else 0.0)])
            draw = fut[None, :] * rng.choice(self.swings[n], (self.n_samples, h))
            if self.jitter > 0 and "-" in n:
                draw *= np.maximum(0.0, 1.0 + self.jitter * rng.standard_normal(draw.shape))
            rows.append(draw)
        return Forecast(names, np.stack(rows), {n: self.name for n in names})


def bounds(sc: Scenario, capacity: float, seed: int, trend_minutes: int = 5) -> dict[str, float]:
    """Lost cluster utility of the oracle, the noisy, smooth and trend oracles."""
    names, counts, warm = sc.load()
    names0, smooth, _ = replace(sc, jitter=0.0).load()  # the same shifts (the noise is drawn anyway)
    if names0 != names:
        raise ValueError("the noise-free workload has other jobs than the run's")
    models, cluster = sc.models(names), sc.cluster(capacity)
    table = dict(zip(names, smooth))
    policies = {
        "oracle": OraclePolicy(models, cluster),
        "noisy-oracle": BoundOracle(models, cluster, table, sc.jitter, name="noisy-oracle"),
        "smooth-oracle": BoundOracle(models, cluster, table, 0.0, name="smooth-oracle"),
    }
    if trend_minutes > 0:
        trend = {n: trend_of(r, trend_minutes) for n, r in table.items()}
        swings = {n: swings_of(table[n], trend[n]) for n in names}
        policies["trend-oracle"] = TrendOracle(models, cluster, trend, swings, sc.jitter, name="trend-oracle")
    return {
        k: simulate(counts, models, p, sc.sim_config(capacity, seed), warmup_history=warm).summary.lost_cluster_utility
        for k, p in policies.items()
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(FARO))
    ap.add_argument("--day", type=int, default=10)
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--n-jobs", type=int, default=100)
    ap.add_argument("--capacity", type=float, default=320)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument(
        "--trend-minutes", type=int, default=5, help="width of the trend oracle's centred mean (0 = no trend oracle)"
    )
    a = ap.parse_args(argv)
    sc = Scenario(trace=a.trace, day=a.day, sample=a.sample, n_jobs=a.n_jobs).validate()
    cols = ["oracle", "noisy-oracle", "smooth-oracle"] + (["trend-oracle"] if a.trend_minutes > 0 else [])
    print(f"| seed | {' | '.join(cols)} |  ({a.n_jobs} jobs, day {a.day}, {a.capacity:g} replicas)")
    print("|---:|" + "---:|" * len(cols))
    for s in (int(x) for x in a.seeds.split(",")):
        r = bounds(sc, a.capacity, s, a.trend_minutes)
        print(f"| {s} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |", flush=True)


if __name__ == "__main__":
    main()
