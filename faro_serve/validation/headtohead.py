"""The live head-to-head report of ``faro-serve compare`` (issue 18): faro-serve against what
its users run today, plain Ray Serve under Ray's own autoscaler (``ray-native`` at Ray's
defaults, ``ray-tuned`` as Ray's guide tunes it for latency), on the same trace slice, each
on freshly deployed models.

Pure: it reads what :func:`faro_serve.validation.matched.run_live` saved (each run's schedule
and request records) and the validation document of
:func:`~faro_serve.validation.matched.resimulate` (the simulated counterpart of each run), and
writes markdown and plots. Every figure comes from the simulator's metric code.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..engine import min_replicas_for_slo
from ..metrics import Summary
from ..replay.replay_report import replay_result
from .comparison import NATIVE, RAY_SETTINGS, Workload, ray_settings_line, sim_policy


def loss_verdict(p: str, ours: Summary, b: str, theirs: Summary) -> str:
    """One line: the utility ``p`` loses against what Ray's run ``b`` loses (their ratio,
    the paper's measure, where ``b`` lost any), and both runs' SLO violation rates."""
    lost, base = ours.lost_cluster_utility, theirs.lost_cluster_utility
    if base > 0:
        head = f"{p} loses {lost / base:.2f}x the utility {b} loses ({lost:.3f} against {base:.3f})"
    elif lost > 0:
        head = f"{p} loses {lost:.3f} of utility where {b} loses none (no ratio)"
    else:
        head = f"{p} loses no utility, nor does {b}"
    return (
        f"{head}; SLO violations {100 * ours.cluster_slo_violation_rate:.2f} % against "
        f"{100 * theirs.cluster_slo_violation_rate:.2f} %."
    )


def contention(wl: Workload, capacity: float) -> dict:
    """How much the slice asks of the cluster: per job the replicas its busiest minute needs
    within the SLO (M/D/c), their sum against the capacity, and the most any one minute needs."""
    tr = wl.load()
    models = wl.models(tr.names)
    need = np.array(
        [
            [
                min_replicas_for_slo(
                    max(c / 60.0, 1e-9),
                    m.processing_ms / 1e3,
                    m.slo_ms / 1e3,
                    m.percentile / 100,
                    concurrency=m.concurrency,
                )[0]
                for c in row
            ]
            for row, m in zip(tr.counts, models)
        ]
    )
    return {
        "peak_need": {n: int(need[i].max()) for i, n in enumerate(tr.names)},
        "sum_of_peaks": int(need.max(axis=1).sum()),
        "max_minute_need": int(need.sum(axis=0).max()),
        "mean_need": round(float(need.sum(axis=0).mean()), 1),
        "capacity": capacity,
    }


def live_results(state: dict) -> dict:
    wl: Workload = state["workload"]
    out = {}
    for p, (sched, rec) in state["runs"].items():
        models = wl.models(sched.names)
        out[p] = replay_result(
            sched,
            rec,
            {m.name: m.slo_ms for m in models},
            {m.name: m.percentile for m in models},
            policy=p,
            capacity=state["capacity"],
        )
    return out


def replicas_over_time(rec, names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds, targets, running) from a run's status polls; NaN where a model was missing."""
    t = np.array([s for s, _ in rec.status_polls], float)
    tg = np.full((t.size, len(names)), np.nan)
    run = np.full((t.size, len(names)), np.nan)
    for k, (_, st) in enumerate(rec.status_polls):
        for j, n in enumerate(names):
            m = (st.get("models") or {}).get(n) or {}
            if m.get("target") is not None:
                tg[k, j] = m["target"]
            if m.get("replicas") is not None:
                run[k, j] = m["replicas"]
    return t, tg, run


