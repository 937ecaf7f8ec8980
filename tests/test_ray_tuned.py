"""``ray-tuned`` without Ray (issue 31, item 1): its simulated counterpart ``ray-serve-tuned``,
the simulated server behind each Ray run (a queue bounded at ``max_queued_requests`` with
``max_ongoing_requests`` held at each replica), the report's settings lines and compare's
argument checks. The live side is in test_compare_live.py."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaler import make_policy
from autoscaler.contract.policy import Policy
from autoscaler.policies.ray_rule import RAY_DEFAULTS, RAY_TUNED
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.sim import NO_OVERHEAD, SimConfig, TimeDist, simulate
from faro_serve.validation.comparison import NATIVE, RAY_SETTINGS, ray_settings_line, sim_policy, sim_queue


class Hold(Policy):
    name = "hold"

    def decide(self, obs):
        return None


def test_each_ray_run_is_paired_with_its_simulated_rule_and_server():
    assert sim_policy("ray-native") == "ray-serve" and sim_policy("ray-tuned") == "ray-serve-tuned"
    assert RAY_SETTINGS == {"ray-native": RAY_DEFAULTS, "ray-tuned": RAY_TUNED}
    tuned = sim_queue("ray-tuned")
    # Ray's proxy refuses past max_queued_requests; each replica holds max_ongoing_requests
    assert tuned == {
        "queue_limit": RAY_TUNED["max_queued_requests"],
        "queue_per_replica": RAY_TUNED["max_ongoing_requests"] - 1,
        "cancel_timed_out": False,
    }
    native = sim_queue("ray-native")  # max_queued_requests -1: no limit
    assert native["queue_limit"] >= 10**6 and native["cancel_timed_out"] is False
    assert sim_queue("faro-fairsum", 50) == {"queue_limit": 50, "queue_per_replica": 0, "cancel_timed_out": True}
    pol = make_policy("ray-serve-tuned", [ModelSLO(name="m", slo_ms=720)], ClusterSpec(cpus=4))
    a = RAY_TUNED["autoscaling_config"]
    assert (pol.name, pol.tick_s, pol.target_ongoing, pol.up_delay, pol.down_delay, pol.look_back) == (
        "ray-serve-tuned",
        a["metrics_interval_s"],
        a["target_ongoing_requests"],
        a["upscale_delay_s"],
        a["downscale_delay_s"],
        a["look_back_period_s"],
    )
    # ray-serve keeps the cluster's reactive interval (10 s, Ray's default metrics interval)
    assert make_policy("ray-serve", [ModelSLO(name="m", slo_ms=720)], ClusterSpec(cpus=4)).tick_s == 10


@pytest.mark.parametrize("per_replica", [0, 1])
def test_each_serving_replica_holds_its_share_beyond_the_queue_limit(per_replica):
    """3 replicas of 1 s at 10 req/s: the waiting room is the limit (5) plus what the serving
    replicas hold (L = 5 + per_replica x 3), so an admitted request finds at most L - 1 ahead
    and waits at most floor((L - 1) / 3) services plus the rest of one in progress."""
    m = [ModelSLO(name="m", slo_ms=5000.0, processing_ms=1000.0, max_replicas=3)]
    cfg = SimConfig(
        capacity_cpus=3,
        initial_replicas=3,
        processing=TimeDist("const", (1.0,)),
        router_overhead=NO_OVERHEAD,
        queue_limit=5,
        queue_per_replica=per_replica,
        keep_records=True,
    )
    res = simulate(np.array([[600.0, 600.0]]), m, Hold(m, ClusterSpec(cpus=3)), cfg)
    rec = res.records
    served = ~rec["dropped"]
    bound = (5 + 3 * per_replica - 1) // 3 + 1.0 + 1.0  # the wait, then its own service
    assert rec["latency_s"][served].max() <= bound + 1e-9
    assert rec["latency_s"][served].max() > bound - 0.2  # the room is full under 3x overload
    # about 3 of every 10 served, the rest tail-dropped and counted by the shared metrics
    assert served.sum() + rec["dropped"].sum() == res.summary.job_requests[0]
    assert res.summary.job_dropped[0] / res.summary.job_requests[0] == pytest.approx(0.7, abs=0.03)


def _step(policy: str):
    """One model of 100 ms at 3 req/s for 2 minutes, then 40 req/s for 3 (4 replicas' worth)
    on a cluster of 10, with the server of the policy's live run (sim_queue)."""
    m = [ModelSLO(name="m", slo_ms=500.0, processing_ms=100.0)]
    live = next(k for k, v in NATIVE.items() if v == policy)
    cfg = SimConfig(
        capacity_cpus=10,
        cold_start_s=5.0,
        processing=TimeDist("const", (0.1,)),
        router_overhead=NO_OVERHEAD,
        client_timeout_s=60.0,
        keep_records=True,
        **sim_queue(live),
    )
    counts = np.array([[180.0, 180.0, 2400.0, 2400.0, 2400.0]])
    return simulate(counts, m, make_policy(policy, m, ClusterSpec(cpus=10)), cfg)


def test_tuned_ray_reacts_to_a_step_in_seconds_and_tail_drops_past_its_queue(report):
    default, tuned = _step("ray-serve"), _step("ray-serve-tuned")

    def first_upscale(res):  # seconds from the step (t = 120) to Ray's first added replica
        t = res.tick_times
        up = t[(t >= 120) & (res.targets[:, 0] > res.targets[0, 0])]
        return float(up[0] - 120) if up.size else np.inf

    up_d, up_t = first_upscale(default), first_upscale(tuned)
    # Ray's rule acts after the desire held upscale_delay_s: 3 s tuned (plus a 2 s metrics
    # tick and the 10 s look-back's average crossing 1), 30 s by default
    assert up_t <= 10 and up_d >= 30, (up_t, up_d)
    lat_t = tuned.records["latency_s"][~tuned.records["dropped"]]
    lat_d = default.records["latency_s"][~default.records["dropped"]]
    # tuned: refused past 50 queued + 1 at each replica, so a served request waited at most
    # (50 + r) / r services of 0.1 s (largest at one replica); by default nothing is refused
    # and the backlog of the 30 s delay waits
    assert tuned.summary.job_dropped[0] > 0 and lat_t.max() <= 52 * 0.1 + 1e-9
    assert default.summary.job_dropped[0] == 0 and lat_d.max() > 5.2
    assert tuned.summary.lost_cluster_utility < default.summary.lost_cluster_utility
    report(
        f"step 3 -> 40 req/s: first upscale after {up_t:.0f} s tuned, {up_d:.0f} s default; "
        f"tuned tail-dropped {int(tuned.summary.job_dropped[0])} of "
        f"{int(tuned.summary.job_requests[0])}, max latency {lat_t.max():.2f} s against "
        f"{lat_d.max():.2f} s"
    )


def test_report_line_names_ray_settings_as_ray_does():
    line = ray_settings_line(RAY_TUNED)
    for k, v in RAY_TUNED["autoscaling_config"].items():
        assert f"{k}: {v:g}" in line
    assert "max_ongoing_requests: 2" in line and "max_queued_requests: 50" in line
    assert "max_queued_requests: -1" in ray_settings_line(RAY_DEFAULTS)


def test_compare_accepts_ray_tuned_and_names_it_among_the_choices(cli, tmp_path):
    """Argument checks run before any Ray cluster starts: ray-tuned passes them (a bad slice
    fails later, on the trace), an unknown name fails listing ray-tuned among the choices."""
    code, _, err = cli("compare", "--policies", "ray-tuned,nope", "--out", str(tmp_path))
    assert code == 2 and "unknown nope" in err and "ray-tuned" in err and "ray-native" in err
    code, _, err = cli(
        "compare",
        "--policies",
        "faro-fairsum,ray-native,ray-tuned",
        "--trace",
        str(tmp_path / "missing.csv"),
        "--out",
        str(tmp_path),
    )
    assert code == 2 and "--policies" not in err and "missing.csv" in err
    code, _, err = cli("compare", "--policies", "ray-tuned", "--capacity", "0.5", "--out", str(tmp_path))
    assert code == 2 and "--capacity must be a finite number >= 1 (got 0.5)" in err
