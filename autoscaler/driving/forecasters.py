"""Which forecaster a policy plans with, in one place for every driver: the live autoscaler
(``forecaster`` / ``forecaster_dir`` in the ``faro`` application's args), ``simulate``,
``suite``, ``validate`` and ``compare``.

- a trained directory (``forecaster_dir``): that N-HiTS;
- ``fallback``: the fallback predictor, by choice (labelled ``fallback: chosen``);
- ``shipped``, or nothing at all: the N-HiTS shipped in the package
  (``forecasting.shipped``); with nothing given, one that cannot be loaded is logged and the
  fallback predictor serves, labelled ``fallback: forecaster failed to load: <why>``;
- any other name: a forecaster plug-in or an import path (``autoscaler.catalogue.plugins``).

Ray-free, like every module of the policy layer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from autoscaler.catalogue.plugins import make_forecaster
from forecasting.base import Forecaster
from forecasting.daily import DailyContext, check_daily
from forecasting.recurrence import check_share
from forecasting.shipped import BUILTIN_NAMES, FALLBACK, SHIPPED, default_forecaster

if TYPE_CHECKING:
    from forecasting.base import FallbackForecaster
    from forecasting.nhits import NHitsForecaster

log = logging.getLogger("faro_serve.autoscaler")

__all__ = [
    "BUILTIN_NAMES",
    "FALLBACK",
    "SHIPPED",
    "choose_forecaster",
    "is_builtin",
    "policy_forecasts",
    "set_daily",
    "set_recurrence",
]


def policy_forecasts(policy: str) -> bool:
    """Whether ``policy`` plans with a forecaster: a built-in says so in its catalogue row
    (``autoscaler.catalogue.builtin``); a plug-in, registered or import-path policy is given one too
    (one that does not forecast ignores it). None is loaded for the others."""
    from autoscaler.catalogue.builtin import BUILTIN

    return {row[0]: row[4] for row in BUILTIN}.get(policy, True)


def is_builtin(spec: str | None) -> bool:
    """``shipped`` or ``fallback``: a name faro-serve resolves itself, not a plug-in."""
    return spec in BUILTIN_NAMES


def set_daily(forecaster: Any, daily: tuple[int, float] | None) -> None:
    """Give an N-HiTS forecaster the daily context ``(period, weight)`` (forecasting/daily.py):
    the args' live, a replayed trace's day in the simulator. A plug-in forecaster is the
    user's and keeps what it does; one wrapped in ``DailyContext`` is told the period only."""
    if daily is None:
        return
    check_daily(*daily)
    if hasattr(forecaster, "daily_weight"):
        forecaster.daily_period, forecaster.daily_weight = int(daily[0]), float(daily[1])
    elif isinstance(forecaster, DailyContext):
        forecaster.period = int(daily[0])


def set_recurrence(forecaster: object, share: float | None) -> None:
    """Give an N-HiTS forecaster its recurring peaks' ``share`` (forecasting/recurrence.py);
    a plug-in forecaster is the user's and keeps what it does."""
    if share is None:
        return
    check_share(share)
    if hasattr(forecaster, "recurrence_share"):
        forecaster.recurrence_share = float(share)


def choose_forecaster(
    spec: str | None = None,
    directory: str | None = None,
    short_history: str | None = None,
    daily: tuple[int, float] | None = None,
    recurrence: float | None = None,
) -> tuple[Forecaster, str]:
    """``(forecaster, why)``: the forecaster of a name / import path (``spec``) or of a trained
    ``directory`` (not both), else the shipped one; ``why`` says which and why, e.g.
    ``nhits-normal (shipped)``, ``fallback: chosen``, ``nhits-normal (runs/fc)``, or a
    plug-in's name or import path as given. ``daily``: the N-HiTS's daily context
    ``(period, weight)`` (default: a day of 1,440 minutes, weight 0.25); ``recurrence``: the
    share of its samples that gain a model's recurring peak (default 0.25)."""
    if spec and directory:
        raise ValueError("give a forecaster (a name or an import path) or a trained forecaster directory, not both")
    fc: NHitsForecaster | FallbackForecaster
    if directory:
        from forecasting.io import load_forecaster

        fc = load_forecaster(directory)
        if short_history is not None:
            fc.short_history = short_history
        set_daily(fc, daily)
        set_recurrence(fc, recurrence)
        return fc, f"{fc.name} ({directory})"
    if spec is None or is_builtin(spec):
        fc, why = default_forecaster(spec, short_history)
        set_daily(fc, daily)
        set_recurrence(fc, recurrence)
        return fc, why
    return make_forecaster(spec), spec
