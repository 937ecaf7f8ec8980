"""What ``faro-serve whatif``'s replay takes of each deployment from its recorded history,
for :func:`faro_serve.sim.history_replay.build`: the simulated processing time (a lognormal
fitted to the recorded histogram, at the service time behind it), the SLO when none is given
(the p99 its application measured), and its Ray autoscaling settings with Ray Serve's
defaults filled in. Whatever is assumed is added to the run's notes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from autoscaler.policies.ray_rule import RAY_DEFAULTS, RULE_FIELDS
from forecasting.serve_history import ServeHistory, bucket_quantile

from ..distributions import PAPER_PROCESSING, TimeDist

Z90 = 1.2815515655446004  # the standard normal's 0.9 quantile
# Ray Serve 2.60's defaults for a field its REST API leaves out (or null)
RAY_RULE = {**RAY_DEFAULTS["autoscaling_config"], "upscaling_factor": 1.0, "downscaling_factor": 1.0}
RAY_MIN, RAY_MAX = 1, 1  # AutoscalingConfig's min_replicas / max_replicas
AUTO_MAX = 100  # num_replicas "auto": Ray's max_replicas for it
NO_TRAFFIC_SLO_MS = 1000.0


@dataclass(frozen=True)
class SLO:
    ms: float
    percentile: float = 99.0
    derived: bool = False


def fit_lognormal(le, counts, mean_ms: float) -> TimeDist | None:
    """The lognormal of mean ``mean_ms`` whose CDF is nearest (least squares) to the
    histogram's at its finite bucket edges: the mean (Prometheus's _sum / _count) is exact,
    and every edge counts, not two quantiles read by interpolating inside a bucket."""
    c = np.asarray(counts, float)
    edges = np.asarray(le, float)
    keep = np.isfinite(edges) & (edges > 0)
    if not c.size or not c[-1] > 0 or not keep.any():
        return None
    x, frac = np.log(edges[keep]), c[keep] / c[-1]

    def best_of(grid: np.ndarray) -> float:  # the shape whose CDF errs least at the edges
        mu = math.log(mean_ms) - grid**2 / 2
        err = ((ndtr((x[None, :] - mu[:, None]) / grid[:, None]) - frac[None, :]) ** 2).sum(axis=1)
        return float(grid[int(np.argmin(err))])

    best = best_of(np.linspace(0.01, 3.0, 300))
    best = best_of(np.linspace(max(0.001, best - 0.01), best + 0.01, 81))  # refined around it
    return TimeDist("lognorm", (best, 0.0, math.exp(math.log(mean_ms) - best**2 / 2) / 1e3))


def processing_of(d, notes: list[str]) -> tuple[TimeDist, float]:
    """(the simulated processing time, its mean in ms). Ray's processing time includes the
    wait inside a replica that admitted several requests, so the mean is the service time
    behind it (``DeploymentHistory.service_time_ms``: M/D/1 solved per step), and the shape
    the lognormal fitted (:func:`fit_lognormal`) to the quietest quarter of the minutes
    (``quiet_processing``), where that wait is least; without the steps, the whole range's
    histogram and mean; without a mean, through its p50 and p90; without a histogram, the
    paper's shape at the recorded mean."""
    counts, mean = d.quiet_processing()
    service = d.service_time_ms()
    p50 = bucket_quantile(d.processing_le, counts, 0.5)
    p90 = bucket_quantile(d.processing_le, counts, 0.9)
    fit = fit_lognormal(d.processing_le, counts, mean) if mean and mean > 0 else None
    if fit is not None and service is not None and service > 0:
        if mean and service < 0.95 * mean:
            notes.append(
                f"{d.key}: service time {service:.1f} ms behind a recorded processing time of "
                f"{d.processing_mean_ms or mean:.1f} ms (the rest: the wait inside its replicas)"
            )
        return fit.scaled_to_mean(service / 1e3), float(service)
    if fit is not None:
        return fit, float(mean)
    if p50 is not None and p90 is not None and p50 > 0:
        s = max(0.0, math.log(max(p90, p50) / p50) / Z90)
        dist = TimeDist("lognorm", (s, 0.0, p50 / 1e3))
        return dist, float(mean) if mean and mean > 0 else dist.mean * 1e3
    if mean and mean > 0:
        notes.append(
            f"{d.key}: no processing-time histogram; the paper's lognormal shape at its recorded mean {mean:.1f} ms"
        )
        return PAPER_PROCESSING.scaled_to_mean(mean / 1e3), float(mean)
    notes.append(f"{d.key}: no processing time recorded; the paper's {PAPER_PROCESSING.mean * 1e3:.0f} ms assumed")
    return PAPER_PROCESSING, PAPER_PROCESSING.mean * 1e3


