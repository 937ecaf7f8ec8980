"""A live replay's records through the simulator's metric code (paper section 6).

The point of a replay is to compare a live run with the matched simulator, so nothing here
computes a metric: :func:`replay_result` turns the records into the arrays
``faro_serve.metrics`` takes (model, arrival, latency, dropped) and builds the very
:class:`~faro_serve.sim.runner.SimResult` the simulator returns, so ``to_dict()`` (the
``faro-serve simulate --json`` document) and the simulate table are the same code.

Outcomes: a 200 is served; anything else (503 drop or queue-full, 4xx, a connection error
or timeout) is a failed request, counted as dropped (infinite latency), as the paper counts
a dropped request. Requests the sender could not send (in-flight cap) are left out of the
metrics and reported in ``accounting.not_sent``. A request's latency is what its client
sees: the answer time plus the network time the schedule attached (``--network-delay``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from ..metrics import minute_table, summarize
from ..sim.runner import SimResult
from .client import NOT_SENT, ReplayRecords
from .loadgen import Schedule


def client_latency(schedule: Schedule, rec: ReplayRecords) -> tuple[np.ndarray, np.ndarray]:
    """(served, latency s) per request: what its client sees, the answer time plus the
    network time the schedule attached; infinite for a request not answered 200."""
    served = np.array([s == "200" for s in rec.status], dtype=bool)
    return served, np.where(served, rec.latency_s + schedule.network_s, np.inf)


def replay_result(
    schedule: Schedule,
    rec: ReplayRecords,
    slo_ms: dict[str, float],
    percentile: dict[str, float],
    policy: str = "live",
    capacity: float | None = None,
) -> SimResult:
    names = schedule.names
    sent = np.array([s != NOT_SENT for s in rec.status], dtype=bool)
    served, lat = client_latency(schedule, rec)
    slo_s = np.array([slo_ms[n] / 1e3 for n in names])
    pct = np.array([percentile[n] for n in names])
    table = minute_table(
        names,
        rec.model[sent],
        rec.trace_s[sent],
        lat[sent],
        ~served[sent],
        slo_s,
        minutes=schedule.minutes,
        percentile=pct,
    )
    summary = summarize(table, slo_s)
    ticks, targets, serving = [], [], []
    for t, st in rec.status_polls:
        models = st.get("models") or {}
        if all(n in models for n in names):
            ticks.append(t)
            targets.append([models[n].get("target") or np.nan for n in names])
            serving.append([models[n].get("replicas") or np.nan for n in names])
    if not ticks:  # no status seen: the table shows "nan" replicas rather than guessing
        targets = serving = [[np.nan] * len(names)]
    if capacity is None:
        caps = [st.get("capacity_cpus") for _, st in rec.status_polls if st.get("capacity_cpus")]
        capacity = float(caps[-1]) if caps else float("nan")
    return SimResult(
        policy=policy,
        names=list(names),
        capacity_cpus=capacity,
        seed=schedule.seed,
        table=table,
        summary=summary,
        wall_s=rec.wall_s,
        tick_times=np.asarray(ticks, float),
        targets=np.asarray(targets, float),
        serving=np.asarray(serving, float),
    )


def replay_step(
    schedule: Schedule, rec: ReplayRecords, slo_ms: dict[str, float], percentile: dict[str, float], step_s: float
) -> dict:
    """The surge metrics of ``faro_serve.recovery`` on the replay's records, on the trace's
    clock (the instants the minute tables use); requests not sent are left out."""
    from ..recovery import surge_report

    names = schedule.names
    sent = np.array([s != NOT_SENT for s in rec.status], dtype=bool)
    served, lat = client_latency(schedule, rec)
    return surge_report(
        names,
        rec.model[sent],
        rec.trace_s[sent],
        lat[sent],
        ~served[sent],
        [slo_ms[n] / 1e3 for n in names],
        [percentile[n] for n in names],
        step_s,
    )


def _ms(v: float):
    if math.isnan(v):
        return None  # no request in that minute
    return "inf" if math.isinf(v) else round(v * 1e3, 2)


def replay_document(res: SimResult, schedule: Schedule, rec: ReplayRecords, url: str) -> dict:
    """``SimResult.to_dict()`` (the simulate JSON) plus what only a live run has."""
    out = res.to_dict() | {"forecaster": "live"}
    out["accounting"] = rec.counts()
    reasons: dict[str, int] = {}
    for s, r in zip(rec.status, rec.reason):
        if s not in ("200", NOT_SENT):
            key = f"{s}:{r}" if r else s
            reasons[key] = reasons.get(key, 0) + 1
    out["failures"] = dict(sorted(reasons.items()))
    out["per_minute_p99_ms"] = {n: [_ms(float(v)) for v in res.table.p_all[i]] for i, n in enumerate(res.names)}
    out["replay"] = {
        "url": url,
        "jobs": schedule.jobs,
        "models": schedule.names,
        "time_scale": schedule.time_scale,
        "rate_scale": schedule.rate_scale,
        "trace_minutes": schedule.minutes,
        "duration_s": schedule.duration_s,
        "network": schedule.network,
        "network_ms_mean": round(float(schedule.network_s.mean()) * 1e3, 3) if schedule.size else 0.0,
    }
    return out


def write_records(path: Path, schedule: Schedule, rec: ReplayRecords) -> None:
    """One CSV row per scheduled request: model, trace and send instants, outcome, latency."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "job", "trace_s", "send_s", "status", "latency_ms", "reason", "network_ms"])
        for i in range(len(rec.status)):
            m = int(rec.model[i])
            send = rec.send_s[i]
            lat = rec.latency_s[i]
            w.writerow(
                [
                    schedule.names[m],
                    schedule.jobs[m],
                    f"{rec.trace_s[i]:.6f}",
                    "" if math.isnan(send) else f"{send:.6f}",
                    rec.status[i],
                    "" if math.isnan(lat) else f"{lat * 1e3:.3f}",
                    rec.reason[i],
                    f"{schedule.network_s[i] * 1e3:.3f}",
                ]
            )


def write_json(path: str | Path, doc: dict) -> None:
    text = json.dumps(doc, indent=2)
    if str(path) == "-":
        print(text)
    else:
        Path(path).write_text(text + "\n")
