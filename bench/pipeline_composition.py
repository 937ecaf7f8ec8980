"""How well does the engine's end-to-end estimate of a pipeline match a simulated chain of
M/D/c queues? (issue 35 item 3; docs/pipelines.md).

A chain of stages, each ``c`` replicas serving one request at a time for a deterministic
``p`` seconds, is simulated request by request with the simulator's kernel
(``faro_serve.sim.kernels.advance``): Poisson arrivals enter stage 1, and a request's
completion there is its arrival at stage 2 (no router overhead, no hold, no drops). The
simulated percentile of the end-to-end latency is compared with three estimates:

* ``sum``: the sum of the per-stage M/D/c percentile latencies (engine.pipeline_latency's
  rule, what the planner uses);
* ``conv``: the percentile of the convolution of the per-stage latency distributions the
  M/D/c estimate stands for (p + an atom at 0 or an exponential wait, ``stage_tail``);
* ``single``: each stage's estimate alone against its simulated percentile (the M/D/c
  approximation's own error, for reference).

``python -m bench.pipeline_composition`` prints one row per (stages, load) case.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from faro_serve.engine.latency import EST_MDC_EXACT, latency
from faro_serve.engine.pipeline_latency import conv_quantile, stage_tail
from faro_serve.sim.kernels import advance


def simulate_stage(arr: np.ndarray, c: int, p: float) -> np.ndarray:
    """Completion times of the requests arriving at ``arr`` (sorted) on ``c`` deterministic
    servers of ``p`` seconds, FIFO (the simulator's kernel)."""
    n = arr.size
    proc = np.full(n, p)
    zeros = np.zeros(n)
    start = np.zeros(n)
    lat = np.zeros(n)
    status = np.zeros(n, dtype=np.int64)
    qbuf = np.zeros(n, dtype=np.int64)
    advance(
        0.0,
        float(arr[-1]) + 1e6,
        arr,
        proc,
        zeros,
        zeros,
        start,
        lat,
        status,
        0,
        n,
        qbuf,
        0,
        0,
        np.zeros(c),
        np.zeros(c),
        0.0,
        n + 1,
    )
    return arr + lat


def simulate_chain(lam: float, stages: list[tuple[int, float]], n: int, seed: int) -> np.ndarray:
    """End-to-end latencies of ``n`` Poisson(``lam``) requests through ``stages`` (c, p)."""
    rng = np.random.default_rng(seed)
    arr0 = np.cumsum(rng.exponential(1.0 / lam, n))
    t = arr0
    per_stage = []
    for c, p in stages:
        order = np.argsort(t, kind="stable")
        done = np.empty(n)
        done[order] = simulate_stage(np.ascontiguousarray(t[order]), c, p)
        per_stage.append(done - t)
        t = done
    return t - arr0, per_stage


def case(lam: float, stages: list[tuple[int, float]], q: float, n: int, seed: int) -> dict:
    e2e, per = simulate_chain(lam, stages, n, seed)
    warm = n // 20  # drop the first 5 %: the queues start empty
    sim = float(np.quantile(e2e[warm:], q))
    ests = [latency(c, lam, p, q, 0.95, EST_MDC_EXACT) for c, p in stages]
    tails = np.array([stage_tail(c, lam, p, q, 0.95, EST_MDC_EXACT) for c, p in stages])
    conv = conv_quantile(tails[:, 0], tails[:, 1], tails[:, 2], q)
    single = [(float(np.quantile(s[warm:], q)), e) for s, e in zip(per, ests)]
    return {
        "sim": sim,
        "sum": float(sum(ests)),
        "conv": conv,
        "single": single,
        "rho": [lam * p / c for c, p in stages],
    }


CASES = [  # (label, rate, [(replicas, processing s), ...])
    ("2 stages, rho .5/.5", 40.0, [(2, 0.025), (4, 0.05)]),
    ("2 stages, rho .8/.8", 64.0, [(2, 0.025), (4, 0.05)]),
    ("2 stages, rho .9/.6", 36.0, [(1, 0.025), (3, 0.05)]),
    ("2 stages, rho .6/.9", 48.0, [(2, 0.025), (2, 0.0375)]),
    ("2 stages, rho .7/.7, c=8", 224.0, [(8, 0.025), (8, 0.025)]),
    ("2 stages slow first .8/.4", 64.0, [(4, 0.05), (4, 0.025)]),
    ("2 stages slow first .9/.9", 72.0, [(4, 0.05), (2, 0.025)]),
    ("2 stages c=1, rho .5/.5", 20.0, [(1, 0.025), (1, 0.025)]),
    ("2 stages c=1, rho .8/.8", 32.0, [(1, 0.025), (1, 0.025)]),
    ("3 stages, rho .7 each", 56.0, [(2, 0.025), (4, 0.05), (1, 0.0125)]),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--percentile", type=float, default=99.0)
    a = ap.parse_args(argv)
    q = a.percentile / 100
    t0 = time.perf_counter()
    print(f"p{a.percentile:g} end-to-end latency (ms), {a.requests} requests x {a.seeds} seeds")
    print(f"{'case':28s} {'sim':>8s} {'sum':>8s} {'sum/sim':>8s} {'conv':>8s} {'conv/sim':>8s}  per stage sim/est")
    for label, lam, st in CASES:
        rows = [case(lam, st, q, a.requests, s) for s in range(a.seeds)]
        sim = np.mean([r["sim"] for r in rows])
        s_, c_ = rows[0]["sum"], rows[0]["conv"]
        per = " ".join(
            f"{np.mean([r['single'][k][0] for r in rows]) * 1e3:.1f}/{rows[0]['single'][k][1] * 1e3:.1f}"
            for k in range(len(st))
        )
        print(f"{label:28s} {sim * 1e3:8.1f} {s_ * 1e3:8.1f} {s_ / sim:8.2f} {c_ * 1e3:8.1f} {c_ / sim:8.2f}  {per}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
