"""``faro-serve plan``: one Faro decision for a cluster described in a YAML/JSON file.

The file holds ``cluster:`` (see :class:`faro_serve.config.ClusterSpec`) and ``models:``,
each model an SLO (:class:`faro_serve.config.ModelSLO`) plus its load for the next window:
``rate`` (requests/s) or ``rates`` (a list of samples, or samples x steps), and optionally
``current_replicas`` (default: min_replicas).
"""

from __future__ import annotations

import json
import math
from typing import Any

LOAD_KEYS = ("rate", "rates", "current_replicas")


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="allocate replicas for a cluster spec file", description=__doc__.split("\n\n", 1)[1]
    )
    p.add_argument("--spec", required=True, help="YAML or JSON file with cluster and models")
    p.add_argument("--json", action="store_true", help="print the allocation as JSON")
    p.set_defaults(func=run)


def parse_plan_spec(data: Any, source: str = ""):
    """Split a plan document into (FaroConfig, forecasts, current replicas).

    Raises :class:`faro_serve.config.ConfigError` naming the model and field at fault.
    """
    from ..config import ConfigError, parse_config
    from ..engine import normalise_rates

    where = f" in {source}" if source else ""
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ConfigError(f"invalid plan spec{where}: expected a mapping with 'cluster' and a list 'models'")
    slos, forecasts, current = [], {}, {}
    for k, m in enumerate(data["models"]):
        if not isinstance(m, dict):
            raise ConfigError(f"invalid plan spec{where}: models.{k} must be a mapping")
        name = m.get("name", f"models.{k}")
        if ("rate" in m) == ("rates" in m):
            raise ConfigError(
                f"invalid plan spec{where}: models.{k} ({name}) needs exactly one "
                f"of 'rate' (requests/s) or 'rates' (samples)"
            )
        try:
            forecasts[name] = normalise_rates(m.get("rate", m.get("rates")), name)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"invalid plan spec{where}: models.{k}: {err}") from None
        cur = m.get("current_replicas")
        if cur is not None:
            if isinstance(cur, bool) or not isinstance(cur, int) or cur < 0:
                raise ConfigError(
                    f"invalid plan spec{where}: models.{k}.current_replicas must be a whole number >= 0 (got {cur!r})"
                )
            current[name] = cur
        slos.append({key: v for key, v in m.items() if key not in LOAD_KEYS})
    cfg = parse_config({**{k: v for k, v in data.items() if k != "models"}, "models": slos}, source)
    return cfg, forecasts, current


def run(args) -> int:
    from ..config import load_document
    from ..engine import plan

    cfg, forecasts, current = parse_plan_spec(load_document(args.spec), args.spec)
    alloc = plan(cfg.models, forecasts, current, cfg.cluster)
    if args.json:
        print(json.dumps(alloc.to_dict(), indent=2))
        return 0
    print_allocation(alloc, cfg.cluster)
    return 0


def print_allocation(alloc, cluster) -> None:
    from rich.table import Table

    from ..console import console

    table = Table(title=f"Faro plan: objective {alloc.objective}")
    for col in ("model", "SLO ms", "rate/s", "proc ms", "replicas", "drop", "pred. ms", "utility"):
        table.add_column(col, justify="left" if col == "model" else "right", no_wrap=True)
    for d in alloc.decisions:
        lat = "inf" if not math.isfinite(d.latency_ms) else f"{d.latency_ms:.0f}"
        table.add_row(
            d.name,
            f"{d.slo_ms:g}",
            f"{d.arrival_rate:.2f}",
            f"{d.processing_ms:.0f}",
            f"{d.current} -> {d.replicas}",
            f"{d.drop_rate:.1%}",
            lat,
            f"{d.utility:.3f}",
        )
    out = console()
    out.print(table)
    cap = f"{cluster.cpus:g}"
    out.print(
        f"objective value {alloc.objective_value:.4f} | CPUs {alloc.cpus_used:g}/{cap} | "
        f"solve {alloc.solve_ms:.1f} ms | groups {alloc.groups}"
        + (f" | {'; '.join(alloc.notes)}" if alloc.notes else "")
    )
