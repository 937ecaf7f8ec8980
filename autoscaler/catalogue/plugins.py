"""Policies and forecasters from outside faro-serve: by import path or by entry point.

An import path follows Ray's ``import_path``: ``my_pkg.policies:MyPolicy`` (or
``my_pkg.policies.MyPolicy``). An installed distribution offers one by name in the entry
point groups ``faro_serve.policies`` and ``faro_serve.forecasters`` (entry name = the
name users write, value = the import path). Nothing is imported until it is used, so a
broken plug-in fails where it is named, with a message that says which and why, and never
at the import of faro-serve. Ray-free, like every module of the policy layer.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import numpy as np

from autoscaler.contract.policy import Policy
from faro_serve.config import ClusterSpec, ModelSLO
from forecasting.base import Forecast, Forecaster

POLICY_GROUP = "faro_serve.policies"
FORECASTER_GROUP = "faro_serve.forecasters"


class PluginError(ValueError):
    """An import path or a plug-in that cannot give what it is named for."""


def is_import_path(spec: str) -> bool:
    """Whether ``spec`` reads as an import path rather than a bare name (a built-in policy
    name has neither ':' nor '.')."""
    return ":" in spec or "." in spec


def load_object(path: str, what: str) -> Any:
    """The object at ``module:attr`` (or ``module.attr``); ``what`` starts each error."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    parts = module.split(".") + attr.split(".")
    if not module or not attr or not all(p.isidentifier() for p in parts):
        raise PluginError(f"{what}: {path!r} is not an import path (module:attribute, e.g. my_pkg.policies:MyPolicy)")
    try:
        obj = importlib.import_module(module)
    except ImportError as err:
        raise PluginError(f"{what}: module {module!r} does not import ({err})") from None
    except Exception as err:  # the module itself raises while it is imported
        raise PluginError(f"{what}: importing module {module!r} failed ({type(err).__name__}: {err})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{what}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    """The installed plug-ins of ``group`` by name (the first found on sys.path wins),
    read from the distributions' metadata without importing them."""
    out: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=group):
        out.setdefault(ep.name, ep)
    return out


def entry_source(ep: metadata.EntryPoint) -> str:
    """``value (distribution version)``: where a plug-in comes from, for messages."""
    dist = getattr(ep, "dist", None)
    return f"{ep.value} ({dist.name} {dist.version})" if dist is not None else ep.value


# -- policies -----------------------------------------------------------------------------
Factory = Callable[..., Policy]


def _accepts(func: Callable[..., object], param: str) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == param or p.kind is p.VAR_KEYWORD for p in params)


def policy_factory(obj: Any, what: str, name: str) -> Factory:
    """``factory(models, cluster, forecaster=None)`` for a :class:`Policy` subclass (built
    as ``cls(models, cluster)``, with ``forecaster=`` when its ``__init__`` takes it) or for
    a factory function; checks what can be checked before anything is built. A policy that
    keeps the default name gets ``name``, so its saved state and log say which it is."""
    if inspect.isclass(obj):
        if not issubclass(obj, Policy):
            raise PluginError(
                f"{what}: {obj.__module__}.{obj.__qualname__} is not a Policy "
                f"subclass (autoscaler.contract.policy.Policy) or a factory"
            )
        if inspect.isabstract(obj):
            raise PluginError(
                f"{what}: {obj.__qualname__} does not implement {', '.join(sorted(obj.__abstractmethods__))}"
            )
        takes_forecaster = _accepts(obj, "forecaster")
        cls: Callable[..., Policy] = obj  # a subclass: its __init__ may take forecaster=

        def make(models: Sequence[ModelSLO], cluster: ClusterSpec, forecaster: Forecaster | None = None) -> Policy:
            return cls(models, cluster, forecaster=forecaster) if takes_forecaster else cls(models, cluster)
    elif callable(obj):
        try:
            inspect.signature(obj).bind(None, None, forecaster=None)
        except TypeError:
            raise PluginError(
                f"{what}: {getattr(obj, '__qualname__', obj)!r} cannot be called as "
                f"factory(models, cluster, forecaster=None)"
            ) from None
        except ValueError:  # no signature to check (a builtin): the call will tell
            pass
        make = obj
    else:
        raise PluginError(f"{what}: a {type(obj).__name__} object is not a Policy subclass or a factory")

    def build(models: Sequence[ModelSLO], cluster: ClusterSpec, forecaster: Forecaster | None = None) -> Policy:
        pol = make(models, cluster, forecaster=forecaster)
        if not isinstance(pol, Policy):
            raise PluginError(
                f"{what}: the factory returned a {type(pol).__name__}, not a Policy (autoscaler.contract.policy.Policy)"
            )
        if pol.name == Policy.name:
            pol.name = name
        return pol

    return build


