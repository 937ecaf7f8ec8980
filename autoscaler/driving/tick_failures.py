"""The autoscaler's failed ticks, as its status reports them (issue 50).

A tick fails where applying a decision fails (e.g. Serve's REST API unreachable: Ray started
without its dashboard). Only ticks that decide apply anything, and most ticks decide nothing
(a plan every long-term interval, a reactive step when the SLO is at risk), so a count of
failures *in a row* is reset by the no-op ticks between and hides the failure. Kept here
instead: the newest error and the failures since a tick last applied a decision, cleared by
the next tick that does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class TickFailures:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.in_a_row = 0  # consecutive failed ticks (the health check's count)
        self.failed = 0  # failed ticks since a decision was last applied
        self.last: dict[str, Any] | None = None  # the newest failure: when, and the error

    def ok(self, record: dict[str, Any]) -> None:
        """A tick that ran; one that applied a decision (``record["decision"]``) ends the
        failures."""
        self.in_a_row = 0
        if record.get("decision") is not None:
            self.failed, self.last = 0, None

    def fail(self, err: BaseException) -> None:
        self.in_a_row += 1
        self.failed += 1
        self.last = {"at": self.clock(), "error": f"{type(err).__name__}: {err}"[:500]}

    def status(self) -> dict[str, Any] | None:
        """``{at, error, failed, in_a_row}`` while failures are not over, else ``None``."""
        return None if self.last is None else {**self.last, "failed": self.failed, "in_a_row": self.in_a_row}
