"""``faro-split``: Faro-FairSum blind to pipelines (issue 35; docs/pipelines.md).

Every stage of a pipeline is planned and scaled as a separate model with its own target,
the fixed split of the pipeline's SLO (``Stage.slo_ms``; by default the SLO divided equally
along the longest path), and its own forecast. It is the baseline that planning the
pipeline end to end (Faro with pipelines attached) is measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autoscaler.faro.hybrid import FaroPolicy
from faro_serve.pipelines import PipelineSLO

if TYPE_CHECKING:
    from faro_serve.config import ClusterSpec, ModelSLO
    from forecasting.base import Forecaster


class FaroSplitPolicy(FaroPolicy):
    """FaroPolicy whose :meth:`attach_pipelines` only checks the stages are its models."""

    def attach_pipelines(self, pipelines: Sequence[PipelineSLO]) -> None:
        super().attach_pipelines(pipelines)  # the same checks
        self.pipelines = ()


def build(models: Sequence[ModelSLO], cluster: ClusterSpec, forecaster: Forecaster | None = None) -> FaroSplitPolicy:
    return FaroSplitPolicy(models, cluster.model_copy(update={"objective": "fair_sum"}), forecaster, name="faro-split")
