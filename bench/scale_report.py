"""The report of ``bench/scale_bench.py``: ``scale-bench.md`` and ``scale-bench.json``."""

from __future__ import annotations

import json
from pathlib import Path

TARGETS = {"decision_s": 2.0, "gap_pct": 2.0, "loop_rss_mb": 1024.0, "sim_wall_s": 600.0}


def _planner(res: dict) -> list[str]:
    lines = [
        "## Planner (`plan(...)`)",
        "",
        "Objective gap: how far each decision's objective falls below the best any "
        "configuration reached on the very same input (0 = the best). Configurations "
        "marked 1 decision ran on the first input only (too slow to repeat).",
        "",
        "| models / replicas | inputs | configuration | decisions | median ms | p90 ms | "
        "mean objective | mean / worst gap % | deadline fallbacks | load (1 min) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['models']} / {r['replicas']} | {r['inputs']} | {r['config']} | "
            f"{r['decisions']} | {r['median_ms']:.0f} | {r['p90_ms']:.0f} | "
            f"{r['mean_objective']} | {r['mean_gap_pct']:.2f} / {r['worst_gap_pct']:.2f} | "
            f"{r['fallbacks']} | {r['mean_load1']} |"
        )
    ex = [r for r in res["rows"] if r["fallback_example"]]
    if ex:
        lines += ["", "Fallback notes (`Allocation.fallback`), one per configuration:", ""]
        lines += [f"* {r['models']} models, {r['inputs']}, {r['config']}: {r['fallback_example']}" for r in ex]
    lines += ["", f"Planner process peak RSS {res['peak_rss_mb']} MB."]
    return lines


def _sim(r: dict) -> list[str]:
    ok = "met" if r["wall_s"] <= TARGETS["sim_wall_s"] else "**missed**"
    return [
        "## Simulator, a 1,000-model day",
        "",
        "| jobs | replicas | policy | minutes | requests | wall s | in the policy s | plans "
        "(s) | peak RSS MB | lost cluster utility | SLO violation rate |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['jobs']} | {r['replicas']} | {r['policy']} | {r['minutes']} | "
        f"{r['requests']:,} | {r['wall_s']} | {r['policy_decide_s']} | {r['plans']} "
        f"({r['plan_s']}) | {r['peak_rss_mb']} | {r['lost_cluster_utility']} | "
        f"{r['slo_violation_rate']:.2%} |",
        "",
        f"Target: the day in under {TARGETS['sim_wall_s']:.0f} s: {ok}.",
    ]


def _loops(rs: list[dict]) -> list[str]:
    out = ["## Autoscaler loop (fake cluster adapter, no Ray)", ""]
    for r in rs:
        out += _loop(r) + [
            "",
            f"Run at {r.get('date')}, wall time {r['part_wall_s']} s; load average before "
            f"{r['loadavg_before']}, after {r['loadavg_after']}.",
            "",
        ]
    return out


def _loop(r: dict) -> list[str]:
    ok = "met" if max(r["peak_rss_mb"], r["rss_mb"]) <= TARGETS["loop_rss_mb"] else "**missed**"
    return [
        f"### Forecaster {r['forecaster']}",
        "",
        f"{r['models']} models on {r['cpus']} CPUs, forecaster {r['forecaster']}, "
        f"{r['ticks']} ticks of 10 s ({r['plan_ticks']} long-term plans).",
        "",
        "| what | value |",
        "|---|---:|",
        f"| tick with a plan: median / max ms | {r['plan_tick_ms_median']} / {r['plan_tick_ms_max']} |",
        f"| other ticks: median / p90 ms | {r['other_tick_ms_median']} / {r['other_tick_ms_p90']} |",
        f"| of each tick, the fake fronts' reports (not the loop's cost) ms | {r['fake_reports_ms_per_tick']} |",
        f"| saved state (JSON) bytes | {r['state_json_bytes']:,} |",
        f"| saving it (json.dumps) ms per tick | {r['state_save_ms_mean']} |",
        f"| status (JSON) bytes | {r['status_json_bytes']:,} |",
        f"| one decision record (the log line) bytes | {r['decision_record_bytes']:,} |",
        f"| decision records kept in memory (at most) | {r['history_records_kept']} ({r['history_maxlen']}) |",
        f"| the records held, Python memory MB (at most: x {r['history_maxlen']} / "
        f"{max(r['history_records_kept'], 1)}) | {r['history_held_mb']} "
        f"({r['history_held_mb'] * r['history_maxlen'] / max(r['history_records_kept'], 1):.0f}) |",
        f"| RSS before the loop / at the end / peak MB | {r['rss_before_loop_mb']} / {r['rss_mb']} / {r['peak_rss_mb']} |",
        "",
        f"Target: autoscaler memory under 1 GB: {ok}.",
    ]


def write(out: Path, env: dict, results: dict) -> None:
    (out / "scale-bench.json").write_text(json.dumps({"env": env, **results}, indent=2) + "\n")
    lines = [
        "# A thousand models (issue 36, item 3)",
        "",
        f"Written on {env['date']} at {env['commit']} ({env['machine']}; the machine "
        "shared with live Ray benchmarks, so each part gives its time and load average) "
        "by (with --merge, a later command re-ran some parts):",
        "",
        "```sh",
        *env["commands"],
        "```",
        "",
    ]
    for part, fn in (("planner", _planner), ("sim", _sim)):
        if part in results:
            r = results[part]
            lines += fn(r) + [
                "",
                f"Run at {r.get('date')}, wall time {r['part_wall_s']} s; load average before "
                f"{r['loadavg_before']}, after {r['loadavg_after']}.",
                "",
            ]
    if "loop" in results:
        lines += _loops(results["loop"])
    (out / "scale-bench.md").write_text("\n".join(lines))
    print("\n".join(lines))
