"""Issue 32: the durable arrival store (forecasting/store.py), the loop writing it once per
minute and a restarted loop forecasting from it at its first tick (autoscaler/driving/history.py,
a fake cluster and clock as in test_loop_restart.py, a small real N-HiTS), and N-HiTS on
a short history (forecasting/nhits.py)."""

import logging
import sqlite3

import numpy as np
import pytest
from meter_reports import meter_report

from autoscaler.driving.forecasters import set_daily
from autoscaler.driving.history import HistoryKeeper, fill_short_gaps
from autoscaler.driving.loop import AutoscalerLoop
from faro_serve.measures import HISTORY_MINUTES
from faro_serve.serving.schema import parse_autoscaler_config
from forecasting.nhits import DEFAULT_SHORT_RULE, SHORT_RULES
from forecasting.store import FILE_NAME, ArrivalStore
from forecasting.train import TrainConfig, train_forecaster

T0 = 1_800_000_017.3  # wall clock at the first meter's start: 17.3 s into a minute


def per_min(name: str, minute: int) -> int:
    return 300 + 40 * (minute % 7) + (100 if name == "b" else 0)


@pytest.fixture(scope="module")
def nhits():
    """A small Gaussian N-HiTS (input 15, horizon 7), trained in a few seconds."""
    rng = np.random.default_rng(3)
    series = {f"s{i}": rng.poisson(200 + 100 * i + 50 * np.sin(np.arange(400) / 9)).astype(float) for i in range(3)}
    return train_forecaster(
        series, TrainConfig(max_steps=60, mlp_width=32, windows_batch_size=64, val_check_steps=30, seed=1, members=1)
    )


def config():
    return parse_autoscaler_config(
        {
            "cluster": {"cpus": 4, "objective": "fair_sum"},
            "models": [
                {"name": "a", "slo_ms": 720, "processing_ms": 50, "cpus": 0.25},
                {"name": "b", "slo_ms": 720, "processing_ms": 50, "cpus": 0.25},
            ],
        }
    )


