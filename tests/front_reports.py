"""A complete meter report (``faro_serve.front_report``) for the tests' fake clusters: the
autoscaler reads reports strictly, so a fake sends every field, idle defaults unless set."""

from faro_serve.front_report import FrontReport, Processing


def front_report(model: str = "m", **fields) -> dict:
    """The JSON form of an idle model's report, ``fields`` set (``processing`` may give only
    some of its keys)."""
    proc = {"mean_ms": None, "p50_ms": None, "p99_ms": None, "n": 0, **fields.pop("processing", {})}
    base = dict(model=model, now=0.0, arrival_rate=0.0, arrivals_per_min=[], current_minute_count=0,
                current_minute_elapsed_s=0.0, latency_ms=None, latency_p50_ms=None,
                latency_mean_ms=None, in_flight=0, mean_in_flight=0.0, queue_length=0,
                arrivals_total=0, completed_total=0, dropped={}, drop_rate=0.0, replicas=1,
                percentile=99.0, setting={}, waiting=0, dispatched=0, dispatch_capacity=0, replica_cpus=None,
                replica_memory_gb=None)
    return FrontReport(processing=Processing(**proc), **{**base, **fields}).wire()
