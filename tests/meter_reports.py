"""A complete meter report (``faro_serve.meter_report``) and a fake cluster for the tests of
the autoscaler loop: the loop reads reports strictly, so a fake sends every field, idle
defaults unless set."""

from faro_serve.meter_report import MeterReport, Processing


def meter_report(model: str = "m", **fields) -> dict:
    """The JSON form of an idle model's report, ``fields`` set (``processing`` may give only
    some of its keys)."""
    proc = {"mean_ms": None, "p50_ms": None, "p99_ms": None, "n": 0, **fields.pop("processing", {})}
    base = dict(
        model=model,
        now=0.0,
        arrival_rate=0.0,
        arrivals_per_min=[],
        current_minute_count=0,
        current_minute_elapsed_s=0.0,
        latency_ms=None,
        latency_p50_ms=None,
        latency_mean_ms=None,
        in_flight=0,
        mean_in_flight=0.0,
        queue_length=0,
        arrivals_total=0,
        completed_total=0,
        dropped={},
        drop_rate=0.0,
        replicas=1,
        percentile=99.0,
        setting={},
        waiting=0,
        dispatched=0,
        dispatch_capacity=0,
        replica_cpus=None,
        replica_memory_gb=None,
    )
    return MeterReport(processing=Processing(**proc), **{**base, **fields}).wire()


class FakeCluster:
    """The loop's cluster adapter: replicas start at once, each front answers the report
    in ``fronts`` (default: idle) and takes what it is told into it."""

    def __init__(self, running, fronts=None):
        self.running = dict(running)
        self.fronts = fronts if fronts is not None else {n: meter_report(n, replicas=r) for n, r in running.items()}
        self.scaled, self.controls = [], []

    def capacity(self):
        return 2.0, None

    def running_replicas(self):
        return dict(self.running)

    def meter_reports(self, names):
        return {n: self.fronts[n] for n in names}

    def scale(self, name, replicas):
        self.scaled.append((name, replicas))
        self.running[name] = replicas

    def control(self, name, setting, percentile):
        self.controls.append((name, setting.drop_rate, setting.replicas))
        self.fronts[name].update(
            drop_rate=setting.drop_rate, replicas=setting.replicas, percentile=percentile, setting=setting.to_json()
        )
