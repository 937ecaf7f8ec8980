"""The built-in policies, in one catalog: (name, factory, summary, needs_batching, forecasts)
rows. ``forecasts``: the policy plans with a forecaster, so the drivers load one for it
(``autoscaler.driving.forecasters.policy_forecasts``).

This module imports the policy modules and lists what each declares in its ``POLICIES``;
the registry reads the catalog. So imports run one way (registry -> catalog -> policies)
and no policy module imports the registry to register itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autoscaler.contract.policy import Policy
from autoscaler.faro import split as faro_split
from autoscaler.faro.hybrid import FaroPolicy, OraclePolicy
from autoscaler.policies import baselines, seeds, sponge
from autoscaler.policies.common import faro_policy_name
from faro_serve.config import ClusterSpec, ModelSLO
from forecasting.base import Forecaster

#: (name, factory(models, cluster, forecaster=None), summary, needs_batching, forecasts)
Row = tuple[str, Callable[..., Policy], str, bool, bool]

FARO_OBJECTIVES = {faro_policy_name(o): o for o in ("sum", "fair", "fair_sum", "penalty_sum", "penalty_fair_sum")}


def _faro(objective: str, policy_name: str) -> Callable[..., FaroPolicy]:
    def build(models: Sequence[ModelSLO], cluster: ClusterSpec, forecaster: Forecaster | None = None) -> FaroPolicy:
        return FaroPolicy(models, cluster.model_copy(update={"objective": objective}), forecaster, name=policy_name)

    return build


_FARO = (
    "Faro: a forecast-driven plan every 5 min, +1 replica after 30 s over the SLO (in a "
    "full cluster: one moved from the model that loses least), the surge response; maximises "
)
_OBJECTIVE_SUMMARY = {
    "sum": "the total utility",
    "fair": "the worst model's utility (max-min fairness)",
    "fair_sum": "the total utility with a fairness term (the default)",
    "penalty_sum": "the total utility minus drop penalties (drops requests when overloaded)",
    "penalty_fair_sum": "the fair total utility minus drop penalties",
}

FARO: tuple[Row, ...] = tuple(
    (name, _faro(obj, name), _FARO + _OBJECTIVE_SUMMARY[obj], False, True) for name, obj in FARO_OBJECTIVES.items()
) + (
    (
        "oracle",
        lambda models, cluster, forecaster=None: OraclePolicy(models, cluster),
        "Faro-FairSum planning with the true future arrivals (simulator only): the bound",
        False,
        False,
    ),
    (
        "faro-split",
        faro_split.build,
        "Faro-FairSum blind to pipelines: each stage a model "
        "with a fixed share of its pipeline's SLO (equal split by default): the baseline",
        False,
        True,
    ),
)

#: every built-in policy; the registry keeps them in this order
BUILTIN: tuple[Row, ...] = FARO + baselines.POLICIES + seeds.POLICIES + sponge.POLICIES
