"""InferLine's planner against the coarse-grained baselines, as in the paper (SoCC '20,
section 7.1, Figs. 6 and 7a): cost of the configuration and its SLO miss rate on the live
part of a real trace.

Setup, after section 6: a per-minute trace (one job of ``../shared/traces``, Twitter by
default, like the paper's Social Media workload) rescaled to ``--peak`` queries/s and
expanded to Poisson arrivals within each minute (CV^2 = 1, as the paper's Gamma
sampling); the first 25 % is the planning sample, the remaining 75 % the live workload. The
pipeline is Social-Media-like, on CPUs (this project's cluster): ``ingest`` fans out to an
image classifier (``resnet``, batches) and a language identifier (``langid``), which sends
30 % of the queries on to a translation model (``nmt``, batches). End-to-end SLO at P99.

* InferLine: ``engine.inferline_plan.plan`` on the sample (replicas, batch, 1 or 2 CPUs
  per replica of a batching stage).
* Coarse-grained (the paper's baseline, from AutoScale): the whole pipeline is one unit
  (one replica of every stage at its own CPUs) that serves a batch of ``B`` queries in
  ``T(B)`` = the longest path of the stages' times at their share of the batch; ``B`` =
  the largest power of two with ``2 T(B) <= SLO`` (a query may wait for the batch in
  service, then its own: "the maximum batch size capable of meeting the SLO"); units =
  ceil(rate / (B / T(B))) with rate = the sample's mean (CG-Mean) or its peak over a
  sliding window of the SLO's width (CG-Peak).

* InferLine + tuner: the policy ``inferline`` driven tick by tick (``tuned``), its
  decisions served as replica schedules.

Every configuration is then run through the same Estimator (``engine.pipeline_des``) on
the live arrivals: P99 latency and the share of queries over the SLO. Cost = CPUs
reserved (the tuned policy: their mean over the live part). Deterministic given
``--seed``. Runs in 10-40 s (``--quick``: a 40-minute window). Results: docs/inferline.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "faro10_days1-10.csv"


def social_media(slo_ms: float = 1000.0):
    from faro_serve.config import Batching
    from faro_serve.pipelines import PipelineSLO

    return PipelineSLO(
        name="social",
        slo_ms=slo_ms,
        percentile=99.0,
        stages=[
            {"name": "ingest", "processing_ms": 10, "max_replicas": 200},
            {
                "name": "resnet",
                "after": ["ingest"],
                "processing_ms": 150,
                "max_replicas": 200,
                "batching": Batching(gamma=0.75, eps=0.25, max_batch_size=16).model_dump(),
            },
            {"name": "langid", "after": ["ingest"], "processing_ms": 20, "max_replicas": 200},
            {
                "name": "nmt",
                "after": ["langid"],
                "fraction": 0.3,
                "processing_ms": 250,
                "max_replicas": 200,
                "batching": Batching(gamma=0.6, eps=0.4, max_batch_size=16).model_dump(),
            },
        ],
    )


def arrivals(trace: Path, job: str, day: int, start: int, minutes: int, peak: float, seed: int) -> np.ndarray:
    from autoscaler.policies.inferline_pipeline import sample_arrivals
    from faro_serve.traces import load_trace

    tr = load_trace(trace, days=str(day), sample=0, jobs=[job])
    c = tr.counts[0]
    c = c * (60.0 * peak / c.max())  # the day's busiest minute = peak queries/s
    return sample_arrivals(c[start : start + minutes], seed)


def coarse(pipeline, profs, sample: np.ndarray, slo_s: float):
    """The coarse-grained unit: (batch B, its time T(B), the unit's CPUs) and the units for
    the mean and for the peak (sliding window of the SLO's width) rate of the sample."""
    times = _unit_times(pipeline, profs, 16)
    cpus = {m.name: m.cpus for m in pipeline.stage_models()}
    b = max(bb for bb in (1, 2, 4, 8, 16) if 2 * times[bb - 1] <= slo_s or bb == 1)
    t = float(times[b - 1])
    thru = b / t
    span = sample.max() - sample.min()
    mean = sample.size / span
    j = np.searchsorted(sample, sample + slo_s, side="left")
    peak = float((j - np.arange(sample.size)).max()) / slo_s
    unit_cpus = sum(cpus.values())
    return b, t, unit_cpus, {"CG-Mean": math.ceil(mean / thru), "CG-Peak": math.ceil(peak / thru)}


def tuned(pipe, arr: np.ndarray, cut: float, minutes: int, activation_s: float, seed: int, replan_s: float = 1e12):
    """The policy ``inferline`` (planner + tuner) driven tick by tick over the whole trace:
    it plans on the sample at the cut (its ``plan_history_min`` = the sample's minutes) and
    tunes after (re-planning every ``replan_s``: never by default, as in the paper's Fig. 7); its decisions become replica schedules (an increase serves
    ``activation_s`` later; the paper's replicas activate in 5 s) and the Estimator serves
    the trace on them. The tuner reads arrivals only, so the schedule can be made first.
    Batch sizes: the plan's at the cut, for the whole run. Returns the run and the
    time-averaged CPUs over the live part."""
    from autoscaler import make_policy
    from autoscaler.contract.policy import ModelObservation, Observation, PipelineObservation
    from faro_serve.config import ClusterSpec
    from faro_serve.engine.inferline_plan import profiles
    from faro_serve.engine.pipeline_des import simulate

    models = pipe.stage_models()
    pol = make_policy("inferline", models, ClusterSpec(cpus=1e5), pipelines=[pipe])
    pol.plan_history_min, pol.replan_s = int(round(cut / 60)), replan_s
    per_min = np.bincount((arr // 60).astype(int), minlength=minutes).astype(float)
    frac = {st.name: st.fraction for st in pipe.stages}
    target = {m.name: 1 for m in models}
    sched = {m.name: ([0.0], [1]) for m in models}
    tick, end = pol.tick_s, float(arr.max())
    for t in np.arange(0.0, end + tick, tick):
        hist = per_min[: int(t // 60)]
        rate = float(np.sum((arr > t - tick) & (arr <= t))) / tick
        obs = Observation(
            now=float(t),
            capacity_cpus=1e5,
            capacity_memory_gb=None,
            models={
                n: ModelObservation(
                    name=n, replicas=r, target_replicas=r, arrivals_per_min=hist * frac[n], arrival_rate=rate * frac[n]
                )
                for n, r in target.items()
            },
            pipelines={pipe.name: PipelineObservation(pipe.name, hist, rate)},
        )
        dec = pol.decide(obs)
        for n, r in dec.replicas.items() if dec is not None else ():
            times, counts = sched[n]
            times.append(t + (activation_s if r > target[n] else 0.0))
            counts.append(r)
            target[n] = r
    profs = profiles(pipe, cpu_factors=(1.0,))
    batch = pol.pstate[pipe.name]["batch"]
    order = [p.spec.name for p in profs]
    sch = []
    for n in order:
        times, counts = (np.asarray(x, float) for x in sched[n])
        o = np.argsort(times, kind="stable")
        sch.append((times[o], counts[o].astype(int)))
    run = simulate(
        arr,
        [p.spec for p in profs],
        [1] * len(profs),
        [batch[n] for n in order],
        [p.times[p.choices[0]] for p in profs],
        seed=seed,
        schedules=sch,
    )
    cpus = {m.name: m.cpus for m in models}
    grid = np.linspace(cut, end, 2000)
    mean_cpus = sum(cpus[n] * np.mean(c[np.searchsorted(t, grid, side="right") - 1]) for n, (t, c) in zip(order, sch))
    return run, mean_cpus, {n: int(sch[i][1].max()) for i, n in enumerate(order)}, batch


def run(args) -> list[dict]:
    from faro_serve.engine.inferline_plan import plan, profiles
    from faro_serve.engine.pipeline_des import StageSpec, simulate

    pipe = social_media(args.slo_ms)
    slo = pipe.slo_ms / 1e3
    arr = arrivals(Path(args.trace), args.job, args.day, args.start, args.minutes, args.peak, args.seed)
    cut = 60.0 * round(args.minutes * 0.25)
    sample, live = arr[arr < cut], arr[arr >= cut]
    profs = profiles(pipe, cpu_factors=(1.0, 2.0))
    t0 = time.perf_counter()
    il = plan(profs, sample, slo, pipe.percentile, seed=args.seed)
    plan_s = time.perf_counter() - t0
    if not il.feasible:
        raise SystemExit(f"InferLine's planner: infeasible ({il.reason})")
    rows = []
    specs = [p.spec for p in profs]
    cfg = [il.configs[s.name] for s in specs]
    run_il = simulate(
        live,
        specs,
        [c.replicas for c in cfg],
        [c.batch for c in cfg],
        [p.times[c.cpus] for p, c in zip(profs, cfg)],
        seed=args.seed,
    )
    rows.append(
        {
            "system": "InferLine",
            "cost": il.cost,
            "config": " ".join(f"{s.name}:{c.replicas}x b{c.batch} {c.cpus:g}c" for s, c in zip(specs, cfg)),
            "p99_ms": run_il.percentile(99) * 1e3,
            "miss": float(np.mean(run_il.latency_s > slo)),
        }
    )
    tr, mean_cpus, most, batch = tuned(pipe, arr, cut, args.minutes, args.activation_s, args.seed, args.replan_s)
    lv = arr >= cut
    rows.append(
        {
            "system": "InferLine + tuner",
            "cost": mean_cpus,
            "config": "most "
            + " ".join(f"{n}:{k}x b{batch[n]}" for n, k in most.items())
            + f" (mean CPUs; activation {args.activation_s:g} s"
            + (f", replan {args.replan_s:g} s)" if args.replan_s < 1e12 else ")"),
            "p99_ms": float(np.percentile(tr.latency_s[lv], 99)) * 1e3,
            "miss": float(np.mean(tr.latency_s[lv] > slo)),
        }
    )
    b, t, unit_cpus, units = coarse(pipe, profs, sample, slo)
    for name, u in units.items():
        r = simulate(live, [StageSpec("unit")], [u], [b], [_unit_times(pipe, profs, b)], seed=args.seed)
        rows.append(
            {
                "system": name,
                "cost": u * unit_cpus,
                "config": f"{u} units x b{b} ({t * 1e3:.0f} ms)",
                "p99_ms": r.percentile(99) * 1e3,
                "miss": float(np.mean(r.latency_s > slo)),
            }
        )
    for r in rows:
        r["x_cost"] = r["cost"] / rows[0]["cost"]
    rows.append({"plan_s": plan_s, "evaluations": il.evaluations, "sample": sample.size, "live": live.size})
    return rows


def _unit_times(pipe, profs, b: int) -> np.ndarray:
    """T(k) for k = 1..b: the coarse unit's time for a batch of k (see ``coarse``)."""
    order = [p.spec.name for p in profs]
    by = {p.spec.name: p for p in profs}
    cpus = {m.name: m.cpus for m in pipe.stage_models()}
    out = []
    for kk in range(1, b + 1):
        done: dict[str, float] = {}
        for n in order:
            p = by[n]
            k = max(1, math.ceil(kk * p.spec.fraction))
            t = p.times[cpus[n]]
            dt = t[k - 1] if len(t) >= k else k * t[0]
            done[n] = dt + max((done[order[i]] for i in p.spec.parents), default=0.0)
        out.append(max(done.values()))
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--job", default="job9", help="trace job (job9: the Twitter stream)")
    p.add_argument("--day", type=int, default=10)
    p.add_argument("--start", type=int, default=120, help="first minute of the window (120: the day's busy part)")
    p.add_argument("--minutes", type=int, default=120)
    p.add_argument("--peak", type=float, default=50.0, help="the day's busiest minute, queries/s")
    p.add_argument("--slo-ms", type=float, default=1000.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--activation-s",
        type=float,
        default=5.0,
        help="a tuner's new replica serves this long after the decision (paper: 5 s)",
    )
    p.add_argument(
        "--replan-s", type=float, default=1e12, help="the tuned policy re-plans this often (default: never, as Fig. 7)"
    )
    p.add_argument("--quick", action="store_true", help="40 minutes instead of --minutes")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes = 40
    *rows, meta = run(args)
    print(
        f"trace {Path(args.trace).name} {args.job} day {args.day} minutes {args.start}.."
        f"{args.start + args.minutes} peak {args.peak:g}/s, SLO {args.slo_ms:g} ms P99; "
        f"sample {meta['sample']} queries (first 25 %), live {meta['live']}; planner "
        f"{meta['evaluations']} DES runs in {meta['plan_s']:.1f} s"
    )
    print("| system | CPUs | x InferLine | live P99 ms | live miss % | configuration |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['system']} | {r['cost']:.1f} | {r['x_cost']:.2f} | {r['p99_ms']:.0f} | "
            f"{100 * r['miss']:.2f} | {r['config']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
