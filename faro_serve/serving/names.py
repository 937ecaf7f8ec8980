"""The names faro-serve gives Ray Serve deployments and applications, in one place: the
autoscaler and the tools find models by them."""

FRONT = "Front"  # a model application's router front (direct path: its meter)
MODEL = "Model"  # a model application's replicas, the deployment the autoscaler scales
AUTOSCALER = "FaroAutoscaler"  # the autoscaler's deployment
AUTOSCALER_APP = "faro"  # its application, routed at /faro
