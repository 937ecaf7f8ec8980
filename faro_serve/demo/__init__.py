"""``faro-serve demo`` (``make run``): start the deployment, replay a real trace slice against
it with a live table, write a report, and shut everything down.

* :mod:`.deployment` reads ``serve_config.yaml``, starts a private local Ray and
  ``serve run <config>`` as child process groups, waits until every model answers, and stops
  them again (also on Ctrl-C);
* :mod:`.live` sends the schedule with the replay's sender and shows the live table;
* :mod:`.report` writes ``report.md`` and ``timeline.png`` from the replay's records.

The bundled slice (``faro_serve/data/demo_trace.csv``, provenance in ``data/README.md``)
is six real minutes of four jobs of ``faro10_days1-10.csv`` (day 4, sample 0, minutes
68-73), replayed with :data:`DEMO_MAP` and :data:`DEMO_RATE_SCALE` unless told otherwise.
"""

from __future__ import annotations

from pathlib import Path

DEMO_TRACE = Path(__file__).resolve().parent.parent / "data" / "demo_trace.csv"
# job -> model of the bundled slice: the small jobs go to the CPU-bound ResNets, the job with
# the tenfold jump and the rising one to the synthetic models.
DEMO_MAP = "job2=resnet18,job8=resnet34,job7=synth-a,job1=synth-b"
# Counts x 0.3: about 13 requests/s at the peak, which a 2-core machine serves with the
# default config's 8 replicas (see data/README.md).
DEMO_RATE_SCALE = 0.3
