"""The demo's report: ``report.md`` and ``timeline.png`` from a replay's records.

Every figure comes from the replay's own outputs: the metrics from
:func:`~faro_serve.replay.replay_report.replay_result` (the simulator's metric code), the accounting
from the sender's records, the replicas from the ``GET /faro/status`` polls made during the
replay. Time is in trace minutes (a trace minute lasts ``60 x time_scale`` wall seconds).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from ..replay.client import NOT_SENT, ReplayRecords
from ..replay.loadgen import Schedule


def trim(schedule: Schedule, rec: ReplayRecords, minutes: int) -> tuple[Schedule, ReplayRecords]:
    """The first ``minutes`` trace minutes of a run (an interrupted run's metrics cover only
    the minutes it reached)."""
    keep = schedule.trace_s < 60.0 * minutes
    sched = dataclasses.replace(
        schedule,
        model=schedule.model[keep],
        trace_s=schedule.trace_s[keep],
        send_s=schedule.send_s[keep],
        counts=schedule.counts[:, :minutes],
        network_s=schedule.network_s[keep],
    )
    idx = np.flatnonzero(keep)
    r = dataclasses.replace(
        rec,
        model=rec.model[keep],
        trace_s=rec.trace_s[keep],
        send_s=rec.send_s[keep],
        status=[rec.status[i] for i in idx],
        latency_s=rec.latency_s[keep],
        reason=[rec.reason[i] for i in idx],
    )
    return sched, r


def replica_timeline(schedule: Schedule, rec: ReplayRecords) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trace minute of each status poll, serving replicas, target replicas), (polls, models)."""
    names = schedule.names
    t, serving, target = [], [], []
    for wall, st in rec.status_polls:
        models = st.get("models") or {}
        t.append(wall / (60.0 * schedule.time_scale))
        serving.append([float((models.get(n) or {}).get("replicas") or np.nan) for n in names])
        target.append([float((models.get(n) or {}).get("target") or np.nan) for n in names])
    shape = (len(t), len(names))
    return (np.asarray(t, float), np.asarray(serving, float).reshape(shape), np.asarray(target, float).reshape(shape))


