"""Batch latency curves (issue 47): the shape fitted to the H200 and the 16-core CPU profiles,
a model's batching declared by a profile file, measured points, Sponge's model or nothing
(measured live), the planner choosing batch and replicas for a flat (GPU) and a linear (CPU)
curve, every Faro mechanism sizing a batching model by its batches, and the simulator's
kernel batching as Ray's decorator does (a batch closes when its wait ends) or as Faro's
gate does (a freed replica takes its backlog)."""

import json

import numpy as np
import pytest
from conftest import ROOT
from pydantic import ValidationError

from autoscaler.contract.policy import ModelObservation
from autoscaler.policies.service import MIN_BATCHES, measured_shape, service_of
from faro_serve.batch_curve import BatchCurve, fit_hinge, linear_shape
from faro_serve.config import Batching, ClusterSpec, ModelSLO
from faro_serve.engine import plan
from faro_serve.sim.kernels import DONE, advance

PROFILES = ROOT / "profiles"


def rows(name: str, **match):
    doc = json.loads((PROFILES / name).read_text())
    out = [r for r in doc["rows"] if all(r.get(k) == v for k, v in match.items())]
    return [r["batch"] for r in out], [r["latency_s"] for r in out]


@pytest.mark.parametrize("arch", ["resnet18", "resnet34", "resnet50"])
def test_the_curves_fit_the_h200_and_the_cpu_profiles(arch, report):
    """The breakpoints through the H200 medians (made monotone) are the profile within 15 %
    at every batch; the three-number hinge (flat, then linear) fits the GPU where its knee
    is the data's (ResNet34/50: R2 >= 0.99) and the CPU at one thread (an affine line,
    R2 >= 0.94), and says how well (the docs' table)."""
    b, t = rows(f"h200-{arch}.json", dtype="fp32")
    points = BatchCurve.from_points(b, t)
    hinge = fit_hinge(b, t)
    cb, ct = rows(f"cpu16-{arch}.json", threads=1)
    cpu = fit_hinge(cb, ct)
    report(
        f"curve fit {arch}: H200 breakpoints R2 {points.r2:.4f} (max error "
        f"{points.max_rel_err:.1%}), H200 hinge R2 {hinge.r2:.4f} ({hinge.max_rel_err:.1%}), "
        f"CPU 1-thread hinge R2 {cpu.r2:.4f} ({cpu.max_rel_err:.1%})"
    )
    assert points.max_rel_err <= 0.15 and points.r2 >= 0.99
    assert np.all(np.diff(points.latency(np.arange(1, 129))) >= 0)  # never faster when larger
    assert cpu.r2 >= 0.94
    if arch != "resnet18":  # ResNet18's batch of 1 takes 1.45 ms, of 2-32 2.3-2.5: a step, not a knee
        assert hinge.r2 >= 0.99
    # the shape of a GPU: a batch of 16 costs at most 1.7x one request; of a CPU thread, ~16x
    assert points.shape(16)[16] <= 1.7 and cpu.shape(16)[16] >= 12


def test_a_curve_refuses_what_is_not_one():
    with pytest.raises(ValueError, match="increasing"):
        BatchCurve(((2.0, 0.01), (1.0, 0.02)))
    with pytest.raises(ValueError, match="not fall"):
        BatchCurve(((1.0, 0.02), (2.0, 0.01)))
    with pytest.raises(ValueError, match="at least 2 batch sizes"):
        fit_hinge([4, 4], [0.01, 0.011])
    c = BatchCurve.affine(0.003, 0.001)  # 3 ms a request, 1 ms a batch
    assert c.latency(5) == pytest.approx(0.016) and c.shape(4).tolist() == pytest.approx([0, 1, 1.75, 2.5, 3.25])
    assert BatchCurve.from_dict(c.to_dict()).points == c.points


