"""Daily context (forecasting/daily.py, issue 32 item 5): the base forecast moved towards
yesterday's same minutes, only with a day of history, seeded and never negative."""

import numpy as np
import pytest

from forecasting.base import FallbackForecaster, Forecaster
from forecasting.daily import DAY_MINUTES as DAY_MINUTES_LIVE
from forecasting.daily import DailyContext

PERIOD = 60


def periodic(days: float, base: float = 30.0, peak: float = 300.0) -> np.ndarray:
    """Per-minute counts repeating every PERIOD minutes: flat, then a rise at minute 40."""
    t = np.arange(int(days * PERIOD))
    return np.where(t % PERIOD >= 40, peak, base).astype(float)


def test_is_a_forecaster_and_rejects_bad_settings():
    fc = DailyContext(FallbackForecaster(), period=PERIOD)
    assert isinstance(fc, Forecaster)
    assert (fc.input_size, fc.horizon) == (15, 7)
    with pytest.raises(ValueError, match="period"):
        DailyContext(FallbackForecaster(), period=1)
    with pytest.raises(ValueError, match="weight"):
        DailyContext(FallbackForecaster(), period=PERIOD, weight=1.5)


def test_short_history_is_the_base_forecast():
    base = FallbackForecaster()
    fc = DailyContext(base, period=PERIOD, weight=0.5)
    h = {"m": periodic(1.0)[: PERIOD + 10]}  # less than a day and the level window
    a, b = fc.predict(h, 50, seed=3), base.predict(h, 50, seed=3)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert a.predictor["m"] == b.predictor["m"]


def test_a_rise_seen_yesterday_is_forecast_today():
    """The fallback predictor (the last 15 minutes' mean..max) cannot see the daily rise at
    minute 40; with yesterday's minutes at weight 1 the forecast mean is that rise."""
    h = periodic(2.0)[: PERIOD + 37]  # now: minute 37 of the second day, the rise 3 minutes on
    base = FallbackForecaster()
    plain = base.predict({"m": h}, 200, seed=0).samples[0].mean(axis=0) * 60
    daily = DailyContext(base, period=PERIOD, weight=1.0).predict({"m": h}, 200, seed=0)
    mean = daily.samples[0].mean(axis=0) * 60
    np.testing.assert_allclose(plain, 30.0)
    np.testing.assert_allclose(mean, [30, 30, 30, 300, 300, 300, 300], rtol=1e-9)
    assert daily.predictor["m"].endswith("+ daily")
    half = DailyContext(base, period=PERIOD, weight=0.5).predict({"m": h}, 200, seed=0)
    np.testing.assert_allclose(half.samples[0].mean(axis=0) * 60, [30, 30, 30, 165, 165, 165, 165])


def test_yesterday_is_scaled_to_todays_level():
    h = periodic(2.0)[: PERIOD + 37]
    h[PERIOD:] *= 2.0  # today runs at twice yesterday's level
    y = DailyContext(FallbackForecaster(), period=PERIOD).yesterday_means(h)
    np.testing.assert_allclose(y, [60, 60, 60, 600, 600, 600, 600])


def test_seeded_finite_non_negative_and_weight_zero_is_the_base():
    rng = np.random.default_rng(0)
    h = {f"m{i}": rng.poisson(50, size=2 * PERIOD).astype(float) for i in range(4)}
    h["idle"] = np.zeros(2 * PERIOD)
    fc = DailyContext(FallbackForecaster(), period=PERIOD, weight=0.25)
    a, b = fc.predict(h, 40, seed=7), fc.predict(h, 40, seed=7)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert np.isfinite(a.samples).all() and (a.samples >= 0).all()
    np.testing.assert_array_equal(a.samples[-1], 0.0)  # nothing yesterday, nothing today
    off = DailyContext(FallbackForecaster(), period=PERIOD, weight=0.0).predict(h, 40, seed=7)
    np.testing.assert_array_equal(off.samples, FallbackForecaster().predict(h, 40, seed=7).samples)