class Cluster:
    """Meters started at ``meter_start`` (wall clock) counting ``per_min`` per minute."""

    def __init__(self, meter_start: float, keep: int | None = None):
        self.meter_start = meter_start
        self.keep = keep  # minutes a meter holds (a real one: HISTORY_MINUTES)
        self.t = meter_start
        self.running = {"a": 1, "b": 1}

    def capacity(self):
        return 4.0, None

    def running_replicas(self):
        return dict(self.running)

    def meter_reports(self, names):
        age = self.t - self.meter_start
        done = int(age // 60)
        held = range(0 if self.keep is None else max(done - self.keep, 0), done)
        return {
            n: meter_report(
                n,
                now=self.t,
                arrivals_per_min=[per_min(n, self.minute(k)) for k in held],
                current_minute_count=0,
                current_minute_elapsed_s=age - 60 * done,
                arrival_rate=per_min(n, 0) / 60,
                latency_ms=100.0,
            )
            for n in names
        }

    def minute(self, k: int) -> int:
        """The wall-clock minute of the meter's k-th minute (the grid is 17.3 s off)."""
        return int(np.floor((self.meter_start + 60 * k) / 60 + 0.5))

    def scale(self, name, replicas):
        self.running[name] = replicas

    def control(self, *args):
        pass


class Spy:
    """Records every history a forecaster was given, then forecasts with it."""

    def __init__(self, fc):
        self.fc, self.seen = fc, []
        self.input_size, self.horizon = fc.input_size, fc.horizon

    daily_period = property(lambda self: self.fc.daily_period, lambda self, v: setattr(self.fc, "daily_period", v))
    daily_weight = property(lambda self: self.fc.daily_weight, lambda self, v: setattr(self.fc, "daily_weight", v))

    def predict(self, history, n_samples=100, seed=None):
        self.seen.append({n: np.asarray(h).copy() for n, h in history.items()})
        return self.fc.predict(history, n_samples=n_samples, seed=seed)


def run(loop, cluster, seconds, step=10.0):
    records = []
    end = cluster.t + seconds
    while cluster.t < end - 1e-9:
        records.append(loop.step())
        cluster.t += step
    return records


def test_loop_writes_each_minute_once_and_a_restarted_loop_plans_from_the_store(tmp_path, nhits):
    store = ArrivalStore(tmp_path)
    writes = []
    append = store.append_many
    store.append_many = lambda model, rows: writes.append((model, list(rows))) or append(model, rows)
    cluster = Cluster(T0)
    loop = AutoscalerLoop(config(), cluster, Spy(nhits), clock=lambda: cluster.t, history=store)
    run(loop, cluster, 20 * 60 + 5)
    # 20 completed minutes per model, each written once, in the tick after it completed
    assert sorted(m for m, _ in writes) == ["a"] * 20 + ["b"] * 20
    assert all(len(rows) == 1 for _, rows in writes)
    want = np.array([per_min("a", cluster.minute(k)) for k in range(20)], float)
    last = cluster.minute(19)
    assert np.array_equal(store.load("a", 20), want)
    around = store.load("a", 22, end_minute=last + 2)  # one minute either side: not recorded
    assert np.array_equal(around[1:21], want) and np.isnan(around[[0, 21]]).all()
    # the model applications restart 30 s later (new meters, no history) and so does the
    # autoscaler, without its saved state: a new loop over the same directory
    cluster2 = Cluster(cluster.t + 30.0)
    spy = Spy(nhits)
    again = AutoscalerLoop(config(), cluster2, spy, clock=lambda: cluster2.t, history=ArrivalStore(tmp_path))
    first = again.step()
    assert first["decision"]["kind"] == "long_term"
    # not the fallback; the traffic's 7-minute cycle is seen (forecasting/recurrence.py)
    assert first["models"]["a"]["predictor"] == "nhits-normal + recurrence (7 min)"
    # the store's minutes, restored; the old meters' last minute, never completed, is a
    # one-minute gap before the new meters' first, bridged with its neighbour
    seen = spy.seen[0]["a"]
    assert seen.size == 21 and np.array_equal(seen[:20], want) and seen[20] == want[-1]
    assert again.status()["history"]["joined_minutes"] == {"a": 21, "b": 21}


def test_the_join_counts_an_overlap_once_and_bridges_only_a_short_gap(tmp_path, nhits):
    store = ArrivalStore(tmp_path)
    cluster = Cluster(T0)
    loop = AutoscalerLoop(config(), cluster, nhits, clock=lambda: cluster.t, history=store)
    run(loop, cluster, 16 * 60 + 5)
    # the autoscaler restarts, the meters do not: their 16 minutes are all in the store too
    spy = Spy(nhits)
    again = AutoscalerLoop(config(), cluster, spy, clock=lambda: cluster.t, history=ArrivalStore(tmp_path))
    again.step()
    assert spy.seen[0]["a"].size == 16 and again.keeper.joined["a"] == 0
    # new meters 3 minutes after the store's last minute: the gap is interpolated
    late = Cluster(cluster.meter_start + 16 * 60 + 3 * 60)
    late.t += 61.0
    spy = Spy(nhits)
    AutoscalerLoop(config(), late, spy, clock=lambda: late.t, history=ArrivalStore(tmp_path)).step()
    h = spy.seen[0]["a"]
    assert h.size == 16 + 3 + 1 and np.isfinite(h).all()
    # ... 30 minutes after it: the old minutes are stale and left out
    stale = Cluster(cluster.meter_start + 16 * 60 + 30 * 60)
    stale.t += 61.0
    spy = Spy(nhits)
    AutoscalerLoop(config(), stale, spy, clock=lambda: stale.t, history=ArrivalStore(tmp_path)).step()
    assert spy.seen[0]["a"].size == 1


def test_fill_short_gaps():
    nan = np.nan
    assert np.array_equal(fill_short_gaps(np.array([1.0, nan, 3.0]), 2), [1.0, 2.0, 3.0])
    assert np.array_equal(fill_short_gaps(np.array([1.0, nan, nan, nan, 5.0, 6.0]), 2), [5.0, 6.0])
    assert np.array_equal(fill_short_gaps(np.array([2.0, nan]), 2, next_value=4.0), [2.0, 3.0])
    assert fill_short_gaps(np.array([2.0, nan, nan, nan]), 2, next_value=4.0).size == 0
    assert fill_short_gaps(np.full(4, nan), 2).size == 0


def test_appends_are_idempotent_and_the_store_is_bounded(tmp_path):
    store = ArrivalStore(tmp_path, keep_days=1)
    store.append("m", 600.0, 5)
    store.append("m", 600.0, 7)  # the same minute again: replaced, not added
    store.append("m", 601.0, 7)  # 1 s later is the same wall-clock minute
    assert store.rows("m") == 1 and store.load("m", 1)[0] == 7
    start = 1_000_000 * 60.0
    for day in range(3):  # three days, minute by minute, in hourly batches
        for h in range(24):
            store.append_many("m", [(start + 60 * (1440 * day + 60 * h + k), 1.0) for k in range(60)])
    assert store.rows("m") == 1440  # one day kept, the older pruned on write
    assert store.rows() == 1440 and (tmp_path / FILE_NAME).stat().st_size < 200_000
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        store.append("m", start, -1)


def _refused(tmp_path, caplog, make, reason):
    path = tmp_path / FILE_NAME
    make(path)
    with caplog.at_level(logging.ERROR, logger="faro_serve.history"):
        store = ArrivalStore(tmp_path)
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert str(path) in msg and reason in msg and "starting a fresh store" in msg
    aside = list(tmp_path.glob(f"{FILE_NAME}.corrupt-*"))
    assert len(aside) == 1 and store.refused[0]["moved_to"] == str(aside[0])
    store.append("m", 0.0, 3)  # a fresh store works
    assert store.load("m", 1)[0] == 3 and ArrivalStore(tmp_path).rows() == 1
    return aside[0]


def test_a_corrupt_file_is_refused_moved_aside_and_replaced(tmp_path, caplog):
    aside = _refused(tmp_path, caplog, lambda p: p.write_bytes(b"\x00garbage" * 100), "not an SQLite database")
    assert aside.read_bytes() == b"\x00garbage" * 100  # kept, not deleted


def test_a_foreign_sqlite_file_is_refused(tmp_path, caplog):
    def make(p):
        db = sqlite3.connect(p)
        db.execute("CREATE TABLE invoices (id INTEGER)")
        db.commit()
        db.close()

    _refused(tmp_path, caplog, make, "foreign SQLite database")


def test_another_schema_version_is_refused(tmp_path, caplog):
    ArrivalStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / FILE_NAME)
    db.execute("PRAGMA user_version = 9")
    db.commit()
    db.close()
    _refused(tmp_path, caplog, lambda p: None, "schema version 9")


