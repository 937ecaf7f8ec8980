"""faro-serve: SLO-aware autoscaling for multi-model Ray Serve clusters."""
__version__ = "0.1.0"
