"""How much does the forecaster's training seed decide, and what does an ensemble buy?

Trains one N-HiTS per ``--net-seeds`` seed (``TrainConfig(members=1)``, otherwise the
defaults, on ``--train-days`` of the trace; cached under ``--cache``), then runs
Faro-FairSum in the simulator with each network alone and with the mixtures ``--mixes``
names (an ensemble of those networks, as ``forecast train --members`` builds one: each
draws an equal share of the samples; docs/forecasting.md, "Ensemble"). One table row per
forecaster: lost cluster utility per simulator seed and the mean, at each capacity.

    python -m bench.ensemble_seeds --day 8 --train-days 1-7 --net-seeds 1-8 \\
        --mixes 1-2,3-4,5-6,7-8,1-4,5-8,1-8 --capacities 36,32,16
    python -m bench.ensemble_seeds --trace ../shared/traces/azure12_days8-12.csv --day 11 \\
        --train-days 8-10 --rescale 1,1600 --net-seeds 1-4 --mixes 1-4 --capacities 24,22,15
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from faro_serve.sim.forecaster import ensure_forecaster
from faro_serve.sim.scenario import Scenario, run_scenario
from forecasting.io import load_forecaster
from forecasting.nhits import NHitsForecaster
from forecasting.train import TrainConfig

FARO = Path(__file__).resolve().parents[2] / "shared" / "traces" / "faro10_days1-10.csv"


def seeds_of(text: str) -> list[int]:
    """``"1-4"`` -> [1, 2, 3, 4]; ``"3"`` -> [3]."""
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def network(
    trace: str, days: str, sample: int | None, seed: int, cache: Path, max_steps: int | None = None
) -> NHitsForecaster:
    """The single network of ``seed`` trained on ``days``, cached as the suites' ``--history``
    networks are (:func:`faro_serve.sim.forecaster.ensure_forecaster`)."""
    steps = {} if max_steps is None else {"max_steps": max_steps}
    where = ensure_forecaster(
        trace, days, sample, cache_dir=cache, log=lambda *_: None, config=TrainConfig(seed=seed, members=1, **steps)
    )
    return load_forecaster(where, script=False)


def mixture(nets: list[NHitsForecaster]) -> NHitsForecaster:
    """One forecaster drawing an equal share of the samples from each network."""
    return NHitsForecaster(nets[0].model, nets[0].loss, nets[0].meta, members=[n.model for n in nets[1:]])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(FARO))
    ap.add_argument("--day", type=int, default=8)
    ap.add_argument("--sample", type=int, default=0, help="the trace's sample (-1: a file without)")
    ap.add_argument("--train-days", default="1-7")
    ap.add_argument("--rescale", default=None, help="LOW,HIGH as the suite's --rescale")
    ap.add_argument("--n-jobs", type=int, default=None)
    ap.add_argument("--net-seeds", default="1-4", help="training seeds of the single networks")
    ap.add_argument("--mixes", default="1-4", help="comma-separated seed ranges mixed as ensembles")
    ap.add_argument("--capacities", default="36,32,16")
    ap.add_argument("--seeds", type=int, default=3, help="simulator seeds 0 .. N-1")
    ap.add_argument("--cache", default="runs/forecasters")
    ap.add_argument(
        "--max-steps", type=int, default=None, help="training steps of each network (default: TrainConfig's)"
    )
    a = ap.parse_args(argv)
    sample = None if a.sample < 0 else a.sample
    rescale = tuple(float(x) for x in a.rescale.split(",")) if a.rescale else None
    sc = Scenario(
        trace=a.trace, day=a.day, sample=sample, rescale=rescale, **({"n_jobs": a.n_jobs} if a.n_jobs else {})
    ).validate()
    nets = {s: network(a.trace, a.train_days, sample, s, Path(a.cache), a.max_steps) for s in seeds_of(a.net_seeds)}
    rows = [(f"seed {s}", nets[s]) for s in nets]
    rows += [(f"seeds {m}", mixture([nets[s] for s in seeds_of(m)])) for m in a.mixes.split(",") if m]
    caps = [float(c) for c in a.capacities.split(",")]
    print(
        f"| forecaster | {' | '.join(f'{c:g} replicas' for c in caps)} |  (day {a.day}, trained on "
        f"days {a.train_days}; lost cluster utility per simulator seed (mean))"
    )
    print("|---|" + "---:|" * len(caps))
    for name, fc in rows:
        cells = []
        for c in caps:
            lost = [run_scenario(sc, "faro-fairsum", c, s, fc).summary.lost_cluster_utility for s in range(a.seeds)]
            cells.append(" / ".join(f"{x:.3f}" for x in lost) + f" ({np.mean(lost):.4f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
