"""Policies x capacities x seeds in parallel processes: the paper's comparison (Table 7).

Each run is one :func:`~faro_serve.sim.scenario.run_scenario` in a worker process; workers
load the (already trained and cached) forecaster once. The parent collects one row per run
and each run's cluster utility per minute, then writes ``results.csv``, ``timeline.csv``,
``summary.md`` (mean and SD over seeds, policies ranked per capacity as in Table 7) and the
plots (``faro_serve.sim.plots``).
"""

from __future__ import annotations

import csv
import itertools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .scenario import Scenario, run_scenario

_WORKER: dict = {}


@dataclass(frozen=True)
class Task:
    policy: str
    capacity: float
    seed: int


class RunFailed(ValueError):
    """A run stopped by the user's side: their policy raised or broke the driver's rules, or a
    worker process died. One line naming the policy (a ``ValueError``: exit code 2)."""


class SuiteStopped(Exception):
    """A run failed, so the suite stopped: ``error`` (the run's), with the rows and timelines
    of the runs that finished, which the caller writes (work done is not lost), and
    ``unfinished``, the tasks that failed or did not run."""

    def __init__(self, error: BaseException, rows: list, timelines: dict, unfinished: list):
        super().__init__(str(error))
        self.error, self.rows, self.timelines, self.unfinished = error, rows, timelines, unfinished


@contextmanager
def policy_failures(policy: str):
    """Around a run of ``policy``: what a user's policy (an import path or a plug-in) raises
    becomes one :class:`RunFailed` naming it and the simulated time, which the driver gives
    the exception as ``now`` (``autoscaler.driving.driver.decide``; none: no time named). The
    driver's own refusals (``autoscaler.driving.driver.apply_decision``) already say both and keep
    their message. A built-in policy's exception is faro-serve's bug: it stays a traceback."""
    from autoscaler.catalogue.builtin import BUILTIN
    from autoscaler.catalogue.plugins import PluginError
    from autoscaler.driving.driver import CapacityExceeded, DecisionRefused

    try:
        yield
    except (RunFailed, KeyboardInterrupt):
        raise
    except Exception as err:
        if policy in {b[0] for b in BUILTIN}:
            raise
        if isinstance(err, (PluginError, DecisionRefused, CapacityExceeded)):
            raise RunFailed(str(err)) from None  # these name the policy and time already
        now = getattr(err, "now", None)
        at = f" at t={now:g}s" if isinstance(now, (int, float)) else ""
        raise RunFailed(f"policy {policy!r} failed{at}: {type(err).__name__}: {err}") from None


def uses_forecaster(policy: str) -> bool:
    """Faro's and MArk's policies plan with the forecaster; a plug-in or import-path policy
    is given it too (one that does not forecast ignores it)."""
    from autoscaler.driving.forecasters import policy_forecasts

    return policy_forecasts(policy)


