"""Validation of the per-model histories every forecaster takes.

Histories are per-minute request counts, oldest first; bad values (NaN, negative counts,
2-D arrays) would silently poison a forecast, so they are rejected with a one-line
:class:`ValueError` naming the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def check_history(history: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{name: 1-D float array}``; raises ``ValueError`` on NaN, inf or negative counts."""
    if not isinstance(history, Mapping):
        raise ValueError(f"history must map model names to count arrays, got {type(history).__name__}")
    out: dict[str, np.ndarray] = {}
    for name, values in history.items():
        try:
            h = np.asarray(values, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"history of {name!r}: counts must be numbers") from None
        if h.ndim != 1:
            raise ValueError(f"history of {name!r}: expected a 1-D series of per-minute counts, got shape {h.shape}")
        if not np.all(np.isfinite(h)):
            raise ValueError(f"history of {name!r}: counts must be finite (found NaN or inf)")
        if (h < 0).any():
            raise ValueError(f"history of {name!r}: counts must be >= 0")
        out[str(name)] = h
    return out


def history_frame(hist: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """neuralforecast's long format: columns ``unique_id``, ``ds`` (minute index), ``y``."""
    import pandas as pd

    names = list(hist)
    return pd.DataFrame(
        {
            "unique_id": np.repeat(names, [len(hist[n]) for n in names]),
            "ds": np.concatenate([np.arange(len(hist[n])) for n in names]),
            "y": np.concatenate([np.asarray(hist[n], dtype=np.float32) for n in names]),
        }
    )
