"""Faro's joint plan of a pipeline against faro-split's fixed equal split (issue 35;
docs/pipelines.md): per case, the replicas each plans with ample capacity (what meeting
the SLO costs), the end-to-end estimate of each allocation, and the split the joint plan
implies (each stage's share of its estimate). ``python -m bench.pipeline_plans``.
"""

from __future__ import annotations

import argparse

import numpy as np

from faro_serve.config import ClusterSpec
from faro_serve.engine import plan
from faro_serve.engine.pipeline_latency import compose, path_matrix
from faro_serve.pipelines import PipelineSLO

CASES = [  # (label, SLO ms, [(stage, processing ms, after)], entry rate req/s)
    ("fast a -> slow b", 250.0, [("a", 5.0, []), ("b", 100.0, ["a"])], 40.0),
    ("slow a -> fast b", 250.0, [("a", 100.0, []), ("b", 5.0, ["a"])], 40.0),
    ("balanced a -> b", 200.0, [("a", 50.0, []), ("b", 50.0, ["a"])], 60.0),
    ("3 stages 10/40/80 ms", 400.0, [("a", 10.0, []), ("b", 40.0, ["a"]), ("c", 80.0, ["b"])], 50.0),
    ("fan-out a -> (b, c)", 300.0, [("a", 20.0, []), ("b", 120.0, ["a"]), ("c", 30.0, ["a"])], 30.0),
]


def run_case(slo: float, stages, lam: float, cpus: float = 200.0) -> dict:
    p = PipelineSLO(
        name="p", slo_ms=slo, stages=[dict(name=n, processing_ms=ms, after=a, cpus=1) for n, ms, a in stages]
    )
    models = p.stage_models()
    cur = {m.name: 1 for m in models}
    cl = ClusterSpec(cpus=cpus, cold_start_s=0.0)
    joint = plan(models, {"p": lam}, cur, cl, pipelines=[p])
    split = plan(models, {m.name: lam for m in models}, cur, cl)
    local = {n: k for k, n in enumerate(p.stage_names)}
    paths = path_matrix([[local[n] for n in path] for path in p.paths()], len(local))
    e2e_split = float(compose(np.array([d.latency_ms for d in split.decisions]), paths))
    pd = joint.pipelines[0]
    return {
        "joint": joint.replicas,
        "split": split.replicas,
        "joint_ms": pd.latency_ms,
        "split_ms": e2e_split,
        "shares": {n: s["share"] for n, s in pd.stages.items()},
    }


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help; no options
    print(
        f"{'case':24s} {'joint replicas':>18s} {'e2e ms':>7s} {'split replicas':>18s} "
        f"{'e2e ms':>7s}  joint split of the SLO"
    )
    for label, slo, stages, lam in CASES:
        r = run_case(slo, stages, lam)

        def fmt(reps):
            return "/".join(str(v) for v in reps.values()) + f" ={sum(reps.values())}"

        shares = " ".join(f"{n} {s:.0%}" for n, s in r["shares"].items())
        print(
            f"{label:24s} {fmt(r['joint']):>18s} {r['joint_ms']:7.1f} {fmt(r['split']):>18s} "
            f"{r['split_ms']:7.1f}  {shares}  (SLO {slo:g} ms, {lam:g} req/s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
