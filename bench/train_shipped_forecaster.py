"""Train the forecaster that ships with faro-serve (``make forecaster``).

The global N-HiTS with a Gaussian head, an ensemble of four networks (seeds 1-4), on both
shared trace families: the Faro 10-job workload, days 1-8, every one of its 4 samples (40
series of 2,880 minutes), and 12 Azure functions, days 8-11 (12 series of 5,760 minutes).
Held out, never trained on: Faro days 9-10 and Azure day 12, where docs/forecasting.md
evaluates it. One torch thread, the hyper-parameters of ``forecasting.train.TrainConfig``
(four members, docs/forecasting.md "Ensemble") except the hidden width (128 units, not 256:
a quarter of the weights; docs/forecasting.md, "The shipped forecaster").

    python -m bench.train_shipped_forecaster [--traces ../shared/traces] [--out faro_serve/data/forecaster]

The same as ``faro-serve forecast train --trace <faro10> --days 1-8 --sample all --trace
<azure12> --days 8-11 --mlp-width 128 --seed 1 --out DIR``, with one torch thread. About
2 minutes on this 2-core machine when idle (27 s a network). Retraining gives the same
weights; ``meta.json`` differs only in ``saved_at`` and the training's ``seconds``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

FARO10 = "faro10_days1-10.csv"
AZURE12 = "azure12_days8-12.csv"
# (file, days, sample) -- the held-out days (Faro 9-10, Azure 12) are never listed here
SOURCES = ((FARO10, "1-8", "all"), (AZURE12, "8-11", "all"))
MLP_WIDTH = 128
SEED = 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default="../shared/traces", help="folder of the shared traces")
    ap.add_argument("--out", default="faro_serve/data/forecaster", help="where to save it")
    ap.add_argument("--mlp-width", type=int, default=MLP_WIDTH, help=f"hidden units ({MLP_WIDTH})")
    ap.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="training steps (default: TrainConfig's; "
        "fewer only to try the command: the shipped one is trained with the default)",
    )
    args = ap.parse_args(argv)

    from faro_serve.commands.forecast import training_history, training_sources
    from forecasting.io import save_forecaster
    from forecasting.train import TrainConfig, train_forecaster

    folder = Path(args.traces)
    sources = training_sources(
        [str(folder / f) for f, _, _ in SOURCES], [d for _, d, _ in SOURCES], [s for _, _, s in SOURCES]
    )
    history = training_history(sources)
    steps = {} if args.max_steps is None else {"max_steps": args.max_steps}
    cfg = TrainConfig(mlp_width=args.mlp_width, seed=SEED, threads=1, **steps)
    fc = train_forecaster(history, cfg)
    out = save_forecaster(fc, args.out)
    meta = json.loads((out / "meta.json").read_text())
    meta["train_data"] = [
        {"file": f, "sha256": hashlib.sha256((folder / f).read_bytes()).hexdigest(), "days": d, "sample": s}
        for f, d, s in SOURCES
    ]
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    rep = fc.meta["training"]
    size = sum(p.stat().st_size for p in out.iterdir())
    print(
        f"trained on {len(history)} series ({sum(h.size for h in history.values()):,} minutes) in "
        f"{rep['seconds']:.0f} s, {rep['steps']} steps, best validation loss "
        f"{rep['best_val_loss']:.4f} at step {rep['best_step']}; {out} ({size / 1e6:.2f} MB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
