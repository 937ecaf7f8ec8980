"""The planner's rule for concurrency per replica against the simulator (docs/concurrency.md).

A replica of concurrency k is k servers of the measured processing time, so c replicas are
an M/D/(c k) queue. For c = 3 replicas of concurrency k = 1, 2, 4 and a few SLOs this takes
the rate at which the estimator says they serve within the SLO (p99), simulates them at that
rate request by request (the kernel's k slots per replica, the paper's ResNet34 processing
times, no router overhead) and prints the simulated p99 against the estimate. Then the same
at fixed loads, where the estimate is below the simulation at light load (it counts the mean
processing time, the simulation each request's own). A few seconds on one core.

    python -m bench.concurrency_check [--requests 100000] [--seeds 3]
"""

from __future__ import annotations

import argparse

import numpy as np

from faro_serve.distributions import PAPER_PROCESSING
from faro_serve.engine.latency import EST_MDC_EXACT, latency, max_rate_for_slo
from faro_serve.sim.model_state import ModelState

P = PAPER_PROCESSING.mean
Q = 0.99


def simulated_p99(replicas: int, k: int, lam: float, n: int, seed: int) -> float:
    """p99 latency (s) of ``replicas`` replicas of concurrency ``k`` at Poisson rate ``lam``
    (the first tenth of the requests is warm-up; no queue limit)."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / lam, n))
    proc = PAPER_PROCESSING.sample(rng, n)
    st = ModelState("m", 0, queue_limit=n, look_back_ticks=1, concurrency=k)
    st.scale_to(replicas, 0.0, 0.0)
    st.append(arr, proc, np.zeros(n), np.zeros(n))
    st.run(0.0, 1e18)
    if not np.isfinite(st.lat).all():
        raise RuntimeError("a request was not served")
    return float(np.percentile(st.lat[n // 10 :], 99))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    a = ap.parse_args(argv)
    c = a.replicas

    def sim(k, lam):
        return np.mean([simulated_p99(c, k, lam, a.requests, s) for s in range(a.seeds)])

    print(
        f"{c} replicas, processing {PAPER_PROCESSING} (mean {P * 1e3:.0f} ms), p99, "
        f"{a.requests} requests x {a.seeds} seeds\n"
    )
    print("At the rate the estimate meets the SLO:\n")
    print("| SLO ms | k | servers | rate req/s | load | estimate ms | simulated ms | sim / est |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for slo in (0.3, 0.45, 0.72, 1.0):
        for k in (1, 2, 4):
            lam = max_rate_for_slo(c, P, slo, Q, concurrency=k)
            s = sim(k, lam)
            print(
                f"| {slo * 1e3:.0f} | {k} | {c * k} | {lam:.1f} | {lam * P / (c * k):.2f} | "
                f"{slo * 1e3:.0f} | {s * 1e3:.0f} | {s / slo:.2f} |"
            )
    print("\nAt fixed loads (rate / (servers / processing time)):\n")
    print("| k | servers | load | estimate ms | simulated ms | sim / est |")
    print("|---:|---:|---:|---:|---:|---:|")
    for k in (1, 2, 4):
        for rho in (0.5, 0.7, 0.85):
            lam = rho * c * k / P
            est = latency(c * k, lam, P, Q, 0.95, EST_MDC_EXACT)
            s = sim(k, lam)
            print(f"| {k} | {c * k} | {rho:.2f} | {est * 1e3:.0f} | {s * 1e3:.0f} | {s / est:.2f} |")


if __name__ == "__main__":
    main()
