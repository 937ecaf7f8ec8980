"""Training the global N-HiTS forecaster (paper section 3.5) with neuralforecast.

One model is trained on the per-minute request counts of all jobs at once: every series is
cut into (input_size -> horizon) windows, each window scaled by its own statistics
(``scaler_type``, standard by default) so jobs of very different magnitude share one network,
and with ``loss="normal"`` the network learns the Gaussian's mean and std by maximum
likelihood. The last ``val_size`` minutes of every series are held out for early stopping
and the weights with the best validation loss are kept.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .history_check import check_history, history_frame
from .nhits import PREDICTORS, NHitsForecaster
from .quiet import QUIET_TRAINER_KWARGS, default_threads, preserved_global_rng, quiet_lightning, torch_threads

if TYPE_CHECKING:
    import pytorch_lightning as pl

SCALERS = ("robust", "standard", "minmax", "identity")


@dataclass
class TrainConfig:
    """Hyper-parameters; the defaults are the ones tuned on days 1-8 (docs/forecasting.md)."""

    input_size: int = 15  # minutes of history fed to the network (paper: 15)
    horizon: int = 7  # minutes forecast (paper: 7)
    loss: str = "normal"  # "normal" (Faro) or "mae" (point N-HiTS baseline)
    max_steps: int = 1500
    learning_rate: float = 5e-4
    scaler_type: str = "standard"
    val_size: int | None = None  # minutes per series held out; None: 1/8 of the shortest series
    val_check_steps: int = 50
    early_stop_patience_steps: int = 5  # validation checks without improvement
    mlp_width: int = 256  # units of the 2 hidden layers of each of the 3 N-HiTS stacks
    windows_batch_size: int = 256
    seed: int = 1
    members: int = 4  # networks of the ensemble, seeds seed .. seed + members - 1
    threads: int | None = None  # torch threads while training (None: half the cores, at most 4)
    extra: dict[str, Any] = field(default_factory=dict)  # further NHITS keyword arguments

    def validate(self) -> None:
        if self.input_size < 2 or self.horizon < 1:
            raise ValueError(f"input size must be >= 2 and horizon >= 1 (got {self.input_size}, {self.horizon})")
        if self.loss not in PREDICTORS:
            raise ValueError(f"loss must be one of {', '.join(PREDICTORS)} (got {self.loss!r})")
        if self.max_steps < 1:
            raise ValueError(f"max steps must be >= 1 (got {self.max_steps})")
        if not 0 < self.learning_rate < 1:
            raise ValueError(f"learning rate must be in (0, 1) (got {self.learning_rate})")
        if self.scaler_type not in SCALERS:
            raise ValueError(f"scaler must be one of {', '.join(SCALERS)} (got {self.scaler_type!r})")
        if self.val_size is not None and self.val_size < 0:
            raise ValueError(f"validation size must be >= 0 (got {self.val_size})")
        if self.mlp_width < 1 or self.windows_batch_size < 1 or self.val_check_steps < 1:
            raise ValueError("mlp width, windows batch size and val check steps must be >= 1")
        if self.members < 1:
            raise ValueError(f"members must be >= 1 (got {self.members})")


@dataclass
class TrainReport:
    """What happened in training, stored in the model's meta.json."""

    steps: int = 0
    best_step: int = 0
    best_val_loss: float | None = None
    val_size: int = 0
    seconds: float = 0.0
    stopped_early: bool = False


ProgressFn = Callable[[int, int, float], None]  # (step, max_steps, train loss)


