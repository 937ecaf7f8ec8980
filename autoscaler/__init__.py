"""Autoscaling policies and the Ray-free driver around them (observations, decisions), shared
by the live autoscaler (``faro_serve.serving.autoscaler_deployment``) and the simulator."""

from .policy import Decision, ModelObservation, ModelPlan, Observation, Policy, grant_in_order
from .registry import make_policy, policy_names, register

__all__ = ["Decision", "ModelObservation", "ModelPlan", "Observation", "Policy", "grant_in_order",
           "make_policy", "policy_names", "register"]
