"""Policies with the mistakes a user's policy makes (tests/test_cli_mistakes.py): each one
is the user's bug, which faro-serve reports in one line naming the policy."""

from __future__ import annotations

import os

from autoscaler import Decision, Policy


class Boom(Policy):
    """Raises from the second minute on."""

    def decide(self, obs):
        if obs.now >= 60:
            return {}["x"]
        return None


class ReturnsDict(Policy):
    def decide(self, obs):
        return {m: 2 for m in obs.models}


class Negative(Policy):
    def decide(self, obs):
        return Decision({m: -3 for m in obs.models})


class TooMany(Policy):
    def decide(self, obs):
        return Decision({m: 100 for m in obs.models})


class Dies(Policy):
    """Ends its process, as a policy that calls exit (or the OOM killer) would."""

    def decide(self, obs):
        os._exit(3)


class RenamesModels:
    """A forecaster that answers under names of its own (its models' order lost)."""

    input_size, horizon, name = 15, 7, "renames"

    def predict(self, history, n_samples=100, seed=None):
        import numpy as np

        from forecasting.base import Forecast

        names = [f"m{i}" for i, _ in enumerate(history)]
        return Forecast(names, np.ones((len(names), n_samples, self.horizon)), {n: self.name for n in names})
