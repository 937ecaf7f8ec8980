"""Which forecaster a policy plans with, in one place for every driver: the live autoscaler
(``forecaster`` / ``forecaster_dir`` in the ``faro`` application's args), ``simulate``,
``suite``, ``validate`` and ``compare``.

- a trained directory (``forecaster_dir``): that N-HiTS;
- ``fallback``: the fallback predictor, by choice (labelled ``fallback: chosen``);
- ``shipped``, or nothing at all: the N-HiTS shipped in the package
  (``forecasting.shipped``); with nothing given, one that cannot be loaded is logged and the
  fallback predictor serves, labelled ``fallback: forecaster failed to load: <why>``;
- any other name: a forecaster plug-in or an import path (``autoscaler.plugins``).

Ray-free, like every module of the policy layer.
"""

from __future__ import annotations

from forecasting.daily import DailyContext, check_daily
from forecasting.recurrence import check_share
from forecasting.shipped import BUILTIN_NAMES, FALLBACK, SHIPPED, default_forecaster

from .plugins import make_forecaster

__all__ = ["BUILTIN_NAMES", "FALLBACK", "SHIPPED", "choose_forecaster", "is_builtin", "policy_forecasts",
           "set_daily", "set_recurrence"]

FORECASTING = ("faro-", "mark")  # the built-in policies that plan with a forecaster


def policy_forecasts(policy: str) -> bool:
    """Faro's and MArk's policies plan with the forecaster; a plug-in or import-path policy
    is given it too (one that does not forecast ignores it); the other built-ins need none,
    so none is loaded for them."""
    if policy.startswith(FORECASTING[0]) or policy == FORECASTING[1]:
        return True
    from .builtin import BUILTIN

    return policy not in {row[0] for row in BUILTIN}


def is_builtin(spec: str | None) -> bool:
    """``shipped`` or ``fallback``: a name faro-serve resolves itself, not a plug-in."""
    return spec in BUILTIN_NAMES


def set_daily(forecaster, daily: tuple[int, float] | None) -> None:
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


def set_recurrence(forecaster, share: float | None) -> None:
    """Give an N-HiTS forecaster its recurring peaks' ``share`` (forecasting/recurrence.py);
    a plug-in forecaster is the user's and keeps what it does."""
    if share is None:
        return
    check_share(share)
    if hasattr(forecaster, "recurrence_share"):
        forecaster.recurrence_share = float(share)


def choose_forecaster(spec: str | None = None, directory: str | None = None,
                      short_history: str | None = None, daily: tuple[int, float] | None = None,
                      recurrence: float | None = None):
    """``(forecaster, why)``: the forecaster of a name / import path (``spec``) or of a trained
    ``directory`` (not both), else the shipped one; ``why`` says which and why, e.g.
    ``nhits-normal (shipped)``, ``fallback: chosen``, ``nhits-normal (runs/fc)``, or a
    plug-in's name or import path as given. ``daily``: the N-HiTS's daily context
    ``(period, weight)`` (default: a day of 1,440 minutes, weight 0.25); ``recurrence``: the
    share of its samples that gain a model's recurring peak (default 0.25)."""
    if spec and directory:
        raise ValueError("give a forecaster (a name or an import path) or a trained forecaster "
                         "directory, not both")
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