def test_a_models_batching_from_a_file_points_sponge_or_nothing(tmp_path):
    h200 = Batching(profile=str(PROFILES / "h200-resnet50.json"), max_batch_size=64)
    assert h200.latency_ms[1] == pytest.approx(3.332, abs=1e-3) and not h200.measured
    assert h200.shape()[64] == pytest.approx(9.51 / 3.332, rel=0.01)  # fp32 rows, batch 64
    pts = Batching(latency_ms={1: 3.3, 16: 4.3, 64: 9.5}, max_batch_size=32, batch_wait_s=0.004)
    assert pts.shape()[16] == pytest.approx(4.3 / 3.3) and pts.batch_wait_s == 0.004
    cpu = Batching(profile=str(PROFILES / "cpu16-resnet18.json"))  # its Sponge fit: gamma ...
    assert cpu.gamma > 0 and cpu.share(16.0) == pytest.approx(1.0)  # eps = eta = 0: no gain
    saved = tmp_path / "mine.json"  # what faro-serve profile --deployment writes
    saved.write_text(json.dumps({"curve": BatchCurve(((1.0, 0.01), (8.0, 0.012))).to_dict()}))
    assert Batching(profile=str(saved)).shape(bmax=8)[8] == pytest.approx(1.2)
    live = Batching(max_batch_size=16)  # nothing: measured from the replicas' batches
    assert live.measured and live.curve() is None and live.shape().tolist() == linear_shape(16).tolist()
    with pytest.raises(ValidationError, match="give the batch curve once"):
        Batching(gamma=0.1, latency_ms={1: 3.0})
    with pytest.raises(ValidationError, match="latency_ms needs batch sizes >= 1"):
        Batching(latency_ms={0: 3.0})
    with pytest.raises(ValidationError, match="not a saved profile"):
        Batching(profile=str(tmp_path / "nope.json"))


def _obs(name, **kw):
    base = dict(name=name, replicas=1, target_replicas=1, arrivals_per_min=np.full(20, 600.0))
    return ModelObservation(**{**base, **kw})


def test_a_curve_not_given_is_measured_from_the_replicas_batches():
    """No curve declared: a batch saves nothing (f(b) = b) until the meter has reported
    MIN_BATCHES batches of two sizes; then the hinge fitted to them, and one request's time
    from the batches' times."""
    m = ModelSLO(name="g", slo_ms=200, batching=Batching(max_batch_size=16))
    early = service_of(m, _obs("g", processing_ms=12.0, mean_batch=4.0))
    assert not early.curve_known and early.shape[16] == 16
    assert early.p_s == pytest.approx(0.003)  # 12 ms for a batch of 4 at f(4) = 4
    times = np.array([[1, 40, 0.010], [4, 60, 0.011], [16, 30, 0.016]])  # flat, then linear
    svc = service_of(m, _obs("g", processing_ms=12.0, mean_batch=6.0, batch_times=times))
    assert svc.curve_known and svc.shape[4] == pytest.approx(1.1, abs=0.05) and svc.shape[16] < 1.8
    assert svc.p_s == pytest.approx(0.010, rel=0.1)
    few = times.copy()
    few[:, 1] = MIN_BATCHES - 1
    assert measured_shape(few, 16) is None


FLAT = Batching(latency_ms={1: 10.0, 32: 12.0, 64: 20.0}, max_batch_size=64)  # a GPU's
LINEAR = Batching(gamma=0.010, eps=0.0, max_batch_size=64)  # a CPU's: a batch saves nothing


def test_the_planner_takes_a_large_batch_and_few_replicas_on_a_flat_curve_and_batch_one_on_a_linear():
    cluster = ClusterSpec(cpus=64, objective="fair_sum", cold_start_s=0)
    rates = {"m": np.full((20, 7), 800.0)}  # 800 req/s x 10 ms: 8 replicas' worth one at a time
    flat = plan([ModelSLO(name="m", slo_ms=100, processing_ms=10, batching=FLAT)], rates, {"m": 1}, cluster)
    lin = plan([ModelSLO(name="m", slo_ms=100, processing_ms=10, batching=LINEAR)], rates, {"m": 1}, cluster)
    one = plan([ModelSLO(name="m", slo_ms=100, processing_ms=10)], rates, {"m": 1}, cluster)
    f, li, o = flat.decisions[0], lin.decisions[0], one.decisions[0]
    assert f.batch_size >= 8 and f.replicas <= 2 and f.latency_ms <= 100
    assert li.batch_size == 1 and li.replicas == o.replicas >= 4 * f.replicas


def test_the_surge_rule_and_the_guard_size_a_batching_model_by_its_batches():
    """The rate one replica serves within the SLO, and the replicas a rate needs: a flat
    curve's replicas serve many times what one request at a time serves."""
    cluster = ClusterSpec(cpus=64)
    batched = service_of(ModelSLO(name="m", slo_ms=100, processing_ms=10, batching=FLAT))
    plain = service_of(ModelSLO(name="m", slo_ms=100, processing_ms=10))
    assert batched.max_rate(1, cluster) > 10 * plain.max_rate(1, cluster)
    assert batched.replicas_for(800.0, cluster) == 1 and plain.replicas_for(800.0, cluster) >= 9
    assert batched.latency(1, batched.max_rate(1, cluster), cluster, exact=True) <= 0.1 + 1e-9


