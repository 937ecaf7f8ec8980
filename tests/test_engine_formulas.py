"""Every formula of the engine against hand-computed values (paper sections 3.1-3.4)."""

import math

import numpy as np
import pytest

from faro_serve.engine import (
    cluster_objective,
    effective_utility,
    erlang_b,
    erlang_c,
    latency_mdc,
    latency_relaxed,
    latency_upper,
    min_replicas_for_slo,
    mmc_wait_quantile,
    penalty_relaxed,
    penalty_step,
    phi,
    utility_relaxed,
    utility_step,
)
from faro_serve.engine.latency import EST_MDC, EST_MDC_EXACT, EST_UPPER, latency_row, rho_max_factors
from faro_serve.engine.window import cold_start_fractions, step_utility_table, window_table


# --- Erlang and M/M/c ---------------------------------------------------------------
def test_erlang_b_and_c_hand_values():
    # B(3, 2) = (8/6) / (1 + 2 + 2 + 8/6) = 4/19; C = B / (1 - rho (1 - B)) = 4/9
    assert erlang_b(3, 2.0) == pytest.approx(4 / 19)
    assert erlang_c(3, 2.0) == pytest.approx(4 / 9)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = rho
    assert erlang_c(4, 4.0) == 1.0  # unstable
    assert erlang_c(3, 0.0) == 0.0


def test_mm1_wait_quantile_hand_value():
    # lambda 5, p 0.1 (mu 10): P(W > t) = 0.5 exp(-5 t); 99th percentile = ln(50) / 5
    assert mmc_wait_quantile(1, 5.0, 0.1, 0.99) == pytest.approx(math.log(50) / 5)
    # P(wait) below the tail -> the percentile waits zero
    assert mmc_wait_quantile(1, 0.05, 0.1, 0.99) == 0.0
    assert math.isinf(mmc_wait_quantile(2, 20.0, 0.1, 0.99))


def test_mdc_is_processing_plus_half_mmc_wait():
    assert latency_mdc(1, 5.0, 0.1, 0.99) == pytest.approx(0.1 + 0.5 * math.log(50) / 5)
    assert latency_mdc(3, 0.0, 0.2, 0.99) == pytest.approx(0.2)
    assert math.isinf(latency_mdc(2, 10.0, 0.2, 0.99))  # rho = 1


def test_upper_bound_estimator():
    assert latency_upper(10, 40.0, 0.15) == pytest.approx(0.6)
    assert latency_upper(9, 40.0, 0.15) == pytest.approx(0.15 * 40 / 9)
    assert latency_upper(10, 1.0, 0.15) == pytest.approx(0.15)  # never below p
    assert math.isinf(latency_upper(0, 1.0, 0.15))


def test_paper_example_8_vs_10():
    """Paper 3.3: p = 150 ms, lambda = 40/s, SLO 600 ms at p99.99 -> M/D/c 8, upper bound 10."""
    assert min_replicas_for_slo(40, 0.15, 0.6, 0.9999, "mdc")[0] == 8
    assert min_replicas_for_slo(40, 0.15, 0.6, 0.9999, "upper")[0] == 10


def test_relaxed_latency_beyond_rho_max():
    p, q, rho_max, c = 0.1, 0.99, 0.95, 4
    lam_r = rho_max * c / p  # 38 req/s
    for lam in (39.0, 40.0, 60.0, 200.0):  # unstable or beyond rho_max
        expect = lam / lam_r * latency_mdc(c, lam_r, p, q)
        assert latency_relaxed(c, lam, p, q, rho_max) == pytest.approx(expect)
    # identical below rho_max, continuous at it, and strictly increasing past it (no plateau)
    assert latency_relaxed(c, 20.0, p, q, rho_max) == latency_mdc(c, 20.0, p, q)
    assert latency_relaxed(c, lam_r * (1 + 1e-9), p, q, rho_max) == pytest.approx(latency_mdc(c, lam_r, p, q), rel=1e-6)
    assert latency_relaxed(c, 100.0, p, q, rho_max) < latency_relaxed(c, 101.0, p, q, rho_max)


@pytest.mark.parametrize("est", [EST_MDC, EST_MDC_EXACT, EST_UPPER])
@pytest.mark.parametrize("lam", [0.0, 3.0, 17.5, 80.0])
def test_vectorised_row_matches_scalar_estimators(est, lam):
    p, q, rho_max, cmax = 0.154, 0.99, 0.95, 30
    row = np.empty(cmax + 1)
    latency_row(lam, p, q, rho_max, est, rho_max_factors(cmax, q, rho_max), row)
    for c in range(cmax + 1):
        if est == EST_UPPER:
            expect = latency_upper(c, lam, p)
        elif est == EST_MDC_EXACT:
            expect = latency_mdc(c, lam, p, q) if c > 0 else math.inf
        else:
            expect = latency_relaxed(c, lam, p, q, rho_max)
        if math.isinf(expect):
            assert math.isinf(row[c])
        else:
            assert row[c] == pytest.approx(expect, rel=1e-9)


# --- utilities, penalty, objectives ------------------------------------------------
def test_utilities():
    assert utility_step([0.4, 0.5, 0.6, math.inf], 0.5).tolist() == [1, 1, 0, 0]
    assert utility_relaxed(1.0, 0.5).item() == pytest.approx(0.5)
    assert utility_relaxed(1.0, 0.5, alpha=2).item() == pytest.approx(0.25)
    assert utility_relaxed(0.3, 0.5).item() == 1.0
    assert utility_relaxed(math.inf, 0.5).item() == 0.0


def test_penalty_steps_aws_table():
    avail = [1.0, 0.995, 0.99, 0.97, 0.95, 0.93, 0.90, 0.85, 0.0]
    assert penalty_step(avail).tolist() == [0, 0, 0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0]


