"""Matched validation end to end: live runs, the matched simulations, the comparison and
its files (paper section 6.5).

``live.pkl`` keeps each live run's schedule and records, so :func:`resimulate` can compare a
changed simulator against the same live runs without the hour of live replay again.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np

from ..distributions import TimeDist, parse_dist
from ..replay.loadgen import build_schedule
from ..replay.replay_report import replay_document, replay_result, write_records
from ..sim.runner import SimConfig, simulate
from .comparison import (
    NATIVE,
    RAY_SETTINGS,
    REPLAY_TIMEOUT_S,
    SIM_DRAWS,
    Workload,
    cluster_spec,
    compare,
    fit_overhead,
    markdown,
    scale_up_lags,
    sim_policy,
    sim_queue,
)


def simulate_policy(
    policy: str,
    wl: Workload,
    capacity: float,
    overhead: TimeDist,
    cold_start_s: float,
    forecaster=None,
    queue_limit: int = 50,
    hold_s: float = 0.0,
    client_timeout_s: float = REPLAY_TIMEOUT_S,
    draw: int = 0,
    cluster: dict | None = None,
):
    """The simulator on the live run's workload: the same slice, seed (so the same
    per-minute counts), models, policy settings, and this machine's overhead and cold start.
    Its clients give up after the replay's timeout. A Ray run is simulated as plain Ray
    Serve behaved live (docs/compare.md): requests whose clients gave up still served, behind
    its ``max_queued_requests`` (``ray-native``: no limit; ``ray-tuned``: 50, plus the one
    waiting at each replica); faro-serve's front tail-drops at ``queue_limit`` and drops a
    request whose client left (``compare.sim_queue``). ``draw`` > 0: the same counts,
    another draw of the per-request randomness (sim.workload.Workload). ``cluster``: ClusterSpec
    fields over the matched defaults, as ``run_policy`` takes live."""
    from autoscaler import make_policy

    tr = wl.load()
    models = wl.models(tr.names)
    spec = cluster_spec(capacity).model_copy(update=cluster or {})
    pol = make_policy(sim_policy(policy), models, spec, forecaster)
    cfg = SimConfig(
        capacity_cpus=capacity,
        cold_start_s=cold_start_s,
        processing=wl.processing(),
        router_overhead=overhead,
        replica_hold_s=hold_s,
        client_timeout_s=client_timeout_s,
        seed=wl.seed,
        draw=draw,
        **sim_queue(policy, queue_limit),
    )
    return simulate(tr.counts, models, pol, cfg)


def run_live(
    wl: Workload,
    policies: list[str],
    capacity: float,
    out: Path,
    forecaster_dir: str | None = None,
    progress=None,
    previous: dict | None = None,
    data_path: str = "direct",
) -> dict:
    """Every policy live, one after the other, on a fresh local Ray cluster; saves
    ``live.pkl`` and each policy's ``records.csv``/``result.json``. Returns the saved state.

    ``previous`` (a saved state of the same workload, capacity and data path) keeps its other
    policies' runs: a run disturbed by other work on the machine can be repeated alone.
    ``data_path`` is the models' data path: the router front or the direct path."""
    from .live_runs import LiveCluster

    tr = wl.load()
    models = wl.models(tr.names)
    sched = build_schedule(tr, tr.names, 1.0, 1.0, wl.seed)
    processing = str(wl.processing())
    state = {
        "workload": wl,
        "capacity": capacity,
        "processing": processing,
        "forecaster_dir": forecaster_dir,
        "runs": {},
        "calibration": None,
        "data_path": data_path,
    }
    if previous is not None:
        saved = {
            "workload": previous["workload"],
            "capacity": previous["capacity"],
            "data path": previous.get("data_path", "front"),
        }
        asked = {"workload": wl, "capacity": capacity, "data path": data_path}
        differ = [k for k in asked if saved[k] != asked[k]]
        if differ:
            raise ValueError(
                f"--again: the saved runs have another {' and '.join(differ)}; use the same flags, or another --out"
            )
        state = previous
    with LiveCluster(capacity, data_path) as lc:
        for k, p in enumerate(policies):
            task = progress(p, sched.size) if progress else None
            load_before = os.getloadavg()[0]
            if p in NATIVE:  # plain Ray Serve: nothing of faro-serve on the data path
                cal = None
                if k == 0 and previous is None:  # the calibration measures faro-serve's path
                    lc.deploy_models([m.name for m in models], processing)
                    cal = lc.calibrate(models[0].name)
                    lc.delete_all()
                res, rec, ray = lc.run_native(
                    sched, models, capacity, processing, policy=p, settings=RAY_SETTINGS[p], on_done=task
                )
                # what Ray held, read back from it: the report prints it for every Ray run
                state.setdefault("ray_settings", {})[p] = ray
            else:
                res, rec, cal = lc.run_policy(
                    p,
                    sched,
                    models,
                    capacity,
                    processing,
                    forecaster_dir,
                    calibrate=k == 0 and previous is None,
                    on_done=task,
                )
            if cal is not None:
                state["calibration"] = cal
            d = out / p
            d.mkdir(parents=True, exist_ok=True)
            write_records(d / "records.csv", sched, rec)
            (d / "result.json").write_text(json.dumps(replay_document(res, sched, rec, lc.base), indent=2) + "\n")
            state["runs"][p] = (sched, rec)
            # the machine's load around the run: other work on a small machine shows up here
            state.setdefault("load_average", {})[p] = (round(load_before, 2), round(os.getloadavg()[1], 2))
            with (out / "live.pkl").open("wb") as f:  # after every policy: a crash keeps the rest
                pickle.dump(state, f)
    return state


