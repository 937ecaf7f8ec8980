"""Saving and loading a trained forecaster as a directory.

The autoscaler and the simulator load the forecaster at start, so the directory must be
self-describing and safe to read: ``meta.json`` (format, version, input size, horizon,
loss, ensemble members, scaling, training series and report) next to each network's weights
in neuralforecast's pickle-free safetensors format (``nhits.safetensors``, then
``nhits-1.safetensors``, ... for an ensemble), and each network's forward pass traced to
TorchScript (``nhits.pt``, ``nhits-1.pt``, ...; :mod:`forecasting.scripted`), which the
autoscaler loads with torch alone. Anything unexpected raises :class:`ForecasterLoadError`
(a ``ValueError``) with one line. Load only forecasters you trained or trust: a TorchScript
file is a program (restricted to TorchScript, but a program).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from .nhits import PREDICTORS, NHitsForecaster
from .quiet import preserved_global_rng, quiet_lightning
from .scripted import SCRIPT_FILE, export

log = logging.getLogger("faro_serve.forecasting")
FORMAT = "faro-serve-forecaster"
VERSION = 1
META_FILE = "meta.json"
WEIGHTS_FILE = "nhits.safetensors"


class ForecasterLoadError(ValueError):
    """A forecaster directory is missing, incomplete or of an unknown format."""


def save_forecaster(forecaster: NHitsForecaster, directory: str | Path) -> Path:
    """Write ``meta.json`` and the weights into ``directory`` (created if needed)."""
    import neuralforecast

    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise ValueError(f"{d}: exists and is not a directory")
    d.mkdir(parents=True, exist_ok=True)
    if forecaster.model is None:
        raise ValueError(
            "this forecaster was loaded without its model (traced forward only); "
            "save the directory it was loaded from instead"
        )
    if any(m is None for m, _ in forecaster.nets):
        raise ValueError(
            "an ensemble member was loaded without its model; save the directory it was loaded from instead"
        )
    with quiet_lightning():
        for i, (model, _) in enumerate(forecaster.nets):
            model.save(str(d / member_file(WEIGHTS_FILE, i)))
            export(model, forecaster.loss, forecaster.input_size, d / member_file(SCRIPT_FILE, i))
    # a larger ensemble saved here before: its further networks go, not to mislead a reader
    for name in (WEIGHTS_FILE, SCRIPT_FILE):
        stem, _, ext = name.partition(".")
        for old in d.glob(f"{stem}-*.{ext}"):
            index = old.name[len(stem) + 1 : -len(ext) - 1]
            if index.isdigit() and int(index) >= forecaster.n_members:
                old.unlink()
    cfg = forecaster.meta.get("config", {})
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "model": "NHITS",
        "predictor": forecaster.name,
        "loss": forecaster.loss,
        "input_size": forecaster.input_size,
        "horizon": forecaster.horizon,
        "members": forecaster.n_members,
        "scaler_type": cfg.get("scaler_type", getattr(forecaster.model.scaler, "scaler_type", None)),
        "units": {"history": "requests per minute", "samples": "requests per second"},
        "train_series": forecaster.meta.get("train_series", []),
        "train_minutes": forecaster.meta.get("train_minutes", {}),
        "config": cfg,
        "training": forecaster.meta.get("training", {}),
        "neuralforecast_version": neuralforecast.__version__,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (d / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return d


def member_file(name: str, i: int) -> str:
    """The file of ensemble member ``i``: the first keeps the single network's name
    (``nhits.pt``), the others are numbered (``nhits-1.pt``)."""
    if i == 0:
        return name
    stem, _, ext = name.partition(".")
    return f"{stem}-{i}.{ext}"


def read_meta(directory: str | Path) -> dict[str, Any]:
    """The validated ``meta.json`` of a forecaster directory."""
    d = Path(directory)
    if d.is_file():
        raise ForecasterLoadError(f"{d}: a file, not a forecaster directory (one that holds meta.json and the network)")
    if not d.is_dir():
        raise ForecasterLoadError(f"{d}: no such forecaster directory")
    path = d / META_FILE
    if not path.is_file():
        raise ForecasterLoadError(
            f"{d}: not a trained forecaster (no {META_FILE}); train one with 'faro-serve forecast train'"
        )
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ForecasterLoadError(f"{path}: unreadable metadata ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ForecasterLoadError(f"{path}: not a {FORMAT} metadata file")
    if meta.get("version") != VERSION:
        raise ForecasterLoadError(
            f"{path}: unsupported forecaster version {meta.get('version')!r} (this faro-serve reads version {VERSION})"
        )
    if meta.get("loss") not in PREDICTORS:
        raise ForecasterLoadError(f"{path}: unknown loss {meta.get('loss')!r}")
    meta.setdefault("members", 1)  # saved before ensembles: one network
    for key in ("input_size", "horizon", "members"):
        if not isinstance(meta.get(key), int) or meta[key] < 1:
            raise ForecasterLoadError(f"{path}: '{key}' must be a positive integer")
    return meta


def load_forecaster(directory: str | Path, script: bool = True) -> NHitsForecaster:
    """Load a forecaster saved by :func:`save_forecaster`, ready to predict (warmed up).
    With ``script`` and a traced forward in the directory (:mod:`forecasting.scripted`), only
    that is loaded, with torch alone: neuralforecast is not imported (about 470 MB less
    resident here); otherwise, or if that file cannot be loaded, the N-HiTS weights."""
    d = Path(directory)
    meta = read_meta(d)
    k = meta["members"]
    scripts = [d / member_file(SCRIPT_FILE, i) for i in range(k)]
    if script and all(p.is_file() for p in scripts):
        try:
            from .scripted import load

            with preserved_global_rng():
                nets = [load(p) for p in scripts]
                fc = NHitsForecaster(
                    None,
                    meta["loss"],
                    _meta_of(meta),
                    script=nets[0],
                    input_size=meta["input_size"],
                    horizon=meta["horizon"],
                    members=nets[1:],
                )
                fc.warm_up()
            return fc
        except Exception as err:  # a corrupt or foreign file: the weights are the source
            log.warning(
                "%s: cannot load the traced forward (%s); loading the weights instead",
                d,
                str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__,
            )
    models = [_load_weights(d, member_file(WEIGHTS_FILE, i), meta) for i in range(k)]
    fc = NHitsForecaster(models[0], meta["loss"], _meta_of(meta), members=models[1:])
    fc.warm_up()
    return fc


def _load_weights(d: Path, name: str, meta: dict[str, Any]) -> Any:
    """One network's N-HiTS weights, checked against ``meta``."""
    weights = d / name
    if not weights.is_file():
        raise ForecasterLoadError(f"{d}: weights file {name} is missing")
    try:
        with quiet_lightning(), preserved_global_rng():
            from neuralforecast.models import NHITS

            model = NHITS.load(str(weights), map_location="cpu")
    except Exception as err:  # corrupt or foreign files: one clear line, not a traceback
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ForecasterLoadError(f"{weights}: cannot load the N-HiTS weights ({msg})") from None
    if int(model.input_size) != meta["input_size"] or int(model.h) != meta["horizon"]:
        raise ForecasterLoadError(
            f"{d}: weights (input {model.input_size}, horizon {model.h}) do not "
            f"match {META_FILE} (input {meta['input_size']}, horizon {meta['horizon']})"
        )
    return model


def _meta_of(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in ("config", "train_series", "train_minutes", "training")}
