"""Retraining the live forecaster off the control loop (issue 32 item 4).

Every ``every_s`` the loop's :meth:`Retrainer.poll` starts one retrain in a daemon thread
with a CPU budget of one torch thread: it reads every model's stored per-minute arrivals
(:class:`forecasting.store.ArrivalStore`, the contiguous recent part), trains a candidate
N-HiTS without the last ``holdout`` minutes and judges it against the forecaster serving
now on them (:func:`forecasting.retrain.retrain`). The loop's next ``poll`` hands a winning
candidate over, so the swap happens between two ticks on the loop's own thread; it is
saved under ``save_dir`` (a restarted autoscaler loads it) and logged, and every verdict,
won or lost, is in :meth:`status` and the log. Nothing here may stop the autoscaler: a
failed retrain is logged and tried again at the next period. Ray-free.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from autoscaler.driving.history import fill_short_gaps
from forecasting.base import Forecaster
from forecasting.store import HistorySource

if TYPE_CHECKING:
    from autoscaler.driving.loop_config import AutoscalerConfig
    from forecasting.nhits import NHitsForecaster
    from forecasting.train import TrainConfig

log = logging.getLogger("faro_serve.autoscaler")
RETRAINED_DIR = "forecaster-retrained"


def retraining_on(cfg: AutoscalerConfig) -> bool:
    """The one rule for both the loop (retrain) and the deployment (load what was retrained):
    a ``history_dir``, ``retrain_every_h`` > 0, and no forecaster named in the args
    (``forecaster`` or ``forecaster_dir``: the user's choice is kept)."""
    return bool(cfg.history_dir and cfg.retrain_every_h and not cfg.forecaster and not cfg.forecaster_dir)


class ListedSource(HistorySource, Protocol):
    """A history source that lists its models (``forecasting.store.ArrivalStore``)."""

    def models(self) -> list[str]: ...


def recent_history(
    store: HistorySource, models: Sequence[str] | None = None, keep: int | None = None, max_gap_minutes: int = 5
) -> dict[str, np.ndarray]:
    """Each model's (default: every stored model's) most recent ``keep`` (default: all the
    store keeps) stored minutes after its last gap longer than ``max_gap_minutes``, shorter
    gaps interpolated: the contiguous history a forecaster trains on."""
    out = {}
    # without ``models``, a store that lists its own (the retrainer always names them)
    for n in cast(ListedSource, store).models() if models is None else models:
        h = fill_short_gaps(store.load(n, keep or store.keep_minutes), max_gap_minutes)
        if h.size:
            out[n] = h
    return out


class Retrainer:
    """``store``: the arrival store; ``models``: whose history to train on; ``every_s``:
    the period (the first retrain after one period); ``holdout``: minutes held back;
    ``keep``: at most this many recent minutes per model; ``save_dir``: where a swapped-in
    forecaster is saved (None: not saved); ``config``: the candidate's
    :class:`forecasting.train.TrainConfig` (default:
    :func:`forecasting.retrain.candidate_config`, one thread); ``clock``: wall seconds."""

    def __init__(
        self,
        store: HistorySource,
        models: Sequence[str],
        every_s: float,
        holdout: int = 120,
        keep: int = 7 * 1440,
        save_dir: str | Path | None = None,
        config: TrainConfig | None = None,
        clock: Callable[[], float] = time.time,
        max_gap_minutes: int = 5,
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"the retrain period must be > 0 s (got {every_s})")
        self.store, self.models = store, list(models)
        self.every_s, self.holdout, self.keep = float(every_s), int(holdout), int(keep)
        self.save_dir = Path(save_dir).expanduser() if save_dir else None
        self.config, self.clock, self.max_gap = config, clock, max_gap_minutes
        self.next_at = clock() + self.every_s
        self.runs = 0
        self.swaps: list[dict[str, Any]] = []  # {"at", "verdict", "saved_to"}
        self.last: dict[str, Any] | None = None  # the last verdict, or {"error": ...}
        self._thread: threading.Thread | None = None
        self._ready: tuple[Forecaster, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def history(self) -> dict[str, np.ndarray]:
        """Every model's recent stored minutes after its last gap longer than ``max_gap``."""
        return recent_history(self.store, self.models, self.keep, self.max_gap)

    def run_once(self, current: Forecaster) -> tuple[Forecaster | None, dict[str, Any]]:
        """One retrain now, in this thread: (the candidate if it should serve, the verdict)."""
        from forecasting.retrain import candidate_config, retrain

        cfg = self.config or candidate_config(current, threads=1)
        try:
            # the loop's ticks go on forecasting with ``current``: judge a copy of it
            candidate, verdict = retrain(self.history(), copy.deepcopy(current), self.holdout, cfg)
        except Exception as err:
            doc = {"at": self.clock(), "swap": False, "error": f"{type(err).__name__}: {err}"}
            log.warning("forecaster retrain: %s; trying again in %.0f s", doc["error"], self.every_s)
            return None, doc
        doc = {"at": self.clock(), **verdict.as_dict()}
        log.info("forecaster retrain: %s", verdict.reason)
        return (candidate if verdict.swap else None), doc

    def _work(self, current: Forecaster) -> None:
        candidate, doc = self.run_once(current)
        with self._lock:
            self.runs += 1
            self.last = doc
            if candidate is not None:
                self._ready = (candidate, doc)

    def poll(self, current: Forecaster | None) -> Forecaster | None:
        """Once per tick: a candidate to serve from now on (saved, logged), or None; starts a
        retrain in the background when one is due and none runs."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            return self._swap(*ready)
        now = self.clock()
        busy = self._thread is not None and self._thread.is_alive()
        if current is not None and not busy and now >= self.next_at:
            self.next_at = now + self.every_s
            self._thread = threading.Thread(target=self._work, args=(current,), daemon=True, name="faro-retrain")
            self._thread.start()
        return None

    def _swap(self, candidate: Forecaster, doc: dict[str, Any]) -> Forecaster:
        saved = None
        if self.save_dir is not None:
            try:
                from forecasting.io import save_forecaster

                # an N-HiTS: retrain() trains with forecasting.train.train_forecaster
                saved = str(save_forecaster(cast("NHitsForecaster", candidate), self.save_dir / RETRAINED_DIR))
            except Exception as err:  # it serves anyway; a restart goes back to the previous
                log.warning("cannot save the retrained forecaster in %s: %s", self.save_dir, err)
        self.swaps.append({"at": doc["at"], "verdict": doc, "saved_to": saved})
        log.info("forecaster swapped in: %s (saved to %s)", doc.get("reason"), saved)
        return candidate

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a running retrain (tests, shutdown)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "every_s": self.every_s,
                "holdout_minutes": self.holdout,
                "runs": self.runs,
                "running": bool(self._thread and self._thread.is_alive()),
                "next_at": round(self.next_at, 1),
                "last": self.last,
                "swaps": list(self.swaps[-5:]),
            }
