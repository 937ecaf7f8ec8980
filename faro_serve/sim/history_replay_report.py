"""``faro-serve whatif``'s figures and report: ``whatif.json`` (every figure), ``report.md``
(the tables docs/whatif.md explains, rendered by ``history_replay_markdown``) and one plot
per deployment (arrivals; recorded, as-run and Faro replicas), from a
:class:`faro_serve.sim.history_replay.WhatIf`.

Replica-hours count every replica a run asked for, starting ones included (what the cluster
reserved); the recorded ones count the healthy replicas Prometheus saw each minute. A request
violates its SLO when it is slower than the SLO's latency or dropped (the paper's rate).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from .history_replay import WhatIf
from .history_replay_markdown import markdown
from .plots import _colour, _plt, _save

TOP_MINUTES = 10


def _r(x, nd=4):
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def minute_replicas(res) -> np.ndarray:
    """Target replicas (models x minutes): the mean over each minute's ticks."""
    minute = (res.tick_times // 60).astype(int)
    n = res.table.minutes
    ticks = np.bincount(minute, minlength=n)[:n]
    out = np.stack(
        [np.bincount(minute, weights=res.targets[:, i], minlength=n)[:n] for i in range(res.targets.shape[1])]
    )
    return out / np.maximum(ticks, 1)


def _violating(res) -> np.ndarray:
    """Requests over the SLO or dropped, models x minutes."""
    return res.table.over_slo + res.table.dropped


def _run_figures(res, i: int, gpus: float) -> dict:
    s = res.summary
    rh = float(res.targets[:, i].sum() * res.tick_s / 3600.0)
    return {
        "slo_violation_rate": _r(s.job_slo_violation_rate[i], 6),
        "violating": int(_violating(res)[i].sum()),
        "dropped": int(s.job_dropped[i]),
        "replica_hours": round(rh, 3),
        "gpu_hours": round(rh * gpus, 3),
        "mean_replicas": round(float(res.targets[:, i].mean()), 3),
    }


def _total(runs: list[dict], requests: int) -> dict:
    bad = sum(r["violating"] for r in runs)
    return {
        "slo_violation_rate": _r(bad / requests, 6) if requests else 0.0,
        "violating": bad,
        "dropped": sum(r["dropped"] for r in runs),
        "replica_hours": round(sum(r["replica_hours"] for r in runs), 3),
        "gpu_hours": round(sum(r["gpu_hours"] for r in runs), 3),
    }


def _when(start: float, minute: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(start + 60.0 * minute))


def figures(w: WhatIf) -> dict:
    """Every figure of the report, JSON-ready."""
    hist, deps = w.hist, w.deployments
    per: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[dict[str, Any]]] = {"as_run": [], "faro": []}
    for i, d in enumerate(deps):
        dh = hist.deployments[d.key]
        rec = np.asarray(dh.replicas, float)
        seen = np.isfinite(rec)
        rec_h = float(np.nansum(rec) / 60.0)
        lat = hist.latency.get(dh.application)
        n, slow = lat.over(d.slo.ms) if lat is not None else (0.0, 0.0)
        row: dict[str, Any] = {
            "model": d.name,
            "mode": d.mode,
            "as_run_replicas": [d.min_replicas, d.max_replicas],
            "rule": d.rule,
            "cpus": d.cpus,
            "gpus": d.gpus,
            "faro_replicas": [1, d.faro_max],
            "initial_replicas": d.initial,
            "processing": str(d.processing),
            "processing_mean_ms": round(d.processing_mean_ms, 3),
            "slo_ms": d.slo.ms,
            "slo_percentile": d.slo.percentile,
            "slo_derived": d.slo.derived,
            "requests": int(w.as_run.summary.job_requests[i]),
            "recorded": {
                "mean_replicas": _r(np.nanmean(rec), 3) if seen.any() else None,
                "replica_hours": round(rec_h, 3),
                "gpu_hours": round(rec_h * d.gpus, 3),
                "minutes_without_replicas": int((~seen).sum()),
            },
        }
        for key, res in (("as_run", w.as_run), ("faro", w.faro)):
            row[key] = _run_figures(res, i, d.gpus)
            runs[key].append(row[key])
        row["check"] = {
            "measured_requests": round(n, 1),
            "measured_violation_rate": _r(slow / n, 6) if n > 0 else None,
            "simulated_violation_rate": row["as_run"]["slo_violation_rate"],
            "recorded_mean_replicas": row["recorded"]["mean_replicas"],
            "simulated_mean_serving_replicas": round(float(w.as_run.serving[:, i].mean()), 3),
        }
        per[d.key] = row
    requests = int(w.as_run.summary.job_requests.sum())
    total = {
        "requests": requests,
        "as_run": _total(runs["as_run"], requests),
        "faro": _total(runs["faro"], requests),
        "recorded": {
            "replica_hours": round(sum(r["recorded"]["replica_hours"] for r in per.values()), 3),
            "gpu_hours": round(sum(r["recorded"]["gpu_hours"] for r in per.values()), 3),
        },
    }
    cpus = np.array([d.cpus for d in deps])[:, None]
    ray_v, faro_v = _violating(w.as_run).sum(axis=0), _violating(w.faro).sum(axis=0)
    ray_r, faro_r = minute_replicas(w.as_run), minute_replicas(w.faro)
    rec = np.stack([np.asarray(hist.deployments[d.key].replicas, float) for d in deps])
    per_minute = {
        "requests": w.as_run.table.requests.sum(axis=0).tolist(),
        "as_run_violating": ray_v.tolist(),
        "faro_violating": faro_v.tolist(),
        "as_run_cpus": np.round((ray_r * cpus).sum(axis=0), 3).tolist(),
        "faro_cpus": np.round((faro_r * cpus).sum(axis=0), 3).tolist(),
        "recorded_cpus": np.round(np.nansum(rec * cpus, axis=0), 3).tolist(),
    }
    diff = faro_v - ray_v
    order = sorted(np.flatnonzero(diff), key=lambda m: (-abs(int(diff[m])), m))[:TOP_MINUTES]
    top = [
        {
            "minute": int(m),
            "time": _when(hist.start, int(m)),
            "requests": int(per_minute["requests"][m]),
            "as_run_violating": int(ray_v[m]),
            "faro_violating": int(faro_v[m]),
            "difference": int(diff[m]),
            "as_run_cpus": per_minute["as_run_cpus"][m],
            "faro_cpus": per_minute["faro_cpus"][m],
        }
        for m in order
    ]
    return {
        "source": hist.source,
        "start": _when(hist.start, 0) + " UTC",
        "minutes": hist.minutes,
        "capacity_cpus": w.capacity_cpus,
        "capacity_gpus": w.capacity_gpus,
        "policy": w.policy,
        "as_run_policy": w.as_run.policy,
        "seed": w.config.seed,
        "cold_start_s": w.config.cold_start_s,
        "queue": w.queue,
        "deployments": per,
        "total": total,
        "top_minutes": top,
        "days": _days(hist, w, ray_v, faro_v, ray_r, faro_r, rec),
        "per_minute": per_minute,
        "notes": list(w.notes),
        "decisions": {"as_run": dict(w.as_run.decisions), "faro": dict(w.faro.decisions)},
        "wall_s": {  # each replay's, and of it the time inside its policy (its own decisions)
            "as_run": round(w.as_run.wall_s, 2),
            "faro": round(w.faro.wall_s, 2),
            "as_run_policy": round(w.as_run.policy_s, 2),
            "faro_policy": round(w.faro.policy_s, 2),
        },
    }


