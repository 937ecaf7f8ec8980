"""The names faro-serve gives Ray Serve deployments and applications, in one place: the
autoscaler and the tools find models by them."""

METER = "Meter"  # a model application's meter (with data_path: front, also its ingress: the router front)
MODEL = "Model"  # a model application's replicas, the deployment the autoscaler scales
AUTOSCALER = "FaroAutoscaler"  # the autoscaler's deployment
AUTOSCALER_APP = "faro"  # its application, routed at /faro
# Internal deployments (the meters) write no access logs: several calls a second per model
# (``CALL ingest OK``) would bury the user's own requests in Serve's logs.
QUIET = {"enable_access_log": False}
# The network time a request spent before it reached the cluster, in milliseconds, as its
# client declares it (the replay's --network-delay): Sponge's remaining budget starts at the
# SLO minus it. A request without it spent none that the server can know of.
NETWORK_HEADER = "x-faro-network-ms"


METER_SUFFIX = "-faro-meter"


def meter_name(deployment: str) -> str:
    """The meter of a model deployment in its application: faro-serve's own model apps keep
    theirs as ``Meter``; a user's deployment under Faro gets ``<deployment>-faro-meter``."""
    return METER if deployment == MODEL else f"{deployment}{METER_SUFFIX}"


def is_meter(deployment: str) -> bool:
    """Whether a deployment of that name is a faro-serve meter (:func:`meter_name`'s)."""
    return deployment == METER or deployment.endswith(METER_SUFFIX)