def resimulate(
    state: dict,
    out: Path,
    overhead: str | None = None,
    cold_start_s: float | None = None,
    forecaster=None,
    hold_s: float | None = None,
    draws: int = SIM_DRAWS,
) -> dict:
    """Simulate every live-run policy with the calibration (or the given overrides), ``draws``
    times (the same counts, other draws of each request's arrival offset and times: the
    simulator's expected value, compare.compare), compare, and write ``validation.json``,
    ``validation.md`` and ``validation.png``."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1 (got {draws})")
    wl: Workload = state["workload"]
    capacity = state["capacity"]
    cal = state["calibration"]
    ovh = parse_dist(overhead) if overhead else fit_overhead(np.asarray(cal.overhead_s))
    lags = []
    for sched, rec in state["runs"].values():
        lags += scale_up_lags(rec.status_polls, sched.names)
    # Cold start: what the live runs showed (target raised -> replicas serving, median), which
    # on a busy machine is several times the idle calibration; the calibration without them.
    cold = (
        cold_start_s if cold_start_s is not None else (float(np.median(lags)) if len(lags) >= 3 else cal.cold_start_s)
    )
    # Replica hold: the calibration burst's median (saved runs from before it: 0, the
    # paper's model, unless given)
    # (clipped at 0: on a fast path the burst's noise can exceed the hold)
    hold = hold_s if hold_s is not None else max(0.0, getattr(cal, "hold_median_s", None) or 0.0)
    live, sim = {}, {}
    for p, (sched, rec) in state["runs"].items():
        models = wl.models(sched.names)
        live[p] = replay_result(
            sched,
            rec,
            {m.name: m.slo_ms for m in models},
            {m.name: m.percentile for m in models},
            policy=p,
            capacity=capacity,
        )
        sim[p] = [simulate_policy(p, wl, capacity, ovh, cold, forecaster, hold_s=hold, draw=k) for k in range(draws)]
    cmp = compare(live, sim)
    doc = {
        "workload": {k: getattr(wl, k) for k in wl.__dataclass_fields__},
        "capacity": capacity,
        "forecaster_dir": state["forecaster_dir"],
        "data_path": state.get("data_path", "front"),
        "calibration": cal.to_dict() | {"scale_up_lag_s": _quantiles(lags)},
        "simulator": {
            "router_overhead": str(ovh),
            "cold_start_s": cold,
            "replica_hold_s": hold,
            "processing": state["processing"],
        },
        "load_average": state.get("load_average", {}),  # (1-min before, 5-min after) per run
        "comparison": cmp,
        "live": {p: r.to_dict() for p, r in live.items()},
        "sim": {p: r[0].to_dict() for p, r in sim.items()},  # draw 0; the means in "comparison"
        "sim_draws": draws,
    }
    (out / "validation.json").write_text(json.dumps(doc, indent=2, default=_jsonable) + "\n")
    (out / "validation.md").write_text(_report(doc, cmp))
    plot(live, {p: r[0] for p, r in sim.items()}, out / "validation.png")
    return doc


def load_state(out: Path) -> dict:
    path = out / "live.pkl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no saved live runs (run without --resimulate first)")
    again = "run validate without --resimulate to make a new one"
    try:
        with path.open("rb") as f:
            state = pickle.load(f)
    except Exception as err:  # truncated, another program's, or classes this version lacks
        detail = " ".join(str(err).split())  # one line, whatever the error says
        raise ValueError(f"{path}: not a saved validate run ({type(err).__name__}: {detail}); {again}") from None
    need = ("workload", "capacity", "runs")
    missing = [k for k in need if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: not a saved validate run (no {', '.join(missing)}); {again}")
    return state


def _quantiles(x: list[float]) -> dict:
    if not x:
        return {"n": 0}
    q = np.percentile(x, [0, 50, 100])
    return {"n": len(x), "min": round(float(q[0]), 2), "median": round(float(q[1]), 2), "max": round(float(q[2]), 2)}


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def _report(doc: dict, cmp: dict) -> str:
    wl, cal, simc = doc["workload"], doc["calibration"], doc["simulator"]
    return "\n".join(
        [
            "# Matched validation: live Ray Serve vs the simulator",
            "",
            f"Workload: {', '.join(wl['jobs'])} of `{wl['trace']}` day {wl['day']} sample {wl['sample']}, "
            f"minutes {wl['start']}-{wl['start'] + wl['minutes']} (x{wl['rate_scale']:g}), seed {wl['seed']}; "
            f"capacity {doc['capacity']:g} replicas; SLO {wl['slo_ms'] * wl['slowdown']:g} ms at "
            f"p{wl['percentile']:g}; processing and SLO x{wl['slowdown']:g}; "
            f"forecaster {doc['forecaster_dir'] or 'shipped'}; live data path "
            f"{doc.get('data_path', 'front')}.",
            "",
            f"Calibration on this machine: overhead outside the model {cal['overhead_ms']['p50']} ms p50 / "
            f"{cal['overhead_ms']['p99']} ms p99 (idle); replica hold between queued requests "
            f"{cal.get('hold_ms', {}).get('p50', 'not measured')} ms p50 (idle, one replica); cold start {cal['cold_start_s']} s (idle, one "
            f"replica); scale-up lags seen in the live runs {cal['scale_up_lag_s']}.",
            "",
            f"Load average around each live run (1-min before, 5-min after): {doc['load_average']}.",
            "",
            f"Simulator: router overhead `{simc['router_overhead']}`, cold start {simc['cold_start_s']:g} s, "
            f"replica hold {simc.get('replica_hold_s', 0) * 1e3:.1f} ms, "
            f"processing `{simc['processing']}`.",
            "",
            markdown(cmp),
            "",
        ]
    )


def plot(live: dict, sim: dict, path: Path) -> None:
    """Per policy: cluster utility per minute, live against simulated."""
    from ..sim.plots import _colour, _plt, _save

    plt = _plt()
    fig, axes = plt.subplots(len(live), 1, figsize=(8, 2.4 * len(live)), sharex=True, squeeze=False)
    for k, (p, ax) in enumerate(zip(live, axes[:, 0])):
        for res, style, label in ((live[p], "-", "live"), (sim[p], "--", "simulated")):
            cu = res.summary.cluster_utility
            ax.plot(np.arange(len(cu)), cu, style, color=_colour(p, k), label=label)
        ax.set_ylabel("cluster utility")
        ax.set_title(p, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower left", fontsize=8)
    axes[-1, 0].set_xlabel("trace minute")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