def test_a_file_damaged_while_in_use_is_set_aside_and_the_loop_keeps_running(tmp_path, caplog, nhits):
    store = ArrivalStore(tmp_path)
    cluster = Cluster(T0)
    loop = AutoscalerLoop(config(), cluster, nhits, clock=lambda: cluster.t, history=store)
    run(loop, cluster, 3 * 60 + 5)
    store.close()
    (tmp_path / FILE_NAME).write_bytes(b"not a database any more" * 50)
    with caplog.at_level(logging.ERROR, logger="faro_serve.history"):
        records = run(loop, cluster, 2 * 60)
    assert all(r["models"]["a"]["replicas"] >= 1 for r in records)  # every tick ran
    assert "refused" in caplog.text and store.refused and store.rows("a") >= 1


@pytest.mark.parametrize("rule", [r for r in SHORT_RULES if r != "fallback"])
def test_short_history_forecasts_are_finite_non_negative_and_seeded(nhits, rule):
    nhits.short_history = rule
    try:
        hist = {"one": np.array([40.0]), "few": np.array([0.0, 300.0, 20.0, 0.0]), "zeros": np.zeros(6)}
        f = nhits.predict(hist, seed=4)
        again = nhits.predict(hist, seed=4)
        other = nhits.predict(hist, seed=5)
    finally:
        nhits.short_history = DEFAULT_SHORT_RULE
    assert np.isfinite(f.samples).all() and (f.samples >= 0).all()
    assert np.array_equal(f.samples, again.samples) and not np.array_equal(f.samples, other.samples)
    assert f.predictor["few"] == "nhits-normal (short history: 4 of 15 minutes)"


