"""The simulator's shortcuts (``faro-serve whatif`` at scale) give what the plain code gives,
bit for bit: the arrival rates of a group of models at once, the look-back percentile
without numba's copies, a model's serving replicas from a cache, a quiet interval without
the queue kernel, and a meter snapshot without the frozen dataclass's ``__init__``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from numba import njit

from autoscaler.driving.driver import MeterSnapshot
from faro_serve.sim.model_state import ModelState
from faro_serve.sim.order_stats import percentile_in_place
from faro_serve.sim.rates import TickRates


def _bits(values) -> list[bytes]:
    return [np.float64(v).tobytes() for v in values]


def test_group_rates_are_each_keys_rate():
    rng = np.random.default_rng(0)
    for _ in range(300):
        window = float(rng.choice([10.0, 5.0, 7.3]))
        one, group = TickRates(window), TickRates(window)
        keys = [f"m{k}" for k in range(int(rng.integers(1, 6)))]
        for _ in range(int(rng.integers(1, 30))):
            dt = float(rng.choice([2.0, 2.5, 0.7, 1 / 3, 5.0, 10.0, 12.0, 0.0]))
            counts = [int(c) for c in rng.integers(0, 1000, len(keys))]
            want = [one.rate(k, dt, c) for k, c in zip(keys, counts)]
            got = group.rates("models", dt, counts)
            assert all(type(r) is float for r in got)
            assert _bits(got) == _bits(want), (dt, want, got)
    with pytest.raises(TypeError, match="whole numbers"):
        TickRates().rates("models", 2.0, [0.5])


@njit(cache=False)
def _numba_percentile(a, q):
    return np.percentile(a, q)


def test_the_in_place_percentile_is_numbas():
    """The same float as numba's ``np.percentile`` (which the look-back kernel used), on
    values with ties, sorted and reversed, and at odd percentiles."""
    rng = np.random.default_rng(1)
    for trial in range(3000):
        n = int(rng.integers(1, 120))
        a = rng.lognormal(-2.0, 1.0, n)
        if trial % 4 == 1:
            a = np.round(a, 1)  # ties
        elif trial % 4 == 2:
            a = np.sort(a)
        elif trial % 4 == 3:
            a = np.sort(a)[::-1].copy()
        q = float(rng.choice([50.0, 90.0, 95.0, 99.0, 99.9, rng.uniform(1e-6, 100 - 1e-6)]))
        want = _numba_percentile(a.copy(), q)
        buf = np.concatenate([a, rng.uniform(0, 1, 3)])  # a scratch buffer longer than n
        assert _bits([percentile_in_place(buf, n, q)]) == _bits([want]), (n, q)


class _AlwaysKernel(ModelState):
    """``run`` as it was: the kernel on every interval, serving replicas counted afresh."""

    def serving(self, now: float) -> int:
        return int(np.count_nonzero(self.ready_at <= now))

    def run(self, t0: float, t1: float) -> None:
        self._kernel(t0, t1)


@pytest.mark.parametrize("k", [1, 3])
def test_a_quiet_interval_and_the_serving_cache_change_nothing(k):
    """Sparse arrivals (many intervals with none, some with requests still in service) and
    replicas added and removed: the same requests, queue, replicas and tick sums."""
    rng = np.random.default_rng(2)
    fast, plain = (
        cls("m", 0, 8, 4, per_replica=2, max_replicas=8, concurrency=k) for cls in (ModelState, _AlwaysKernel)
    )
    t = 0.0
    for minute in range(6):
        n = int(rng.poisson(20))
        arrival = 60.0 * minute + np.sort(rng.uniform(0, 60, n))
        draws = (arrival, rng.lognormal(np.log(0.8), 0.6, n), np.full(n, 0.002), rng.uniform(0, 1, n))
        for s in (fast, plain):
            s.append(*draws)
        while t < 60.0 * (minute + 1):
            if rng.uniform() < 0.1:
                r = int(rng.integers(0, 5))
                for s in (fast, plain):
                    s.scale_to(r, t, 5.0)
            for s in (fast, plain):
                s.run(t, t + 2.0)
            t += 2.0
            assert fast.serving(t) == plain.serving(t)
            assert fast.end_tick() == plain.end_tick()
    for name in ("arr", "start", "lat", "status", "qbuf", "ready_at", "busy_until", "free_at"):
        assert np.array_equal(getattr(fast, name), getattr(plain, name), equal_nan=True), name
    assert (fast.nxt, fast.qh, fast.nq) == (plain.nxt, plain.qh, plain.nq)


def test_a_quick_snapshot_is_the_constructors():
    fields = dict(
        arrivals_per_min=np.arange(3.0),
        arrival_rate=1.5,
        latency_ms=None,
        processing_ms=12.0,
        queue_length=2.0,
        mean_in_flight=0.25,
        queued_ages_s=None,
        batch_size=4,
    )
    quick, plain = MeterSnapshot.quick(**fields), MeterSnapshot(**fields)
    assert list(vars(quick)) == list(vars(plain)) and repr(quick) == repr(plain)
    assert pickle.dumps(quick) == pickle.dumps(plain)
    with pytest.raises(AttributeError):  # still frozen
        quick.arrival_rate = 2.0  # type: ignore[misc]
