"""The GPU cluster scenario's bench (bench/gpu_cluster.py, issue 47) on a tiny input: its
replicas' curves, one short run of each kind of policy, and the report with its targets."""

import argparse

import numpy as np
import pytest

from bench.gpu_cluster import aggregate, report
from bench.gpu_cluster_sim import ARCHS, Run, curve, run_one, sharing_factor


def test_a_quarter_gpu_replica_is_slower_than_a_whole_one_and_never_past_the_gpus_ceiling():
    for arch in set(ARCHS):
        whole, quarter = curve(arch), curve(arch, 0.25)
        b = np.array([1, 8, 64, 128])
        assert np.all(quarter.latency(b) >= whole.latency(b) - 1e-12)
        best = max(float(x) for x in whole.throughput(np.array([1, 2, 4, 8, 16, 32, 64, 128])))
        assert np.all(quarter.throughput(b) <= best / 4 + 1e-6)  # four share one GPU
        assert 0 < sharing_factor(arch, 4, 8) <= sharing_factor(arch, 4, 1) <= 1


@pytest.mark.parametrize("policy", ["faro-batch1", "ray-tuned-b16", "inferline"])
def test_a_short_run_of_each_kind_sums_up(policy):
    """Three minutes at a tenth of the scenario's rate: the row's figures are the
    simulator's, every request accounted for."""
    row = run_one(Run(policy, 9, 0, 4, 10.0, 20.0, 2000, None, 120, 123, 0.25))
    assert row["requests"] > 1000 and 0 <= row["lost_cluster_utility"] <= 10
    assert 2.5 <= row["mean_gpus"] <= 4.0 and row["policy"] == policy
    args = argparse.Namespace(
        days="9",
        seeds="0",
        rate_scale=10.0,
        slo_ms=20.0,
        minutes="120-123",
        gpus_per_replica=0.25,
        gpus="4",
        batch1_gpus="4",
        few_gpus="4",
    )
    text = report(aggregate([row]), args, 1.0)
    assert policy in text and "Issue 47's targets" in text
