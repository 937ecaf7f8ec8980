"""Policies by name, for the live autoscaler, the simulator and the command line.

Every policy is built from the same (models, cluster) pair; forecasting policies also
take a forecaster (default: the fallback predictor). Other modules add their policies
with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from faro_serve.config import ClusterSpec, ModelSLO

from .common import faro_policy_name
from .faro import FaroPolicy, OraclePolicy
from .policy import Policy

FARO_OBJECTIVES = {faro_policy_name(o): o for o in ("sum", "fair", "fair_sum", "penalty_sum",
                                                    "penalty_fair_sum")}

Factory = Callable[..., Policy]
_REGISTRY: dict[str, Factory] = {}
_SUMMARY: dict[str, str] = {}
_NEEDS_BATCHING: set[str] = set()


def register(name: str, factory: Factory, summary: str = "", needs_batching: bool = False) -> None:
    """Make ``factory(models, cluster, forecaster=None)`` available as ``name``; ``summary``
    is the one line ``faro-serve policies`` shows; ``needs_batching``: the policy only runs
    models whose config declares ``batching`` (a profile)."""
    _REGISTRY[name] = factory
    _SUMMARY[name] = summary
    if needs_batching:
        _NEEDS_BATCHING.add(name)


def needs_batching(name: str) -> bool:
    """Whether policy ``name`` runs only models that declare ``batching`` (Sponge)."""
    _load_plugins()
    return name in _NEEDS_BATCHING


def _faro(objective: str, policy_name: str) -> Factory:
    def build(models, cluster: ClusterSpec, forecaster=None):
        return FaroPolicy(models, cluster.model_copy(update={"objective": objective}),
                          forecaster, name=policy_name)
    return build


_FARO = ("Faro: a forecast-driven plan every 5 min, +1 replica after 30 s over the SLO, the "
         "surge response; maximises ")
_OBJECTIVE_SUMMARY = {
    "sum": "the total utility",
    "fair": "the worst model's utility (max-min fairness)",
    "fair_sum": "the total utility with a fairness term (the default)",
    "penalty_sum": "the total utility minus drop penalties (drops requests when overloaded)",
    "penalty_fair_sum": "the fair total utility minus drop penalties",
}
for _name, _obj in FARO_OBJECTIVES.items():
    register(_name, _faro(_obj, _name), _FARO + _OBJECTIVE_SUMMARY[_obj])
register("oracle", lambda models, cluster, forecaster=None: OraclePolicy(models, cluster),
         "Faro-FairSum planning with the true future arrivals (simulator only): the bound")


def policy_names() -> list[str]:
    _load_plugins()
    return sorted(_REGISTRY)


def policy_summaries() -> dict[str, str]:
    """Every policy's one-line description, by name."""
    _load_plugins()
    return {n: _SUMMARY[n] for n in sorted(_REGISTRY)}


def make_policy(name: str, models: Sequence[ModelSLO], cluster: ClusterSpec,
                forecaster=None) -> Policy:
    """Build the policy called ``name``; ValueError lists the known names otherwise."""
    _load_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](list(models), cluster, forecaster=forecaster)


# Modules that register further policies when imported (baselines, seed systems).
PLUGINS: list[str] = ["autoscaler.baselines", "autoscaler.seeds", "autoscaler.sponge"]


def _load_plugins() -> None:
    import importlib

    for mod in PLUGINS:
        importlib.import_module(mod)
