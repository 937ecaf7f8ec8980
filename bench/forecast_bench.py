"""Forecasting benchmark: Faro's Gaussian N-HiTS against point baselines (paper section 3.5).

Trains on days 1-8 of the Faro 10-job trace (sample 0), evaluates on days 9-10 with a
forecast every 5 minutes, and writes ``forecast_bench.md`` and ``forecast_bench.json`` to
the output directory (default ``bench/results/``). Nothing is tuned on days 9-10.

    .venv/bin/python -m bench.forecast_bench [--out DIR] [--save-models DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"
TARGETS = {"max_window_coverage_90": 0.85, "train_seconds": 300.0, "predict_ms": 100.0}
COLUMNS = ("rmse", "mae", "coverage_80", "coverage_90", "max_window_coverage_90", "predict_ms")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.forecast_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(DEFAULT_TRACE), help="tidy CSV trace (default: the Faro 10-job trace)")
    p.add_argument("--train-days", default="1-8")
    p.add_argument("--eval-days", default="9-10")
    p.add_argument("--sample", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for the table and JSON")
    p.add_argument("--save-models", help="keep the trained models in this directory")
    p.add_argument("--max-steps", type=int, default=None, help="override the training steps")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def train_and_reload(history, cfg, directory):
    """Train, save, load back (as the autoscaler would) and return (forecaster, seconds)."""
    from forecasting.io import load_forecaster, save_forecaster
    from forecasting.train import train_forecaster

    t0 = time.perf_counter()
    fc = train_forecaster(history, cfg)
    seconds = time.perf_counter() - t0
    save_forecaster(fc, directory)
    return load_forecaster(directory), seconds


def run(args) -> dict:
    from faro_serve.traces import load_trace
    from forecasting.baseline_forecasters import make_baseline
    from forecasting.evaluate import rolling_evaluation
    from forecasting.train import TrainConfig

    train = load_trace(args.trace, days=args.train_days, sample=args.sample)
    test = load_trace(args.trace, days=args.eval_days, sample=args.sample)
    load_start = os.getloadavg()[0]
    rows, trained = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(args.save_models) if args.save_models else Path(tmp)
        for label, loss in (("nhits-normal", "normal"), ("nhits-point", "mae")):
            cfg = TrainConfig(loss=loss, seed=args.seed)
            if args.max_steps:
                cfg.max_steps = args.max_steps
            print(f"training {label} on days {args.train_days} ...", file=sys.stderr, flush=True)
            fc, secs = train_and_reload(train.history(), cfg, models_dir / label)
            trained[label] = fc
            rows[label] = {"train_seconds": secs, "training": fc.meta["training"], "config": fc.meta["config"]}
        forecasters = {**trained, **{b: make_baseline(b) for b in ("last", "mean", "max")}}
        per_job = {}
        for label, fc in forecasters.items():
            ev = rolling_evaluation(fc, test.names, test.counts, step=5, n_samples=100, seed=0)
            rows.setdefault(label, {}).update(ev.summary())
            per_job[label] = ev.per_job()
    g, pt = rows["nhits-normal"], rows["nhits-point"]
    checks = {
        "max_window_coverage_90 >= 0.85": g["max_window_coverage_90"] >= TARGETS["max_window_coverage_90"],
        "max_window_coverage_90 above nhits-point": g["max_window_coverage_90"] > pt["max_window_coverage_90"],
        "training <= 300 s": g["train_seconds"] <= TARGETS["train_seconds"],
        "predict <= 100 ms for all jobs": g["predict_ms"] <= TARGETS["predict_ms"],
    }
    import neuralforecast
    import torch

    return {
        "trace": str(args.trace),
        "train_days": args.train_days,
        "eval_days": args.eval_days,
        "sample": args.sample,
        "jobs": test.names,
        "train_minutes": train.minutes,
        "eval_minutes": test.minutes,
        "origin_step_minutes": 5,
        "samples": 100,
        "units": "rmse/mae in requests per minute; predict_ms = median wall time of one predict "
        "call for all jobs (after load and warm-up)",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "neuralforecast": neuralforecast.__version__,
            "accelerator": "cpu",
            "load_average_start": round(load_start, 2),
            "load_average_end": round(os.getloadavg()[0], 2),
        },
        "results": rows,
        "per_job": per_job,
        "checks": checks,
    }


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [
        f"Trained on days {res['train_days']}, evaluated on days {res['eval_days']} (sample {res['sample']}) "
        f"of `{Path(res['trace']).name}`: {len(res['jobs'])} jobs, a forecast every "
        f"{res['origin_step_minutes']} min ({res['results']['last']['origins']} origins), "
        f"{res['samples']} samples. RMSE/MAE in requests per minute.",
        "",
        "| forecaster | RMSE | MAE | coverage 80 | coverage 90 | max-window coverage 90 | predict ms (all jobs) | train s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in res["results"].items():
        train = f"{r['train_seconds']:.0f}" if "train_seconds" in r else "-"
        lines.append(
            f"| {label} | {r['rmse']:.1f} | {r['mae']:.1f} | {r['coverage_80']:.3f} | "
            f"{r['coverage_90']:.3f} | {r['max_window_coverage_90']:.3f} | "
            f"{r['predict_ms']:.2f} | {train} |"
        )
    lines += [
        "",
        f"Machine: {m['cpus']} CPUs, CPU only, torch {m['torch']}, neuralforecast "
        f"{m['neuralforecast']}; load average {m['load_average_start']} at start, "
        f"{m['load_average_end']} at end.",
        "",
    ]
    lines += [f"- {'met' if ok else 'MISSED'}: {name}" for name, ok in res["checks"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    res = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(res)
    (out / "forecast_bench.md").write_text(table)
    (out / "forecast_bench.json").write_text(json.dumps(res, indent=2) + "\n")
    print(table)
    print(f"wrote {out / 'forecast_bench.md'} and {out / 'forecast_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
