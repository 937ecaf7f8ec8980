"""Recurring peaks (forecasting/recurrence.py, issue 32 item 5): a model's own cycle found in
its history and its next peak added as an upside to a share of the forecast's samples."""

from pathlib import Path

import numpy as np
import pytest

from forecasting.base import FallbackForecaster, Forecast
from forecasting.recurrence import Recurrence, add_recurrence, autocorrelation, detect_period, recurring_path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "azure12_days8-12.csv"


def spikes(minutes: int, every: int, drift: int = 0, seed: int = 0) -> np.ndarray:
    """One request a minute, and a 700-request minute about every ``every`` minutes (each
    gap ``every`` +- ``drift``), as a timer-driven function's trace looks."""
    rng = np.random.default_rng(seed)
    h = np.ones(minutes)
    t = 7
    while t < minutes:
        h[t] = 700.0
        t += every + int(rng.integers(-drift, drift + 1))
    return h


def test_autocorrelation_of_a_cycle_peaks_at_its_period():
    x = np.sin(2 * np.pi * np.arange(600) / 40)
    acf = autocorrelation(x, 60)
    assert acf[0] == pytest.approx(1.0)
    assert int(np.argmax(acf[5:])) + 5 == 40
    assert not autocorrelation(np.full(100, 3.0), 10).any()


def test_the_cycle_is_found_even_when_it_drifts_and_smooth_or_short_series_have_none():
    rc = Recurrence()
    assert detect_period(spikes(720, 30), rc) == 30
    assert detect_period(spikes(720, 60), rc) == 60
    assert detect_period(spikes(720, 30, drift=2, seed=1), rc) in range(28, 33)
    walk = np.cumsum(np.random.default_rng(2).normal(0, 1, 720)) + 100  # smooth: no cycle
    assert detect_period(walk, rc) is None
    assert detect_period(np.full(720, 5.0), rc) is None
    assert detect_period(spikes(40, 30), rc) is None  # too short to see one cycle thrice


def test_the_path_reads_one_cycle_back_within_the_jitter():
    h = np.ones(100)
    h[100 - 30 + 2] = 700.0  # a peak 28 minutes ago: due in 2 minutes on a 30-minute cycle
    np.testing.assert_array_equal(recurring_path(h, 30, 7, jitter=0), [1, 1, 700, 1, 1, 1, 1])
    np.testing.assert_array_equal(recurring_path(h, 30, 7, jitter=1), [1, 700, 700, 700, 1, 1, 1])
    # a cycle shorter than the horizon: whole cycles further back, never the future
    short = np.tile([1.0, 1.0, 9.0], 10)
    np.testing.assert_array_equal(recurring_path(short, 3, 7, jitter=0), [1, 1, 9, 1, 1, 9, 1])


def test_a_share_of_samples_gains_the_peak_and_none_is_lowered():
    h = spikes(720, 30)[:695]  # peaks at minutes 7, 37, ..., 667: the next is due in 2 minutes
    base = FallbackForecaster().predict({"m": h, "flat": np.full(720, 20.0)}, 100, seed=4)
    out = add_recurrence(base, {"m": h, "flat": np.full(720, 20.0)}, Recurrence(share=0.25, jitter=0))
    assert out.predictor["m"] == base.predictor["m"] + " + recurrence (30 min)"
    assert out.predictor["flat"] == base.predictor["flat"]
    np.testing.assert_array_equal(out.samples[1], base.samples[1])
    m_new, m_old = out.samples[0], base.samples[0]
    assert (m_new >= m_old).all()
    raised = (m_new > m_old).any(axis=1)
    assert raised.sum() == 25 and raised[-25:].all()
    np.testing.assert_allclose(m_new[-25:, 2], 700 / 60)
    assert add_recurrence(base, {"m": h}, Recurrence(share=0.0)) is base
    with pytest.raises(ValueError, match="share"):
        Recurrence(share=1.5)
    with pytest.raises(ValueError, match="min_lag"):
        Recurrence(min_lag=10, max_lag=5)


