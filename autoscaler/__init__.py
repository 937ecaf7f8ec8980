"""Autoscaling policies (Ray-free) and the live autoscaler that drives them."""

from .policy import Decision, ModelObservation, Observation, Policy, grant_in_order
from .registry import make_policy, policy_names, register

__all__ = ["Decision", "ModelObservation", "Observation", "Policy", "grant_in_order",
           "make_policy", "policy_names", "register"]
