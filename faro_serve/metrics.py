"""Evaluation metrics of the Faro paper (section 6), shared by simulated and live runs.

Input is one record per request: the model (an index into ``names``), the arrival time in
seconds, the end-to-end latency in seconds and whether the request was dropped (a dropped
request's latency is treated as infinite, whatever the record says). Everything is pure
numpy, so the simulator and a live load generator feed the same functions.

* :func:`minute_table` groups requests by (job, arrival minute): counts, drops, requests
  over the SLO, the SLO-percentile latency with drops as infinity (the paper's metric) and
  over served requests only (the input of effective utility, eq. 2).
* :func:`summarize` turns a table into the paper's numbers: per job-minute utility
  ``min(SLO / p99, 1)`` (alpha 1; 1 for a minute without requests), cluster utility per
  minute (sum over jobs), lost cluster utility (jobs minus cluster utility, averaged over
  minutes), job and cluster SLO violation rates, effective utility with the step penalty
  ``phi`` (Table 5) and the spread of per-job lost utility (fairness, Figure 12).

Tables of disjoint (job, minute) cells can be merged (:meth:`MinuteTable.merge`), which
lets the simulator summarise minutes as they finish instead of keeping every request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine.utility import phi, utility_relaxed


@dataclass
class MinuteTable:
    """Per (job, minute) aggregates; arrays have shape ``(jobs, minutes)``."""

    names: list[str]
    requests: np.ndarray  # int64
    dropped: np.ndarray  # int64
    over_slo: np.ndarray  # int64, served requests slower than the SLO
    p_all: np.ndarray  # SLO-percentile latency (s), drops = inf; NaN where no requests
    p_served: np.ndarray  # the same over served requests only; NaN where none were served

    @classmethod
    def empty(cls, names: list[str], minutes: int) -> "MinuteTable":
        shape = (len(names), minutes)
        z = np.zeros(shape, dtype=np.int64)
        return cls(list(names), z, z.copy(), z.copy(), np.full(shape, np.nan), np.full(shape, np.nan))

    @property
    def minutes(self) -> int:
        return int(self.requests.shape[1])

    def merge(self, other: "MinuteTable") -> "MinuteTable":
        """Combine two tables whose non-empty cells do not overlap (e.g. successive minutes)."""
        if other.names != self.names or other.requests.shape != self.requests.shape:
            raise ValueError("can only merge tables of the same jobs and minutes")
        both = (self.requests > 0) & (other.requests > 0)
        if both.any():
            raise ValueError("tables overlap: a (job, minute) cell appears in both")
        take = other.requests > 0
        return MinuteTable(
            self.names,
            self.requests + other.requests,
            self.dropped + other.dropped,
            self.over_slo + other.over_slo,
            np.where(take, other.p_all, self.p_all),
            np.where(take, other.p_served, self.p_served),
        )


def _sort_cells(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Order sorting by (key, value); values are >= 0 and may be +inf."""
    if keys.size and np.all(values >= 0):
        # One float sort: key + a monotone map of [0, inf] into [0, 0.5] (ties closer than
        # about 1e-9 s may swap, which moves a quantile by less than that).
        with np.errstate(invalid="ignore"):
            squash = np.where(np.isinf(values), 0.5, 0.5 * values / (1.0 + values))
        return np.argsort(keys + squash)
    return np.lexsort((values, keys))


def _group_quantile(k: np.ndarray, v: np.ndarray, n_keys: int, q: float) -> np.ndarray:
    """Per-key ``q`` quantile (numpy's 'linear' rule) of values already sorted by (key, value).

    +inf is a legal value: numpy yields NaN when it interpolates towards +inf at a fractional
    position of 0; here a position on a finite value is that value and any interpolation
    towards +inf is +inf.
    """
    out = np.full(n_keys, np.nan)
    if k.size == 0:
        return out
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[starts, k.size])
    h = (counts - 1) * q
    lo = np.floor(h).astype(np.int64)
    frac = h - lo
    a = v[starts + lo]
    b = v[starts + np.minimum(lo + 1, counts - 1)]
    with np.errstate(invalid="ignore"):
        mid = np.where(np.isinf(b), np.inf, a + (b - a) * frac)
    out[k[starts]] = np.where(frac > 0, mid, a)
    return out


