"""Sponge in its own setting, simulated (issue 20; docs/batching.md).

Usage: ``python -m bench.sponge_setting [--profile profiles/resnet50.json] [--seeds 3]
[--seconds 600] [--rate 20] [--slo-ms 1000]``

The setting of Sponge's section 4: one model, requests at a fixed 20 per second, an SLO of
1 s end to end, 200 KB images over a network of 0.5-7 MB/s that changes every second (a
stand-in for its 4G logs, ``faro_serve.sim.batched_runner.bandwidth_trace``), batches and
cores up to 16. Sponge against static 8 and 16 cores (batch still chosen each second).
The paper's claim: at most 0.3 % SLO violations with at least 20 % fewer cores than a
static 16. The model is the profile given (``faro-serve profile`` makes one); without
one, Sponge's Table 1 (a ResNet human detector) fitted here.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from autoscaler.policies.sponge import SpongePolicy, static
from faro_serve.config import Batching, ClusterSpec, ModelSLO
from faro_serve.engine.batching import BatchProfile, fit_profile
from faro_serve.sim.batched_runner import BatchedSetting, simulate_batched

# Sponge's Table 1: (cores, batch, P99 ms) of its ResNet human detector
TABLE_1 = [(1, 1, 55), (1, 2, 97), (2, 4, 94), (4, 8, 92), (8, 4, 37), (8, 8, 62)]


def load_profile(path: str | None) -> tuple[BatchProfile, str]:
    if path is None:
        c, b, ms = zip(*TABLE_1)
        return fit_profile(b, c, np.array(ms) / 1e3), "Sponge's Table 1 (ResNet human detector)"
    doc = json.loads(Path(path).read_text())
    return BatchProfile.from_dict(doc["profile"]), f"{doc.get('arch', path)} profiled here ({path})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None, help="a faro-serve profile JSON (default: Sponge's Table 1)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--slo-ms", type=float, default=1000.0)
    args = ap.parse_args(argv)
    prof, source = load_profile(args.profile)
    print(
        f"model: {source}: gamma {prof.gamma * 1e3:.2f} ms, eps {prof.eps * 1e3:.2f} ms, "
        f"delta {prof.delta * 1e3:.2f} ms, eta {prof.eta * 1e3:.2f} ms (R^2 {prof.r2:.3f})"
    )
    models = [
        ModelSLO(
            name="m",
            slo_ms=args.slo_ms,
            processing_ms=min(float(prof.latency(1, 1)) * 1e3, args.slo_ms / 2),
            cpus=16,
            max_replicas=1,
            batching=Batching(gamma=prof.gamma, eps=prof.eps, delta=prof.delta, eta=prof.eta, max_batch_size=16),
        )
    ]
    cluster, profiles = ClusterSpec(cpus=16), {"m": prof}
    rows: dict[str, list] = {}
    for seed in range(args.seeds):
        setting = BatchedSetting(
            profile=prof, slo_s=args.slo_ms / 1e3, rate=args.rate, duration_s=args.seconds, seed=seed
        )
        for pol in (
            SpongePolicy(models, cluster, profiles),
            static(16, models, cluster, profiles),
            static(8, models, cluster, profiles),
        ):
            r = simulate_batched(setting, pol)
            rows.setdefault(pol.name, []).append(r)
    print(
        f"{args.rate:g} req/s, SLO {args.slo_ms:g} ms, {args.seconds} s, {args.seeds} seeds "
        "(mean over seeds; network 0.5-7 MB/s, 200 KB)"
    )
    print("| policy | SLO violations | mean cores | cores vs static 16 | p99 ms | mean batch |")
    print("|---|---:|---:|---:|---:|---:|")
    base = np.mean([r.mean_cores for r in rows["static-16"]])
    for name, rs in rows.items():
        v = np.mean([r.slo_violation_rate for r in rs])
        c = np.mean([r.mean_cores for r in rs])
        print(
            f"| {name} | {v * 100:.2f} % | {c:.2f} | {(c / base - 1) * 100:+.0f} % | "
            f"{np.mean([r.p99_ms for r in rs]):.0f} | {np.mean([r.batch.mean() for r in rs]):.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
