"""The paper's evaluation metrics (section 6) against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from faro_serve.metrics import MinuteTable, minute_table, summarize, summarize_records, utility_from_latency

SLO = 0.72


def _records(rows):
    """rows: (job, arrival_s, latency_s or None for dropped)."""
    model = np.array([r[0] for r in rows])
    arr = np.array([r[1] for r in rows], dtype=float)
    dropped = np.array([r[2] is None for r in rows])
    lat = np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=float)
    return model, arr, lat, dropped


def test_p99_utility_and_lost_cluster_utility_by_hand():
    # job a, minute 0: 3 requests 0.1, 0.2, 1.44 -> p99 = 1.44 - 0.02 * (1.44 - 0.2) = 1.4152
    # job a, minute 1: no requests -> utility 1
    # job b, minute 0: 0.3 -> utility 1;  minute 1: 0.36 and a drop -> p99 = inf -> utility 0
    rows = [(0, 1.0, 0.1), (0, 2.0, 0.2), (0, 3.0, 1.44), (1, 5.0, 0.3), (1, 61.0, 0.36), (1, 62.0, None)]
    tab = minute_table(["a", "b"], *_records(rows), slo_s=SLO, minutes=2)
    assert tab.requests.tolist() == [[3, 0], [1, 2]]
    assert tab.dropped.tolist() == [[0, 0], [0, 1]]
    assert tab.over_slo.tolist() == [[1, 0], [0, 0]]
    p = 0.2 + 0.98 * (1.44 - 0.2)
    assert tab.p_all[0, 0] == pytest.approx(p)
    assert np.isnan(tab.p_all[0, 1]) and np.isinf(tab.p_all[1, 1])
    assert tab.p_served[1, 1] == pytest.approx(0.36)
    s = summarize(tab, SLO)
    u_a0 = SLO / p
    assert s.cluster_utility.tolist() == pytest.approx([u_a0 + 1.0, 1.0 + 0.0])
    # lost cluster utility = jobs - mean cluster utility
    assert s.lost_cluster_utility == pytest.approx(2 - (u_a0 + 2.0) / 2)
    assert s.job_lost_utility.tolist() == pytest.approx([(1 - u_a0) / 2, 0.5])
    assert s.lost_cluster_utility == pytest.approx(s.job_lost_utility.sum())
    # job SLO violation rate = (over SLO + dropped) / all; cluster = mean over jobs
    assert s.job_slo_violation_rate.tolist() == pytest.approx([1 / 3, 1 / 3])
    assert s.cluster_slo_violation_rate == pytest.approx(1 / 3)
    assert s.job_requests.tolist() == [3, 3] and s.job_dropped.tolist() == [0, 1]
    # effective utility: job b minute 1 drops 50 % -> availability 50 % -> penalty 100 % -> 0
    assert s.effective_cluster_utility.tolist() == pytest.approx([u_a0 + 1.0, 1.0])
    assert s.fairness["min"] == pytest.approx((1 - u_a0) / 2) and s.fairness["max"] == pytest.approx(0.5)


def test_p99_matches_numpy_and_one_drop_in_a_hundred_is_infinite():
    rng = np.random.default_rng(3)
    lat = rng.lognormal(-1.5, 0.5, 500)
    rows = [(0, 0.1 * k, float(v)) for k, v in enumerate(lat)]
    tab = minute_table(["a"], *_records(rows), slo_s=SLO, minutes=1)
    assert tab.p_all[0, 0] == pytest.approx(np.percentile(lat, 99))
    # 99 served + 1 dropped: the 99th percentile interpolates towards the drop -> infinite
    rows = [(0, 0.1 * k, 0.1) for k in range(99)] + [(0, 10.0, None)]
    tab = minute_table(["a"], *_records(rows), slo_s=SLO)
    assert np.isinf(tab.p_all[0, 0])
    assert utility_from_latency(tab.p_all, [SLO])[0, 0] == 0.0
    # 199 served + 1 dropped: still finite
    rows = [(0, 0.1 * k, 0.1) for k in range(199)] + [(0, 30.0, None)]
    assert minute_table(["a"], *_records(rows), slo_s=SLO).p_all[0, 0] == pytest.approx(0.1)


def test_effective_utility_uses_the_step_penalty():
    # 100 requests, 3 dropped (availability 97 % -> penalty 25 %), served all at 1.44 s
    rows = [(0, 0.5 * k, 1.44) for k in range(97)] + [(0, 50.0 + k, None) for k in range(3)]
    s = summarize_records(["a"], *_records(rows), slo_s=SLO)
    assert s.effective_cluster_utility[0] == pytest.approx(0.75 * 0.5)
    assert s.cluster_utility[0] == 0.0  # the drops make p99 infinite


def test_utility_is_one_without_requests_and_capped_at_one():
    u = utility_from_latency(np.array([[np.nan, 0.1, 1.44, np.inf]]), [SLO])
    assert u.tolist() == [[1.0, 1.0, 0.5, 0.0]]


def test_merge_combines_disjoint_minutes_and_refuses_overlap():
    names = ["a"]
    first = minute_table(names, *_records([(0, 1.0, 0.1)]), slo_s=SLO, minutes=2)
    second = minute_table(names, *_records([(0, 70.0, 2.0)]), slo_s=SLO, minutes=2)
    both = first.merge(second)
    whole = minute_table(names, *_records([(0, 1.0, 0.1), (0, 70.0, 2.0)]), slo_s=SLO, minutes=2)
    assert both.requests.tolist() == whole.requests.tolist()
    assert both.p_all.tolist() == whole.p_all.tolist()
    with pytest.raises(ValueError):
        both.merge(first)
    assert MinuteTable.empty(names, 2).merge(first).requests.tolist() == [[1, 0]]


def test_bad_records_are_rejected():
    with pytest.raises(ValueError, match="no latency"):
        minute_table(["a"], [0], [1.0], [np.nan], [False], SLO)
    with pytest.raises(ValueError, match="model indices"):
        minute_table(["a"], [1], [1.0], [0.1], [False], SLO)
