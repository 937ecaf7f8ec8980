"""Keep neuralforecast / Lightning quiet and side-effect free inside the autoscaler.

Lightning prints banners ("GPU available", "Seed set to"), warnings about data loaders and
a progress bar; the autoscaler and the CLI want none of that unless asked. Building or
loading a neuralforecast model also calls ``seed_everything``, which would reseed the
caller's global RNGs (the simulator's); :func:`preserved_global_rng` undoes that.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning", "neuralforecast")

# Trainer settings that turn off Lightning's own output and files (CPU only: section 3.5
# predictions are small MLP evaluations, a GPU buys nothing here).
QUIET_TRAINER_KWARGS = dict(
    accelerator="cpu",
    devices=1,
    enable_progress_bar=False,
    enable_model_summary=False,
    logger=False,
    enable_checkpointing=False,
)


@contextmanager
def quiet_lightning(verbose: bool = False) -> Iterator[None]:
    """Silence Lightning's loggers and Python warnings for the block (unless ``verbose``).

    Levels are set on entry, after the libraries configured their own loggers at import.
    """
    if verbose:
        yield
        return
    try:  # importing Lightning resets its loggers to INFO, so import it before silencing
        import lightning_fabric  # noqa: F401
        import pytorch_lightning  # noqa: F401
    except ImportError:  # pragma: no cover - neuralforecast depends on both
        pass
    saved = {}
    for name in LIGHTNING_LOGGERS:
        log = logging.getLogger(name)
        saved[name] = log.level
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def preserved_global_rng() -> Iterator[None]:
    """Restore Python's, numpy's and torch's global RNG states (and PL_GLOBAL_SEED) on exit."""
    import torch

    py, npy, th = random.getstate(), np.random.get_state(), torch.get_rng_state()
    env = os.environ.get("PL_GLOBAL_SEED")
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(th)
        if env is None:
            os.environ.pop("PL_GLOBAL_SEED", None)
        else:
            os.environ["PL_GLOBAL_SEED"] = env


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Use ``n`` intra-op threads for the block (None: leave as is), then restore."""
    import torch

    if not n:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def default_threads() -> int:
    """Training threads: half the cores, at most 4. The cores are shared with the serving
    replicas (and on this project's 2-core machine with other work); with any contention a
    2-thread OpenMP pool on 2 cores ran 3-9x slower per step than one thread."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))