def write_trace(path, days: int = 3, minutes: int = 40):
    """A trace file whose job ``j`` repeats daily: 2 requests a minute, 200 from minute 30."""
    rows = ["day,sample,minute,job,requests"]
    for d in range(1, days + 1):
        for m in range(minutes):
            rows.append(f"{d},0,{m},j,{200 if m >= 30 else 2}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_the_warm_up_spans_days_and_the_scenario_tells_the_forecaster_its_day(tmp_path):
    from faro_serve.sim.scenario import Scenario, run_scenario
    from faro_serve.traces import day_minutes, previous_day_tail

    trace = write_trace(tmp_path / "t.csv")
    assert day_minutes(trace, 3, 0) == 40
    tail = previous_day_tail(trace, 3, 0, 50, ["j"])  # day 2, and the last 10 of day 1
    assert tail.shape == (1, 50) and tail[0, 0] == 200 and tail[0, 10] == 2
    assert previous_day_tail(trace, 2, 0, 500, ["j"]).shape == (1, 40)  # as far back as it goes
    sc = Scenario(trace=trace, day=3, sample=0).validate()
    assert sc.warmup() == 100  # a day and an hour: all the file has before day 3 is 80
    names, counts, warm = sc.load()
    assert warm.shape == (1, 80) and counts.shape == (1, 40)
    fc = DailyContext(FallbackForecaster(), period=DAY_MINUTES_LIVE)
    res = run_scenario(sc, "faro-fairsum", 8, seed=0, forecaster=fc)
    assert fc.period == 40 and res.summary.job_requests.sum() > 0
    with pytest.raises(ValueError, match="daily-weight"):
        Scenario(trace=trace, day=3, sample=0, daily_weight=2.0).validate()
    from faro_serve.config import ModelSLO
    from faro_serve.sim.pipeline_scenario import PipelineScenario

    with pytest.raises(ValueError, match=r"--daily-weight must be within 0\.\.1 \(got -1\)"):
        PipelineScenario(trace=str(trace), models=(ModelSLO(name="j", slo_ms=720, processing_ms=154),), daily_weight=-1)


@pytest.mark.parametrize(
    "value, shown", [(2.0, "2"), (-1e-9, "-1e-09"), (1.0000001, "1.0000001"), (float("nan"), "nan")]
)
def test_every_weight_and_share_check_is_one_rule(value, shown):
    """The flags, the daily context and the recurring peaks refuse the same values in the
    same words (forecasting.base.check_fraction), the value as given: 1.0000001 is not "1"."""
    from faro_serve.sim.scenario import check_forecast_flags
    from forecasting.daily import check_daily
    from forecasting.recurrence import check_share

    checks = {
        "--daily-weight": lambda v: check_forecast_flags(v, 0.25),
        "--recurrence-share": lambda v: check_forecast_flags(0.25, v),
        "daily context: weight": lambda v: check_daily(PERIOD, v),
        "recurrence: share": check_share,
    }
    for what, check in checks.items():
        check(0.0), check(1.0)
        with pytest.raises(ValueError) as err:
            check(value)
        assert str(err.value) == f"{what} must be within 0..1 (got {shown})"


def test_rescale_keeps_the_days_range_whatever_the_warm_up(tmp_path):
    from faro_serve.sim.scenario import Scenario

    trace = tmp_path / "t.csv"
    rows = (
        ["day,sample,minute,job,requests"]
        + [f"1,0,{m},j,1000" for m in range(10)]
        + [f"2,0,{m},j,{10 + m}" for m in range(10)]
    )
    trace.write_text("\n".join(rows) + "\n")
    a = Scenario(trace=str(trace), day=2, sample=0, rescale=(1, 100), warmup_minutes=0).validate().load()
    b = Scenario(trace=str(trace), day=2, sample=0, rescale=(1, 100)).validate().load()
    np.testing.assert_allclose(a[1], b[1])  # the replayed day is the same
    assert a[1].min() == 1 and a[1].max() == 100 and b[2].shape == (1, 10) and b[2].min() > 100


def test_the_shipped_nhits_applies_it_and_set_daily_configures_it():
    """The N-HiTS the product ships moves its own forecast (not only the DailyContext
    wrapper): at weight 1 each step's mean is yesterday's scaled minute; at 0 it is the
    network's, unlabelled."""
    from autoscaler.driving.forecasters import set_daily
    from forecasting.daily import yesterday_means
    from forecasting.shipped import load_shipped

    fc = load_shipped()
    assert (fc.daily_period, fc.daily_weight) == (DAY_MINUTES_LIVE, 0.25)
    h = periodic(2.0)[: PERIOD + 37]
    set_daily(fc, (PERIOD, 1.0))
    out = fc.predict({"m": h}, 50, seed=1)
    np.testing.assert_allclose(
        out.samples[0].mean(axis=0) * 60, yesterday_means(h, PERIOD, fc.input_size, fc.horizon), rtol=1e-9
    )
    assert out.predictor["m"] == "nhits-normal + daily"
    set_daily(fc, (PERIOD, 0.0))
    plain = fc.predict({"m": h}, 50, seed=1)
    assert plain.predictor["m"] == "nhits-normal"
    assert not np.allclose(plain.samples[0].mean(axis=0), out.samples[0].mean(axis=0))
    with pytest.raises(ValueError, match="weight"):
        set_daily(fc, (PERIOD, -0.1))
