"""One constant per measured quantity, shared by the live data path and the simulator.

The reactive policies compare what the live meters measure with what the simulator's
queues measure (matched validation, docs/validation.md), so a window that differs between
the two makes them disagree silently. Each period or window is defined here once; the
serving layer (``serving/stats.py``, ``direct.py``, ``proxy_queue.py``, ``front.py``) and the
simulator (``sim/runner.py``) import it. Config layer: nothing of the project is imported.
"""

LOOK_BACK_S = 30.0
"""The look-back of the SLO-percentile latency, the processing time and the mean batch
(paper section 4.4: the reactive trigger reads the latency over the last 30 s)."""

ARRIVAL_RATE_S = 10.0
"""The arrival rate a snapshot reports: requests/s over this many whole seconds, one
autoscaler tick at the default ``reactive_interval_s``; the simulator keeps this window at
any tick (``sim/rates.py``)."""

REPORT_S = 1.0
"""How often the proxy's router and each model replica report to the model's meter
(direct data path, paper section 5)."""

REPORT_STALE_S = 10 * REPORT_S
"""A router's or replica's last report older than this no longer counts (its reporter is
gone: a replica stopped, the proxy restarted)."""

QUEUED_STALE_S = 5.0
"""A request queued in the proxy that Ray has not asked about for this long was given up
(cancelled by its client, failed with its replica): it no longer counts as waiting."""

NETWORK_S = 3.0
"""The clients' declared network time behind a queued request's budget: the median over
the requests of the last this-many seconds (Sponge's bandwidth changes over seconds)."""

REPLICA_POLL_S = 0.1
"""How often a queue that waits for a free replica looks again to see a new replica (a new
replica shows up in the router, not in a completion)."""

HISTORY_MINUTES = 240
"""Per-minute arrival counts a meter keeps: the forecaster's input, 4 hours."""
