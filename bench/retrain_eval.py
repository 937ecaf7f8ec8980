"""What a retrain on a cluster's own traffic gains (issue 32 item 4), on the shared traces.

A trace slice stands in for the history the live autoscaler records (its arrival store):
``forecasting.retrain.retrain`` trains a candidate without the last ``--holdout`` minutes and
judges it against the current forecaster (``fallback`` or a trained directory) on them, the
same call the live retrainer makes. The candidate is saved to ``--out`` so the simulator can
measure it on a later day it did not see (``faro-serve suite ... --forecaster-dir``).

    .venv/bin/python bench/retrain_eval.py --trace ../shared/traces/azure12_days8-12.csv \\
        --days 8-11 --current fallback --out runs/retrained-azure12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faro_serve.traces import load_trace  # noqa: E402
from forecasting.base import FallbackForecaster  # noqa: E402
from forecasting.io import load_forecaster, save_forecaster  # noqa: E402
from forecasting.retrain import candidate_config, retrain  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(ROOT.parent / "shared/traces/azure12_days8-12.csv"))
    p.add_argument("--days", default="8-11", help="the recorded history (joined in order)")
    p.add_argument("--sample", type=int, default=None)
    p.add_argument("--current", default="fallback", help="'fallback' or a trained forecaster directory")
    p.add_argument("--holdout", type=int, default=240, help="minutes held back to judge on")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="save the candidate here")
    a = p.parse_args(argv)
    trace = load_trace(a.trace, a.days, a.sample)
    current = FallbackForecaster() if a.current == "fallback" else load_forecaster(a.current)
    cfg = candidate_config(current, max_steps=a.max_steps, seed=a.seed)
    candidate, verdict = retrain(trace.history(), current, a.holdout, cfg)
    doc = {"trace": a.trace, "days": a.days, "current": a.current, **verdict.as_dict()}
    if a.out:
        doc["saved_to"] = str(save_forecaster(candidate, a.out))
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