def choose_val_size(lengths: list[int], cfg: TrainConfig) -> int:
    """Held-out minutes per series: as configured, else 1/8 of the shortest series, rounded
    down to a multiple of the horizon, while leaving room for training windows."""
    need = cfg.input_size + cfg.horizon
    shortest = min(lengths)
    if cfg.val_size is not None:
        val = cfg.val_size
        if 0 < val < cfg.horizon:
            raise ValueError(f"validation size must be 0 or at least the horizon ({cfg.horizon})")
    else:
        val = max(cfg.horizon, (shortest // 8) // cfg.horizon * cfg.horizon)
    if shortest < need + val:
        raise ValueError(
            f"series too short to train: the shortest has {shortest} minutes, need at "
            f"least input_size + horizon + validation = {need} + {val} = {need + val}"
        )
    return val


def _callback(report: TrainReport, best: dict[str, Any], max_steps: int, progress: ProgressFn | None) -> pl.Callback:
    """A Lightning callback: reports progress and keeps the best weights (in ``best``) on
    validation. State lives in the closure because neuralforecast deep-copies its models
    (and so their callbacks) before fitting."""
    import pytorch_lightning as pl

    class BestAndProgress(pl.Callback):
        def on_train_batch_end(
            self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            report.steps = int(trainer.global_step)
            if progress is not None:
                loss = outputs["loss"] if isinstance(outputs, dict) else outputs
                progress(report.steps, max_steps, float(loss.detach()) if loss is not None else float("nan"))

        def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            metric = trainer.callback_metrics.get("ptl/val_loss")
            if metric is None or trainer.sanity_checking:
                return
            val = float(metric)
            if np.isfinite(val) and (report.best_val_loss is None or val < report.best_val_loss):
                report.best_val_loss, report.best_step = val, int(trainer.global_step)
                best["state"] = copy.deepcopy(pl_module.state_dict())

    return BestAndProgress()


def train_forecaster(
    history: Mapping[str, np.ndarray],
    config: TrainConfig | None = None,
    progress: ProgressFn | None = None,
    verbose: bool = False,
) -> NHitsForecaster:
    """Train the global N-HiTS on ``history`` (``{job: per-minute counts}``), CPU only: an
    ensemble of ``config.members`` networks alike but for their seeds (``seed``, ``seed + 1``,
    ...), which :class:`NHitsForecaster` mixes (docs/forecasting.md, "Ensemble": on the tuning
    days the mixture of four planned better than the average single network).

    ``progress(step, max_steps, loss)`` is called after every training step, counted over
    the whole ensemble. The caller's global RNG state is left untouched.
    """
    cfg = config or TrainConfig()
    cfg.validate()
    hist = check_history(history)
    if not hist:
        raise ValueError("no series to train on")
    val_size = choose_val_size([h.size for h in hist.values()], cfg)
    total = cfg.members * cfg.max_steps
    nets, reports = [], []
    for i in range(cfg.members):
        step = (
            None if progress is None else (lambda s, _, loss, done=i * cfg.max_steps: progress(done + s, total, loss))
        )
        model, report = _train_one(hist, cfg, cfg.seed + i, val_size, step, verbose)
        nets.append(model)
        reports.append(asdict(report))
    meta = {
        "config": asdict(cfg),
        "train_series": list(hist),
        "train_minutes": {n: int(h.size) for n, h in hist.items()},
        "training": {**reports[0], "seconds": sum(r["seconds"] for r in reports), "members": reports},
    }
    return NHitsForecaster(nets[0], cfg.loss, meta, members=nets[1:])


def _train_one(
    hist: dict[str, np.ndarray], cfg: TrainConfig, seed: int, val_size: int, progress: ProgressFn | None, verbose: bool
) -> tuple[Any, TrainReport]:
    """One network of the ensemble, seeded by ``seed``: the model and its report."""
    report = TrainReport(val_size=val_size)
    best: dict[str, Any] = {}
    cb = _callback(report, best, cfg.max_steps, progress)
    t0 = time.perf_counter()
    with quiet_lightning(verbose), preserved_global_rng(), torch_threads(cfg.threads or default_threads()):
        from neuralforecast import NeuralForecast
        from neuralforecast.losses.pytorch import MAE, DistributionLoss
        from neuralforecast.models import NHITS

        loss = DistributionLoss("Normal", level=[80, 90]) if cfg.loss == "normal" else MAE()
        trainer_kwargs = dict(QUIET_TRAINER_KWARGS)
        if verbose:
            trainer_kwargs.update(enable_model_summary=True)
        model = NHITS(
            h=cfg.horizon,
            input_size=cfg.input_size,
            loss=loss,
            max_steps=cfg.max_steps,
            learning_rate=cfg.learning_rate,
            scaler_type=cfg.scaler_type,
            mlp_units=3 * [[cfg.mlp_width, cfg.mlp_width]],
            windows_batch_size=cfg.windows_batch_size,
            val_check_steps=cfg.val_check_steps,
            early_stop_patience_steps=cfg.early_stop_patience_steps if val_size else -1,
            random_seed=seed,
            callbacks=[cb],
            **cfg.extra,
            **trainer_kwargs,
        )
        nf = NeuralForecast(models=[model], freq=1)
        nf.fit(history_frame(hist), val_size=val_size)
        model = nf.models[0]
        if "state" in best:
            model.load_state_dict(best["state"])
    report.seconds = time.perf_counter() - t0
    report.stopped_early = report.steps < cfg.max_steps
    # Runtime objects must not travel with the saved hyper-parameters.
    for holder in (model.hparams, model.trainer_kwargs):
        holder.pop("callbacks", None)
    # The loss keeps its last batch's mean; after a training step (max_steps not a multiple
    # of val_check_steps) it is still in the autograd graph and saving cannot copy it.
    import torch

    for loss in {id(x): x for x in (model.loss, model.hparams.get("loss"))}.values():
        if isinstance(getattr(loss, "distr_mean", None), torch.Tensor):
            loss.distr_mean = loss.distr_mean.detach()
    return model, report