def report(state: dict, doc: dict) -> str:
    wl: Workload = state["workload"]
    live = live_results(state)
    cont = contention(wl, state["capacity"])
    sims = doc["sim"]
    lines = [
        "# Live head-to-head: faro-serve against plain Ray Serve",
        "",
        f"Workload: {', '.join(wl.jobs)} of `{wl.trace}` day {wl.day} sample {wl.sample}, trace "
        f"minutes {wl.start}-{wl.start + wl.minutes} (one wall minute each), counts x{wl.rate_scale:g}, "
        f"processing and SLO x{wl.slowdown:g} (SLO {wl.slo_ms * wl.slowdown:g} ms at "
        f"p{wl.percentile:g}), seed {wl.seed}; capacity {state['capacity']:g} replicas of 1 CPU; "
        f"faro-serve's data path: {state.get('data_path', 'front')}.",
        "",
        f"Contention: the jobs' busiest minutes need {cont['sum_of_peaks']} replicas together "
        f"(per job {cont['peak_need']}), the busiest single minute {cont['max_minute_need']}, "
        f"the mean minute {cont['mean_need']}, against {cont['capacity']:g}.",
        "",
        "| run | lost cluster utility | SLO violation rate | simulated as | its lost utility "
        "| SLO violations | sent | answered (by status) | errors | load avg before / after |",
        "|---|---:|---:|---|---:|---:|---:|---|---:|---|",
    ]
    for p, res in live.items():
        s = res.summary
        acc = state["runs"][p][1].counts()
        sim = sims.get(p, {})
        load = state.get("load_average", {}).get(p, ("?", "?"))
        lines.append(
            f"| {p} | {s.lost_cluster_utility:.3f} | {100 * s.cluster_slo_violation_rate:.2f} % "
            f"| {sim_policy(p)} | {sim.get('lost_cluster_utility', math.nan):.3f} "
            f"| {100 * sim.get('cluster_slo_violation_rate', math.nan):.2f} % | {acc['sent']:,} "
            f"| {acc['answered']:,} ({', '.join(f'{k}: {v:,}' for k, v in acc['by_status'].items())}) "
            f"| {acc['errors']:,} | {load[0]} / {load[1]} |"
        )
    ray_runs = [p for p in live if p in NATIVE]
    if ray_runs:
        lines += [
            "",
            "Ray Serve's settings in force per Ray run (read back from Ray Serve at the "
            "run; runs saved before that: as configured):",
            "",
        ]
        held = state.get("ray_settings", {})
        lines += [f"- {p}: {ray_settings_line(held.get(p) or RAY_SETTINGS[p])}" for p in ray_runs]
    for b in ray_runs:
        for p, res in live.items():
            if p not in NATIVE:
                lines += ["", loss_verdict(p, res.summary, b, live[b].summary)]
    lines += [
        "",
        "Per-minute p99 (ms) against the SLO, live (inf: the minute's percentile fell on a failed request):",
        "",
    ]
    names = next(iter(live.values())).names
    for n in names:
        slo = wl.slo_ms * wl.slowdown
        lines.append(
            f"- {n} (SLO {slo:g} ms): "
            + "; ".join(
                f"{p} " + " ".join(_ms(v) for v in res.table.p_all[res.names.index(n)]) for p, res in live.items()
            )
        )
    lines += [
        "",
        "Sent = answered + errors for every run; a request not answered 200 (a 503: "
        "faro-serve's tail-drop or drop rate, or Ray's max_queued_requests refusing it) or "
        "not answered within the replay's 60 s timeout counts as dropped.",
        "",
    ]
    return "\n".join(lines)


def _ms(v: float) -> str:
    if math.isnan(v):
        return "-"
    return "inf" if math.isinf(v) else f"{v * 1e3:.0f}"


def plot(state: dict, path: Path) -> None:
    """Per model: replicas over time (target dashed, running solid) and the per-minute p99
    against the SLO, one colour per run."""
    from ..sim.plots import _colour, _plt, _save

    wl: Workload = state["workload"]
    live = live_results(state)
    names = next(iter(live.values())).names
    plt = _plt()
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 2.1 * len(names)), squeeze=False)
    for k, (p, (sched, rec)) in enumerate(state["runs"].items()):
        t, tg, run = replicas_over_time(rec, names)
        colour = _colour(p, k)
        for j, n in enumerate(names):
            ax = axes[j, 0]
            if t.size:
                ax.step(t / 60, run[:, j], where="post", color=colour, label=f"{p} running")
                ax.step(t / 60, tg[:, j], where="post", color=colour, ls="--", alpha=0.6)
            ax.set_ylabel(f"{n}\nreplicas", fontsize=8)
            p99 = live[p].table.p_all[j] * 1e3
            ax2 = axes[j, 1]
            ax2.plot(np.arange(p99.size), np.where(np.isinf(p99), np.nan, p99), "o-", ms=3, color=colour, label=p)
            ax2.axhline(wl.slo_ms * wl.slowdown, color="red", lw=0.8)
            ax2.set_yscale("log")
            ax2.set_ylabel("p99 ms", fontsize=8)
    axes[0, 0].set_title("replicas (running; target dashed)", fontsize=9)
    axes[0, 1].set_title("per-minute p99 vs SLO (red)", fontsize=9)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("wall minute")
    axes[-1, 1].set_xlabel("trace minute")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