def _days(hist, w, ray_v, faro_v, ray_r, faro_r, rec) -> list[dict]:
    """Per UTC day (only for a range over a day), in time order."""
    if hist.minutes <= 1440:
        return []
    day = ((hist.start + 60.0 * np.arange(hist.minutes)) // 86400).astype(int)
    gpus = np.array([d.gpus for d in w.deployments])[:, None]
    req = w.as_run.table.requests.sum(axis=0)
    out = []
    for k in np.unique(day):
        sel = day == k
        out.append(
            {
                "day": time.strftime("%Y-%m-%d", time.gmtime(86400.0 * k)),
                "minutes": int(sel.sum()),
                "requests": int(req[sel].sum()),
                "as_run_violating": int(ray_v[sel].sum()),
                "faro_violating": int(faro_v[sel].sum()),
                "difference": int(faro_v[sel].sum() - ray_v[sel].sum()),
                "as_run_replica_hours": round(float(ray_r[:, sel].sum() / 60), 2),
                "faro_replica_hours": round(float(faro_r[:, sel].sum() / 60), 2),
                "recorded_replica_hours": round(float(np.nansum(rec[:, sel]) / 60), 2),
                "as_run_gpu_hours": round(float((ray_r[:, sel] * gpus).sum() / 60), 2),
                "faro_gpu_hours": round(float((faro_r[:, sel] * gpus).sum() / 60), 2),
            }
        )
    return out


# -- plots ----------------------------------------------------------------------------------
def plot_deployment(w: WhatIf, i: int, path: Path, ray_r: np.ndarray, faro_r: np.ndarray) -> None:
    """Arrivals per minute above; recorded, as-run and Faro replicas below (hours)."""
    plt = _plt()
    d = w.deployments[i]
    dh = w.hist.deployments[d.key]
    hours = np.arange(w.hist.minutes) / 60.0
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 4.6), dpi=80, sharex=True)
    a1.plot(hours, dh.arrivals, color="#444444", linewidth=0.7)
    a1.set_ylabel("requests / min")
    a1.set_title(
        f"{d.key}: SLO {d.slo.ms:g} ms p{d.slo.percentile:g}" + (" (derived)" if d.slo.derived else ""), fontsize=10
    )
    a2.plot(hours, dh.replicas, color="#aaaaaa", linewidth=1.6, label="recorded")
    a2.plot(hours, ray_r[i], color=_colour("ray-serve", 0), linewidth=0.9, label="as run (simulated)")
    a2.plot(hours, faro_r[i], color=_colour("faro-fairsum", 0), linewidth=0.9, label=f"{w.policy} (simulated)")
    a2.set_ylabel("replicas")
    a2.set_xlabel("hours from the start")
    for a in (a1, a2):
        a.grid(alpha=0.3)
    a2.legend(fontsize=7, frameon=False, loc="upper left")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def write_report(w: WhatIf, out: str | Path, extra: dict | None = None, plots: bool = True) -> dict:
    """Write ``whatif.json``, ``report.md`` and ``plots/`` under ``out``; returns the figures."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    f = figures(w) | (extra or {})
    names = []
    if plots:
        (out / "plots").mkdir(exist_ok=True)
        ray_r, faro_r = minute_replicas(w.as_run), minute_replicas(w.faro)
        for i, d in enumerate(w.deployments):
            rel = f"plots/{d.name}.png"
            plot_deployment(w, i, out / rel, ray_r, faro_r)
            names.append(rel)
    f["plots"] = names
    (out / "whatif.json").write_text(json.dumps(f, indent=1) + "\n")
    (out / "report.md").write_text(markdown(f, names))
    return f
