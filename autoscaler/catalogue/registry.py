"""Policies by name or import path, for the live autoscaler, the simulator and the command line.

Every policy is built from the same (models, cluster) pair; forecasting policies also
take a forecaster (default: the fallback predictor). Three sources, in this order:

- the built-in policies (``autoscaler.catalogue.builtin``) and those added with :func:`register`;
- installed plug-ins, entry point group ``faro_serve.policies`` (a plug-in that takes a
  built-in's name is ignored with a warning: the built-in wins);
- any import path, ``my_pkg.policies:MyPolicy``: a Policy subclass or a factory
  (``autoscaler.catalogue.plugins``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from autoscaler.catalogue import plugins
from autoscaler.catalogue.builtin import BUILTIN
from autoscaler.contract.policy import Policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.pipelines import PipelineSLO
from forecasting.base import Forecaster

log = logging.getLogger(__name__)

Factory = Callable[..., Policy]


class UnknownPolicy(ValueError):
    """A policy name that is neither known nor an import path."""


@dataclass(frozen=True)
class Entry:
    factory: Factory
    summary: str
    needs_batching: bool
    kind: str  # "built-in" or "registered"


_REGISTRY: dict[str, Entry] = {
    name: Entry(factory, summary, nb, "built-in") for name, factory, summary, nb, _ in BUILTIN
}
_WARNED: set[str] = set()


def register(name: str, factory: Factory, summary: str = "", needs_batching: bool = False) -> None:
    """Make ``factory(models, cluster, forecaster=None)`` available as ``name``; ``summary``
    is the one line ``faro-serve policies`` shows; ``needs_batching``: the policy only runs
    models whose config declares ``batching`` (a profile)."""
    _REGISTRY[name] = Entry(factory, summary, needs_batching, "registered")


def _plugins() -> dict[str, metadata.EntryPoint]:
    """Installed policy plug-ins by name, without those that clash with a known policy."""
    eps = plugins.entry_points(plugins.POLICY_GROUP)
    for name in sorted(set(eps) & set(_REGISTRY)):
        if name not in _WARNED:
            _WARNED.add(name)
            log.warning(
                "policy plug-in %r = %s has the name of a built-in policy; the built-in wins",
                name,
                plugins.entry_source(eps[name]),
            )
    return {n: ep for n, ep in eps.items() if n not in _REGISTRY}


def needs_batching(name: str) -> bool:
    """Whether policy ``name`` runs only models that declare ``batching`` (Sponge); False
    for plug-ins and import paths (not imported to ask: a model they cannot run is theirs
    to report)."""
    return name in _REGISTRY and _REGISTRY[name].needs_batching


def policy_names() -> list[str]:
    """Every policy known by name: built-in, registered and installed plug-ins."""
    return sorted(set(_REGISTRY) | set(_plugins()))


def policy_summaries() -> dict[str, str]:
    """Every policy's one-line description, by name (a plug-in's says where it comes from;
    it is not imported to describe it)."""
    eps = _plugins()
    return {
        n: _REGISTRY[n].summary if n in _REGISTRY else f"plug-in {plugins.entry_source(eps[n])}" for n in policy_names()
    }


def policy_catalog() -> list[dict[str, Any]]:
    """Every policy by name with its kind (built-in, registered, plug-in) and source."""
    eps = _plugins()
    rows = []
    for n in policy_names():
        if n in _REGISTRY:
            e = _REGISTRY[n]
            src = getattr(e.factory, "__module__", None) or ""
            rows.append(
                {"name": n, "kind": e.kind, "source": src, "summary": e.summary, "needs_batching": e.needs_batching}
            )
        else:
            rows.append(
                {
                    "name": n,
                    "kind": "plug-in",
                    "source": plugins.entry_source(eps[n]),
                    "summary": f"plug-in {plugins.entry_source(eps[n])}",
                    "needs_batching": False,
                }
            )
    return rows


def policy_factory(name: str) -> Factory:
    """The factory of a policy name, plug-in or import path; raises ``UnknownPolicy`` or
    ``plugins.PluginError`` (both ``ValueError``s) saying what is wrong. Config validation
    calls it, so a bad import path fails when the config is read, not at the first tick."""
    if name in _REGISTRY:
        return _REGISTRY[name].factory
    eps = _plugins()
    if name in eps:
        what = f"policy plug-in {name!r} = {plugins.entry_source(eps[name])}"
        return plugins.policy_factory(plugins.load_object(eps[name].value, what), what, name)
    if plugins.is_import_path(name):
        what = f"policy {name!r}"
        return plugins.policy_factory(plugins.load_object(name, what), what, name)
    raise UnknownPolicy(
        f"unknown policy {name!r}; choose one of {', '.join(policy_names())}, "
        f"or give an import path (my_pkg.policies:MyPolicy)"
    )


def make_policy(
    name: str,
    models: Sequence[ModelSLO],
    cluster: ClusterSpec,
    forecaster: Forecaster | None = None,
    pipelines: Sequence[PipelineSLO] = (),
) -> Policy:
    """Build the policy called ``name`` (a name or an import path) over ``models`` (stages
    included) and tell it the ``pipelines``; ValueError otherwise."""
    policy = policy_factory(name)(list(models), cluster, forecaster=forecaster)
    if pipelines:
        policy.attach_pipelines(pipelines)
    return policy
