"""``faro-serve status``: what the running autoscaler sees and decided, per model."""

from __future__ import annotations

import json

from ._live import fetch_status
from .errors import UsageError


def register(sub) -> None:
    p = sub.add_parser(
        "status",
        help="per-model SLO, load, latency and replicas of a running deployment",
        description="Reads GET <url>/faro/status from a running faro-serve "
        "deployment (serve run serve_config.yaml) and prints a table per model.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="Serve HTTP address")
    p.add_argument("--app", default="faro", help="route prefix of the autoscaler application")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument(
        "--explain",
        nargs="?",
        type=int,
        const=5,
        default=None,
        metavar="N",
        help="also explain the last N decisions (5): the forecast quantiles used, each "
        "model's estimated p99 and utility at the chosen replicas, the objective "
        "value and the constraint that bound (GET <url>/faro/decisions)",
    )
    p.set_defaults(func=run)


def _fmt(v, spec=".0f", none="-"):
    return none if v is None else format(v, spec)


def run(args) -> int:
    if args.explain is not None and args.explain < 1:
        raise UsageError(f"--explain N needs N >= 1 (got {args.explain})")
    st = fetch_status(args.url, args.app)
    decisions = fetch_status(args.url, args.app, path=f"decisions?limit={args.explain}") if args.explain else None
    if args.json:
        print(json.dumps(st if decisions is None else {"status": st, "decisions": decisions}, indent=2))
        return 0
    failing = tick_error_lines(st.get("tick_errors"))
    if not st.get("models") and not st.get("ticks"):  # just started or restarted: no tick yet
        if failing:  # its ticks fail before they observe: waiting will not help
            print("\n".join(failing))
            return 1
        restored = st.get("restored")
        source = restored.get("from") if isinstance(restored, dict) else None
        since = (
            ""
            if not restored
            else " since its config changed"
            if source == "the previous configuration"
            else " since it restarted (its state restored)"
        )
        print(
            f"the autoscaler ({st.get('policy', '?')}) has not observed the cluster yet{since}"
            + ": its first tick comes within its reactive interval (10 s by default); "
            "run faro-serve status again"
        )
        return 1
    from rich.table import Table

    from ..console import console

    loaded = st.get("forecaster")
    table = Table(
        title=f"faro-serve: policy {st.get('policy')} (objective {st.get('objective')}), "
        f"capacity {st.get('capacity_cpus')} CPUs" + (f", forecaster {loaded}" if loaded else ""),
        caption="p99 measured: over the last 30 s; utility measured: min(SLO / that p99, 1); "
        "utility planned: what the last plan expected over its window; forecaster: "
        "the predictor of that plan (or, before one, the forecaster loaded)",
    )
    shadow = st.get("mode") == "shadow"
    cols = [
        "model",
        "SLO",
        "rate/s",
        "p99 measured",
        "proc ms",
        "replicas",
        "utility measured",
        "utility planned",
        "drop",
        "forecaster",
    ]
    if shadow:  # issue 48: what it would set beside what runs
        cols[5:5] = ["advised"]
        cols[cols.index("utility planned")] = "utility advised"
    for col in cols:
        if col == "forecaster":  # a long label wraps rather than squeezing the numbers
            table.add_column(col, justify="left", ratio=1, min_width=12, overflow="fold")
        else:
            table.add_column(col, justify="left" if col == "model" else "right", no_wrap=True)
    for name, m in st.get("models", {}).items():
        lat = m.get("latency_ms")
        style = "red" if lat is not None and lat > m["slo_ms"] else None
        row = [
            name,
            f"{m['slo_ms']:g} ms p{m['percentile']:g}",
            _fmt(m.get("arrival_rate"), ".2f"),
            f"{_fmt(lat)} ms" if lat is not None else "-",
            _fmt(m.get("processing_ms")),
            f"{m.get('replicas')}/{m.get('target')}",
            _fmt(m.get("observed_utility"), ".3f"),
            _fmt(m.get("predicted_utility"), ".3f"),
            f"{m.get('drop_rate', 0):.1%}",
            m.get("predictor") or loaded or "-",
        ]
        if shadow:
            adv = m.get("advised") or {}
            row[5:5] = [f"{adv['replicas']} ({adv.get('drop_rate') or 0:.0%} drop)" if adv else "-"]
            row[-2] = "-"  # the cluster's own autoscaler sets the drops: none
        table.add_row(*row, style=style)
    console().print(table)
    for line in failing:
        print(line)
    for line in batch_lines(st.get("models", {})):
        print(line)
    for line in pipeline_lines(st.get("pipelines")):
        print(line)
    for name, err in (st.get("meter_errors") or {}).items():  # left out of the plan this tick
        print(f"{name}: not planned: {err}")
    if shadow:
        print(
            "shadow mode: the autoscaler plans every tick and changes nothing; 'advised' is what it "
            "would set, 'replicas' what runs (mode: control in the faro args hands it the replicas)"
        )
    if not st.get("enabled", True):
        print("autoscaling is disabled (enabled: false): measuring only")
    for line in retrain_lines(st.get("retrain")):
        print(line)
    if decisions is not None:
        from autoscaler.driving.explain import explain

        for line in explain(decisions):
            print(line)
    return 1 if failing else 0  # decisions not applied: a check that runs this must see it


def tick_error_lines(errors: dict | None) -> list[str]:
    """When ticks failed since the autoscaler last applied a decision: how many, the newest
    error and what it means (its decisions are not being applied), so a mistake (e.g. Ray
    started without its dashboard, whose REST API scales) shows here, not only in the
    replica's log (issue 50)."""
    if not errors:
        return []
    n = errors.get("failed", 1)
    return [
        f"{n} autoscaler tick{'s' if n != 1 else ''} failed since it last applied a decision, "
        f"so its decisions are not being applied: {errors.get('error')}",
        "  (the faro replica's log has the traceback; a connection refused to the dashboard "
        "URL: start Ray with its dashboard, or set dashboard_url)",
    ]


def batch_lines(models: dict) -> list[str]:
    """Per model that batches or says where it runs: its batch in force, the mean batch its
    replicas served and its device (issue 47)."""
    out = []
    for name, m in models.items():
        parts = []
        if m.get("batch_size") is not None:
            parts.append(f"batch {m['batch_size']} in force, {m.get('mean_batch') or 1:.1f} served on average")
        if m.get("device"):
            parts.append(f"on {m['device']}")
        if parts:
            out.append(f"{name}: " + ", ".join(parts))
    return out


def pipeline_lines(pipes: dict | None) -> list[str]:
    """One line per pipeline: its stages, its entry rate and end-to-end latency (measured
    at its ingress) against its SLO."""
    out = []
    for name, p in (pipes or {}).items():
        lat = p.get("latency_ms")
        seen = (
            f"{lat:.0f} ms end to end (utility {p.get('observed_utility')})"
            if lat is not None
            else "end to end not measured"
            + ("" if p.get("ingress") else " (no ingress: faro_serve.scaled(Ingress, pipeline))")
        )
        rate = p.get("arrival_rate")
        out.append(
            f"pipeline {name}: stages {', '.join(p.get('stages', []))}; SLO {p['slo_ms']:g} ms "
            f"p{p['percentile']:g}; {'-' if rate is None else f'{rate:.2f}'}/s; {seen}"
        )
    return out


def retrain_lines(rt: dict | None) -> list[str]:
    """What the autoscaler's retrainer did last (``retrain`` in the status; issue 32)."""
    if not rt:
        return []
    every = rt["every_s"]
    period = f"{every / 3600:g} h" if every >= 3600 else f"{every:g} s"
    head = f"retraining every {period}: {rt['runs']} run(s), {len(rt.get('swaps') or [])} swap(s)"
    if rt.get("running"):
        head += ", one running now"
    last = rt.get("last")
    if not last:
        return [head + "; none finished yet"]
    return [
        head,
        f"last retrain: {'swapped in' if last.get('swap') else 'kept the current forecaster'}: "
        + (last.get("reason") or last.get("error") or ""),
    ]
