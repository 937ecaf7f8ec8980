"""What the demo's report says beyond the timeline (issue 19): the autoscaler's decisions
with their reasons, and whether the machine rather than the policy was the bottleneck.

* **Decisions**: every long-term plan (forecast band, estimated p99 per model at the
  chosen replicas, utility, the objective and what bound it) and every reactive step that
  changed something, with what triggered it: the autoscaler's own records
  (``GET /faro/decisions``), explained by :func:`autoscaler.driving.explain.explain`, at their time
  in the replay.
* **The machine**: per minute, the 1-minute load average against the cores, and each
  model's processing time (what its replicas measured, median of the autoscaler's reads)
  against the warm-up's or the first minute's; replica start times (target raised ->
  serving). A minute is *machine-bound* when the load average exceeds 1.5x the cores or a
  model's processing time drifted past 1.5x its baseline: SLO misses then say more about
  this machine than about the policy.
"""

from __future__ import annotations

import math
import os

import numpy as np

from autoscaler.driving.explain import explain

from ..validation.comparison import scale_up_lags

LOAD_FACTOR = 1.5  # load average above this many times the cores: the CPUs are oversubscribed
DRIFT_FACTOR = 1.5  # processing time above this many times its baseline: replicas starved


def notable(records: list[dict]) -> list[dict]:
    """Plans, and reactive decisions that changed replicas or drop rates."""
    out, last = [], None
    for rec in records:
        d = rec.get("decision") or {}
        info = d.get("info") or {}
        changed = (d.get("replicas") != last) or any(v for v in (d.get("drop_rates") or {}).values())
        if "models" in info or changed or info.get("scaled_up") or info.get("surge"):
            out.append(rec)
        last = d.get("replicas")
    return out


def decisions_section(records: list[dict], replay_start_wall: float | None) -> list[str]:
    """Markdown lines: the notable decisions, their time as seconds since the replay began."""
    keep = notable(records)
    lines = ["## Autoscaler decisions", ""]
    if not keep:
        return lines + ["The autoscaler made no decision during the replay (or could not be read).", ""]
    shifted = []
    for rec in keep:
        r = dict(rec)
        if replay_start_wall is not None and rec.get("time") is not None:
            r["t"] = float(rec["time"]) - replay_start_wall
        shifted.append(r)
    plans = sum(1 for r in keep if "models" in ((r.get("decision") or {}).get("info") or {}))
    lines += [
        f"{len(keep)} decisions that planned or changed something ({plans} long-term plans, "
        f"{len(keep) - plans} reactive steps), of {len(records)} recorded; t = seconds since "
        f"the replay started. Plans show the forecast band p10/p50/p90, the estimated p99 at the "
        f"chosen replicas and the objective; reactive steps show their trigger.",
        "",
        "```",
    ]
    lines += [ln for ln in explain(shifted) if ln.strip()] + ["```", ""]
    return lines


def machine_minutes(
    polls: list[tuple[float, dict]],
    load: list[tuple[float, float]],
    names: list[str],
    minute_s: float,
    minutes: int,
    baseline_ms: dict[str, float] | None = None,
    cores: int | None = None,
) -> dict:
    """Per minute: max load average, each model's median processing time, and the verdict."""
    cores = cores or os.cpu_count() or 1
    la = np.full(minutes, np.nan)
    for t, v in load:
        m = int(t // minute_s)
        if 0 <= m < minutes:
            la[m] = v if math.isnan(la[m]) else max(la[m], v)
    proc = {n: [[] for _ in range(minutes)] for n in names}
    for t, st in polls:
        m = int(t // minute_s)
        if not 0 <= m < minutes:
            continue
        for n in names:
            v = ((st.get("models") or {}).get(n) or {}).get("processing_ms")
            if v is not None:
                proc[n][m].append(float(v))
    med = {n: np.array([np.median(v) if v else np.nan for v in proc[n]]) for n in names}
    base = {}
    for n in names:
        b = (baseline_ms or {}).get(n)
        if b is None:
            finite = med[n][np.isfinite(med[n])]
            b = float(finite[0]) if finite.size else None
        base[n] = b
    bound = []
    for m in range(minutes):
        why = []
        if np.isfinite(la[m]) and la[m] > LOAD_FACTOR * cores:
            why.append(f"load average {la[m]:.1f} on {cores} cores")
        for n in names:
            v, b = med[n][m], base[n]
            if b and np.isfinite(v) and v > DRIFT_FACTOR * b:
                why.append(f"{n} processing {v:.0f} ms vs {b:.0f} ms")
        bound.append(why)
    lags = {n: scale_up_lags(polls, [n]) for n in names}
    return {"load": la, "processing": med, "baseline": base, "bound": bound, "lags": lags, "cores": cores}


def machine_section(
    mm: dict, names: list[str], slo_ok: dict[str, np.ndarray] | None = None, warmup_note: str | None = None
) -> list[str]:
    """Markdown lines for :func:`machine_minutes`' figures, with the verdict per minute."""
    lines = ["## The machine", ""]
    if warmup_note:
        lines += [warmup_note, ""]
    lines += [
        f"Per minute: the highest 1-minute load average ({mm['cores']} cores) and each model's "
        f"median processing time as its replicas measured it (baseline: "
        + ", ".join(f"{n} {mm['baseline'][n]:.0f} ms" if mm["baseline"][n] else f"{n} -" for n in names)
        + f"). A minute is machine-bound when the load average exceeds {LOAD_FACTOR:g}x the "
        f"cores or a processing time drifted past {DRIFT_FACTOR:g}x its baseline.",
        "",
        "| minute | load avg | " + " | ".join(f"{n} proc ms" for n in names) + " | machine-bound |",
        "|---:|---:|" + "---:|" * len(names) + "---|",
    ]
    for m in range(len(mm["bound"])):
        la = mm["load"][m]
        cells = [f"{v:.0f}" if np.isfinite(v) else "-" for v in (mm["processing"][n][m] for n in names)]
        lines.append(
            f"| {m + 1} | {'-' if not np.isfinite(la) else f'{la:.1f}'} | "
            + " | ".join(cells)
            + f" | {'; '.join(mm['bound'][m]) or 'no'} |"
        )
    lines.append("")
    starts = [
        f"{n}: {len(v)} start(s), median {np.median(v):.1f} s, max {max(v):.1f} s" for n, v in mm["lags"].items() if v
    ]
    lines += ["Replica starts (target raised -> serving): " + ("; ".join(starts) if starts else "none") + ".", ""]
    bound = [m + 1 for m, why in enumerate(mm["bound"]) if why]
    if not bound:
        lines += ["Verdict: the machine kept up in every minute; SLO misses are the policy's (or the load's).", ""]
    else:
        missed = []
        if slo_ok:
            for m in bound:
                bad = [n for n in names if n in slo_ok and m - 1 < slo_ok[n].size and not slo_ok[n][m - 1]]
                if bad:
                    missed.append(f"minute {m}: {', '.join(bad)} over the SLO")
        lines += [
            f"Verdict: the machine was the bottleneck in minute(s) {', '.join(map(str, bound))}"
            + (f" ({'; '.join(missed)})" if missed else "")
            + ": misses there measure this "
            "machine, not the policy.",
            "",
        ]
    return lines