def test_the_keeper_carries_on_over_the_same_store_only(tmp_path):
    a, b = ArrivalStore(tmp_path / "a"), ArrivalStore(tmp_path / "b")
    k = HistoryKeeper(a)
    assert HistoryKeeper.carry_on(a, k) is k and HistoryKeeper.carry_on(b, k).store is b
    assert HistoryKeeper.carry_on(None, k) is None


def daily_config(period: int, weight: float = 0.25):
    cfg = config().model_dump()
    cfg.update(daily_period_minutes=period, daily_weight=weight)
    return parse_autoscaler_config(cfg)


def test_history_length_follows_the_daily_context():
    assert config().history_minutes() == 1440 + 60  # the default: a day and an hour
    assert daily_config(300).history_minutes() == 360
    assert daily_config(300, weight=0.0).history_minutes() == HISTORY_MINUTES
    assert daily_config(60).history_minutes() == HISTORY_MINUTES  # the meters hold more


def test_a_restarted_loop_forecasts_with_yesterday_from_the_store(tmp_path, nhits):
    """A day of stored minutes (a 300-minute "day" here) reaches the forecaster through the
    keeper, beyond the meters' history, and the forecast says it used the daily context;
    after that the keeper reads one new minute a tick-minute, not the whole day again."""
    store = ArrivalStore(tmp_path)
    cluster = Cluster(T0 + 400 * 60, keep=2)  # meters holding 2 minutes: their window moves
    start = cluster.minute(0)
    for n in ("a", "b"):
        store.append_many(n, [(60.0 * m, float(per_min(n, m))) for m in range(start - 400, start)])
    reads = []
    load = store.load
    store.load = lambda model, minutes, end_minute=None: reads.append(minutes) or load(model, minutes, end_minute)
    spy = Spy(nhits)
    loop = AutoscalerLoop(daily_config(300), cluster, spy, clock=lambda: cluster.t, history=store)
    assert loop.keeper.keep_minutes == 360 and spy.fc.daily_period == 300
    cluster.t += 61.0
    rec = loop.step()
    seen = spy.seen[0]["a"]
    assert seen.size == 360 and np.isfinite(seen).all()
    want = [per_min("a", m) for m in range(start - 359, start)]
    assert np.array_equal(seen[:-1], want)  # the store's minutes, in order, then the meter's
    assert rec["models"]["a"]["predictor"] == "nhits-normal + daily + recurrence (7 min)"
    assert reads == [360, 360]  # one whole read per model
    reads.clear()
    run(loop, cluster, 6 * 60)  # past the next long-term plan
    assert reads and max(reads) == 1  # the meters' window moved a minute at a time: one row read
    last = spy.seen[-1]["a"]  # a later plan's history: the day, contiguous, moved on
    ends = [
        e for e in range(start + 1, start + 8) if np.array_equal(last, [per_min("a", m) for m in range(e - 359, e + 1)])
    ]
    assert len(spy.seen) > 1 and ends
    off = Spy(nhits)
    AutoscalerLoop(daily_config(300, 0.0), cluster, off, clock=lambda: cluster.t, history=ArrivalStore(tmp_path)).step()
    assert off.seen[0]["a"].size < 360
    set_daily(nhits, (1440, 0.25))  # the module's fixture, as the other tests had it