def _init_worker(scenario: Scenario, forecaster_dir: str | None, forecaster: str | None = None, started=None) -> None:
    """``forecaster_dir``: a trained N-HiTS; ``forecaster``: ``fallback``, ``shipped``, a
    plug-in name or an import path; neither: the shipped N-HiTS (autoscaler.driving.forecasters).
    ``started``: a queue told each task a worker starts (which run a dead worker was on)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _WORKER["started"] = started
    _WORKER["scenario"] = scenario
    _WORKER["loaded"] = scenario.load()
    if forecaster_dir or forecaster in (None, "shipped"):
        import torch  # one thread per worker: the workers share the cores

        torch.set_num_threads(1)
    from autoscaler.driving.forecasters import choose_forecaster

    try:
        _WORKER["forecaster"], _WORKER["forecaster_name"] = choose_forecaster(forecaster, forecaster_dir)
        _WORKER["init_error"] = None
    except ValueError as err:  # a plug-in that fails its check, a directory that does not load
        _WORKER["init_error"] = str(err)  # the first run says so (an initializer's error
        # would only print a traceback per worker and break the pool)


def _run(task: Task) -> dict:
    sc = _WORKER["scenario"]
    if _WORKER.get("started") is not None:
        _WORKER["started"].put(task)
    if _WORKER.get("init_error"):
        raise RunFailed(_WORKER["init_error"])
    fc = _WORKER["forecaster"] if uses_forecaster(task.policy) else None
    with policy_failures(task.policy):
        res = run_scenario(sc, task.policy, task.capacity, task.seed, forecaster=fc, loaded=_WORKER["loaded"])
    s = res.summary
    row = {
        "policy": task.policy,
        "capacity": task.capacity,
        "seed": task.seed,
        "lost_cluster_utility": s.lost_cluster_utility,
        "lost_effective_utility": s.lost_effective_utility,
        "cluster_slo_violation_rate": s.cluster_slo_violation_rate,
        "requests": int(s.job_requests.sum()),
        "dropped": int(s.job_dropped.sum()),
        **{f"job_lost_{k}": v for k, v in s.fairness.items()},
        "mean_replicas": float(res.targets.sum(axis=1).mean()),
        "wall_s": res.wall_s,
        "forecaster": _WORKER["forecaster_name"] if uses_forecaster(task.policy) else "",
    }
    return {"row": row, "timeline": s.cluster_utility.tolist()}


def run_suite(
    scenario: Scenario,
    policies: list[str],
    capacities: list[float],
    seeds: list[int],
    workers: int = 2,
    forecaster_dir: str | None = None,
    progress=None,
    forecaster: str | None = None,
) -> tuple[list, dict]:
    """Run every (policy, capacity, seed); returns (rows, {(policy, capacity, seed): timeline}).
    The forecasting policies plan with ``forecaster`` (``fallback``, ``shipped``, a plug-in
    name or an import path) or the N-HiTS in ``forecaster_dir``, else the shipped N-HiTS.
    A failed run stops the suite (runs not started are cancelled, running ones finish) with
    :class:`SuiteStopped`, which carries the rows of the runs that finished."""
    tasks = [Task(p, c, s) for c, p, s in itertools.product(capacities, policies, seeds)]
    if not any(uses_forecaster(p) for p in policies):  # nothing forecasts: load none
        forecaster_dir, forecaster = None, "fallback"
    rows, timelines, done = [], {}, set()

    def finished(t: Task, out: dict) -> None:
        rows.append(out["row"])
        timelines[(t.policy, t.capacity, t.seed)] = out["timeline"]
        done.add(t)
        if progress:
            progress(t, out["row"])

    def stop(err: BaseException):
        return SuiteStopped(err, rows, timelines, [t for t in tasks if t not in done])

    if workers <= 1:
        _init_worker(scenario, forecaster_dir, forecaster)
        for t in tasks:
            try:
                finished(t, _run(t))
            except Exception as err:
                raise stop(err) from err
        return rows, timelines
    started: multiprocessing.SimpleQueue[object] = multiprocessing.SimpleQueue()  # the workers' pids
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_init_worker, initargs=(scenario, forecaster_dir, forecaster, started)
    ) as pool:
        futures = {pool.submit(_run, t): t for t in tasks}
        failure: Exception | None = None
        for fut in as_completed(futures):
            try:
                finished(futures[fut], fut.result())
            except BrokenProcessPool:
                failure = failure or _died(started, done)
            except Exception as err:
                if failure is None:  # the first failure stops the runs not started yet
                    failure = err
                    pool.shutdown(wait=False, cancel_futures=True)
    order = {(t.policy, t.capacity, t.seed): i for i, t in enumerate(tasks)}
    rows.sort(key=lambda r: order[(r["policy"], r["capacity"], r["seed"])])
    if failure is not None:
        raise stop(failure) from failure
    return rows, timelines


def _died(started, done: set) -> RunFailed:
    """A worker process died (a policy that exits, the OOM killer): the runs it may have been
    on, those started and not finished (the pool stops the other workers too)."""
    on = []
    while not started.empty():
        t = started.get()
        if t not in done and t not in on:
            on.append(t)
    runs = " or ".join(f"{t.policy} at {t.capacity:g} (seed {t.seed})" for t in on) or "a run"
    return RunFailed(f"a suite worker process died while running {runs} (out of memory or the policy exited)")


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean and SD over seeds per (capacity, policy), ranked by lost cluster utility."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["capacity"], r["policy"]), []).append(r)
    out = []
    for (cap, pol), rs in groups.items():

        def ms(key):
            v = np.array([r[key] for r in rs], dtype=float)
            return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0

        lu, lu_sd = ms("lost_cluster_utility")
        eu, eu_sd = ms("lost_effective_utility")
        sv, sv_sd = ms("cluster_slo_violation_rate")
        out.append(
            {
                "capacity": cap,
                "policy": pol,
                "seeds": len(rs),
                "lost_utility": lu,
                "lost_utility_sd": lu_sd,
                "lost_effective_utility": eu,
                "lost_effective_sd": eu_sd,
                "slo_violation_rate": sv,
                "slo_violation_sd": sv_sd,
                "job_lost_median": ms("job_lost_median")[0],
                "job_lost_max": ms("job_lost_max")[0],
                "mean_replicas": ms("mean_replicas")[0],
                "wall_s": ms("wall_s")[0],
                "forecaster": rs[0].get("forecaster", ""),
            }
        )
    out.sort(key=lambda a: (-a["capacity"], a["lost_utility"]))
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})


def write_timeline(path: Path, timelines: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "capacity", "seed", "minute", "cluster_utility"])
        for (pol, cap, seed), tl in sorted(timelines.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            for m, u in enumerate(tl):
                w.writerow([pol, cap, seed, m, round(u, 5)])


def markdown_table(agg: list[dict]) -> str:
    """One table per capacity, policies ranked by mean lost cluster utility (lower is better)."""
    lines = []
    for cap in sorted({a["capacity"] for a in agg}, reverse=True):
        lines += [
            f"**Capacity {cap:g} replicas**",
            "",
            "| rank | policy | lost cluster utility (SD) | lost effective utility | "
            "cluster SLO violation rate | median / max job lost utility | mean replicas |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ]
        for k, a in enumerate([a for a in agg if a["capacity"] == cap], 1):
            lines.append(
                f"| {k} | {a['policy']} | {a['lost_utility']:.2f} ({a['lost_utility_sd']:.2f}) | "
                f"{a['lost_effective_utility']:.2f} | {a['slo_violation_rate']:.2%} | "
                f"{a['job_lost_median']:.3f} / {a['job_lost_max']:.3f} | {a['mean_replicas']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def write_outputs(
    out_dir: Path,
    rows: list[dict],
    timelines: dict,
    title: str = "",
    timeline_capacity: float | None = None,
    note: str = "",
) -> dict[str, Path]:
    """``note``: a paragraph atop summary.md (the runs that failed or did not run)."""
    from .plots import plot_lost_utility, plot_timeline

    out_dir.mkdir(parents=True, exist_ok=True)
    agg = aggregate(rows)
    paths = {
        "results": out_dir / "results.csv",
        "timeline": out_dir / "timeline.csv",
        "summary": out_dir / "summary.md",
        "lost_png": out_dir / "lost_utility.png",
        "timeline_png": out_dir / "timeline.png",
    }
    write_csv(paths["results"], rows)
    write_timeline(paths["timeline"], timelines)
    paths["summary"].write_text(
        (f"# {title}\n\n" if title else "") + (f"{note}\n\n" if note else "") + markdown_table(agg) + "\n"
    )
    plot_lost_utility(agg, paths["lost_png"], title)
    caps = sorted({a["capacity"] for a in agg})
    cap = timeline_capacity if timeline_capacity is not None and timeline_capacity in caps else caps[len(caps) // 2]
    plot_timeline(timelines, cap, paths["timeline_png"])
    return paths
