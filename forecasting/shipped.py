"""The forecaster that ships with faro-serve, and which forecaster serves by default.

A global N-HiTS with a Gaussian head, an ensemble of four networks of other seeds, trained
on both shared trace families (the Faro 10-job workload, days 1-8, every sample; 12 Azure
functions, days 8-11) by ``bench/train_shipped_forecaster.py`` (``make forecaster``), lives
in the package as ``faro_serve/data/forecaster/`` (``meta.json``, each network's weights and
traced forward). The live autoscaler, the
simulator, ``suite``, ``validate`` and ``compare`` plan with it unless told otherwise:

- ``forecaster: fallback`` (``--forecaster fallback``): the fallback predictor, by choice;
- ``forecaster: shipped``: the shipped N-HiTS, and an error if it cannot be loaded;
- nothing: the shipped N-HiTS, or, if it cannot be loaded (e.g. neuralforecast does not
  import), the fallback predictor labelled ``fallback: forecaster failed to load: <why>``.

Every model's forecast carries its predictor's label (``Forecast.predictor``), which the
status shows: ``nhits-normal``, ``fallback: chosen``, ``fallback: no history``, ...
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from .base import FallbackForecaster

if TYPE_CHECKING:
    from .nhits import NHitsForecaster

log = logging.getLogger(__name__)

SHIPPED = "shipped"  # the forecaster name of the packaged N-HiTS
FALLBACK = "fallback"  # the explicit opt-out: the fallback predictor
BUILTIN_NAMES = (SHIPPED, FALLBACK)


def shipped_dir() -> Path:
    """Where the packaged forecaster lives (``faro_serve/data/forecaster``), found without
    importing faro_serve (forecasting is a layer below it)."""
    spec = importlib.util.find_spec("faro_serve")
    if spec is None or not spec.submodule_search_locations:
        return Path("faro_serve") / "data" / "forecaster"
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "forecaster"


def load_shipped(short_history: str | None = None) -> NHitsForecaster:
    """The shipped N-HiTS, loaded through :func:`forecasting.io.load_forecaster`; raises
    (``ForecasterLoadError``, ``ImportError``, ...) when it cannot be loaded."""
    from .io import load_forecaster

    fc = load_forecaster(shipped_dir())
    if short_history is not None:
        fc.short_history = short_history
    return fc


def fallback(reason: str) -> FallbackForecaster:
    """The fallback predictor, labelled ``fallback: <reason>`` in every forecast."""
    return FallbackForecaster(reason=reason)


def default_forecaster(
    spec: str | None = None, short_history: str | None = None
) -> tuple[NHitsForecaster | FallbackForecaster, str]:
    """``(forecaster, why)`` for a built-in forecaster name or none (``spec`` None):
    ``shipped`` / none -> the shipped N-HiTS; ``fallback`` -> the fallback predictor
    (``fallback: chosen``). With no name, a shipped forecaster that fails to load is
    logged and replaced by the fallback predictor, its reason in the label; a
    ``shipped`` that fails to load raises."""
    if spec not in (None, *BUILTIN_NAMES):
        raise ValueError(f"not a built-in forecaster: {spec!r} (expected one of {', '.join(BUILTIN_NAMES)})")
    if spec == FALLBACK:
        return fallback("chosen"), "fallback: chosen"
    try:
        fc = load_shipped(short_history)
    except Exception as err:  # neuralforecast or torch missing or broken, files damaged
        if spec == SHIPPED:
            raise
        msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
        why = f"forecaster failed to load: {type(err).__name__}" + (f": {msg}" if msg else "")
        log.warning(
            "the shipped forecaster (%s) cannot be loaded (%s); the fallback predictor serves every model",
            shipped_dir(),
            why,
        )
        return fallback(why), f"fallback: {why}"
    return fc, f"{fc.name} (shipped)"
