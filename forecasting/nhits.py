"""Faro's predictor: one global N-HiTS with a Gaussian head (paper sections 3.5.1-3.5.2).

A point N-HiTS trained with MAE forecasts a damped average and misses the window's peaks;
Faro instead has N-HiTS output the mean and standard deviation of a Normal per future step
(neuralforecast's ``DistributionLoss("Normal")``) and hands the autoscaler 100 samples of it.

Prediction runs the trained network directly in torch on the last ``input_size`` counts of
every model, with the same per-window scaling and scale-decoupling neuralforecast applies,
and samples the Normal with a seeded numpy generator: one batched forward pass for all
models, a few milliseconds, instead of neuralforecast's DataFrame/Trainer round trip.
:func:`neuralforecast_predict` keeps that slow path as the reference the tests compare to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import FallbackForecaster, Forecast
from .daily import DAY_MINUTES, DEFAULT_WEIGHT, add_daily, check_daily
from .history_check import check_history
from .quiet import torch_threads
from .recurrence import DEFAULT_SHARE, Recurrence, add_recurrence

# loss name (as stored in meta.json) -> predictor name reported in Forecast.predictor
PREDICTORS = {"normal": "nhits-normal", "mae": "nhits-point"}

# How a history shorter than the network's input is completed (issue 32, "no blind start"):
# left-padded with its mean, its first value, or its own pattern repeated; "mask" pads with
# the mean but marks the padding unobserved (scaling over the real minutes only);
# "fallback": no network, FallbackForecaster. Measured in docs/forecasting.md.
SHORT_RULES = ("pad-mean", "pad-edge", "pad-tile", "mask", "fallback")
DEFAULT_SHORT_RULE = "mask"


def complete_window(h: np.ndarray, size: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """The last ``size`` minutes of ``h`` (non-empty), left-padded by ``rule`` when shorter,
    and the mask of observed minutes (1) against padded ones (0)."""
    h = np.asarray(h, dtype=float)[-size:]
    k = size - h.size
    mask = np.concatenate([np.zeros(k), np.ones(h.size)])
    if k == 0:
        return h, mask
    if rule == "pad-edge":
        pad = np.full(k, h[0])
    elif rule == "pad-tile":  # the pattern repeated backwards, ending where h starts
        pad = np.tile(h, -(-k // h.size))[-k:]
    else:  # pad-mean, and mask (whose padding the scaler ignores)
        pad = np.full(k, h.mean())
    return np.concatenate([pad, h]), mask


class NHitsForecaster:
    """A trained neuralforecast ``NHITS`` behind the :class:`forecasting.base.Forecaster` API.

    ``loss="normal"``: samples from the predicted Normal per step. ``loss="mae"`` (the point
    baseline): the point forecast repeated, a degenerate interval. A model with some history
    but less than ``input_size`` minutes is forecast by the network on a window completed by
    ``short_history`` (:data:`SHORT_RULES`, measured in docs/forecasting.md); ``"fallback"``
    hands it to :class:`FallbackForecaster` instead, as does an empty history. A model with
    a day of history (``daily_period`` minutes and the input window) has its forecast moved
    towards yesterday's same minutes by ``daily_weight`` (:mod:`forecasting.daily`; 0: off).
    A model whose history shows a cycle has ``recurrence_share`` of its samples raised to
    its recurring peak (:mod:`forecasting.recurrence`; 0: off). An ensemble (``members``)
    draws an equal share of the samples from each network (docs/forecasting.md, "Ensemble").
    """

    def __init__(
        self,
        model: Any,
        loss: str,
        meta: Mapping[str, Any] | None = None,
        *,
        script: Any = None,
        input_size: int | None = None,
        horizon: int | None = None,
        members: Sequence[Any] = (),
    ):
        """``model``: the neuralforecast ``NHITS``; or None with ``script``, its forward pass
        traced (:mod:`forecasting.scripted`, torch alone), and ``input_size``/``horizon``.
        ``members``: the ensemble's further networks, each of the kind of the first (models,
        or traced forwards when ``model`` is None), trained alike from other seeds."""
        if loss not in PREDICTORS:
            raise ValueError(f"unknown N-HiTS loss {loss!r} (expected one of {', '.join(PREDICTORS)})")
        if model is None and (script is None or input_size is None or horizon is None):
            raise ValueError("without the model, give its traced forward (script), input_size and horizon")
        self.model = None if model is None else model.eval()
        self.script = script
        # every network of the ensemble, the first included: (model, traced forward)
        self.nets = [(self.model, script)] + [(m.eval(), None) if model is not None else (None, m) for m in members]
        self.loss = loss
        self.name = PREDICTORS[loss]
        self.input_size = int(model.input_size if model is not None else input_size)  # type: ignore[arg-type]
        self.horizon = int(model.h if model is not None else horizon)  # type: ignore[arg-type]
        self.meta: dict[str, Any] = dict(meta or {})
        # Intra-op threads for the forward pass: one is fastest for this small MLP and does
        # not stall when the autoscaler shares the cores (None: torch's global setting).
        self.threads: int | None = 1
        self.fallback = FallbackForecaster(self.input_size, self.horizon)
        self.short_history = DEFAULT_SHORT_RULE
        self.daily_period = DAY_MINUTES  # a replayed trace's day is its own (the simulator sets it)
        self.daily_weight = DEFAULT_WEIGHT
        self.recurrence_share = DEFAULT_SHARE  # recurring peaks' share of the samples (0: off)

    # -- the network, called directly -------------------------------------------------
    @property
    def n_members(self) -> int:
        """Networks in the ensemble (1: a single N-HiTS)."""
        return len(self.nets)

    def predict_params(
        self, windows: np.ndarray, masks: np.ndarray | None = None, member: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std ``(models, horizon)`` in requests per MINUTE for ``(models, input_size)``
        windows of counts (std is 0 for the point model), by the ensemble's network ``member``;
        ``masks`` (same shape, 0 = not observed) keeps padded minutes out of the scaling and
        the network's residuals."""
        import torch

        x = np.asarray(windows, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.input_size:
            raise ValueError(f"windows must be (models, {self.input_size}), got {x.shape}")
        m, script = self.nets[member]
        if m is None:  # the traced forward: the same computation, torch alone
            from .scripted import run

            with torch_threads(self.threads), torch.inference_mode():
                k = np.ones_like(x) if masks is None else np.asarray(masks, dtype=np.float32)
                mu, sigma = run(script, torch.from_numpy(x), torch.from_numpy(k))
            return mu.double().numpy(), sigma.double().numpy()
        with torch_threads(self.threads), torch.inference_mode():
            y = torch.from_numpy(x).unsqueeze(-1)  # [B, L, 1]
            mask = (
                torch.ones_like(y)
                if masks is None
                else torch.from_numpy(np.asarray(masks, dtype=np.float32)).unsqueeze(-1)
            )
            z = m.scaler.transform(x=y, mask=mask)  # per-window scaling, as in training
            loc, scale = m.scaler.x_shift, m.scaler.x_scale  # [B, 1, 1]
            out = m(
                {"insample_y": z, "insample_mask": mask, "futr_exog": None, "hist_exog": None, "stat_exog": None}
            )  # [B, h, n_outputs]
            if self.loss == "normal":
                mu, sigma = m.loss.scale_decouple(output=m.loss.domain_map(out), loc=loc, scale=scale)
                mu, sigma = mu[..., 0], sigma[..., 0]
            else:
                mu = m.scaler.inverse_transform(z=m.loss.domain_map(out), x_shift=loc, x_scale=scale)[..., 0]
                sigma = torch.zeros_like(mu)
        return mu.double().numpy(), sigma.double().numpy()

    def predict(self, history: Mapping[str, np.ndarray], n_samples: int = 100, seed: int | None = None) -> Forecast:
        """Samples ``(models, n_samples, horizon)`` of requests/s, never negative."""
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1 (got {n_samples})")
        hist = check_history(history)
        names = list(hist)
        rng = np.random.default_rng(seed)
        out = np.zeros((len(names), n_samples, self.horizon))
        predictor: dict[str, str] = {}
        rule = self.short_history
        if rule not in SHORT_RULES:
            raise ValueError(f"unknown short_history rule {rule!r} (expected one of {', '.join(SHORT_RULES)})")
        size = self.input_size
        net = [i for i, n in enumerate(names) if hist[n].size >= size or (rule != "fallback" and hist[n].size > 0)]
        if net:
            pairs = [complete_window(hist[names[i]], size, rule) for i in net]
            windows, masks = np.stack([w for w, _ in pairs]), np.stack([k for _, k in pairs])
            out[net] = self._sample(windows, masks if rule == "mask" else None, n_samples, rng)
            for i in net:
                k = hist[names[i]].size
                predictor[names[i]] = self.name if k >= size else f"{self.name} (short history: {k} of {size} minutes)"
        short = [n for i, n in enumerate(names) if i not in set(net)]
        if short:
            fb_seed = None if seed is None else int(rng.integers(2**32))
            fb = self.fallback.predict({n: hist[n] for n in short}, n_samples, fb_seed)
            for k, n in enumerate(short):
                out[names.index(n)] = fb.samples[k]
                predictor[n] = (
                    f"{fb.predictor[n]}: no history"
                    if hist[n].size == 0
                    else f"{fb.predictor[n]}: short history ({hist[n].size} of {size} minutes)"
                )
        check_daily(self.daily_period, self.daily_weight)
        fc = add_daily(
            Forecast(names, out, {n: predictor[n] for n in names}), hist, self.daily_period, self.daily_weight, size
        )
        return add_recurrence(fc, hist, Recurrence(share=self.recurrence_share))

    def _sample(
        self, windows: np.ndarray, masks: np.ndarray | None, n_samples: int, rng: np.random.Generator
    ) -> np.ndarray:
        """``(models, n_samples, horizon)`` requests/s: each network of the ensemble draws an
        equal share of the samples from its Normal (a mixture; Lakshminarayanan et al.,
        NeurIPS '17: members of other seeds disagree where the data do not decide). The
        samples come grouped by network, so the last quarter, which recurring peaks raise
        (:func:`forecasting.recurrence.add_recurrence`), is the last network's: a raise is a
        maximum with the peak's path, which leaves the samples it does not lift as they were."""
        k = self.n_members
        parts = []
        for i in range(k):
            share = n_samples // k + (i < n_samples % k)
            if share == 0:
                continue
            mu, sigma = self.predict_params(windows, masks, member=i)
            noise = rng.standard_normal((len(windows), share, self.horizon))
            parts.append(mu[:, None, :] + sigma[:, None, :] * noise)
        return np.concatenate(parts, axis=1) / 60.0

    def warm_up(self) -> None:
        """One throw-away forward pass so the first real call is not slower."""
        for i in range(self.n_members):
            self.predict_params(np.ones((1, self.input_size)), member=i)


def neuralforecast_predict(
    forecaster: NHitsForecaster, history: Mapping[str, np.ndarray], seed: int = 1
) -> dict[str, np.ndarray]:
    """Reference forecast through neuralforecast's own ``NeuralForecast.predict(df)``.

    Returns ``{"mean": (models, horizon)}`` in requests per minute (for the Gaussian model
    the mean of neuralforecast's 1000 samples) plus ``"lo-90"``/``"hi-90"`` for it.
    Slow (a Lightning Trainer per call); used to check :meth:`NHitsForecaster.predict_params`.
    """
    from neuralforecast import NeuralForecast

    from .history_check import history_frame
    from .quiet import preserved_global_rng, quiet_lightning

    hist = check_history(history)
    names = list(hist)
    df = history_frame(hist)
    model = forecaster.model
    if model is None:
        raise ValueError("a traced forecaster (no network) has no neuralforecast reference forecast")
    with quiet_lightning(), preserved_global_rng():
        nf = NeuralForecast(models=[model], freq=1)
        nf.models = [model]
        nf.id_col, nf.time_col, nf.target_col = "unique_id", "ds", "y"
        nf.scalers_, nf.static_scalers_, nf._fitted = {}, {}, True
        kwargs = {"level": [90]} if forecaster.loss == "normal" else {}
        saved_seed, model.random_seed = model.random_seed, seed
        try:
            fc = nf.predict(df=df, **kwargs)
        finally:
            model.random_seed = saved_seed
            model.eval()
    fc = fc.set_index("unique_id").loc[names]
    col = repr(model)
    res = {"mean": fc[col].to_numpy(dtype=float).reshape(len(names), forecaster.horizon)}
    if forecaster.loss == "normal":
        for k in ("lo-90", "hi-90"):
            res[k] = fc[f"{col}-{k}"].to_numpy(dtype=float).reshape(len(names), forecaster.horizon)
    return res
