"""Sponge's latency model, its fit, EDF order and its choice of cores and batch (issue 20)."""

import math

import numpy as np
import pytest

from faro_serve.engine.batching import BatchProfile, edf_order, fit_profile, meets_budgets, sponge_choice

TRUE = BatchProfile(gamma=0.040, eps=0.012, delta=0.003, eta=0.008)


def grid(profile, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    b, c = np.meshgrid([1, 2, 4, 8, 16], [1, 2, 4, 8])
    lat = profile.latency(b, c) * (1 + noise * rng.standard_normal(b.shape))
    return b.ravel(), c.ravel(), lat.ravel()


def test_the_fit_recovers_known_parameters():
    f = fit_profile(*grid(TRUE))
    for k in ("gamma", "eps", "delta", "eta"):
        assert getattr(f, k) == pytest.approx(getattr(TRUE, k), rel=1e-6, abs=1e-9)
    assert f.r2 == pytest.approx(1.0) and f.points == 20
    noisy = fit_profile(*grid(TRUE, noise=0.03, seed=4))
    assert noisy.gamma == pytest.approx(TRUE.gamma, rel=0.1) and noisy.r2 > 0.98
    assert BatchProfile.from_dict(noisy.to_dict()) == noisy


def test_the_fit_refuses_what_cannot_be_fitted():
    with pytest.raises(ValueError, match="2 batch sizes and 2 core counts"):
        fit_profile([1, 1, 1], [1, 2, 4], [0.1, 0.06, 0.04])
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_profile([1, 2], [1, 2], [0.1, -1])
    with pytest.raises(ValueError, match="differ in length"):
        fit_profile([1, 2], [1, 2], [0.1])
    with pytest.raises(ValueError, match="not a batch profile"):
        BatchProfile.from_dict({"gamma": 1})
    with pytest.raises(ValueError, match=">= 0"):
        BatchProfile(-1, 0, 0, 0.1)


def test_edf_takes_the_tightest_first_and_keeps_arrival_order_on_ties():
    assert edf_order([3.0, 1.0, 2.0, 1.0]).tolist() == [1, 3, 2, 0]


def test_budgets_are_checked_batch_by_batch_in_edf_order():
    p = BatchProfile(gamma=0.1, eps=0.0, delta=0.0, eta=0.0)  # l(b, c) = 0.1 b / c
    # batches of 2 on 1 core take 0.2 s: the 1st and 2nd end at 0.2, the 3rd at 0.4
    assert meets_budgets(p, 2, 1, [0.4, 0.2, 0.2])
    assert not meets_budgets(p, 2, 1, [0.2, 0.2, 0.3])
    assert meets_budgets(p, 2, 2, [0.2, 0.2, 0.2])  # 2 cores halve it: 0.1, 0.1, 0.2
    assert meets_budgets(p, 4, 1, [])


def test_sponge_takes_the_fewest_cores_then_the_smallest_batch():
    p = BatchProfile(gamma=0.05, eps=0.02, delta=0.001, eta=0.01)
    # nothing queued, 15 req/s: 1 core serves b / (0.051 b + 0.03) >= 15 from b = 2
    ch = sponge_choice(p, [], 15.0)
    assert (ch.cores, ch.batch, ch.feasible) == (1, 2, True)
    assert p.throughput(1, 1) < 15 <= p.throughput(2, 1)
    # a tight queue needs more cores: 6 requests due within 0.1 s
    ch = sponge_choice(p, [0.1] * 6, 10.0)
    assert ch.feasible and ch.cores > 1
    assert meets_budgets(p, ch.batch, ch.cores, [0.1] * 6)
    assert not any(meets_budgets(p, b, ch.cores - 1, [0.1] * 6) for b in range(1, 17))
    # impossible (a budget below the serial part): the most cores, the best batch there
    ch = sponge_choice(p, [0.005], 10.0)
    best = int(np.argmax(p.throughput(np.arange(1, 17), 16))) + 1
    assert (ch.cores, ch.batch, ch.feasible) == (16, best, False)
    assert not math.isnan(p.latency(best, 16))


# ------------------------------------------------------------------ the batched kernel


def _run_batched(arr, budgets, batch, cores, prof, replicas=1, net=None, limit=1000, jitter=None):
    from faro_serve.sim.batched import advance_batched

    arr = np.asarray(arr, dtype=float)
    n = arr.size
    net = np.zeros(n) if net is None else np.asarray(net, dtype=float)
    jitter = np.ones(n) if jitter is None else np.asarray(jitter, dtype=float)
    start, lat, status = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=np.int64)
    hkey, hidx = np.empty(n + 1), np.empty(n + 1, dtype=np.int64)
    out = advance_batched(
        0.0,
        1e9,
        arr,
        arr + np.asarray(budgets, dtype=float),
        net,
        jitter,
        np.zeros(n),
        start,
        lat,
        status,
        0,
        n,
        hkey,
        hidx,
        0,
        np.zeros(replicas),
        batch,
        float(cores),
        np.asarray(prof, dtype=float),
        limit,
    )
    return start, lat, status, out


