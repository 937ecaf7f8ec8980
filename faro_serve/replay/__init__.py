"""Live trace replay against a running faro-serve deployment (paper section 6).

``loadgen`` draws the open-loop Poisson schedule (pure), ``client`` sends it over HTTP
(aiohttp, asyncio), ``report`` runs the records through ``faro_serve.metrics``.
"""

from .loadgen import Schedule, build_schedule, check_url, parse_map, select_trace

__all__ = ["Schedule", "build_schedule", "check_url", "parse_map", "select_trace"]
