"""The live autoscaler's forecaster over its life (issue 32): the one its args choose at
start (what the retrainer saved before a restart first), the retrainer a loop runs, and the
swap of a winning forecaster into the policy between two ticks. Between ``forecasters.py``
(choosing one by name) and ``retrainer.py`` (training one), which need neither the loop's
config nor each other."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from autoscaler.contract.policy import Policy
from autoscaler.driving.forecasters import choose_forecaster, policy_forecasts, set_daily, set_recurrence
from autoscaler.driving.history import HistoryKeeper
from autoscaler.driving.loop_config import AutoscalerConfig
from autoscaler.driving.retrainer import RETRAINED_DIR, Retrainer, retraining_on
from forecasting.base import Forecaster

if TYPE_CHECKING:
    from forecasting.nhits import NHitsForecaster

log = logging.getLogger("faro_serve.autoscaler")


def loop_retrainer(
    cfg: AutoscalerConfig,
    keeper: HistoryKeeper | None,
    policy: Policy,
    names: list[str],
    old: Retrainer | None,
    clock: Callable[[], float],
) -> Retrainer | None:
    """The control loop's retrainer: with an arrival store, a forecasting policy and
    ``retrain_every_h`` (off for a forecaster the user named in the args:
    :func:`retraining_on`); ``old``, a previous loop's over the same store, models and
    periods, carries on."""
    if keeper is None or not retraining_on(cfg) or not hasattr(policy, "forecaster"):
        return None
    holdout = max(1, round(cfg.retrain_holdout_h * 60))
    if (
        old is not None
        and old.store is keeper.store
        and old.models == names
        and old.every_s == cfg.retrain_every_h * 3600
        and old.holdout == holdout
    ):
        return old
    return Retrainer(
        keeper.store,
        names,
        cfg.retrain_every_h * 3600,
        holdout,
        keep=keeper.store.keep_minutes,
        save_dir=cfg.history_dir,
        clock=clock,
    )


def swap_in(retrainer: Retrainer, policy: Policy, cfg: AutoscalerConfig) -> None:
    """A retrained forecaster that won its held-back hours serves the policy from this tick
    on, with the loop's forecasting args (the policy has a ``forecaster``: :func:`loop_retrainer`)."""
    new = retrainer.poll(getattr(policy, "forecaster", None))
    if new is not None:
        setattr(new, "short_history", cfg.short_history)  # an N-HiTS's, not the Forecaster protocol's
        set_daily(new, cfg.daily)
        set_recurrence(new, cfg.recurrence_share)
        setattr(policy, "forecaster", new)  # not in the Policy contract


def forecaster_of(cfg: AutoscalerConfig) -> tuple[Forecaster | None, str]:
    """``(forecaster, why)`` of the live autoscaler's args (``autoscaler.driving.loop_config.AutoscalerConfig``):
    the forecaster of ``forecaster`` (``fallback``, ``shipped``, a plug-in name or an import
    path) or of ``forecaster_dir``; else what the retrainer saved under ``history_dir`` (what
    the autoscaler learnt before a restart, issue 32); else the N-HiTS shipped with faro-serve;
    none for a built-in policy that does not forecast. One that fails to load by default
    leaves the fallback predictor, and ``why`` (also in the status) says so."""
    if not (cfg.forecaster or cfg.forecaster_dir or policy_forecasts(cfg.policy_name())):
        why = f"none: {cfg.policy_name()} does not forecast"
        log.info("forecaster: %s", why)
        return None, why
    retrained = retrained_dir(cfg)
    if retrained is not None:
        try:
            fc, why = choose_forecaster(None, str(retrained), cfg.short_history, cfg.daily)
            # a trained directory: load_forecaster's N-HiTS
            why = f"{cast('NHitsForecaster', fc).name} (retrained on this cluster's traffic: {retrained})"
            log.info("forecaster: %s", why)
            return fc, why
        except Exception as err:
            log.warning("cannot load the retrained forecaster in %s: %s; using the default", retrained, err)
    fc, why = choose_forecaster(cfg.forecaster, cfg.forecaster_dir, cfg.short_history, cfg.daily)
    log.info("forecaster: %s", why)
    return fc, why


def retrained_dir(cfg: AutoscalerConfig) -> Path | None:
    """The forecaster the retrainer saved under ``history_dir`` (``autoscaler.driving.retrainer``),
    when the args name no other (``forecaster`` or ``forecaster_dir``) and one was saved."""
    if not retraining_on(cfg):
        return None
    assert cfg.history_dir is not None  # retraining_on: there is one
    d = Path(cfg.history_dir).expanduser() / RETRAINED_DIR
    return d if (d / "meta.json").is_file() else None
