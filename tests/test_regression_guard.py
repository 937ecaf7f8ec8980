"""The regression guard: on a bundled slice of real trace minutes where the capacity binds,
Faro-FairSum loses less utility than FairShare and AIAD in the simulator. Fast (a few
seconds), so any change that makes Faro lose to the simplest baselines fails the suite."""

from pathlib import Path

import numpy as np
import pytest

from autoscaler import make_policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import min_replicas_for_slo
from faro_serve.sim import SimConfig, simulate
from faro_serve.traces import load_trace

SLICE = Path(__file__).parent / "data" / "guard_day9.csv"  # provenance: data/README.md
CAPACITY = 24
WARMUP = 30


@pytest.fixture(scope="module")
def workload():
    tr = load_trace(SLICE, days=9, sample=0)
    models = [ModelSLO(name=n, slo_ms=720, processing_ms=154) for n in tr.names]
    return tr, models


def test_the_capacity_binds_on_the_slice(workload):
    tr, models = workload
    busiest = tr.counts[:, WARMUP:].sum(axis=0).argmax()
    need = sum(min_replicas_for_slo(c / 60.0, 0.154, 0.72, 0.99)[0] for c in tr.counts[:, WARMUP + busiest])
    assert need > CAPACITY


@pytest.mark.parametrize("seed", [0, 1])
def test_faro_fairsum_loses_less_than_fairshare_and_aiad(workload, seed, report):
    tr, models = workload
    lost = {}
    for name in ("faro-fairsum", "fairshare", "aiad"):
        pol = make_policy(name, models, ClusterSpec(cpus=CAPACITY))
        res = simulate(
            tr.counts[:, WARMUP:],
            models,
            pol,
            SimConfig(capacity_cpus=CAPACITY, seed=seed),
            warmup_history=tr.counts[:, :WARMUP],
        )
        lost[name] = res.to_dict()["lost_cluster_utility"]
    report(f"regression guard (day 9 minutes 30-149, 10 jobs, {CAPACITY} replicas, seed {seed}): lost utility {lost}")
    assert np.isfinite(list(lost.values())).all()
    assert lost["faro-fairsum"] < lost["fairshare"] and lost["faro-fairsum"] < lost["aiad"], lost