@pytest.mark.skipif(not SHARED.exists(), reason=f"the shared traces are not at {SHARED}")
def test_real_cycles_of_the_azure_functions_are_found():
    """fn3 of the Azure family peaks hourly and fn8 about every half hour (days 8-10)."""
    from faro_serve.traces import load_trace

    tr = load_trace(str(SHARED))
    rc = Recurrence()
    got = {n: detect_period(tr.counts[i][: 3 * 1440], rc) for i, n in enumerate(tr.names)}
    assert got["fn3"] == 60 and got["fn8"] == 30
    assert got["fn4"] is None and got["fn6"] is None  # smooth, busy functions


def test_only_the_share_of_a_cyclic_models_samples_is_raised_and_the_input_is_kept():
    """Half of ten samples: the last five of the cyclic model rise to its path (a peak in the
    horizon), the first five stay; a model without history or cycle, and the input, stay."""
    fc = Forecast(["a", "b", "c"], np.full((3, 10, 30), 0.5), {"a": "x", "b": "x", "c": "x"})
    hist = {"a": spikes(720, 30), "c": np.full(720, 30.0)}  # b: no history; c: flat, no cycle
    out = add_recurrence(fc, hist, Recurrence(share=0.5))
    assert out.samples.shape == (3, 10, 30) and np.isfinite(out.samples).all()
    assert (out.samples[0, :5] == 0.5).all()
    raised = out.samples[0, 5:]
    assert raised.max() * 60 >= 700 - 1e-6 and (raised >= 0.5).all()
    assert (out.samples[1:] == 0.5).all() and (fc.samples == 0.5).all()
    assert out.predictor == {"a": "x + recurrence (30 min)", "b": "x", "c": "x"}


def test_the_shipped_nhits_adds_recurring_peaks_and_set_recurrence_configures_it():
    """The N-HiTS the product ships raises a quarter of its samples to a cyclic model's next
    peak by default; ``set_recurrence`` (what the autoscaler's ``recurrence_share`` and the
    simulator's ``--recurrence-share`` call) changes the share or turns it off."""
    from autoscaler.driving.forecasters import set_recurrence
    from forecasting.recurrence import DEFAULT_SHARE
    from forecasting.shipped import load_shipped

    fc = load_shipped()
    fc.daily_weight = 0.0  # this test is about the cycle alone
    assert fc.recurrence_share == DEFAULT_SHARE == 0.25
    h = {"m": spikes(720, 30)[:695]}  # the next 700-request peak is due in 2 minutes
    out = fc.predict(h, 100, seed=1)
    assert out.predictor["m"] == "nhits-normal + recurrence (30 min)"
    at_peak = out.samples[0][:, 2] * 60
    assert (at_peak >= 700 - 1e-6).sum() >= 25 and np.median(at_peak) < 100
    set_recurrence(fc, 0.0)
    plain = fc.predict(h, 100, seed=1)
    assert plain.predictor["m"] == "nhits-normal" and (plain.samples[0][:, 2] * 60 < 700).all()
    with pytest.raises(ValueError, match="share"):
        set_recurrence(fc, 2.0)


def test_a_bad_share_is_named_in_the_args_and_on_the_command_line(cli, tmp_path):
    from autoscaler.driving.loop_config import parse_autoscaler_config
    from faro_serve.config import ConfigError

    args = {"cluster": {"cpus": 4}, "models": [{"name": "m", "slo_ms": 720, "processing_ms": 154}]}
    assert parse_autoscaler_config(args).recurrence_share == 0.25
    assert parse_autoscaler_config({**args, "recurrence_share": 0}).recurrence_share == 0.0
    with pytest.raises(ConfigError, match="recurrence_share"):
        parse_autoscaler_config({**args, "recurrence_share": 1.5})
    trace = tmp_path / "t.csv"
    trace.write_text("minute,job,requests\n" + "".join(f"{m},a,{5 + m % 3}\n" for m in range(30)))
    code, _, err = cli(
        "simulate", "--trace", str(trace), "--capacity", "4", "--policy", "faro-fairsum", "--recurrence-share", "2"
    )
    assert code == 2 and "--recurrence-share must be within 0..1 (got 2)" in err, err
    from faro_serve.config import ModelSLO
    from faro_serve.sim.pipeline_scenario import PipelineScenario

    with pytest.raises(ValueError, match=r"--recurrence-share must be within 0\.\.1 \(got 3\)"):
        PipelineScenario(
            trace=str(trace), models=(ModelSLO(name="a", slo_ms=720, processing_ms=154),), recurrence_share=3
        )
