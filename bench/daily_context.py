"""The weight of the daily context (forecasting/daily.py), chosen on training days and
reported on held-out days (docs/forecasting.md, "Daily context").

For each trace family, forecasts from rolling origins every 5 minutes (horizon 7) with the
shipped N-HiTS alone (weight 0) and with daily context at several weights: RMSE of the
forecast mean (requests/min) and the 90 % interval's coverage. Tuning days: Faro days 7-8
(every sample), Azure day 11; held out: Faro days 9-10, Azure day 12. The shipped network
was trained on the tuning days, so its forecasts there are better than on unseen days and
the weight chosen there is a conservative one.

    python -m bench.daily_context [--weights 0,0.25,0.5,0.75,1] [--out docs/results/daily-context.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from faro_serve.traces import day_minutes, load_trace
from forecasting.daily import DailyContext
from forecasting.shipped import load_shipped

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
FARO, AZURE = TRACES / "faro10_days1-10.csv", TRACES / "azure12_days8-12.csv"
# (family, file, samples, days loaded, tuning days, held-out days)
SETS = [
    ("Faro 10 jobs", FARO, (0, 1, 2, 3), range(6, 11), (7, 8), (9, 10)),
    ("Azure 12 functions", AZURE, (None,), range(10, 13), (11,), (12,)),
]


def errors(fc, counts: np.ndarray, period: int, first_day: int, days, step: int = 5):
    """Squared errors of the mean and 90 % interval hits over ``days`` (1-based day numbers
    of the loaded ``counts``, which start at ``first_day``)."""
    hist, actual = {}, []
    for d in days:
        lo = (d - first_day) * period
        for t in range(max(lo, period + fc.level_minutes), lo + period - fc.horizon + 1, step):
            for j in range(counts.shape[0]):
                hist[f"{t}:{j}"] = counts[j, :t]
                actual.append(counts[j, t : t + fc.horizon])
    out = fc.predict(hist, n_samples=100, seed=0)
    per_min = out.samples * 60.0
    y = np.array(actual)
    q05, q95 = np.quantile(per_min, [0.05, 0.95], axis=1)
    return (y - per_min.mean(axis=1)) ** 2, (y >= q05) & (y <= q95)


def table(weights: list[float]) -> str:
    base = load_shipped()
    base.daily_weight = 0.0  # the network alone: DailyContext adds the context measured here
    base.recurrence_share = 0.0  # (the table predates recurring peaks: docs/results/recurrence.md)
    rows = [
        "| trace | days | " + " | ".join(f"w {w:g}: RMSE / cov. 90" for w in weights) + " |",
        "|---|---|" + "---:|" * len(weights),
    ]
    for family, path, samples, loaded, tune, held in SETS:
        period = day_minutes(str(path), loaded[0], samples[0])  # 360 points for Faro, 1440 Azure
        for label, days in (("tuning", tune), ("held out", held)):
            cells = []
            for w in weights:
                fc = DailyContext(base, period=period, weight=w)
                sq, hit = [], []
                for s in samples:
                    tr = load_trace(path, days=f"{loaded[0]}-{loaded[-1]}", sample=s)
                    e, h = errors(fc, tr.counts.astype(float), period, loaded[0], days)
                    sq.append(e), hit.append(h)
                cells.append(f"{np.sqrt(np.concatenate(sq).mean()):.2f} / {np.concatenate(hit).mean():.3f}")
            rows.append(f"| {family} | {label} ({', '.join(map(str, days))}) | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    md = table([float(w) for w in args.weights.split(",")])
    print(md)
    if args.out:
        Path(args.out).write_text("# Daily context: forecast error by weight (bench/daily_context.py)\n\n" + md)


if __name__ == "__main__":
    main()
