"""Plain-text reasons for the autoscaler's decision records (``GET /faro/decisions``, the
decision log): for a plan the forecast band, each model's estimated p99 at the chosen
replicas and its utility, the objective and what bound it (paper sections 4.2-4.3); for a
reactive step what triggered it (section 4.4); for a re-plan (issue 31) which model left its
forecast band, for a surge plan what the surge could not get in turn, and for a move which
replica went where and what it gained. ``faro-serve
status --explain`` and the demo's report print these lines."""

from __future__ import annotations

from typing import Any


def explain(records: list[dict[str, Any]]) -> list[str]:
    """Plain-text reasons for decision records (``GET /faro/decisions``), newest last."""
    out = []
    if not records:
        return ["no decisions yet"]
    for rec in records:
        d = rec.get("decision") or {}
        info = d.get("info") or {}
        out.append(
            f"\n[t={rec.get('t', 0):.0f} s] {d.get('kind')} decision: replicas {d.get('replicas')}"
            + (f", drop rates {d['drop_rates']}" if d.get("drop_rates") else "")
        )
        if "models" in info:  # a plan: forecast, estimate, utility per model
            out.append(
                f"  objective {info.get('objective')} = {info.get('objective_value')} "
                f"(solved in {info.get('solve_ms')} ms)"
            )
            if info.get("fallback"):
                out.append(f"  planner fell back: {info['fallback']}")
            g = info.get("overload_guard")
            if g:  # autoscaler/faro/guard.py
                out.append(
                    f"  overload guard: the observed rates need {g['need_cpus']} CPUs of "
                    f"{g['capacity_cpus']}; kept {', '.join(g['kept'])} at what their rates need"
                )
            b = info.get("bound") or {}
            if b:
                why = []
                if b.get("capacity"):
                    why.append(f"the capacity ({b.get('free_cpus')} CPUs left)")
                if b.get("max_replicas"):
                    why.append(f"max_replicas of {', '.join(b['max_replicas'])}")
                if why:
                    out.append("  bound by " + " and ".join(why))
                elif not b.get("short_of_slo"):
                    out.append("  no constraint bound: every model is planned to meet its SLO")
                else:
                    out.append(
                        f"  short of the SLO with room left ({', '.join(b['short_of_slo'])}): "
                        "another replica would not pay within the window (cold start)"
                    )
            for name, m in info["models"].items():
                q = m.get("forecast_rps") or {}
                band = (
                    f"{q.get('p10')}/{q.get('p50')}/{q.get('p90')}"
                    if q
                    else f"mean {m.get('forecast_mean_rps')}, p90 {m.get('forecast_p90_rps')}"
                )
                slo = (rec.get("models") or {}).get(name, {}).get("slo_ms")
                lat = m.get("latency_ms")
                out.append(
                    f"  {name}: forecast p10/p50/p90 {band} req/s ({m.get('predictor')}); "
                    f"{m.get('current')} -> {m.get('replicas')} replicas; estimated p99 "
                    f"{'beyond the SLO' if lat is None else f'{lat:.0f} ms'}"
                    f"{'' if slo is None else f' vs SLO {slo:g} ms'}; utility {m.get('utility')}"
                    + (f"; drop {m['drop_rate']:.1%}" if m.get("drop_rate") else "")
                )
        rp = info.get("replan") or {}
        if rp:
            for name, w in (rp.get("trigger") or {}).items():
                seen = (
                    f"{w.get('rate_rps')} req/s against the band {w.get('band_rps')}"
                    if "rate_rps" in w
                    else f"p99 {w.get('latency_ms')} ms vs SLO {w.get('slo_ms')} ms"
                )
                out.append(f"  re-plan: {name}: {w.get('why')} ({seen})")
            out.append(
                f"  re-plan: the whole cluster re-solved at the rates seen now; gain "
                f"{rp.get('gain')} on the objective"
                + (f"; changes undone as not worth it: {', '.join(rp['undone'])}" if rp.get("undone") else "")
            )
        for name in (rp.get("kept_saturated") or []) + ((info.get("surge_plan") or {}).get("kept_saturated") or []):
            out.append(
                f"  kept: {name} is saturated (over its SLO or queued beyond its replicas): "
                "its measured rate is only what got in, so the plan does not cut it"
            )
        sp = info.get("surge_plan")
        if sp:  # autoscaler/faro/surge.py
            out.append(
                "  surge plan: the surging models' needs did not fit the free capacity (in turn "
                f"they would have got {sp.get('greedy')}): the whole cluster planned at the "
                "rates seen now" + (f"; new, no minute of history: {', '.join(sp['new'])}" if sp.get("new") else "")
            )
        for mv in info.get("moves") or ():
            out.append(
                f"  move: one replica {mv.get('from')} -> {mv.get('to')} (full cluster; "
                f"objective +{mv.get('gain')}; {mv.get('from')} within its SLO with one fewer "
                f"at {mv.get('donor_rate_rps')} req/s)"
            )
        if "scaled_up" in info:
            out.append(f"  reactive: over the SLO for the trigger period: {', '.join(info['scaled_up'])} +1")
        for name, sv in (info.get("surge") or {}).items():
            out.append(
                f"  surge: {name} at {sv.get('rate_rps')} req/s needs {sv.get('need')} replicas: "
                f"{sv.get('from')} -> {sv.get('to')}"
            )
        for key in ("up", "down"):
            if info.get(key):
                out.append(f"  {key}: {', '.join(info[key])}")
    return out