def test_a_freed_replica_takes_what_waits_as_one_batch():
    # l(b, 1) = 0.1 b: the first request runs alone; the three that came meanwhile go together
    start, lat, status, (nxt, nq, n_arr, n_drop, batches) = _run_batched(
        [0.0, 0.01, 0.02, 0.03], [1.0] * 4, 4, 1, (0.1, 0, 0, 0)
    )
    assert status.tolist() == [1, 1, 1, 1] and (nxt, nq, n_arr, n_drop, batches) == (4, 0, 4, 0, 2)
    np.testing.assert_allclose(lat, [0.1, 0.39, 0.38, 0.37])
    np.testing.assert_allclose(start, [0.0, 0.1, 0.1, 0.1])
    # batch 2: the three waiting go as 2 then 1; cores divide the parallel part
    _, lat, _, (*_, batches) = _run_batched([0.0, 0.01, 0.02, 0.03], [1.0] * 4, 2, 2, (0.1, 0, 0, 0))
    np.testing.assert_allclose(lat, [0.05, 0.14, 0.13, 0.17])
    assert batches == 3


def test_the_queue_is_earliest_deadline_first():
    # while the first request runs, three wait: the tightest budget goes next
    start, lat, _, _ = _run_batched([0.0, 0.01, 0.02, 0.03], [1.0, 0.9, 0.3, 0.6], 1, 1, (0, 0, 0, 0.1))
    assert np.argsort(start[1:]).tolist() == [1, 2, 0]  # request 2 (0.3), then 3 (0.6), then 1
    # network time counts in the latency, not in the server's order
    _, lat2, _, _ = _run_batched([0.0], [1.0], 1, 1, (0, 0, 0, 0.1), net=[0.25])
    assert lat2[0] == pytest.approx(0.35)


def test_batch_one_is_the_unbatched_kernel():
    from faro_serve.sim.kernels import advance

    rng = np.random.default_rng(3)
    arr = np.cumsum(rng.exponential(1 / 21, 3000))  # just past saturation: tail-drops
    jitter = rng.lognormal(0, 0.2, arr.size)
    _, lat_b, st_b, _ = _run_batched(arr, np.ones(arr.size), 1, 1, (0, 0, 0, 0.05), replicas=1, jitter=jitter, limit=50)
    n = arr.size
    start, lat, status = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=np.int64)
    advance(
        0.0,
        1e9,
        arr,
        0.05 * jitter,
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        0,
        n,
        np.zeros(n, dtype=np.int64),
        0,
        0,
        np.zeros(1),
        np.zeros(1),
        0.0,
        50,
    )
    assert (st_b == status).all() and (status == 3).sum() > 0  # the same tail-drops too
    np.testing.assert_allclose(lat_b[status == 1], lat[status == 1])


# ------------------------------------------------------------------ Sponge, simulated


def test_sponge_in_its_own_setting_saves_cores_and_meets_the_budgets():
    """The paper's section 4 setting, shortened: 20 req/s at a fixed rate, SLO 1 s, 200 KB
    images over a 0.5-7 MB/s network. A model costing about 0.4 s per image on one core:
    8 static cores cannot keep up, 16 can; Sponge meets the SLO with far fewer."""
    from autoscaler.policies.sponge import SpongePolicy, static
    from faro_serve.config import Batching, ClusterSpec, ModelSLO
    from faro_serve.sim.batched_runner import BatchedSetting, simulate_batched

    prof = BatchProfile(gamma=0.4, eps=0.02, delta=0.004, eta=0.02)
    batching = Batching(gamma=0.4, eps=0.02, delta=0.004, eta=0.02, max_batch_size=16)
    models = [ModelSLO(name="m", slo_ms=1000, processing_ms=400, cpus=16, max_replicas=1, batching=batching)]
    cluster, profiles = ClusterSpec(cpus=16), {"m": prof}
    setting = BatchedSetting(profile=prof, duration_s=180, seed=1)
    sponge = simulate_batched(setting, SpongePolicy(models, cluster, profiles))
    s16 = simulate_batched(setting, static(16, models, cluster, profiles))
    s8 = simulate_batched(setting, static(8, models, cluster, profiles))
    assert sponge.requests == s16.requests == 3600 and 0.02 < sponge.network_s.min() < sponge.network_s.max() < 0.45
    assert s8.slo_violation_rate > 0.5 and s16.slo_violation_rate == 0.0
    assert sponge.slo_violation_rate <= 0.003 and sponge.mean_cores <= 0.8 * s16.mean_cores
    assert 1 < sponge.batch.max() <= 16 and len(set(sponge.cores.tolist())) > 1  # it adapts
    with pytest.raises(ValueError, match="no batch profile for m"):
        SpongePolicy(models, cluster, {})


