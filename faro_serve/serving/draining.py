"""Drain faro-serve's models before Serve stops them (issue 50): what was admitted is
answered, what comes now is refused with a reason.

Ray Serve's own shutdown (``serve run``'s Ctrl-C, ``serve shutdown``) deletes the
applications and kills its HTTP proxies at once: a request the proxy holds at that moment is
disconnected with no answer, however gracefully the replicas finish it (Ray's
``graceful_shutdown_timeout_s`` covers the replicas, not the proxy). So before Serve is told
to stop, this asks every faro-serve model's meter (``Front`` or ``<deployment>-faro-meter``)
to drain: each replica learns it from its meter's next answer (about a second), answers every
new HTTP request ``503 shutting_down`` with ``Retry-After``, and reports how many admitted
requests it has not answered yet. The drain ends when, for every model, every reporting
replica refuses new requests, none is busy and the proxies' queues are empty, or at the
timeout. ``faro-serve run`` calls it on SIGINT/SIGTERM, then stops Serve and Ray;
``faro-serve drain`` runs it alone (e.g. before ``serve shutdown`` in a pre-stop hook).

Requests between a model's own deployments (a pipeline's handle calls) are not refused:
an admitted request is seen through. Deployments that are not faro-serve's (no meter) are
Ray's to stop as it does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .names import is_meter


def is_drained(state: dict) -> bool:
    """A model is drained when every replica that reports refuses new requests and nothing
    admitted is unanswered or queued (:meth:`MeterControl.drain_state`)."""
    return state["draining"] and state["told"] >= state["replicas"] and state["busy"] == 0 and state["queued"] == 0


@dataclass
class DrainResult:
    seconds: float
    states: dict[str, dict]  # "<app>/<meter>" -> its last drain state
    errors: dict[str, str]  # "<app>/<meter>" -> why it could not be asked

    @property
    def drained(self) -> bool:
        return not self.errors and all(is_drained(s) for s in self.states.values())

    def lines(self) -> list[str]:
        out = []
        for key, s in sorted(self.states.items()):
            mark = "drained" if is_drained(s) else "NOT drained"
            out.append(
                f"{s['model']} ({key}): {mark}: {s['told']}/{s['replicas']} replicas refuse "
                f"new requests, {s['busy']} admitted unanswered, {s['queued']} queued"
            )
        out += [f"{key}: could not be asked to drain: {err}" for key, err in sorted(self.errors.items())]
        return out


def meters() -> list[tuple[str, str]]:
    """(application, deployment) of every faro-serve meter running in Serve now."""
    from ray import serve

    return sorted(
        (app, dep) for app, status in serve.status().applications.items() for dep in status.deployments if is_meter(dep)
    )


def drain(timeout_s: float = 30.0, poll_s: float = 0.5, say: Callable[[str], None] = lambda _: None) -> DrainResult:
    """Drain every faro-serve model of the connected Ray cluster (module docstring)."""
    from ray import serve

    t0 = time.monotonic()
    handles, states, errors = {}, {}, {}
    for app, dep in meters():
        key = f"{app}/{dep}"
        handles[key] = serve.get_deployment_handle(dep, app_name=app)
    pending = {k: h.drain.remote() for k, h in handles.items()}
    for key, resp in pending.items():
        try:
            states[key] = resp.result(timeout_s=10)
        except Exception as err:  # a meter that cannot answer cannot drain its model
            errors[key] = f"{type(err).__name__}: {err}"
            handles.pop(key)
    say(f"draining {len(handles)} model(s): new requests get 503 shutting_down")
    while time.monotonic() - t0 < timeout_s:
        if all(is_drained(states[k]) for k in handles):
            break
        time.sleep(poll_s)
        for key, h in handles.items():
            try:
                states[key] = h.drain_state.remote().result(timeout_s=10)
            except Exception as err:  # keep its last state; say so if it lasts
                errors[key] = f"{type(err).__name__}: {err}"
            else:
                errors.pop(key, None)
    return DrainResult(time.monotonic() - t0, states, errors)
