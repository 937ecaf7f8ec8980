"""What runs a policy: the driver both the live autoscaler and the simulator call around
``policy.decide`` (``driver``), the live control loop and its configuration (``loop``,
``loop_config``), and what the loop keeps beside the policy: the arrival history, the
retrainer, the forecaster it loads, pipelines' meters, failed ticks, decision reasons, and
Ray Serve's own metrics for shadow mode."""
