"""What a model replica tells its meter, once a second (paper section 5: the router's
measurements, here taken where the model runs): its events (processing times, drops,
failures) and what it runs; the meter's answer carries the drop rate in force and what
the autoscaler set. Shared by faro-serve's own model replicas (``direct.DirectModel``) and
by a user's deployment under Faro (``user.py``), so both report the same way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ray import serve

from ..measures import REPORT_S
from .messages import Event, MeterAnswer, ReplicaReport, decode
from .proxy_queue import MAX_EVENTS

log = logging.getLogger("faro_serve.serving")


class ReplicaReporter:
    """Events kept until the meter takes them (at most :data:`MAX_EVENTS`, the oldest go
    first while the meter is away). ``fields()`` adds what the replica runs to each report
    (``batch_size``, ``threads``, ``variant``); ``on_answer`` gets every answer.

    It also keeps the replica's part of a drain (``drain.py``): once the meter's answer says
    the model drains, :meth:`admit` refuses new HTTP requests, and each report says how many
    admitted ones are still unanswered (``busy``), so the drain knows when to let Serve stop."""

    def __init__(
        self, meter, name: str, on_answer: Callable[[MeterAnswer], None], fields: Callable[[], dict] | None = None
    ):
        self.meter = meter
        self.name = name
        self.on_answer = on_answer
        self.fields = fields or dict
        self.events: list[Event] = []
        self._task: asyncio.Task | None = None
        self.draining = False  # the meter's last answer: refuse new HTTP requests
        self.busy = 0  # HTTP requests admitted and not answered yet

    def admit(self) -> bool:
        """Whether to take a new HTTP request (False: the model drains; answer 503
        ``shutting_down``). Each admitted request is :meth:`release`d when answered."""
        if self.draining:
            return False
        self.busy += 1
        return True

    def release(self) -> None:
        self.busy -= 1

    def start(self) -> None:
        """Start reporting on the running event loop (a no-op without one, or once started):
        called from ``__init__`` and again from the first request."""
        if self._task is None:
            try:
                self._task = asyncio.get_running_loop().create_task(self._loop())
            except RuntimeError:  # no loop yet: the first request starts it
                pass

    def event(self, ev: Event) -> None:
        self.events.append(ev)
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS]

    async def _send(self, source: str, events: list[Event]) -> MeterAnswer:
        report = ReplicaReport(tuple(events), **self.fields(), draining=self.draining, busy=self.busy)
        return decode(await self.meter.ingest.remote(source, report.wire()), MeterAnswer)

    async def _loop(self) -> None:
        source = f"replica-{serve.get_replica_context().replica_id.unique_id}"
        warned, refused = False, None
        while True:
            await asyncio.sleep(REPORT_S)
            events, self.events = self.events, []
            try:
                ans = await asyncio.wait_for(self._send(source, events), 10)
            except Exception as err:  # the meter restarts: keep the events for the next try
                self.events[:0] = events
                if not warned:
                    log.warning("cannot report to the meter of %s: %s", self.name, err)
                    warned = True
                continue
            if ans.refused != refused and ans.refused:  # a bug or another version: say it once
                log.error("the meter of %s refused a replica's report: %s", self.name, ans.refused)
            refused, warned = ans.refused, False
            self.draining = ans.draining
            try:
                self.on_answer(ans)
            except Exception as err:  # what the answer asks cannot be done: say so, go on
                log.warning("%s: cannot apply the meter's answer: %s", self.name, err)
