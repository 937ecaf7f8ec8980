"""A Ray Serve cluster's history as faro-serve keeps it (issue 48): per deployment its
minutes (requests, healthy replicas, processing-time histograms) and per application its
end-to-end latency histogram, as ``forecasting.rayserve`` reads them from Prometheus; the
export ``whatif --save`` writes and ``whatif --export`` reads (:meth:`ServeHistory.save`,
:meth:`ServeHistory.load`); and the arithmetic on it (bucket quantiles, the service time
behind Ray's processing time). No network here."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

EXPORT_VERSION = 1


class ServeHistoryError(ValueError):
    """A Ray Serve history that cannot be read or used (the text says why)."""


@dataclass
class DeploymentHistory:
    """One deployment's recorded minutes (``ServeHistory.start`` onwards)."""

    application: str
    deployment: str
    arrivals: list[float]  # requests per minute (gaps filled, zeros before it appeared)
    replicas: list[float]  # healthy replicas at each minute's end (NaN: not scraped)
    processing_le: list[float] = field(default_factory=list)  # bucket edges (ms)
    processing_counts: list[float] = field(default_factory=list)  # cumulative, over the range
    processing_mean_ms: float | None = None
    config: dict[str, Any] = field(default_factory=dict)  # Serve's deployment_config (serve_configs)
    # the processing histogram per step (the end-to-end latency's steps): cumulative counts
    # and the summed milliseconds of each step, for :meth:`quiet_processing`
    processing_step_s: float = 60.0
    processing_steps: list[list[float]] = field(default_factory=list)
    processing_step_ms: list[float] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.application}/{self.deployment}"

    def processing_quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) of the processing time (ms), linear inside a bucket."""
        return bucket_quantile(self.processing_le, self.processing_counts, q)

    def service_time_ms(self) -> float | None:
        """The mean service time behind the processing times (:func:`service_time_ms`) from
        the per-step histograms, each step's replicas its minutes' mean; None without them."""
        rows = np.asarray(self.processing_steps, float)
        if rows.ndim != 2 or not rows.size or len(self.processing_step_ms) != rows.shape[0]:
            return None
        k = max(1, int(round(self.processing_step_s / 60.0)))
        reps = np.asarray(self.replicas, float)
        n = rows.shape[0]
        per = []
        for j in range(n):
            lo = max(0, reps.size - k * (n - j))
            r = reps[lo : lo + k]
            per.append(float(np.nanmean(r)) if np.isfinite(r).any() else 1.0)
        return service_time_ms(rows[:, -1], self.processing_step_ms, per, self.processing_step_s)

    def quiet_processing(self, share: float = 0.25) -> tuple[list[float], float | None]:
        """(cumulative bucket counts, mean ms) of the processing time over the steps with the
        fewest requests per replica: the ``share`` of the steps that served any, at least one.

        Ray times a request from when a replica admits it (up to ``max_ongoing_requests`` at
        once), so where the user's code serves one at a time the time of a busy step includes
        the wait for it; a quiet step's is the service time the simulator wants. Without the
        steps (an older export), the whole range's."""
        rows = np.asarray(self.processing_steps, float)
        if rows.ndim != 2 or not rows.size or len(self.processing_step_ms) != rows.shape[0]:
            return list(self.processing_counts), self.processing_mean_ms
        k = max(1, int(round(self.processing_step_s / 60.0)))
        n = rows[:, -1]
        arr = np.asarray(self.arrivals, float)
        reps = np.asarray(self.replicas, float)
        load = np.full(n.size, np.inf)
        for j in range(n.size):  # step j: the k minutes ending at the range's end - k (n - 1 - j)
            lo = max(0, arr.size - k * (n.size - j))
            r = reps[lo : lo + k]
            mean_r = float(np.nanmean(r)) if np.isfinite(r).any() else 1.0
            if n[j] > 0:
                load[j] = arr[lo : lo + k].sum() / max(mean_r, 1.0)
        served = np.flatnonzero(n > 0)
        if not served.size:
            return list(self.processing_counts), self.processing_mean_ms
        pick = served[np.argsort(load[served], kind="stable")][: max(1, math.ceil(share * served.size))]
        ms = np.asarray(self.processing_step_ms, float)[pick].sum()
        total = rows[pick].sum(axis=0)
        return total.tolist(), (float(ms / total[-1]) if total[-1] > 0 else self.processing_mean_ms)