# ------------------------------------------------------------------ the profile command


@pytest.mark.slow
def test_profile_command_measures_on_ray_serve_fits_and_saves(tmp_path, capsys):
    import json

    from faro_serve.cli import main

    rc = main(
        [
            "profile",
            "--arch",
            "resnet18",
            "--batches",
            "1,8",
            "--threads",
            "1,2",
            "--repeats",
            "3",
            "--image-size",
            "96",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "resnet18.json").read_text())
    prof = BatchProfile.from_dict(doc["profile"])
    assert len(doc["rows"]) == 12 and prof.points == 4 and doc["machine"]["cores"] >= 1
    # the saved profile is the fit of what was measured (the per-point medians of the saved
    # rows, fitted again here), and a batch of 8 costs more than 1 (eight times the
    # arithmetic). How well the fit predicts is not asserted here: on a busy 2-core machine
    # the 2-thread points are noise (a fit of R^2 0.1 once came out of a run beside a
    # profiler); the fit's accuracy on known curves is test_the_fit_recovers_known_parameters
    med = {
        (b, c): np.median([r["latency_s"] for r in doc["rows"] if (r["batch"], r["threads"]) == (b, c)])
        for b in (1, 8)
        for c in (1, 2)
    }
    assert med[(8, 1)] > med[(1, 1)]
    again = fit_profile([b for b, _ in med], [c for _, c in med], list(med.values()))
    for f in ("gamma", "eps", "delta", "eta", "r2"):
        assert getattr(prof, f) == pytest.approx(getattr(again, f), rel=1e-6, abs=1e-12), f
    assert "resnet18: gamma" in capsys.readouterr().out
    assert doc["device"] == "cpu" and {r["device"] for r in doc["rows"]} == {"cpu"}
    assert main(["profile", "--batches", "1"]) == 2  # one batch size cannot be fitted


@pytest.mark.slow  # a local Ray cluster
def test_profile_of_a_users_batching_deployment_times_its_batches(tmp_path, capsys, monkeypatch):
    """``faro-serve profile --deployment``: a user's @serve.batch deployment by import path,
    deployed under Faro, each batch size set through the meter and timed by Faro's timer
    around the user's batched function: its known curve (20 ms + 2 ms a request) comes back,
    and the saved file is a batching profile an SLO takes."""
    import json

    from conftest import ROOT

    from faro_serve.cli import main
    from faro_serve.config import Batching

    monkeypatch.chdir(ROOT)  # the user's package imports from here, as for a user
    rc = main(
        [
            "profile",
            "--deployment",
            "tests.user_apps.batcher:Batcher",
            "--init-kwargs",
            '{"base_s": 0.02, "per_item_s": 0.002}',
            "--batches",
            "1,4,16",
            "--repeats",
            "3",
            "--cpus",
            "0.5",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0, capsys.readouterr()
    doc = json.loads((tmp_path / "batcher.json").read_text())
    got = {r["batch"]: r["latency_s"] for r in doc["rows"]}
    assert set(got) == {1, 4, 16} and all(r["batches"] >= 3 for r in doc["rows"])
    for b, t in got.items():  # the sleep, and some ms of asyncio around it (a busy machine)
        assert 0.02 + 0.002 * b <= t <= 0.02 + 0.002 * b + 0.03, (b, t)
    shape = Batching(profile=str(tmp_path / "batcher.json"), max_batch_size=16).shape()
    assert shape[16] == pytest.approx(got[16] / got[1], rel=1e-6)
    assert doc["hinge"]["r2"] > 0.99 and "hinge fit" in capsys.readouterr().out
    assert main(["profile", "--deployment", "tests.user_apps.shop:Tag", "--out", str(tmp_path)]) == 2
    assert "no @serve.batch method" in capsys.readouterr().err
