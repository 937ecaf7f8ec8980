"""bench/oracle_bounds.py: the oracle told the noise-free future (issue 32's 100-job bound)
plans as the oracle when there is no noise, and draws a copy's noise law when there is."""
import numpy as np

from bench.oracle_bounds import BoundOracle, bounds
from faro_serve.sim.scenario import Scenario


def trace(tmp_path):
    t = np.arange(40)
    rows = [f"{m},{job},{int(base + amp * np.sin(m / 5))}\n"
            for m in t for job, base, amp in (("a", 600, 300), ("b", 300, 100))]
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
    pol = BoundOracle(sc.models(names), sc.cluster(12), dict(zip(names, smooth)), 0.1,
                      n_samples=4000, name="noisy-oracle")

    class Obs:
        now, models = 600.0, {n: None for n in names}

    fc = pol.forecast(Obs, seed=1)
    h = fc.samples.shape[2]
    want = smooth[:, 10:10 + h] / 60.0
    assert fc.samples.shape == (4, 4000, h)
    assert np.allclose(fc.samples[:2], want[:2, None, :])  # originals: the future itself
    assert np.allclose(fc.samples[2:].mean(1), want[2:], rtol=0.01)
    assert np.allclose(fc.samples[2:].std(1), 0.1 * want[2:], rtol=0.1)
    assert np.array_equal(pol.forecast(Obs).samples, pol.forecast(Obs).samples)  # seeded
