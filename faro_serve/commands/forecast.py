"""``faro-serve forecast``: train and evaluate the probabilistic workload forecaster (paper 3.5).

``forecast train`` fits one global N-HiTS with a Gaussian head on the per-minute request
counts of every job of a trace (or of a live autoscaler's recorded arrivals, ``--from``, kept
only if it forecasts the held-back minutes better) and saves it to a directory;
``forecast eval`` replays a
trace, forecasting every 5 minutes as the autoscaler would, and reports errors and the
coverage of the prediction intervals, for a trained model or a baseline.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import _args
from ._output import check_output_dir
from ._train_from_store import train_from_store
from .errors import UsageError

EVAL_BASELINES = ("last", "mean", "max", "nhits-point")


def register(sub) -> None:
    from forecasting.train import TrainConfig

    d = TrainConfig()  # defaults shown in --help
    p = sub.add_parser(
        "forecast", help="train / evaluate the workload forecaster", description=__doc__.split("\n\n", 1)[1]
    )
    fsub = p.add_subparsers(dest="forecast_command", metavar="ACTION")
    fsub.required = True

    t = fsub.add_parser(
        "train",
        help="train N-HiTS on a trace and save it to a directory",
        description="Train the global N-HiTS (Gaussian head, or MAE with "
        "--baseline nhits-point; an ensemble of --members networks) on all jobs "
        "of a trace, or on a live autoscaler's recorded arrivals (--from); CPU only.",
    )
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--trace",
        action="append",
        help="per-minute counts: CSV (minute, job, requests[, day, sample]) or JSON lines; "
        "repeat to train on several traces at once (one global model)",
    )
    src.add_argument(
        "--from",
        dest="from_store",
        metavar="HISTORY_DIR|PROMETHEUS_URL",
        help="train on a live autoscaler's recorded arrivals (its history_dir, the "
        "arrivals.sqlite3 file, or the Prometheus that scrapes the cluster, "
        "http://host:9090): the last --holdout-minutes are held back, and the "
        "new network is saved only if it forecasts them better than --current",
    )
    t.add_argument(
        "--prometheus-minutes",
        type=int,
        default=7 * 1440,
        help="with --from a Prometheus URL: minutes of history to read (default a week; at most 10,999)",
    )
    t.add_argument(
        "--holdout-minutes",
        type=int,
        default=120,
        help="with --from: the most recent minutes held back to judge on (default 120)",
    )
    t.add_argument(
        "--current",
        default=None,
        help="with --from: the forecaster to beat: a trained directory, 'shipped' or "
        "'fallback' (default: the one the autoscaler retrained in HISTORY_DIR, else "
        "the shipped one)",
    )
    t.add_argument(
        "--force", action="store_true", help="with --from: save the new network even if it does not forecast better"
    )
    t.add_argument(
        "--days",
        action="append",
        help="day or range of days to use, e.g. 3 or 1-8 (joined in order); once for "
        "every --trace, or once per --trace in the same order",
    )
    t.add_argument(
        "--sample",
        action="append",
        help="which sample of each day (if the file has several), or 'all': every sample "
        "as series of its own (a file without samples: its one); once for every "
        "--trace, or once per --trace",
    )
    t.add_argument("--out", required=True, help="directory to save the trained forecaster in")
    t.add_argument("--baseline", choices=["nhits-point"], help="train the point N-HiTS (MAE loss) baseline instead")
    t.add_argument("--input-size", type=int, default=15, help="minutes of history (default 15)")
    t.add_argument("--horizon", type=int, default=7, help="minutes forecast (default 7)")
    t.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help=f"training steps, at most (default {d.max_steps}; early stopping may end sooner)",
    )
    t.add_argument(
        "--learning-rate", type=float, default=None, help=f"Adam learning rate (default {d.learning_rate:g})"
    )
    t.add_argument(
        "--scaler",
        default=None,
        help=f"per-window scaler: standard, robust, minmax or identity (default {d.scaler_type})",
    )
    t.add_argument(
        "--val-size",
        type=int,
        default=None,
        help="minutes per job held out for early stopping (default 1/8 of the series)",
    )
    t.add_argument("--mlp-width", type=int, default=None, help=f"units of each hidden layer (default {d.mlp_width})")
    t.add_argument("--seed", type=_args.seed, default=1, help="random seed (default 1)")
    t.add_argument(
        "--members",
        type=int,
        default=None,
        help=f"networks of the ensemble, seeds --seed, --seed + 1, ... (default "
        f"{d.members}; 1: a single N-HiTS, as in the paper)",
    )
    t.add_argument("--verbose", action="store_true", help="show Lightning's own logs and warnings")
    t.set_defaults(func=run_train)

    e = fsub.add_parser(
        "eval",
        help="rolling-origin evaluation of a model or a baseline",
        description="Forecast every --step minutes from the history before "
        "each origin and score the forecasts (RMSE/MAE in requests per minute).",
    )
    e.add_argument("--model", help="trained forecaster directory (for nhits models)")
    e.add_argument("--baseline", choices=EVAL_BASELINES, help="evaluate a baseline instead")
    _trace_args(e)
    e.add_argument("--json", dest="json_out", help="also write the result to this JSON file")
    e.add_argument("--input-size", type=int, default=None, help="baselines: history window (default 15)")
    e.add_argument("--horizon", type=int, default=None, help="baselines: minutes forecast (default 7)")
    e.add_argument("--step", type=int, default=5, help="minutes between forecast origins (default 5)")
    e.add_argument("--samples", type=int, default=100, help="samples per forecast (default 100)")
    e.add_argument("--seed", type=_args.seed, default=0, help="sampling seed (default 0)")
    e.set_defaults(func=run_eval)


def _trace_args(p) -> None:
    p.add_argument(
        "--trace", required=True, help="per-minute counts: CSV (minute, job, requests[, day, sample]) or JSON lines"
    )
    p.add_argument("--days", help="day or range of days to use, e.g. 3 or 1-8 (joined in order)")
    p.add_argument("--sample", type=int, default=None, help="which sample of each day (if the file has several)")


def run_train(args) -> int:
    from forecasting.io import save_forecaster
    from forecasting.train import TrainConfig, train_forecaster

    cfg = TrainConfig(
        input_size=args.input_size,
        horizon=args.horizon,
        seed=args.seed,
        loss="mae" if args.baseline == "nhits-point" else "normal",
    )
    for attr, value in (
        ("max_steps", args.max_steps),
        ("learning_rate", args.learning_rate),
        ("scaler_type", args.scaler),
        ("val_size", args.val_size),
        ("mlp_width", args.mlp_width),
        ("members", args.members),
    ):
        if value is not None:
            setattr(cfg, attr, value)
    try:
        cfg.validate()
    except ValueError as err:
        raise UsageError(str(err)) from None
    check_output_dir(args.out, "--out", create=False)  # before minutes of training
    out = Path(args.out)
    if args.from_store:
        return train_from_store(args, cfg, out)
    for flag in ("current", "force"):
        if getattr(args, flag):
            raise UsageError(f"--{flag} goes with --from")
    history = training_history(training_sources(args.trace, args.days, args.sample))
    fc = _train_with_progress(train_forecaster, history, cfg, args.verbose)
    save_forecaster(fc, out)
    rep = fc.meta["training"]
    best = (
        f", best validation loss {rep['best_val_loss']:.4g} at step {rep['best_step']}"
        if rep.get("best_val_loss") is not None
        else ""
    )
    minutes = sorted({h.size for h in history.values()})
    span = f"{minutes[0]}" if len(minutes) == 1 else f"{minutes[0]}-{minutes[-1]}"
    print(
        f"trained {fc.name} on {len(history)} jobs x {span} minutes in "
        f"{rep['seconds']:.1f} s ({rep['steps']} steps{best}); saved to {out}"
    )
    return 0


def training_sources(
    traces: list[str], days: list[str] | None, samples: list[str] | None
) -> list[tuple[str, str | None, int | str | None]]:
    """``(trace, days, sample)`` per ``--trace``: ``--days`` and ``--sample`` given once apply
    to every trace, or are given once per trace in the same order; a sample is a number or
    ``all``."""

    def per_trace(values, flag):
        if not values:
            return [None] * len(traces)
        if len(values) == 1:
            return values * len(traces)
        if len(values) != len(traces):
            raise UsageError(
                f"{flag} given {len(values)} times for {len(traces)} --trace: give it once for all, or once per --trace"
            )
        return values

    def sample(v):
        if v is None or v == "all":
            return v
        try:
            return int(v)
        except ValueError:
            raise UsageError(f"--sample takes a number or 'all' (got {v!r})") from None

    return [(t, d, sample(s)) for t, d, s in zip(traces, per_trace(days, "--days"), per_trace(samples, "--sample"))]


def training_history(sources) -> dict:
    """``{series: per-minute counts}`` of every ``(trace, days, sample)``: one trace and one
    sample keep the job names; several (``sample`` ``all``: every sample of the file as
    series of its own) name each series ``<file stem>[/s<sample>]/<job>``."""
    from ..traces import TraceError, load_trace

    loads = []
    for path, days, sample in sources:
        if sample == "all":
            for k in _samples(path):
                loads.append((path, k, load_trace(path, days=days, sample=k)))
        else:
            loads.append((path, sample, load_trace(path, days=days, sample=sample)))
    if len(loads) == 1:
        return loads[0][2].history()
    out: dict = {}
    for path, sample, trace in loads:
        prefix = Path(path).stem + ("" if sample is None else f"/s{sample}")
        for name, counts in trace.history().items():
            key = f"{prefix}/{name}"
            if key in out:
                raise TraceError(f"{path}: series {key} given twice (the same trace and sample more than once?)")
            out[key] = counts
    return out


def _samples(path: str) -> list[int | None]:
    import pandas as pd

    from ..traces import TraceError

    p = Path(path)
    try:
        cols = pd.read_csv(p, nrows=0).columns
        if "sample" not in cols:  # one sample: its rows
            return [None]
        return sorted(int(k) for k in pd.read_csv(p, usecols=["sample"])["sample"].unique())
    except (OSError, ValueError, pd.errors.ParserError) as err:
        if isinstance(err, TraceError):
            raise
        raise TraceError(f"{p}: cannot read its samples ({err})") from None


def _train_with_progress(train, history, cfg, verbose):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("training N-HiTS"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("train", total=cfg.max_steps, loss="-")

        def progress(step, total, loss):
            bar.update(task, completed=step, loss=f"{loss:.4g}")

        return train(history, cfg, progress=progress, verbose=verbose)


def run_eval(args) -> int:
    from forecasting.baseline_forecasters import make_baseline
    from forecasting.evaluate import rolling_evaluation
    from forecasting.io import load_forecaster

    from ..traces import load_trace

    if args.step < 1 or args.samples < 1:
        raise UsageError("--step and --samples must be >= 1")
    if args.baseline in ("last", "mean", "max"):
        if args.model:
            raise UsageError(f"--model is not used with --baseline {args.baseline}")
        size = 15 if args.input_size is None else args.input_size
        horizon = 7 if args.horizon is None else args.horizon
        if size < 1 or horizon < 1:
            raise UsageError("--input-size and --horizon must be >= 1")
        forecaster, label = make_baseline(args.baseline, size, horizon), args.baseline
    else:
        if not args.model:
            raise UsageError("--model DIR is required (or choose --baseline last, mean or max)")
        forecaster = load_forecaster(args.model)
        if args.baseline == "nhits-point" and forecaster.loss != "mae":
            raise UsageError(
                f"--baseline nhits-point: {args.model} holds a {forecaster.name} model; "
                f"train one with 'forecast train --baseline nhits-point'"
            )
        for flag, given, have in (
            ("--input-size", args.input_size, forecaster.input_size),
            ("--horizon", args.horizon, forecaster.horizon),
        ):
            if given is not None and given != have:
                raise UsageError(f"{flag} {given} differs from the model's {have}")
        label = forecaster.name
    trace = load_trace(args.trace, days=args.days, sample=args.sample)
    if args.days and hasattr(forecaster, "daily_weight"):  # the daily context's day is the trace's
        from autoscaler.driving.forecasters import set_daily

        from ..traces import day_minutes, parse_days

        period = day_minutes(args.trace, parse_days(args.days)[0], args.sample)
        set_daily(forecaster, (period, forecaster.daily_weight))
    ev = rolling_evaluation(
        forecaster, trace.names, trace.counts, step=args.step, n_samples=args.samples, seed=args.seed
    )
    result = {"forecaster": label, **{k: _round(v) for k, v in ev.summary().items()}}
    text = json.dumps(result, indent=2)
    if args.json_out:
        try:
            Path(args.json_out).write_text(text + "\n")
        except OSError as err:
            raise UsageError(f"--json {args.json_out}: cannot write ({err.strerror or err})") from None
    print(text)
    return 0


def _round(v):
    return round(v, 4) if isinstance(v, float) else v
