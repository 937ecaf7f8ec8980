"""The look-back SLO percentile the autoscaler acts on, computed live and in the simulator
from one request log (issue 19): the meter of the default data path (its router's reports
merged into ``MeterStats``, the same statistics the router front keeps) and the
simulator's ``lookback`` kernel must agree, window by window."""

from types import SimpleNamespace

import numpy as np
import pytest

from faro_serve.serving import direct
from faro_serve.serving.direct import Meter
from faro_serve.serving.messages import VERSION
from faro_serve.serving.stats import MeterStats
from faro_serve.sim.kernels import DONE, lookback

LOOK_BACK_S = 30.0


def _request_log(seed=3, seconds=180.0, rate=12.0):
    """Poisson arrivals with a queueing-like latency: a slow lognormal body and a burst of
    long waits in the middle minute, so the p99 moves from window to window."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2)))
    arr = arr[arr < seconds]
    proc = rng.lognormal(np.log(0.15), 0.4, arr.size)
    lat = proc + rng.exponential(0.05, arr.size)
    burst = (arr > 60) & (arr < 90)
    lat[burst] += rng.uniform(0.5, 3.0, burst.sum())
    return arr, lat, proc


def _kernel(arr, lat, proc, now, q):
    status = np.full(arr.size, DONE, dtype=np.int8)
    p, _, n = lookback(arr, lat, proc, status, 0, arr.size, now - LOOK_BACK_S, now, q)
    return p, n


def _queries(arr, lat):
    """Query times away from any completion by a millisecond: the two windows differ only
    in whether the edge itself is in ((t-30, t] against [t-30, t])."""
    done = np.sort(arr + lat)
    out = []
    for t in np.arange(31.0, float(done[-1]), 7.3):
        if np.min(np.abs(done - t)) > 1e-3 and np.min(np.abs(done - (t - LOOK_BACK_S))) > 1e-3:
            out.append(float(t))
    return out


@pytest.mark.parametrize("q", [99.0, 90.0, 50.0])
def test_router_statistics_and_the_simulator_kernel_give_the_same_percentile(q):
    arr, lat, proc = _request_log()
    st = MeterStats(window_s=LOOK_BACK_S, start=0.0)
    order = np.argsort(arr + lat)
    queries = _queries(arr, lat)
    k = 0
    for t in queries:  # stream completions up to each query, as they would arrive
        while k < order.size and arr[order[k]] + lat[order[k]] <= t:
            j = order[k]
            st.completed(arr[j] + lat[j], lat[j], proc[j])
            k += 1
        live = st.latency_percentile(t, q)
        sim, n = _kernel(arr, lat, proc, t, q)
        assert n == len(st._done)
        assert live == pytest.approx(sim, rel=1e-12), (t, q)
    assert len(queries) > 15


def test_the_meter_on_the_default_path_matches_the_kernel(monkeypatch):
    """The same log as the proxy's router reports it, in one-second batches of (arrival,
    completion, latency) events, ingested by the real meter on a clock that replays the
    log's time; the meter's window is the kernel's."""
    arr, lat, proc = _request_log(seed=5, seconds=90.0)
    t0 = 1.7e9
    clock = [t0]
    monkeypatch.setattr(direct, "time", SimpleNamespace(time=lambda: clock[0]))
    m = Meter.func_or_class("m")
    events = sorted([("a", t0 + a) for a in arr] + [("f", t0 + a + d, d) for a, d in zip(arr, lat)], key=lambda e: e[1])
    checked, k = 0, 0
    for t in _queries(arr, lat):
        # the router's one-second reports up to the query time, each in time order
        while k < len(events) and events[k][1] <= t0 + t:
            sec = int(events[k][1] - t0)
            batch = []
            while k < len(events) and int(events[k][1] - t0) == sec and events[k][1] <= t0 + t:
                batch.append(events[k])
                k += 1
            clock[0] = t0 + sec + 1.0 if sec + 1.0 <= t else t0 + t  # reported at the second's end
            m.ingest(
                "router-1",
                {
                    "v": VERSION,
                    "type": "router",
                    "events": batch,
                    "waiting": 0,
                    "dispatched": 0,
                    "replicas": 1,
                    "waiting_since": None,
                },
            )
        clock[0] = t0 + t
        got = m.stats.latency_percentile(t0 + t, 99.0)
        want, n = _kernel(arr, lat, proc, t, 99.0)
        if n == 0:
            assert got is None
            continue
        assert got == pytest.approx(want, rel=1e-9), t
        checked += 1
    assert checked >= 5
