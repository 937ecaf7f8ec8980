"""A policy and a forecaster written as a user would, outside faro-serve: nothing here is
registered anywhere; faro-serve finds them by import path
(``policy: tests.user_plugins.my_policies:MyPolicy``) or through an entry point.

``MyPolicy`` counts its decisions (``state_fields``, so a restarted autoscaler carries on
counting) and sets every model to a replica count that follows the counter, so where its
decisions land (the simulator's targets, a live cluster's replicas) shows that it ran and
with which count. ``MyForecaster`` forecasts a constant rate and names itself in the
forecast, so a plan shows that it was used."""

from __future__ import annotations

import numpy as np

from autoscaler import Decision, Observation, Policy
from forecasting.base import Forecast

PERIOD = 6  # decisions per step of the target


def target(decisions: int) -> int:
    """The replicas every model gets after ``decisions`` decisions: 1, 2, 3, 1, ... each
    held for PERIOD decisions."""
    return 1 + (decisions // PERIOD) % 3


class MyPolicy(Policy):
    name = "my-policy"
    state_fields = ("decisions",)

    def __init__(self, models, cluster):
        super().__init__(models, cluster)
        self.decisions = 0

    def decide(self, obs: Observation) -> Decision | None:
        self.decisions += 1
        n = target(self.decisions)
        return Decision({m: n for m in obs.models}, kind="my-policy", info={"decisions": self.decisions})


def make_my_policy(models, cluster, forecaster=None) -> MyPolicy:
    """The same policy through a factory function."""
    return MyPolicy(models, cluster)


def not_a_policy(models, cluster, forecaster=None):
    """A factory that returns something else: faro-serve must say so."""
    return {"replicas": 3}


class MyForecaster:
    """Every model at RATE requests/s over the horizon, every sample the same."""

    name = "my-forecaster"
    RATE = 4.0

    def __init__(self, input_size: int = 15, horizon: int = 7):
        self.input_size = input_size
        self.horizon = horizon

    def predict(self, history, n_samples: int = 100, seed: int | None = None) -> Forecast:
        names = list(history)
        return Forecast(names, np.full((len(names), n_samples, self.horizon), self.RATE), {n: self.name for n in names})


def shipped_nhits():
    """The shipped N-HiTS by a factory of the user's: a forecaster that runs torch."""
    from forecasting.shipped import load_shipped

    return load_shipped()


class BrokenForecaster(MyForecaster):
    """A forecaster with a bug: its forecast raises."""

    def predict(self, history, n_samples: int = 100, seed: int | None = None) -> Forecast:
        raise KeyError("rate")


class NoHorizon:
    """Has predict but no input_size/horizon: not a forecaster."""

    def predict(self, history, n_samples=100, seed=None):
        return None


class BatchesAndDrops(Policy):
    """A user's policy over batching models (issue 47's live test): the model named
    ``batcher`` gets batches of at most 4, any model whose name starts with ``drop`` half
    of its requests dropped; replicas stay where they are."""

    name = "batches-and-drops"

    def decide(self, obs: Observation) -> Decision | None:
        d = Decision({}, kind="batches-and-drops")
        for n in obs.models:
            if n == "batcher":
                d.set(n, batch_size=4)
            if n.startswith("drop"):
                d.set(n, drop_rate=0.5)
        return d