def minute_table(
    names: list[str],
    model: np.ndarray,
    arrival_s: np.ndarray,
    latency_s: np.ndarray,
    dropped: np.ndarray,
    slo_s,
    minutes: int | None = None,
    percentile=99.0,
) -> MinuteTable:
    """Aggregate request records into a :class:`MinuteTable` (minute = floor(arrival / 60)).

    ``slo_s`` and ``percentile`` are scalars or one value per job. Requests arriving at or
    after ``minutes`` minutes are ignored (default: as many minutes as the records span).
    """
    model = np.asarray(model, dtype=np.int64)
    arrival_s = np.asarray(arrival_s, dtype=float)
    dropped = np.asarray(dropped, dtype=bool)
    lat = np.where(dropped, np.inf, np.asarray(latency_s, dtype=float))
    if not (model.shape == arrival_s.shape == lat.shape == dropped.shape):
        raise ValueError("request records need equally long model, arrival, latency and dropped arrays")
    n_jobs = len(names)
    if model.size and (model.min() < 0 or model.max() >= n_jobs):
        raise ValueError(f"model indices must lie in 0..{n_jobs - 1}")
    if np.isnan(lat).any():
        raise ValueError("a served request has no latency (NaN); mark it dropped or give its latency")
    minute = np.floor(arrival_s / 60.0).astype(np.int64)
    if minutes is None:
        minutes = int(minute.max()) + 1 if minute.size else 0
    keep = (minute >= 0) & (minute < minutes)
    model, minute, lat, dropped = model[keep], minute[keep], lat[keep], dropped[keep]
    slo = np.broadcast_to(np.asarray(slo_s, dtype=float), (n_jobs,))
    pct = np.broadcast_to(np.asarray(percentile, dtype=float), (n_jobs,))
    cell = model * minutes + minute
    size = n_jobs * minutes
    tab = MinuteTable.empty(names, minutes)
    tab.requests = np.bincount(cell, minlength=size).reshape(n_jobs, minutes)
    tab.dropped = np.bincount(cell, weights=dropped, minlength=size).astype(np.int64).reshape(n_jobs, minutes)
    over = (~dropped) & (lat > slo[model])
    tab.over_slo = np.bincount(cell, weights=over, minlength=size).astype(np.int64).reshape(n_jobs, minutes)
    order = _sort_cells(cell, lat)
    cell_s, lat_s, drop_s, job_s = cell[order], lat[order], dropped[order], model[order]
    for q in np.unique(pct):  # usually one percentile for all jobs
        sel = pct[job_s] == q
        p_all = _group_quantile(cell_s[sel], lat_s[sel], size, q / 100.0).reshape(n_jobs, minutes)
        served = sel & ~drop_s  # a subsequence of a sorted sequence stays sorted
        p_srv = _group_quantile(cell_s[served], lat_s[served], size, q / 100.0).reshape(n_jobs, minutes)
        rows = pct == q
        tab.p_all[rows] = p_all[rows]
        tab.p_served[rows] = p_srv[rows]
    return tab


def utility_from_latency(p_lat: np.ndarray, slo_s, alpha: float = 1.0) -> np.ndarray:
    """The paper's relaxed utility (``engine.utility.utility_relaxed``) per cell, a row of
    ``slo_s`` per model; 1 where NaN (a minute without requests)."""
    p = np.asarray(p_lat, dtype=float)
    slo = np.asarray(slo_s, dtype=float)
    if slo.ndim == 1 and p.ndim == 2:
        slo = slo[:, None]
    return np.where(np.isnan(p), 1.0, utility_relaxed(p, slo, alpha))


