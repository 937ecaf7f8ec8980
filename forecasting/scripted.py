"""The trained N-HiTS's forward pass saved as TorchScript, so forecasting needs torch alone.

The autoscaler only runs the network forward (``NHitsForecaster.predict_params``): per-window
scaling, the N-HiTS stacks, the Normal head's scale-decoupling. neuralforecast, which
defines the network, also imports PyTorch Lightning, Ray Tune and pandas: 980 MB resident
against torch's 513 MB on this machine (issue 36: an autoscaler of 1,000 models peaked at
1,072 MB, the loop's own share 77 MB). ``save_forecaster`` therefore writes this traced
module beside the safetensors weights (the weights stay the source for retraining and for
neuralforecast's own predict), and ``load_forecaster`` loads it with ``torch.jit.load``
when it is there. Tracing records the same operations the Python path runs; the tests
compare the two. neuralforecast's N-HiTS takes its batch size from the input in Python
(``len(...)`` in reshapes), which a trace fixes: the module is traced for :data:`CHUNK` windows
and :func:`run` calls it on chunks of that many, the last one padded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch

SCRIPT_FILE = "nhits.pt"
CHUNK = 64  # windows per call of the traced module


def _forward(model: Any, loss: str) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(windows, masks) ``[B, L]`` of counts per minute -> (mean, std) ``[B, h]``: what
    ``NHitsForecaster.predict_params`` computes. A plain function, not a module holding the
    network: tracing a Lightning module walks properties that need a Trainer; traced as a
    function, the network's weights become the graph's constants."""
    import torch

    m = model.eval()

    def forward(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, k = x.unsqueeze(-1), mask.unsqueeze(-1)  # [B, L, 1]
        z = m.scaler.transform(x=y, mask=k)  # per-window scaling
        loc, scale = m.scaler.x_shift, m.scaler.x_scale  # [B, 1, 1]
        out = m(
            {"insample_y": z, "insample_mask": k, "futr_exog": None, "hist_exog": None, "stat_exog": None}
        )  # [B, h, n_outputs]
        if loss == "normal":
            mu, sigma = m.loss.scale_decouple(output=m.loss.domain_map(out), loc=loc, scale=scale)
            return mu[..., 0], sigma[..., 0]
        mu = m.scaler.inverse_transform(z=m.loss.domain_map(out), x_shift=loc, x_scale=scale)[..., 0]
        return mu, torch.zeros_like(mu)

    return forward


def export(model: Any, loss: str, input_size: int, path: str | Path) -> Path:
    """Trace ``model``'s forward for ``loss`` (``"normal"`` or ``"mae"``) on :data:`CHUNK`
    windows and save it (a copy of the model is traced; ``model`` is left as it was)."""
    import copy

    import torch

    net = copy.deepcopy(model)
    for q in net.parameters():
        q.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(CHUNK, input_size, generator=gen) * 100 + 1
    mask = torch.ones_like(x)
    other = torch.rand(CHUNK, input_size, generator=gen) * 1000
    with torch.no_grad():
        traced = torch.jit.trace(  # type: ignore[no-untyped-call]  # not annotated
            _forward(net, loss), (x, mask), check_inputs=[(other, mask)]
        )
    traced.save(str(path))
    return Path(path)


def load(path: str | Path) -> torch.jit.ScriptModule:
    """The traced module, on the CPU: call it through :func:`run`."""
    import torch

    module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]  # not annotated
    return cast("torch.jit.ScriptModule", module)


def run(module: torch.jit.ScriptModule, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) ``[B, h]`` for ``[B, L]`` tensors, in chunks of :data:`CHUNK` windows."""
    import torch

    b = x.shape[0]
    pad = -b % CHUNK
    if pad:
        x = torch.cat([x, torch.ones(pad, x.shape[1], dtype=x.dtype)])
        mask = torch.cat([mask, torch.ones(pad, mask.shape[1], dtype=mask.dtype)])
    parts = [module(x[i : i + CHUNK], mask[i : i + CHUNK]) for i in range(0, x.shape[0], CHUNK)]
    return torch.cat([m for m, _ in parts])[:b], torch.cat([s for _, s in parts])[:b]