def derived_slo(hist: ServeHistory, d, proc_ms: float, notes: list[str]) -> SLO:
    """The p99 the deployment's application measured end to end over the range."""
    lat = hist.latency.get(d.application)
    tot = np.zeros(0)
    if lat is not None and lat.counts:
        tot = np.nansum(np.asarray(lat.counts, float), axis=0)
    p99 = None if lat is None else bucket_quantile(lat.le, tot, 0.99)  # None where nothing was counted
    if lat is None or p99 is None:
        if sum(d.arrivals) <= 0:
            notes.append(
                f"{d.key}: no requests in the range; SLO {NO_TRAFFIC_SLO_MS:g} ms assumed (it does not matter)"
            )
            return SLO(max(NO_TRAFFIC_SLO_MS, 2 * proc_ms), 99.0, True)
        raise ValueError(
            f"{d.key}: its application {d.application!r} has no end-to-end latency "
            f"recorded to derive an SLO from; give --slo {d.key}=MS"
        )
    finite = [x for x in lat.le if math.isfinite(x)]
    if finite and p99 >= finite[-1]:
        notes.append(
            f"{d.key}: its application's p99 lies beyond the latency histogram's last "
            f"bucket; SLO taken as that bucket's edge, {p99:g} ms"
        )
    if not p99 > proc_ms:
        notes.append(
            f"{d.key}: its application's p99 ({p99:.0f} ms) is not above its mean "
            f"processing time ({proc_ms:.0f} ms); SLO 1.5 x that"
        )
        p99 = 1.5 * proc_ms
    return SLO(round(p99, 1), 99.0, True)


def ray_settings(d, notes: list[str]) -> tuple[str, int, int, dict]:
    """(mode, min, max, rule) of a deployment's Serve config (Ray's defaults filled in)."""
    cfg = d.config or {}
    ac = cfg.get("autoscaling_config")
    num = cfg.get("num_replicas")
    if not ac and num == "auto":
        ac = {"min_replicas": 1, "max_replicas": AUTO_MAX}
    if ac:
        rule = {k: RAY_RULE.get(k) if ac.get(k) is None else float(ac[k]) for k in RULE_FIELDS}
        for k, old in (
            ("upscaling_factor", "upscale_smoothing_factor"),
            ("downscaling_factor", "downscale_smoothing_factor"),
        ):
            if ac.get(k) is None:
                rule[k] = float(ac.get(old) or ac.get("smoothing_factor") or 1.0)
        lo = RAY_MIN if ac.get("min_replicas") is None else int(ac["min_replicas"])
        hi = RAY_MAX if ac.get("max_replicas") is None else int(ac["max_replicas"])
        if lo < 1:
            notes.append(f"{d.key}: min_replicas {lo} taken as 1 (the simulator keeps a replica)")
            lo = 1
        return "autoscaling", lo, max(lo, hi), rule
    if isinstance(num, (int, float)) and num >= 1:
        return "fixed", int(num), int(num), {}
    rec = np.asarray(d.replicas, float)
    n = int(round(float(np.nanmedian(rec)))) if np.isfinite(rec).any() else 1
    n = max(1, n)
    notes.append(
        f"{d.key}: no Serve config (read without --dashboard, or not running now): "
        f"fixed at its median recorded replicas, {n}"
    )
    return "unknown", n, n, {}


def first_recorded(replicas) -> int | None:
    rec = np.asarray(replicas, float)
    seen = np.flatnonzero(np.isfinite(rec))
    return None if not seen.size else int(round(rec[seen[0]]))
