"""How the suite's capacities were chosen for a trace (docs/simulator.md, "A second
workload family"): the replicas each job needs per minute to meet its SLO, from the
M/D/c estimate on the scenario's own counts, summarised two ways:

* busiest minute: the most replicas all jobs need in one minute together;
* sum of peaks: every job at its own busiest minute at once (what static provisioning
  for peaks would hold).

The paper's 36 replicas for its 10-job trace sit between the two (this machine: 32 and
40 for ``faro10_days1-10.csv`` day 10 sample 0), so ``high`` = their mean. Beyond one
replica per job (every policy's floor) the paper's 36/32/16 keep 26/22/6 spare replicas,
so ``mid`` and ``low`` keep those shares (22/26 and 6/26) of ``high``'s spare replicas.
(Scaling the capacities themselves, 8/9 and 4/9 of ``high``, would put 12 jobs' ``low``
below one replica per job: a capacity at which no policy has a choice.)

Usage: ``python -m bench.capacity_need --trace T --day D [--sample S] [--rescale LO,HI]``
"""

import argparse

import numpy as np

from faro_serve.engine.latency import min_replicas_for_slo
from faro_serve.sim.scenario import Scenario


def need_per_minute(counts: np.ndarray, processing_s: float, slo_s: float, q: float) -> np.ndarray:
    """Replicas per job and minute (jobs x minutes) meeting the SLO at that minute's rate."""
    out = np.zeros(counts.shape, dtype=int)
    cache: dict[float, int] = {}
    for idx, c in np.ndenumerate(counts):
        lam = round(float(c) / 60.0, 3)
        if lam not in cache:
            cache[lam] = min_replicas_for_slo(lam, processing_s, slo_s, q)[0] if lam > 0 else 1
        out[idx] = cache[lam]
    return out


def capacities(need: np.ndarray) -> dict:
    busiest, peaks = int(need.sum(axis=0).max()), int(need.max(axis=1).sum())
    high = int(round((busiest + peaks) / 2))
    jobs = need.shape[0]
    spare = max(high - jobs, 0)
    return {
        "busiest_minute": busiest,
        "sum_of_peaks": peaks,
        "high": high,
        "mid": jobs + int(round(spare * 22 / 26)),
        "low": jobs + int(round(spare * 6 / 26)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--day", type=int)
    ap.add_argument("--sample", type=int)
    ap.add_argument("--rescale", help="LOW,HIGH requests/min, as the suite's --rescale")
    ap.add_argument("--slo-ms", type=float, default=720.0)
    ap.add_argument("--processing-ms", type=float, default=154.0)
    args = ap.parse_args(argv)
    rescale = tuple(float(x) for x in args.rescale.split(",")) if args.rescale else None
    sc = Scenario(
        trace=args.trace,
        day=args.day,
        sample=args.sample,
        rescale=rescale,
        slo_ms=args.slo_ms,
        processing_ms=args.processing_ms,
    ).validate()
    names, counts, _ = sc.load()
    need = need_per_minute(counts, sc.processing_ms / 1e3, sc.slo_ms / 1e3, sc.percentile / 100)
    caps = capacities(need)
    print(f"{args.trace} day {args.day}: {len(names)} jobs x {counts.shape[1]} minutes")
    print(f"replicas needed: busiest minute {caps['busiest_minute']}, sum of per-job peaks {caps['sum_of_peaks']}")
    print(
        f"capacities: {caps['high']},{caps['mid']},{caps['low']} (high = their mean; mid, low keep "
        f"22/26 and 6/26 of high's replicas beyond one per job, as the paper's 32 and 16 of 36)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
