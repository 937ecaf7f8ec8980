"""The demo's replay: the replay's own sender (:func:`~faro_serve.replay.client.send_schedule`)
with a live table, a real image as the request body, and Ctrl-C as "stop and report".

The table (rich, redrawn every ``refresh_s``; printed once per trace minute when the output
is not a terminal) shows per model what the autoscaler reports at ``GET /faro/status``
(arrival rate, the p99 its router front measured over the last 30 s, replicas serving and
targeted, drop rate) next to what the sender saw (requests sent so far, answers by status,
the p99 of its own 200 answers over the last 60 s).
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import signal
import time
from collections import deque

import numpy as np

from ..replay.client import NOT_SENT, ReplayRecords, send_schedule
from ..replay.loadgen import Schedule


def demo_image(width: int = 160, height: int = 120) -> bytes:
    """A small real JPEG (a gradient with a few shapes), made in memory: what the ResNets decode."""
    from PIL import Image, ImageDraw

    x = np.linspace(0, 255, width, dtype=np.float32)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    rgb = np.stack(
        [np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width)), np.full((height, width), 128.0)],
        axis=-1,
    ).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    draw = ImageDraw.Draw(img)
    draw.ellipse((20, 20, 80, 80), fill=(220, 40, 40))
    draw.rectangle((90, 50, 140, 100), fill=(30, 30, 200))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def _fmt(v, spec: str = ".0f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


class LiveView:
    """What the live table shows; fed by the sender's ``on_result`` and ``on_status``."""

    WINDOW_S = 60.0  # the sender-side p99 is over the 200 answers of the last minute

    def __init__(self, schedule: Schedule, slo_ms: dict[str, float], url: str, title: str = ""):
        self.schedule = schedule
        self.names = list(schedule.names)
        self.slo_ms = slo_ms
        self.url = url
        self.title = title
        n = len(self.names)
        self.by_status = [dict() for _ in range(n)]  # per model: status -> count
        self.recent: list[deque] = [deque() for _ in range(n)]  # (end time, latency s) of 200s
        self.status: dict = {}
        self.t0 = time.monotonic()
        self.t0_wall = time.time()  # the same instant on the autoscaler's clock (its decision records)
        self.load: list[tuple[float, float]] = []  # (seconds into the replay, 1-min load average)
        self.warmup_note: str | None = None  # what the demo's warm-up measured and chose
        self.baseline_ms: dict[str, float] | None = None  # processing per model at the warm-up
        self.stopped_at: float | None = None
        # send offsets per model, to count what is due (= sent: the sender never waits)
        self._due = [np.sort(schedule.send_s[schedule.model == i]) for i in range(n)]

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def on_result(self, i: int, status: str, latency_s: float) -> None:
        m = int(self.schedule.model[i])
        self.by_status[m][status] = self.by_status[m].get(status, 0) + 1
        if status == "200":
            self.recent[m].append((time.monotonic(), latency_s))

    def on_status(self, _t: float, st: dict) -> None:
        self.status = st
        self.load.append((self.elapsed(), os.getloadavg()[0]))  # the machine, for the report

    def sent(self, m: int) -> int:
        t = self.elapsed() if self.stopped_at is None else self.stopped_at
        return int(np.searchsorted(self._due[m], t, side="right"))

    def client_p99(self, m: int) -> float | None:
        q = self.recent[m]
        cut = time.monotonic() - self.WINDOW_S
        while q and q[0][0] < cut:
            q.popleft()
        if not q:
            return None
        return float(np.percentile([lat for _, lat in q], 99)) * 1e3

    def table(self):
        from rich.table import Table

        sc = self.schedule
        minute_s = 60.0 * sc.time_scale
        t = self.elapsed()
        minute = min(int(t // minute_s) + 1, sc.minutes)
        st = self.status
        when = (
            f"trace minute {minute}/{sc.minutes}, {t:.0f} of {sc.duration_s:.0f} s"
            if self.stopped_at is None
            else f"replay ended after {self.stopped_at:.0f} s"
        )
        title = (
            f"{self.title}{when} | policy {st.get('policy', '?')}, capacity {_fmt(st.get('capacity_cpus'), 'g')} CPUs"
        )
        table = Table(title=title, caption="Ctrl-C: stop, write a partial report, shut down")
        for col in (
            "model",
            "SLO",
            "rate/s",
            "p99 front 30s",
            "p99 client 60s",
            "replicas",
            "drop",
            "sent",
            "200",
            "503",
            "other",
        ):
            table.add_column(col, justify="left" if col == "model" else "right", no_wrap=True)
        models = st.get("models") or {}
        for m, name in enumerate(self.names):
            info = models.get(name, {})
            slo = self.slo_ms.get(name)
            front = info.get("latency_ms")
            client = self.client_p99(m)
            counts = self.by_status[m]
            other = sum(v for k, v in counts.items() if k not in ("200", "503"))
            over = any(v is not None and slo is not None and v > slo for v in (front, client))
            table.add_row(
                name,
                f"{_fmt(slo, 'g')} ms",
                _fmt(info.get("arrival_rate"), ".2f"),
                f"{_fmt(front)} ms",
                f"{_fmt(client)} ms",
                f"{info.get('replicas', '-')}/{info.get('target', '-')}",
                f"{info.get('drop_rate', 0.0):.0%}" if info else "-",
                f"{self.sent(m):,}",
                f"{counts.get('200', 0):,}",
                f"{counts.get('503', 0):,}",
                f"{other:,}",
                style="red" if over else None,
            )
        return table


async def _refresh(view: LiveView, live, console, refresh_s: float) -> None:
    minute_s = 60.0 * view.schedule.time_scale
    next_print = minute_s
    while True:
        await asyncio.sleep(refresh_s)
        if live is not None:
            live.update(view.table(), refresh=True)
        elif view.elapsed() >= next_print:  # not a terminal: one table per trace minute
            console.print(view.table())
            next_print += minute_s


async def _replay(
    schedule: Schedule,
    url: str,
    view: LiveView,
    body: bytes,
    max_in_flight: int,
    timeout_s: float,
    live_table: bool,
    refresh_s: float,
) -> tuple[ReplayRecords, bool]:
    from rich.live import Live

    from ..console import console as make_console

    console = make_console()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            view.stopped_at = view.elapsed()
            console.print("[bold]interrupted: stopping the replay (open requests get 3 s)...[/]")
        stop.set()

    sigs = (signal.SIGINT, signal.SIGTERM)
    for s in sigs:
        loop.add_signal_handler(s, interrupt)
    live = Live(view.table(), console=console, auto_refresh=False) if live_table and console.is_terminal else None
    if live is not None:
        live.start()
    view.t0, view.t0_wall = time.monotonic(), time.time()
    refresher = asyncio.create_task(_refresh(view, live, console, refresh_s))
    try:
        rec = await send_schedule(
            schedule,
            url,
            max_in_flight=max_in_flight,
            timeout_s=timeout_s,
            body=body,
            status_every_s=min(refresh_s, 5.0),
            on_result=view.on_result,
            on_status=view.on_status,
            stop_sending=stop,
        )
    finally:
        refresher.cancel()
        try:
            await refresher
        except asyncio.CancelledError:
            pass
        if view.stopped_at is None:
            view.stopped_at = view.elapsed()
        if live is not None:
            live.update(view.table(), refresh=True)
            live.stop()
        else:
            console.print(view.table())
        for s in sigs:
            loop.remove_signal_handler(s)
    return rec, interrupted


def replay_live(
    schedule: Schedule,
    url: str,
    slo_ms: dict[str, float],
    *,
    body: bytes,
    max_in_flight: int = 500,
    timeout_s: float = 30.0,
    live_table: bool = True,
    refresh_s: float = 2.0,
    title: str = "",
) -> tuple[ReplayRecords, bool, LiveView]:
    """Send ``schedule`` with the live table; returns (records, interrupted, view).

    SIGINT/SIGTERM during the replay stop the sending (see ``send_schedule``'s
    ``stop_sending``); the records then hold what happened up to there, every request
    accounted for.
    """
    view = LiveView(schedule, slo_ms, url, title)
    prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rec, interrupted = asyncio.run(
            _replay(schedule, url, view, body, max_in_flight, timeout_s, live_table, refresh_s)
        )
    finally:
        for s, h in prev.items():  # the event loop reset them to the defaults
            signal.signal(s, h)
    return rec, interrupted, view


def unsent_after_stop(schedule: Schedule, rec: ReplayRecords, stopped_at: float | None) -> int:
    """Requests not sent because the replay was stopped (due after ``stopped_at``)."""
    if stopped_at is None:
        return 0
    not_sent = np.array([s == NOT_SENT for s in rec.status], dtype=bool)
    return int((not_sent & (schedule.send_s >= stopped_at - 0.5)).sum())


__all__ = ["LiveView", "demo_image", "replay_live", "unsent_after_stop"]
