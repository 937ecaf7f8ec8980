"""``faro-serve whatif``'s ``report.md``: the tables docs/whatif.md explains (SLO, cost, the
as-run replay against what the cluster measured, the minutes and days the runs differ most,
what each deployment was replayed with), rendered from the figures
``faro_serve.sim.history_replay_report`` computes and writes."""

from __future__ import annotations

from pathlib import Path

TOP_DAYS = 10


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _num(x, nd=1) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _table(head: list[str], rows: list[list], text: tuple[int, ...] = (0,)) -> list[str]:
    """A markdown table, the columns ``text`` left-aligned and the others right (numbers)."""
    out = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i in text else "---:" for i in range(len(head))) + "|",
    ]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def _slo(r) -> str:
    return f"{r['slo_ms']:g} ms @ p{r['slo_percentile']:g}" + (" (derived)" if r["slo_derived"] else "")


def markdown(f: dict, plots: list[str]) -> str:
    deps, tot = f["deployments"], f["total"]
    lines = [
        f"# What if Faro had autoscaled: {f['minutes']:,} minutes from {f['start']}",
        "",
        f"Source: `{f['source']}`. Capacity {f['capacity_cpus']:g} CPUs"
        + (f", {f['capacity_gpus']:g} GPUs" if f["capacity_gpus"] is not None else "")
        + f". Faro: `{f['policy']}`"
        + (f" (forecaster: {f['forecaster']})" if f.get("forecaster") else "")
        + f"; as run: Ray Serve's rule with each deployment's own settings. Seed {f['seed']}, the same "
        f"requests in both runs; cold start {f['cold_start_s']:g} s; every deployment's replicas "
        f"hold max_ongoing_requests {f['queue']['max_ongoing_requests']}, its callers queue "
        + (
            "without a limit"
            if f["queue"]["max_queued_requests"] < 0
            else f"up to max_queued_requests {f['queue']['max_queued_requests']}"
        )
        + ". "
        "docs/whatif.md explains every column.",
        "",
        "## SLO",
        "",
    ]
    rows = [
        [
            "**total**",
            f"{tot['requests']:,}",
            "",
            _pct(tot["as_run"]["slo_violation_rate"]),
            _pct(tot["faro"]["slo_violation_rate"]),
            f"{tot['as_run']['dropped']:,}",
            f"{tot['faro']['dropped']:,}",
        ]
    ]
    rows += [
        [
            k,
            f"{r['requests']:,}",
            _slo(r),
            _pct(r["as_run"]["slo_violation_rate"]),
            _pct(r["faro"]["slo_violation_rate"]),
            f"{r['as_run']['dropped']:,}",
            f"{r['faro']['dropped']:,}",
        ]
        for k, r in deps.items()
    ]
    lines += _table(
        ["deployment", "requests", "SLO", "violations as run", "violations Faro", "dropped as run", "dropped Faro"],
        rows,
        (0, 2),
    )
    lines += ["", "## Cost", ""]
    rows = [
        [
            "**total**",
            "",
            _num(tot["recorded"]["replica_hours"]),
            _num(tot["as_run"]["replica_hours"]),
            _num(tot["faro"]["replica_hours"]),
            _num(tot["as_run"]["gpu_hours"]),
            _num(tot["faro"]["gpu_hours"]),
        ]
    ]
    rows += [
        [
            k,
            _num(r["recorded"]["mean_replicas"], 2),
            _num(r["recorded"]["replica_hours"]),
            _num(r["as_run"]["replica_hours"]),
            _num(r["faro"]["replica_hours"]),
            _num(r["as_run"]["gpu_hours"]),
            _num(r["faro"]["gpu_hours"]),
        ]
        for k, r in deps.items()
    ]
    lines += _table(
        [
            "deployment",
            "recorded mean replicas",
            "replica-h recorded",
            "replica-h as run",
            "replica-h Faro",
            "GPU-h as run",
            "GPU-h Faro",
        ],
        rows,
    )
    lines += ["", "## How far to trust it: the as-run replay against what the cluster measured", ""]
    rows = [
        [
            k,
            _pct(r["check"]["measured_violation_rate"]),
            _pct(r["check"]["simulated_violation_rate"]),
            _num(r["check"]["recorded_mean_replicas"], 2),
            _num(r["check"]["simulated_mean_serving_replicas"], 2),
        ]
        for k, r in deps.items()
    ]
    lines += _table(
        [
            "deployment",
            "violations measured (its app, end to end)",
            "violations simulated as run",
            "mean replicas recorded",
            "mean replicas simulated as run",
        ],
        rows,
    )
    if f["top_minutes"]:
        lines += ["", f"## The {len(f['top_minutes'])} minutes where the two differ most", ""]
        lines += _table(
            [
                "minute",
                "UTC",
                "requests",
                "violating as run",
                "violating Faro",
                "Faro - as run",
                "CPUs as run",
                "CPUs Faro",
            ],
            [
                [
                    m["minute"],
                    m["time"],
                    f"{m['requests']:,}",
                    f"{m['as_run_violating']:,}",
                    f"{m['faro_violating']:,}",
                    f"{m['difference']:+,}",
                    _num(m["as_run_cpus"]),
                    _num(m["faro_cpus"]),
                ]
                for m in f["top_minutes"]
            ],
            (0, 1),
        )
    if f["days"]:
        days = sorted(f["days"], key=lambda d: -abs(d["difference"]))[:TOP_DAYS]
        lines += ["", "## Days, the most different first", ""]
        lines += _table(
            [
                "day (UTC)",
                "minutes",
                "requests",
                "violating as run",
                "violating Faro",
                "replica-h recorded",
                "replica-h as run",
                "replica-h Faro",
            ],
            [
                [
                    d["day"],
                    d["minutes"],
                    f"{d['requests']:,}",
                    f"{d['as_run_violating']:,}",
                    f"{d['faro_violating']:,}",
                    _num(d["recorded_replica_hours"]),
                    _num(d["as_run_replica_hours"]),
                    _num(d["faro_replica_hours"]),
                ]
                for d in days
            ],
        )
    lines += ["", "## What each deployment was replayed with", ""]
    lines += _table(
        [
            "deployment",
            "as run",
            "Faro replicas",
            "CPUs/GPUs per replica",
            "processing (s)",
            "mean processing ms",
            "SLO",
        ],
        [
            [
                k,
                _mode(r),
                f"1..{r['faro_replicas'][1]}",
                f"{r['cpus']:g}/{r['gpus']:g}",
                r["processing"],
                _num(r["processing_mean_ms"]),
                _slo(r),
            ]
            for k, r in deps.items()
        ],
        (0, 1, 2, 3, 4, 6),
    )
    derived = [k for k, r in deps.items() if r["slo_derived"]]
    if derived:
        lines += [
            "",
            f"SLOs derived (the application's measured p99 over the range, none given with "
            f"--slo): {', '.join(derived)}.",
        ]
    if f["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in f["notes"]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _mode(r) -> str:
    lo, hi = r["as_run_replicas"]
    if r["mode"] == "autoscaling":
        a = r["rule"]
        return (
            f"autoscaling {lo}..{hi}, target {a['target_ongoing_requests']:g}, up {a['upscale_delay_s']:g} s, "
            f"down {a['downscale_delay_s']:g} s"
        )
    return f"fixed {lo}" + (" (no config: recorded median)" if r["mode"] == "unknown" else "")