@dataclass
class AppLatency:
    """An application's end-to-end latency at the proxy: cumulative bucket counts per step."""

    le: list[float]
    step_s: float
    counts: list[list[float]]  # steps x buckets (cumulative per step, ``le`` order)

    def over(self, slo_ms: float, first_step: int = 0, last_step: int | None = None) -> tuple[float, float]:
        """(requests, requests slower than ``slo_ms``) over the steps given (linear inside
        the bucket that holds ``slo_ms``)."""
        rows = np.asarray(self.counts, float)[first_step:last_step]
        if not rows.size:
            return 0.0, 0.0
        tot = np.nansum(rows, axis=0)
        n = float(tot[-1])
        return n, max(0.0, n - cumulative_at(self.le, tot, slo_ms))


@dataclass
class ServeHistory:
    """Every deployment's minutes from ``start`` (epoch s of the first minute's start)."""

    start: float
    minutes: int
    deployments: dict[str, DeploymentHistory]
    latency: dict[str, AppLatency] = field(default_factory=dict)  # by application
    notes: list[str] = field(default_factory=list)
    source: str = ""

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        doc = {
            "version": EXPORT_VERSION,
            "source": self.source,
            "start": self.start,
            "minutes": self.minutes,
            "notes": self.notes,
            "deployments": {k: asdict(d) for k, d in self.deployments.items()},
            "latency": {k: asdict(a) for k, a in self.latency.items()},
        }
        p.write_text(json.dumps(_nan_to_none(doc)))
        return p

    @classmethod
    def load(cls, path: str | Path) -> "ServeHistory":
        p = Path(path)
        try:
            doc = json.loads(p.read_text())
        except OSError as err:
            raise ServeHistoryError(f"{p}: cannot read the export ({err.strerror or err})") from None
        except ValueError as err:
            raise ServeHistoryError(f"{p}: not a faro-serve export (not JSON: {err})") from None
        if not isinstance(doc, dict) or doc.get("version") != EXPORT_VERSION:
            raise ServeHistoryError(
                f"{p}: not a faro-serve export of version {EXPORT_VERSION} (whatif --save writes one)"
            )
        try:
            deps = {
                k: DeploymentHistory(**{**d, "replicas": [math.nan if v is None else v for v in d["replicas"]]})
                for k, d in doc["deployments"].items()
            }
            lat = {k: AppLatency(**{**a, "le": _edges(a["le"])}) for k, a in doc.get("latency", {}).items()}
            for d in deps.values():
                d.processing_le = _edges(d.processing_le)
            out = cls(
                float(doc["start"]),
                int(doc["minutes"]),
                deps,
                lat,
                list(doc.get("notes", [])),
                str(doc.get("source", p)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ServeHistoryError(f"{p}: a malformed export ({type(err).__name__}: {err})") from None
        for d in out.deployments.values():
            if len(d.arrivals) != out.minutes or len(d.replicas) != out.minutes:
                raise ServeHistoryError(
                    f"{p}: deployment {d.key} has {len(d.arrivals)} minutes, the export {out.minutes}"
                )
        return out

    def select(self, names: list[str] | None) -> "ServeHistory":
        """Only the deployments named (``app/deployment`` or a deployment name that is unique);
        an unknown name raises, listing what there is."""
        if not names:
            return self
        keep = {}
        for n in names:
            hits = [k for k, d in self.deployments.items() if n in (k, d.deployment)]
            if len(hits) != 1:
                what = "matches several deployments" if hits else "is not a deployment of this history"
                raise ServeHistoryError(f"{n!r} {what}; it has {', '.join(sorted(self.deployments)) or 'none'}")
            keep[hits[0]] = self.deployments[hits[0]]
        apps = {d.application for d in keep.values()}
        return ServeHistory(
            self.start,
            self.minutes,
            keep,
            {a: v for a, v in self.latency.items() if a in apps},
            self.notes,
            self.source,
        )


def service_time_ms(
    counts: npt.ArrayLike, sums_ms: npt.ArrayLike, replicas: npt.ArrayLike, step_s: float = 60.0
) -> float | None:
    """The mean service time behind the processing times Ray recorded, per step: ``counts``
    requests completed, ``sums_ms`` their summed processing time, ``replicas`` serving.

    Ray times a request from when a replica admits it, and a replica admits up to
    ``max_ongoing_requests`` at once, so where the user's code serves one at a time the time
    is the replica's sojourn ``T``: service ``S`` plus the wait inside it. Taking the replica
    as the simulator does (one at a time, Poisson arrivals, service about constant: M/D/1,
    Pollaczek-Khinchine) ``T = S + lam S^2 / (2 (1 - lam S))`` at ``lam`` requests per ms
    per replica, solved for ``S`` in each step; the median over the steps, weighted by
    requests. ``None`` where nothing completed."""
    n = np.asarray(counts, float)
    tot = np.asarray(sums_ms, float)
    reps = np.maximum(np.nan_to_num(np.asarray(replicas, float), nan=1.0), 1.0)
    ok = (n > 0) & np.isfinite(tot) & (tot > 0)
    if not ok.any():
        return None
    t = tot[ok] / n[ok]
    lam = n[ok] / (step_s * 1e3 * reps[ok])
    b = 2.0 + 2.0 * t * lam
    x = (b - np.sqrt(np.maximum(b * b - 8.0 * lam * t, 0.0))) / (2.0 * lam)  # the root below T
    order = np.argsort(x)
    w = np.cumsum(n[ok][order])
    return float(x[order][int(np.searchsorted(w, w[-1] / 2.0))])


def bucket_quantile(le: Sequence[float], counts: npt.ArrayLike, q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram (``le`` ascending, ``+Inf`` last)."""
    c = np.asarray(counts, float)
    if not c.size or not c[-1] > 0:
        return None
    want = q * c[-1]
    i = int(np.searchsorted(c, want))
    i = min(i, c.size - 1)
    hi = le[i]
    lo = 0.0 if i == 0 else le[i - 1]
    if not math.isfinite(hi):
        return float(lo)
    below = 0.0 if i == 0 else c[i - 1]
    inside = c[i] - below
    return float(lo + (hi - lo) * ((want - below) / inside if inside > 0 else 1.0))


def cumulative_at(le: npt.ArrayLike, counts: npt.ArrayLike, x: float) -> float:
    """Requests at or under ``x`` ms in a cumulative histogram, linear inside a bucket."""
    c = np.asarray(counts, float)
    edges = np.concatenate([[0.0], np.asarray(le, float)])
    cum = np.concatenate([[0.0], c])
    i = int(np.searchsorted(edges, x, side="right"))
    if i >= edges.size:
        return float(cum[-1])
    lo, hi = edges[i - 1], edges[i]
    if not math.isfinite(hi):
        return float(cum[i - 1])
    return float(cum[i - 1] + (cum[i] - cum[i - 1]) * (x - lo) / (hi - lo))


def attach_configs(hist: ServeHistory, configs: dict[str, dict[str, Any]]) -> None:
    for key, d in hist.deployments.items():
        if key in configs:
            d.config = configs[key]
        else:
            hist.notes.append(f"{key}: not running now, so its config is unknown (fixed at its recorded replicas)")


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def _edges(le: Iterable[float | None]) -> list[float]:
    """Histogram edges as saved (JSON has no infinity: :func:`_nan_to_none` wrote the
    ``+Inf`` bucket's edge as null) back to numbers."""
    return [math.inf if x is None else float(x) for x in le]