def test_relaxed_penalty_is_piecewise_linear_through_the_table_points():
    assert penalty_relaxed([1.0, 0.99, 0.95, 0.90, 0.5, 0.0]).tolist() == pytest.approx([0, 0.25, 0.5, 1, 1, 1])
    assert penalty_relaxed(0.995).item() == pytest.approx(0.125)
    assert penalty_relaxed(0.97).item() == pytest.approx(0.375)
    assert penalty_relaxed(0.925).item() == pytest.approx(0.75)
    a = np.linspace(0, 1, 1001)
    assert np.all(penalty_relaxed(a) >= penalty_step(a) - 1e-12)  # never understates
    assert np.all(np.diff(penalty_relaxed(a[a >= 0.9])) < 0)  # every drop costs: no plateau


def test_phi_and_effective_utility():
    assert phi(0.03, relaxed=False).item() == pytest.approx(0.75)
    assert phi(0.03).item() == pytest.approx(1 - 0.375)
    assert phi(0.0).item() == 1.0 and phi(0.005).item() < 1.0
    assert effective_utility(0.8, 0.07, relaxed=False).item() == pytest.approx(0.8 * 0.5)


def test_five_objectives_hand_values():
    u, pri = [1.0, 0.5, 0.8], [1.0, 2.0, 1.0]
    assert cluster_objective("sum", u, pri) == pytest.approx(2.8)
    assert cluster_objective("penalty_sum", u, pri) == pytest.approx(2.8)
    assert cluster_objective("fair", u) == pytest.approx(-0.5)
    assert cluster_objective("fair", u, fair_tiebreak=0.1) == pytest.approx(-0.5 + 0.1 * 2.3 / 3)
    assert cluster_objective("fair_sum", u, pri) == pytest.approx(2.8 - 3 * 0.5)  # gamma = jobs
    assert cluster_objective("penalty_fair_sum", u, pri, gamma=1.0) == pytest.approx(2.3)
    with pytest.raises(ValueError, match="unknown objective"):
        cluster_objective("max", u)


# --- window objective with cold start ------------------------------------------------
def test_cold_start_fractions():
    f = cold_start_fractions(7, 420.0, 65.0)
    assert f.tolist() == pytest.approx([0.0, 55 / 60, 1, 1, 1, 1, 1])
    assert cold_start_fractions(7, 420.0, 0.0).tolist() == [1.0] * 7


def test_window_utility_counts_added_replicas_only_after_cold_start():
    rates = np.full((4, 7), 20.0)  # 20 req/s, p 0.1 -> 1 replica is overloaded
    steps = step_utility_table(rates, 0.1, 0.99, 0.5, 1.0, 0.95, EST_MDC, 6, np.array([0.0]))
    frac = cold_start_fractions(7, 420.0, 65.0)
    w = window_table(steps, 1, frac)[0]
    u = steps[0, 0]  # steady-state utility per count (rates constant over steps)
    assert w[1] == pytest.approx(u[1])  # no change: plain mean
    expect5 = np.mean((1 - frac) * u[1] + frac * u[5])
    assert w[5] == pytest.approx(expect5)
    assert u[5] == 1.0 and w[5] < 1.0  # the first 65 s still run one replica
    # scale-down acts at once: starting from 6 replicas, 4 counts fully
    assert window_table(steps, 6, frac)[0][4] == pytest.approx(u[4])


@pytest.mark.parametrize("estimator", ["mdc", "upper"])
def test_tables_end_at_saturation_without_changing_a_value(estimator):
    """build_problem tabulates a job only up to the count where every sample meets the SLO;
    every lookup up to the job's ceiling equals the full-width table."""
    from faro_serve.engine.latency import ESTIMATORS
    from faro_serve.engine.problem import JobInput, build_problem

    rng = np.random.default_rng(5)
    jobs = [
        JobInput(
            name=f"j{i}",
            rates=np.abs(rng.normal(rng.uniform(0, 40), 5, size=(10, 3))),
            proc_s=p,
            slo_s=p * f,
            quantile=q,
            priority=1.0,
            cpus=1.0,
            memory_gb=1.0,
            min_replicas=lo,
            max_replicas=100,
            current=cur,
            can_drop=drop,
        )
        for i, (p, f, q, lo, cur, drop) in enumerate(
            [
                (0.15, 4.7, 0.99, 1, 0, True),
                (0.05, 1.3, 0.999, 2, 30, True),
                (0.3, 2.0, 0.9, 1, 3, False),
                (0.02, 1.1, 0.99, 5, 1, True),
            ]
        )
    ]
    prob = build_problem(
        jobs,
        cap_cpus=60,
        cap_mem=None,
        kind="penalty_sum",
        gamma=4.0,
        alpha=1.0,
        rho_max=0.95,
        estimator=estimator,
        window_s=420,
        cold_start_s=65,
        fair_tiebreak=0.0,
    )
    assert prob.tables.shape[2] < max(j.max_replicas for j in prob.jobs) + 1  # it did truncate
    frac = cold_start_fractions(3, 420, 65)
    for i, j in enumerate(prob.jobs):
        grid = prob.drop_grid if j.can_drop else np.array([0.0])
        cmax = max(j.max_replicas, j.current)
        full = window_table(
            step_utility_table(
                np.ascontiguousarray(j.rates),
                j.proc_s,
                j.quantile,
                j.slo_s,
                1.0,
                0.95,
                ESTIMATORS[estimator],
                cmax,
                grid,
            ),
            j.current,
            frac,
        )
        for c in range(cmax + 1):
            x = np.zeros(prob.n)
            x[i] = c
            for di, dv in enumerate(grid):
                assert prob.utilities(x, np.full(prob.n, dv))[i] == full[di, c]
