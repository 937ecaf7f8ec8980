"""Autoscaling policies and the Ray-free driver around them (observations, decisions), shared
by the live autoscaler (``faro_serve.serving.autoscaler_deployment``) and the simulator."""

from .catalogue.registry import make_policy, policy_names, register
from .contract.policy import Decision, ModelObservation, ModelPlan, Observation, Policy, grant_in_order

__all__ = [
    "Decision",
    "ModelObservation",
    "ModelPlan",
    "Observation",
    "Policy",
    "grant_in_order",
    "make_policy",
    "policy_names",
    "register",
]
