"""Every registered policy simulated on one trace hour: a fingerprint to compare before and
after a refactoring that must not change behaviour (issue 33's target).

``python -m bench.policy_fingerprint --out before.json`` on the old commit, ``--out
after.json`` on the new one, then ``--compare before.json after.json``: identical field for
field, or the policies and fields that differ. Per policy: the summary (lost utility, SLO
violations, drops, per job), the decision counts, and a digest of the target and serving
replicas at every tick; batching policies also run in Sponge's batched setting (their
cores, batch sizes and latencies digested). Runs the fallback predictor (no training), so
it needs nothing but the shared traces.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "faro10_days1-10.csv"


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:16]


def fingerprint(trace: Path = TRACE, day: int = 10, minutes: int = 60, capacity: float = 24.0, seed: int = 0) -> dict:
    from autoscaler import make_policy, policy_names
    from autoscaler.catalogue.registry import needs_batching
    from faro_serve.config import Batching, ModelSLO, Variant
    from faro_serve.sim import simulate
    from faro_serve.sim.scenario import Scenario, run_scenario

    shape = Batching(gamma=0.75, eps=0.25, max_batch_size=8)
    VARIANTS = [
        Variant(name="resnet34", accuracy=73.3, processing_ms=154, batching=shape, load_s=20),
        Variant(name="resnet18", accuracy=69.8, processing_ms=90, batching=shape, load_s=15),
        Variant(name="resnet50", accuracy=76.1, processing_ms=210, batching=shape, load_s=25),
    ]

    profile = Path(__file__).resolve().parents[1] / "profiles" / "sponge-table1.json"
    plain = Scenario(trace=str(trace), day=day, sample=0, minutes=minutes).validate()
    batched = Scenario(
        trace=str(trace), day=day, sample=0, minutes=minutes, batching=Batching(profile=str(profile), max_batch_size=16)
    ).validate()
    out: dict = {
        "trace": trace.name,
        "day": day,
        "minutes": minutes,
        "capacity": capacity,
        "seed": seed,
        "policies": {},
    }
    loaded = plain.load()
    for name in policy_names():
        sc = batched if needs_batching(name) else plain
        out["policies"][name] = _row(run_scenario(sc, name, capacity, seed, loaded=loaded))
    # the other actuators in the multi-model simulator: batch sizes (Faro planning them with
    # the replicas) and variants (INFaaS switching them)
    res = run_scenario(batched, "faro-fairsum", capacity, seed, loaded=loaded)
    out["policies"]["faro-fairsum+batching"] = _row(res)
    names, counts, warm = loaded
    models = [ModelSLO(name=n, slo_ms=720, processing_ms=154, variants=VARIANTS) for n in names]
    pol = make_policy("infaas", models, plain.cluster(capacity))
    res = simulate(counts, models, pol, plain.sim_config(capacity, seed), warmup_history=warm)
    out["policies"]["infaas+variants"] = _row(res)
    out["batched"] = {
        **batched_fingerprint(profile, seed),
        **{
            f"resnet50/{k}": v
            for k, v in batched_fingerprint(profile.parent / "resnet50.json", seed, rate=10.0).items()
        },
    }
    return out


def _row(res) -> dict:
    row = res.to_dict(per_job=True)
    row.pop("wall_s", None)
    row["targets"] = _digest(res.targets)
    row["serving"] = _digest(res.serving)
    return row


def batched_fingerprint(profile: Path, seed: int = 0, rate: float = 20.0) -> dict:
    """Sponge and the static allocations in Sponge's own setting (the batched simulator),
    two minutes, with a saved profile."""
    from autoscaler.policies.sponge import SpongePolicy, static
    from faro_serve.config import Batching, ClusterSpec, ModelSLO
    from faro_serve.engine.batching import BatchProfile
    from faro_serve.sim.batched_runner import BatchedSetting, simulate_batched

    prof = BatchProfile.from_dict(json.loads(profile.read_text())["profile"])
    batching = Batching(gamma=prof.gamma, eps=prof.eps, delta=prof.delta, eta=prof.eta, max_batch_size=16)
    models = [
        ModelSLO(
            name="m",
            slo_ms=1000,
            processing_ms=min(float(prof.latency(1, 1)) * 1e3, 500),
            cpus=16,
            max_replicas=1,
            batching=batching,
        )
    ]
    cluster, profiles = ClusterSpec(cpus=16), {"m": prof}
    out = {}
    for pol in (
        SpongePolicy(models, cluster, profiles),
        static(16, models, cluster, profiles),
        static(8, models, cluster, profiles),
    ):
        b = simulate_batched(BatchedSetting(profile=prof, rate=rate, duration_s=120, seed=seed), pol)
        out[pol.name] = {
            **b.to_dict(),
            "cores": _digest(b.cores),
            "batch": _digest(b.batch),
            "latency": _digest(b.latency_s),
        }
    return out


def compare(a: dict, b: dict) -> list[str]:
    """The differences between two fingerprints, one line each (empty: identical)."""
    diffs = []
    for k in ("trace", "day", "minutes", "capacity", "seed"):
        if a.get(k) != b.get(k):
            diffs.append(f"setup {k}: {a.get(k)!r} != {b.get(k)!r}")
    runs = {**a["policies"], **{f"batched/{k}": v for k, v in a.get("batched", {}).items()}}
    runs_b = {**b["policies"], **{f"batched/{k}": v for k, v in b.get("batched", {}).items()}}
    for name in sorted(set(runs) | set(runs_b)):
        pa, pb = runs.get(name), runs_b.get(name)
        if pa is None or pb is None:
            diffs.append(f"{name}: only in {'after' if pa is None else 'before'}")
            continue
        for field in sorted(set(pa) | set(pb)):
            if pa.get(field) != pb.get(field):
                diffs.append(f"{name}.{field}: {json.dumps(pa.get(field))[:120]} != {json.dumps(pb.get(field))[:120]}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the fingerprint here (JSON)")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprints")
    p.add_argument("--trace", default=str(TRACE), help="the Faro trace CSV (default: shared/traces)")
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--capacity", type=float, default=24.0)
    args = p.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(f).read_text()) for f in args.compare)
        diffs = compare(a, b)
        print(
            "\n".join(diffs)
            if diffs
            else f"identical: {len(a['policies'])} policies and {len(a.get('batched', {}))} batched runs, every field"
        )
        return 1 if diffs else 0
    fp = fingerprint(Path(args.trace), minutes=args.minutes, capacity=args.capacity)
    text = json.dumps(fp, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text)
        print(f"{len(fp['policies'])} policies -> {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
