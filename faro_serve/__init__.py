"""faro-serve: SLO-aware autoscaling for multi-model Ray Serve clusters.

Your own deployment under Faro (docs/own-models.md)::

    from faro_serve import SLO, Cluster, scaled, run
    slo = SLO(name="clf", slo_ms=300, cpus=0.5)
    run({"clf": scaled(Classifier, slo).bind()}, [slo], Cluster(cpus=4))
"""

__version__ = "0.1.0"

from .config import ClusterSpec as Cluster  # noqa: E402
from .config import ModelSLO as SLO  # noqa: E402
from .pipelines import PipelineSLO as Pipeline  # noqa: E402
from .pipelines import Stage  # noqa: E402

__all__ = ["SLO", "Cluster", "Pipeline", "Stage", "scaled", "run", "Dropped", "__version__"]
_SERVING = {"scaled", "run", "Dropped", "ScaledDeployment"}


def __getattr__(name: str):
    """The Ray-side names import Ray only when used: ``faro_serve.config`` and the engine
    stay importable without it."""
    if name in _SERVING:
        from .serving import user

        return getattr(user, name)
    raise AttributeError(f"module 'faro_serve' has no attribute {name!r}")
