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
