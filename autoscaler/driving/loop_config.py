"""The autoscaler's configuration, Ray-free: the ``args`` of the ``faro`` application.

It lives with the policies it names, so the policy layer never imports the serving layer
(imports run serving -> autoscaler -> engine/forecasting -> config);
``faro_serve.serving.schema`` re-exports it for the Serve applications.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError, model_validator

from autoscaler.catalogue.plugins import PluginError, check_forecaster_spec
from autoscaler.catalogue.registry import UnknownPolicy, policy_factory, policy_names
from autoscaler.driving.forecasters import is_builtin
from autoscaler.policies.common import faro_policy_name
from faro_serve.config import ConfigError, FaroConfig, format_validation_error
from faro_serve.measures import HISTORY_MINUTES
from forecasting.daily import DAY_MINUTES, DEFAULT_WEIGHT
from forecasting.nhits import DEFAULT_SHORT_RULE, SHORT_RULES
from forecasting.recurrence import DEFAULT_SHARE


class AutoscalerConfig(FaroConfig):
    """``args`` of the ``faro`` application: cluster, SLOs, and how to autoscale."""

    policy: str | None = Field(
        None,
        description="policy name, plug-in name or import path (my_pkg.policies:MyPolicy); default faro-<objective>",
    )
    forecaster_dir: str | None = Field(
        None, description="trained forecaster directory; default: the N-HiTS shipped with faro-serve"
    )
    forecaster: str | None = Field(
        None,
        description="'fallback' (the fallback predictor, by "
        "choice), 'shipped' (the N-HiTS shipped with faro-serve, the "
        "default), a forecaster plug-in name or the import path of a "
        "forecaster class or factory (my_pkg.fc:MyForecaster); not "
        "with forecaster_dir",
    )
    history_dir: str | None = Field(
        None,
        description="directory of the durable per-minute "
        "arrival store, restored after a restart (docs/forecasting.md); "
        "default: none (the meters' history only)",
    )
    history_days: float = Field(7.0, gt=0, description="days of arrivals the store keeps per model")
    retrain_every_h: float = Field(
        24.0,
        ge=0,
        description="with history_dir: every so many "
        "hours, retrain N-HiTS off the control loop on the stored "
        "arrivals and swap it in only if it forecasts the held-back "
        "hours better (docs/forecasting.md); 0: never",
    )
    retrain_holdout_h: float = Field(
        2.0,
        gt=0,
        description="the most recent hours a retrain holds back to judge the new forecaster against the current",
    )
    short_history: str = Field(
        DEFAULT_SHORT_RULE,
        description="how N-HiTS forecasts a model with less than its input window: " + ", ".join(SHORT_RULES),
    )
    daily_weight: float = Field(
        DEFAULT_WEIGHT,
        ge=0,
        le=1,
        description="how far N-HiTS's "
        "forecast moves towards yesterday's same minutes scaled to "
        "today's level, for a model with a day of history (needs "
        "history_dir; docs/forecasting.md, 'Daily context'); 0: off",
    )
    daily_period_minutes: int = Field(
        DAY_MINUTES, ge=2, description="the period of the daily context: minutes in a day of the traffic"
    )
    recurrence_share: float = Field(
        DEFAULT_SHARE,
        ge=0,
        le=1,
        description="the share of "
        "N-HiTS's forecast samples raised to a model's recurring "
        "peak where its history shows a cycle (docs/forecasting.md, "
        "'Recurring peaks'); 0: off",
    )
    dashboard_url: str = Field("http://127.0.0.1:8265", description="Ray dashboard (external scaling API)")
    decision_log: str | None = Field(None, description="JSON-lines file of every decision")
    enabled: bool = Field(True, description="false: measure and report, change nothing")
    mode: Literal["control", "shadow"] = Field(
        "control",
        description="control: scale the "
        "models; shadow: plan every tick as in control "
        "and publish what it would set (replicas, drop "
        "rates, predicted latency) beside what runs, "
        "changing nothing (docs/shadow.md)",
    )
    observe: Literal["meters", "prometheus"] = Field(
        "meters",
        description="where the models' "
        "arrivals and latency come from: faro-serve's "
        "meters, or Ray Serve's own metrics in "
        "prometheus_url (deployments that run no "
        "faro-serve code)",
    )
    prometheus_url: str | None = Field(
        None,
        description="the Prometheus that scrapes this Ray "
        "cluster: observe: prometheus reads it, and without "
        "history_dir a new autoscaler's arrival history comes "
        "from Ray Serve's request counters there",
    )

    @model_validator(mode="after")
    def _one_forecaster(self) -> AutoscalerConfig:
        if self.forecaster and self.forecaster_dir:
            raise ValueError("give forecaster (an import path) or forecaster_dir (a trained directory), not both")
        return self

    @model_validator(mode="after")
    def _prometheus_named(self) -> AutoscalerConfig:
        if self.observe == "prometheus" and not self.prometheus_url:
            raise ValueError("observe: prometheus needs prometheus_url (the Prometheus that scrapes this Ray cluster)")
        return self

    @model_validator(mode="after")
    def _known_short_rule(self) -> AutoscalerConfig:
        if self.short_history not in SHORT_RULES:
            raise ValueError(f"short_history {self.short_history!r} is unknown; choose one of {', '.join(SHORT_RULES)}")
        return self

    def policy_name(self) -> str:
        return self.policy or faro_policy_name(self.cluster.objective)

    @property
    def daily(self) -> tuple[int, float]:
        """(period, weight) of the forecaster's daily context."""
        return self.daily_period_minutes, self.daily_weight

    def history_minutes(self) -> int:
        """Minutes of arrival history each model's forecast is given: the meters' 4 hours, or
        a day and an hour with the daily context (joined from the store)."""
        if self.daily_weight <= 0:
            return HISTORY_MINUTES
        return max(HISTORY_MINUTES, self.daily_period_minutes + 60)


def parse_autoscaler_config(data: object, source: str = "faro application args") -> AutoscalerConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration in {source}: expected a mapping with 'cluster' and 'models'")
    try:
        cfg = AutoscalerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None
    if cfg.policy:
        try:
            policy_factory(cfg.policy)
        except UnknownPolicy:
            raise ConfigError(
                f"invalid configuration in {source}: policy {cfg.policy!r} is unknown; "
                f"choose one of {', '.join(policy_names())}, or give an import path "
                f"(my_pkg.policies:MyPolicy)"
            ) from None
        except PluginError as err:
            raise ConfigError(f"invalid configuration in {source}: {err}") from None
    if cfg.forecaster and not is_builtin(cfg.forecaster):
        try:
            check_forecaster_spec(cfg.forecaster)
        except PluginError as err:
            raise ConfigError(f"invalid configuration in {source}: {err}") from None
    return cfg