# -- forecasters --------------------------------------------------------------------------
def _forecaster_object(spec: str) -> tuple[Any, str]:
    """(object, what) for a forecaster plug-in name or import path."""
    eps = entry_points(FORECASTER_GROUP)
    if spec in eps:
        what = f"forecaster plug-in {spec!r} = {entry_source(eps[spec])}"
        return load_object(eps[spec].value, what), what
    what = f"forecaster {spec!r}"
    if not is_import_path(spec):
        names = ", ".join(sorted(eps)) or "none installed"
        raise PluginError(
            f"{what}: not an import path (module:attribute) and no forecaster plug-in of that name (plug-ins: {names})"
        )
    return load_object(spec, what), what


def check_forecaster_spec(spec: str) -> None:
    """Imports a forecaster's class or factory and checks that it is one, without building
    it (building may load weights): what config validation does."""
    obj, what = _forecaster_object(spec)
    if not callable(obj) and not hasattr(obj, "predict"):
        raise PluginError(f"{what}: a {type(obj).__name__} object is not a forecaster class, factory or instance")


def make_forecaster(spec: str) -> Forecaster:
    """The forecaster of ``spec`` (plug-in name or import path of a class or factory called
    with no arguments, or of a ready instance), checked against forecasting.base.Forecaster."""
    obj, what = _forecaster_object(spec)
    fc: Forecaster  # once check_forecaster has passed it
    if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "predict")):
        try:
            fc = obj()
        except TypeError as err:
            raise PluginError(f"{what}: cannot be built with no arguments ({err})") from None
    else:
        fc = obj
    check_forecaster(fc, what)
    return fc


def check_forecaster(fc: Any, what: str) -> None:
    """``fc`` has the interface of forecasting.base.Forecaster and answers a tiny forecast
    with a Forecast of the right shape: a broken one fails at start, not as silent fallback
    forecasts in every plan (the policies fall back when a forecast raises)."""
    kind = type(fc).__name__
    missing = [a for a in ("input_size", "horizon", "predict") if not hasattr(fc, a)]
    if missing:
        raise PluginError(
            f"{what}: {kind} is not a forecaster: no {', '.join(missing)} (see forecasting.base.Forecaster)"
        )
    for a in ("input_size", "horizon"):
        v = getattr(fc, a)
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise PluginError(f"{what}: {kind}.{a} must be a positive integer (got {v!r})")
    asked = ["check-a", "check-b"]  # two models: one dropped or renamed is caught here
    try:
        out = fc.predict({n: np.full(int(fc.input_size), 60.0) for n in asked}, n_samples=2, seed=0)
    except Exception as err:
        raise PluginError(
            f"{what}: {kind}.predict(history, n_samples=2, seed=0) failed ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(out, Forecast) or out.samples.shape != (2, 2, int(fc.horizon)):
        got = type(out).__name__ if not isinstance(out, Forecast) else f"samples {out.samples.shape}"
        raise PluginError(
            f"{what}: {kind}.predict must return a forecasting.base.Forecast with "
            f"samples (models, n_samples, horizon) = (2, 2, {fc.horizon}) for two "
            f"models; got {got}"
        )
    if list(out.names) != asked:
        raise PluginError(
            f"{what}: {kind}.predict must forecast the models it is given, in "
            f"their order ({asked}); got {list(out.names)}"
        )


def forecaster_plugins() -> dict[str, str]:
    """Installed forecaster plug-ins: name -> where from (nothing imported)."""
    return {n: entry_source(ep) for n, ep in sorted(entry_points(FORECASTER_GROUP).items())}