def _kernel(arr, batch, wait, window, shape, p=0.01, replicas=1):
    n = arr.size
    start, lat, status = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=np.int8)
    advance(
        0.0,
        1e9,
        arr,
        np.full(n, p),
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        0,
        n,
        np.zeros(n + 1, dtype=np.int64),
        0,
        0,
        np.zeros(replicas),
        np.full(replicas, -np.inf),
        0.0,
        10_000,
        0.0,
        np.inf,
        True,
        batch,
        shape,
        1.0,
        wait,
        window,
    )
    assert np.all(status == DONE)
    return start, lat


def test_the_kernel_batches_as_rays_decorator_or_as_farós_gate():
    """Requests every 2 ms on one replica whose batch takes 10 ms (flat): Ray's decorator
    (a 4 ms wait, a batch closes when it ends) serves batches of what came within 4 ms of
    the first; a replica that takes its backlog (Faro's gate) serves everything queued when
    it frees; a lone request waits out the wait for company that never comes."""
    shape = np.ones(65)
    shape[0] = 0.0
    arr = np.arange(40) * 0.002
    ray_start, _ = _kernel(arr, 16, 0.004, True, shape)
    gate_start, _ = _kernel(arr, 16, 0.0, False, shape)
    ray_sizes = np.unique(ray_start, return_counts=True)[1]
    gate_sizes = np.unique(gate_start, return_counts=True)[1]
    assert ray_sizes.max() <= 3 and gate_sizes.max() >= 5 and gate_sizes.size < ray_sizes.size
    _, lone = _kernel(np.array([1.0]), 16, 0.004, True, shape)
    assert lone[0] == pytest.approx(0.004 + 0.01)
    _, full = _kernel(np.full(16, 1.0), 16, 0.004, True, shape)  # a full batch does not wait
    assert full == pytest.approx(np.full(16, 0.01))


def test_the_reactive_step_raises_a_flat_curves_batch_when_the_model_breaks_its_slo():
    """A batching model over its SLO for the trigger period with a small batch in force gets
    its largest batch at once beside its extra replica (a flat curve: full batches serve far
    more); a linear one does not (a larger batch would serve no more)."""
    from autoscaler import make_policy
    from autoscaler.contract.policy import Observation

    def run(batching):
        m = ModelSLO(name="m", slo_ms=100, processing_ms=10, batching=batching, max_replicas=8)
        pol = make_policy("faro-fairsum", [m], ClusterSpec(cpus=8, replan=False, surge=False))
        d = None
        for t in range(0, 60, 10):  # the plan at 0, then over the SLO from 10 s on
            o = _obs("m", arrival_rate=50.0, latency_ms=None if t == 0 else 400.0, batch_size=2, processing_ms=10.0)
            d = pol.decide(Observation(now=float(t), capacity_cpus=8, capacity_memory_gb=None, models={"m": o}))
            if t > 0 and d is not None and d.kind == "reactive":
                return d
        return d

    flat = run(FLAT)
    assert flat.field("batch_size") == {"m": 64} and flat.info["batch_raised"] == ["m"]
    lin = run(LINEAR)
    assert "m" not in lin.field("batch_size") and "batch_raised" not in lin.info


def test_the_surge_gives_a_flat_curves_model_its_largest_batch_with_its_replicas():
    """The surge rule sizes a batching model's replicas at its largest batch (service_of);
    one serving smaller batches on a flat curve gets that batch with them, as the reactive
    step gives it (a surge at batch 1 left it serving one at a time: the held-out day 10 of
    docs/batching.md); a linear curve's model keeps its batch."""
    from autoscaler import make_policy
    from autoscaler.contract.policy import Observation

    def run(batching, rate):
        m = ModelSLO(name="m", slo_ms=100, processing_ms=10, batching=batching, max_replicas=8)
        pol = make_policy("faro-fairsum", [m], ClusterSpec(cpus=8, replan=False))
        quiet = np.full(20, 60.0)  # 1 req/s for the last 20 minutes
        d = None
        for t, lam in ((0, 1.0), (10, rate)):  # the plan at 0, then the rate jumps
            o = _obs("m", arrival_rate=lam, arrivals_per_min=quiet, batch_size=1, processing_ms=10.0)
            d = pol.decide(Observation(now=float(t), capacity_cpus=8, capacity_memory_gb=None, models={"m": o}))
        return d

    flat = run(FLAT, 20_000.0)
    assert flat is not None and flat.kind == "surge" and flat.field("replicas")["m"] > 1, flat
    assert flat.field("batch_size") == {"m": 64} and flat.info["batch_raised"] == ["m"]
    lin = run(LINEAR, 2_000.0)
    assert lin is not None and lin.kind == "surge" and lin.field("replicas")["m"] > 1, lin
    assert "m" not in lin.field("batch_size") and "batch_raised" not in lin.info