@dataclass
class Summary:
    """The paper's numbers for one run (section 6); per-job arrays follow ``names``."""

    names: list[str]
    job_lost_utility: np.ndarray  # mean over minutes of 1 - U
    job_slo_violation_rate: np.ndarray  # (over SLO + dropped) / requests; 0 without requests
    job_requests: np.ndarray
    job_dropped: np.ndarray
    cluster_utility: np.ndarray  # per minute, sum over jobs of U
    effective_cluster_utility: np.ndarray  # per minute, sum over jobs of phi(d) * U(served)
    lost_cluster_utility: float
    lost_effective_utility: float
    cluster_slo_violation_rate: float
    fairness: dict[str, float]  # min, q25, median, q75, max of job_lost_utility

    def to_dict(self, per_job: bool = True) -> dict:
        out = {
            "lost_cluster_utility": round(self.lost_cluster_utility, 6),
            "lost_effective_utility": round(self.lost_effective_utility, 6),
            "cluster_slo_violation_rate": round(self.cluster_slo_violation_rate, 6),
            "fairness": {k: round(v, 6) for k, v in self.fairness.items()},
        }
        if per_job:
            out["jobs"] = {
                n: {
                    "requests": int(self.job_requests[i]),
                    "dropped": int(self.job_dropped[i]),
                    "slo_violation_rate": round(float(self.job_slo_violation_rate[i]), 6),
                    "lost_utility": round(float(self.job_lost_utility[i]), 6),
                }
                for i, n in enumerate(self.names)
            }
        return out


def summarize(table: MinuteTable, slo_s, alpha: float = 1.0) -> Summary:
    """Utility, lost utility, SLO violation rates, effective utility and fairness of a run."""
    n_jobs = len(table.names)
    slo = np.broadcast_to(np.asarray(slo_s, dtype=float), (n_jobs,))
    u = utility_from_latency(table.p_all, slo, alpha)
    u_served = utility_from_latency(table.p_served, slo, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        drop_rate = np.where(table.requests > 0, table.dropped / np.maximum(table.requests, 1), 0.0)
    # A minute where everything was dropped has no served latency: U(served) is moot, EU = phi(1) = 0.
    eu = phi(drop_rate, relaxed=False) * np.where(
        (table.requests > 0) & (table.requests == table.dropped), 0.0, u_served
    )
    minutes = max(table.minutes, 1)
    job_lost = (1.0 - u).sum(axis=1) / minutes
    req = table.requests.sum(axis=1)
    bad = table.over_slo.sum(axis=1) + table.dropped.sum(axis=1)
    viol = np.where(req > 0, bad / np.maximum(req, 1), 0.0)
    cu = u.sum(axis=0)
    ecu = eu.sum(axis=0)
    qs = np.quantile(job_lost, [0.0, 0.25, 0.5, 0.75, 1.0]) if n_jobs else np.zeros(5)
    return Summary(
        names=list(table.names),
        job_lost_utility=job_lost,
        job_slo_violation_rate=viol,
        job_requests=req,
        job_dropped=table.dropped.sum(axis=1),
        cluster_utility=cu,
        effective_cluster_utility=ecu,
        lost_cluster_utility=float(n_jobs - cu.mean()) if table.minutes else 0.0,
        lost_effective_utility=float(n_jobs - ecu.mean()) if table.minutes else 0.0,
        cluster_slo_violation_rate=float(viol.mean()) if n_jobs else 0.0,
        fairness=dict(zip(("min", "q25", "median", "q75", "max"), map(float, qs))),
    )


def summarize_records(
    names, model, arrival_s, latency_s, dropped, slo_s, minutes=None, percentile=99.0, alpha: float = 1.0
) -> Summary:
    """:func:`minute_table` then :func:`summarize`, for a complete set of records."""
    return summarize(
        minute_table(names, model, arrival_s, latency_s, dropped, slo_s, minutes, percentile), slo_s, alpha
    )
