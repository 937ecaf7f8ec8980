"""bench/oracle_bounds.py: the oracle told the noise-free future (issue 32's 100-job bound)
plans as the oracle when there is no noise, and draws a copy's noise law when there is; the
trend oracle draws each job's swings about its future trend."""

import numpy as np

from bench.oracle_bounds import BoundOracle, TrendOracle, bounds, swings_of, trend_of
from faro_serve.sim.scenario import Scenario


def trace(tmp_path):
    t = np.arange(40)
    rows = [
        f"{m},{job},{int(base + amp * np.sin(m / 5))}\n"
        for m in t
        for job, base, amp in (("a", 600, 300), ("b", 300, 100))
    ]
    p = tmp_path / "t.csv"
    p.write_text("minute,job,requests\n" + "".join(rows))
    return str(p)


def test_without_noise_both_bounds_are_the_oracle(tmp_path):
    sc = Scenario(trace=trace(tmp_path), n_jobs=4, jitter=0.0, warmup_minutes=0).validate()
    r = bounds(sc, 12, seed=0)
    assert r["oracle"] > 0  # a contended run, so a misplaced minute would show
    assert r["smooth-oracle"] == r["oracle"] == r["noisy-oracle"]


def test_a_copys_forecast_is_its_noise_free_future_with_the_noise_law(tmp_path):
    sc = Scenario(trace=trace(tmp_path), n_jobs=4, jitter=0.1, warmup_minutes=0).validate()
    names, counts, _ = sc.load()
    clean = Scenario(trace=sc.trace, n_jobs=4, jitter=0.0, warmup_minutes=0).validate()
    _, smooth, _ = clean.load()
    assert names == ["a", "b", "a-1", "b-1"] and not np.allclose(counts[2:], smooth[2:])
    assert np.allclose(counts[:2], smooth[:2])  # the originals carry no noise
    ratio = counts[2:] / np.maximum(smooth[2:], 1e-9)  # the copies: the same shifts, noise alone
    assert ratio.min() > 0.5 and ratio.max() < 1.5 and 0.02 < np.abs(ratio - 1).mean() < 0.2
    pol = BoundOracle(
        sc.models(names), sc.cluster(12), dict(zip(names, smooth)), 0.1, n_samples=4000, name="noisy-oracle"
    )

    class Obs:
        now, models = 600.0, {n: None for n in names}

    fc = pol.forecast(Obs, seed=1)
    h = fc.samples.shape[2]
    want = smooth[:, 10 : 10 + h] / 60.0
    assert fc.samples.shape == (4, 4000, h)
    assert np.allclose(fc.samples[:2], want[:2, None, :])  # originals: the future itself
    assert np.allclose(fc.samples[2:].mean(1), want[2:], rtol=0.01)
    assert np.allclose(fc.samples[2:].std(1), 0.1 * want[2:], rtol=0.1)
    assert np.array_equal(pol.forecast(Obs).samples, pol.forecast(Obs).samples)  # seeded


def test_trend_is_the_centred_mean_and_swings_are_the_minutes_over_it():
    row = np.array([0.0, 3.0, 6.0, 3.0, 0.0, 0.0])
    assert np.allclose(trend_of(row, 3), [1.0, 3.0, 4.0, 3.0, 1.0, 0.0])  # ends: edge-padded
    assert np.array_equal(trend_of(row, 1), row)
    assert np.allclose(swings_of(row, trend_of(row, 3)), [0.0, 1.0, 1.5, 1.0, 0.0])  # not where 0
    assert np.array_equal(swings_of(np.zeros(3), np.zeros(3)), [1.0])


def test_the_trend_oracle_draws_each_jobs_swings_about_its_future_trend(tmp_path):
    sc = Scenario(trace=trace(tmp_path), n_jobs=4, jitter=0.1, warmup_minutes=0).validate()
    names, _, _ = sc.load()
    _, smooth, _ = Scenario(trace=sc.trace, n_jobs=4, jitter=0.0, warmup_minutes=0).validate().load()
    table = dict(zip(names, smooth))
    trend = {n: trend_of(r, 5) for n, r in table.items()}
    swings = {n: swings_of(table[n], trend[n]) for n in names}
    pol = TrendOracle(sc.models(names), sc.cluster(12), trend, swings, 0.1, n_samples=4000, name="trend-oracle")

    class Obs:
        now, models = 600.0, {n: None for n in names}

    fc = pol.forecast(Obs, seed=1)
    h = fc.samples.shape[2]
    want = np.stack([trend[n][10 : 10 + h] for n in names]) / 60.0
    ratio = fc.samples[0] / want[0]  # an original: its trend times its own swings, no noise
    assert np.isin(np.round(ratio, 9), np.round(swings["a"], 9)).all()
    assert np.allclose(fc.samples.mean(1), want * np.array([swings[n].mean() for n in names])[:, None], rtol=0.03)
    assert fc.samples[2].std() > 0 and np.array_equal(pol.forecast(Obs, seed=1).samples, fc.samples)
    # told the minutes themselves (a 1-minute trend) and no noise: the future as one point
    exact = TrendOracle(
        sc.models(names), sc.cluster(12), table, {n: swings_of(table[n], table[n]) for n in names}, 0.0, n_samples=3
    )
    assert np.allclose(exact.forecast(Obs).samples, (smooth[:, 10 : 10 + h] / 60.0)[:, None, :])


def test_bounds_report_the_trend_oracle_when_asked(tmp_path):
    sc = Scenario(trace=trace(tmp_path), n_jobs=4, jitter=0.1, warmup_minutes=0).validate()
    assert set(bounds(sc, 12, seed=0, trend_minutes=0)) == {"oracle", "noisy-oracle", "smooth-oracle"}
    r = bounds(sc, 12, seed=0, trend_minutes=5)
    assert set(r) == {"oracle", "noisy-oracle", "smooth-oracle", "trend-oracle"}
    assert r["trend-oracle"] >= 0 and np.isfinite(r["trend-oracle"])