def per_minute(schedule: Schedule, rec: ReplayRecords) -> dict[str, np.ndarray]:
    """Per (model, trace minute): sent, 200, 503, other failures, mean serving replicas."""
    n, minutes = len(schedule.names), schedule.minutes
    minute = np.minimum((rec.trace_s // 60).astype(int), minutes - 1)
    status = np.asarray(rec.status, dtype=object)
    out = {}
    for key, mask in (
        ("sent", status != NOT_SENT),
        ("ok", status == "200"),
        ("503", status == "503"),
        ("other", (status != NOT_SENT) & (status != "200") & (status != "503")),
    ):
        a = np.zeros((n, minutes), dtype=np.int64)
        np.add.at(a, (rec.model[mask], minute[mask]), 1)
        out[key] = a
    t, serving, _ = replica_timeline(schedule, rec)
    reps = np.full((n, minutes), np.nan)
    for m in range(minutes):
        sel = (t >= m) & (t < m + 1)
        if sel.any():
            with np.errstate(all="ignore"):
                reps[:, m] = np.nanmean(serving[sel], axis=0) if np.isfinite(serving[sel]).any() else np.nan
    out["replicas"] = reps
    return out


def plot_timeline(
    path: Path, schedule: Schedule, rec: ReplayRecords, p_all: np.ndarray, slo_ms: dict[str, float]
) -> None:
    """One row per model: arrivals per minute (served/failed), replicas, per-minute p99 vs SLO."""
    from ..sim.plots import _plt, _save

    plt = _plt()
    names, minutes = schedule.names, schedule.minutes
    pm = per_minute(schedule, rec)
    t, serving, target = replica_timeline(schedule, rec)
    x = np.arange(minutes)
    fig, axes = plt.subplots(len(names), 3, figsize=(12, 2.3 * len(names) + 0.6), dpi=90, squeeze=False, sharex=True)
    for i, name in enumerate(names):
        ax = axes[i, 0]
        ax.bar(x + 0.5, pm["ok"][i], width=0.8, color="#3182bd", label="200")
        ax.bar(
            x + 0.5, pm["503"][i] + pm["other"][i], width=0.8, bottom=pm["ok"][i], color="#d62728", label="503 / failed"
        )
        ax.set_ylabel(f"{name}\nrequests/min", fontsize=8)
        ax.set_ylim(0, max(1, int((pm["sent"][i]).max())) * 1.3)  # room for the legend
        ax = axes[i, 1]
        if t.size:
            ax.step(t, serving[:, i], where="post", color="#08519c", label="serving")
            ax.step(t, target[:, i], where="post", color="#ff7f0e", linestyle="--", label="target")
        ax.set_ylabel("replicas", fontsize=8)
        top = np.nanmax(np.concatenate([serving[:, i], target[:, i], [1.0]])) if t.size else 1.0
        ax.set_ylim(0, top + 1)
        ax = axes[i, 2]
        p = p_all[i] * 1e3
        finite = np.isfinite(p)
        slo = slo_ms[name]
        ax.plot(x[finite] + 0.5, p[finite], marker="o", color="#08519c", label="p99 per minute")
        high = max([slo * 1.3] + list(p[finite] * 1.15))
        if (np.isinf(p)).any():  # a minute whose p99 is a failed request
            ax.plot(
                x[np.isinf(p)] + 0.5,
                np.full(int(np.isinf(p).sum()), high * 0.95),
                "x",
                color="#d62728",
                label="p99 = failed request",
            )
        ax.axhline(slo, color="#d62728", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        ax.set_ylim(0, high)
        ax.set_ylabel("ms", fontsize=8)
    from matplotlib.ticker import MaxNLocator

    for ax in axes[-1]:
        ax.set_xlabel("trace minute of the replay")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for j, title in enumerate(("arrivals per minute", "replicas (status polls)", "p99 latency vs SLO")):
        axes[0, j].set_title(title, fontsize=9)
        axes[0, j].legend(fontsize=7, frameon=False, loc="upper left", ncol=2)
    for ax in axes.ravel():
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.set_xlim(0, minutes)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def _ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    return "failed" if math.isinf(v) else f"{v * 1e3:.0f}"


def _accounting_line(acc: dict) -> str:
    by = ", ".join(f"{k}: {v:,}" for k, v in acc["by_status"].items()) or "none"
    return (
        f"sent {acc['sent']:,} = answered {acc['answered']:,} ({by}) + errors {acc['errors']:,}; "
        f"not sent {acc['not_sent']:,} (of {acc['scheduled']:,} scheduled)"
    )


def render_markdown(
    doc: dict,
    res,
    schedule: Schedule,
    rec: ReplayRecords,
    slo_ms: dict[str, float],
    meta: dict,
    image: str | None = "timeline.png",
) -> str:
    """``report.md``: what ran, the accounting, a table per model and one per minute."""
    s = res.summary
    pm = per_minute(schedule, rec)
    _, serving, target = replica_timeline(schedule, rec)
    acc = doc["accounting"]
    lines = ["# faro-serve demo report", ""]
    if meta.get("interrupted"):
        lines += [
            f"**Partial report: interrupted (Ctrl-C) after {meta['stopped_at_s']:.0f} s of "
            f"{60 * schedule.time_scale * meta['full_minutes']:.0f} s; "
            f"the figures cover trace minutes 1-{schedule.minutes} of {meta['full_minutes']}; "
            f"{meta.get('unsent_after_stop', 0):,} requests due after the interrupt were not "
            f"sent.**",
            "",
        ]
    lines += [
        f"- when: {meta['when']}, wall {meta['wall_s']:.0f} s (replay {rec.wall_s:.0f} s)",
        f"- deployment: {meta['deployment']}",
        f"- policy {res.policy}, capacity {res.capacity_cpus:g} CPUs",
        f"- trace: {meta['trace']}",
        f"- load: {schedule.minutes} trace minute(s), a minute lasts {60 * schedule.time_scale:g} s "
        f"(time scale {schedule.time_scale:g}), counts x {schedule.rate_scale:g}, seed {schedule.seed}",
        "",
        "## Accounting",
        "",
        _accounting_line(acc),
        "",
    ]
    if doc.get("failures"):
        lines += ["Failures by status and reason: " + ", ".join(f"{k} {v:,}" for k, v in doc["failures"].items()), ""]
    lines += [
        "## Per model",
        "",
        "| model | SLO | requests | 200 | 503 | other | p99 of 200s | minutes p99 <= SLO | "
        "SLO violation rate | lost utility | replicas mean / max target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, n in enumerate(schedule.names):
        mask = (rec.model == i) & np.array([st == "200" for st in rec.status], dtype=bool)
        p99 = float(np.percentile(rec.latency_s[mask], 99)) if mask.any() else float("nan")
        p = res.table.p_all[i]
        has = res.table.requests[i] > 0
        ok_min = int((p[has] <= slo_ms[n] / 1e3).sum())
        reps = serving[:, i] if serving.size else np.array([np.nan])
        mean_r = float(np.nanmean(reps)) if np.isfinite(reps).any() else float("nan")
        max_r = float(np.nanmax(target[:, i])) if target.size and np.isfinite(target[:, i]).any() else float("nan")
        lines.append(
            f"| {n} | {slo_ms[n]:g} ms | {int(pm['sent'][i].sum()):,} | {int(pm['ok'][i].sum()):,} | "
            f"{int(pm['503'][i].sum()):,} | {int(pm['other'][i].sum()):,} | {_ms(p99)} ms | "
            f"{ok_min}/{int(has.sum())} | {s.job_slo_violation_rate[i]:.1%} | "
            f"{s.job_lost_utility[i]:.3f} | {mean_r:.1f} / {max_r:.0f} |"
        )
    lines += [
        "",
        f"Cluster: lost utility {s.lost_cluster_utility:.3f} (effective "
        f"{s.lost_effective_utility:.3f}), SLO violation rate {s.cluster_slo_violation_rate:.2%} "
        f"(a request violates its SLO when it fails or is slower than the SLO; a minute's p99 "
        f"is 'failed' when more than 1% of its requests failed).",
        "",
    ]
    if image:
        lines += [f"![arrivals, replicas and p99 vs SLO per model]({image})", ""]
    lines += list(meta.get("sections") or [])
    lines += [
        "## Per minute",
        "",
        "| minute | model | sent | 200 | 503 / other | p99 ms | SLO ms | replicas (mean) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in range(schedule.minutes):
        for i, n in enumerate(schedule.names):
            r = pm["replicas"][i, m]
            lines.append(
                f"| {m + 1} | {n} | {pm['sent'][i, m]:,} | {pm['ok'][i, m]:,} | "
                f"{pm['503'][i, m]:,} / {pm['other'][i, m]:,} | {_ms(float(res.table.p_all[i, m]))} | "
                f"{slo_ms[n]:g} | {'-' if math.isnan(r) else f'{r:.1f}'} |"
            )
    lines += ["", "## Files", ""] + [f"- `{f}`" for f in meta.get("files", [])] + [""]
    return "\n".join(lines)
