"""A durable per-model, per-minute arrival store: what the forecaster reads after a restart
(issue 32, "history that survives"; the paper's N-HiTS needs 15 minutes of input, section 3.5).

One SQLite file (stdlib ``sqlite3``, no server): a row per (model, wall-clock minute) with
that minute's request count. Appends are idempotent (a minute written twice keeps the last
count), rows older than ``keep_days`` before a model's newest minute are pruned on write,
so the file stays bounded (7 days x 1440 minutes x 10 models: about 3 MB). The file carries
an application id and a schema version (SQLite's ``application_id`` and ``user_version``);
a file that is not SQLite, is damaged, belongs to something else or has another schema
version is refused with one log line naming it and why, moved aside to
``<file>.corrupt-<time>``, and a fresh store takes its place: losing history must never stop
the autoscaler. Pure and Ray-free; thread-safe (the live loop and a reconfiguration may
share it).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

log = logging.getLogger("faro_serve.history")
T = TypeVar("T")

APPLICATION_ID = 0x4641524F  # "FARO"
SCHEMA_VERSION = 1
FILE_NAME = "arrivals.sqlite3"
_SCHEMA = """
CREATE TABLE arrivals (model TEXT NOT NULL, minute INTEGER NOT NULL, count REAL NOT NULL,
                       PRIMARY KEY (model, minute)) WITHOUT ROWID;
"""


class StoreRefused(Exception):
    """The file is not a store this version can read (the text says why)."""


def epoch_minute(minute_start_epoch: float) -> int:
    """The wall-clock minute (minutes since the epoch) a minute starting at this time is."""
    return int(math.floor(float(minute_start_epoch) / 60.0 + 0.5))


@runtime_checkable
class HistorySource(Protocol):
    """What the live loop's history reads and writes (``autoscaler.driving.history.HistoryKeeper``):
    the minutes of each model, by wall-clock minute. :class:`ArrivalStore` (SQLite, durable)
    and ``forecasting.rayserve.ServeMetricsStore`` (Ray Serve's counters in Prometheus, read
    only: ``append_many`` keeps nothing) both are one; a new history source implements
    these five and ``faro_serve.serving.autoscaler_deployment.open_history`` opens it."""

    path: Any  # where it reads from, for the status and logs
    refused: list[dict[str, str]]  # files or rows it set aside, with why
    keep_minutes: int  # the newest minutes it keeps per model

    def load(self, model: str, minutes: int, end_minute: int | None = None) -> np.ndarray:
        """``model``'s requests in each of the ``minutes`` minutes before ``end_minute``
        (epoch minutes, exclusive; default: the current one); NaN where none is known."""
        ...

    def append_many(self, model: str, rows: Iterable[tuple[float, float]]) -> int:
        """Store ``(epoch minute, requests)`` rows of ``model``; how many were kept."""
        ...


class ArrivalStore:
    """``path``: the SQLite file, or a directory to hold :data:`FILE_NAME` (created).

    ``read_only``: a reader's view (``faro-serve forecast train --from``): the file must
    already be a store; anything else raises :class:`StoreRefused` and is left as it is (a
    user who gives a trace CSV by mistake must not find it moved aside), and nothing is
    ever written."""

    def __init__(self, path: str | Path, keep_days: float = 7.0, *, read_only: bool = False):
        p = Path(path).expanduser()
        self.path = p / FILE_NAME if p.suffix == "" or p.is_dir() else p
        if read_only and p.is_file():  # a reader takes the file it is given, suffix or not
            self.path = p
        if keep_days <= 0:
            raise ValueError(f"keep_days must be > 0 (got {keep_days})")
        self.keep_minutes = int(round(keep_days * 1440))
        self.read_only = bool(read_only)
        self.refused: list[dict[str, str]] = []  # files moved aside: {"file", "reason", "moved_to"}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._open()

    # -- opening, checking, starting afresh ----------------------------------------------
    def _open(self) -> None:
        if self.read_only:
            self._db = self._connect_checked()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._connect_checked()
        except StoreRefused as err:
            self._set_aside(str(err))
            self._db = self._connect_checked()

    def _connect_checked(self) -> sqlite3.Connection:
        if self.read_only and not self.path.is_file():
            raise StoreRefused("no such file")
        if self.path.is_file() and (self.path.stat().st_size > 0 or self.read_only):
            with self.path.open("rb") as f:
                if f.read(16) != b"SQLite format 3\x00":
                    raise StoreRefused("not an SQLite database")
        if self.read_only:
            db = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro",
                uri=True,
                timeout=5.0,
                check_same_thread=False,
                isolation_level=None,
            )
        else:
            db = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False, isolation_level=None)
        try:
            app = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            if app == 0 and not tables and self.read_only:
                raise StoreRefused("an empty SQLite database, not a faro-serve history store")
            if app == 0 and not tables:  # a new (or empty) file: ours from now on
                db.executescript(
                    f"BEGIN; {_SCHEMA} PRAGMA application_id = {APPLICATION_ID}; "
                    f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
                )
            elif app != APPLICATION_ID:
                raise StoreRefused(
                    f"a foreign SQLite database (application id {app}, tables "
                    f"{', '.join(tables) or 'none'}), not a faro-serve history store"
                )
            elif version != SCHEMA_VERSION:
                raise StoreRefused(
                    f"history store schema version {version}; this faro-serve reads version {SCHEMA_VERSION}"
                )
            else:
                check = db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok" or "arrivals" not in tables:
                    raise StoreRefused(f"damaged ({check if check != 'ok' else 'no arrivals table'})")
        except sqlite3.OperationalError:  # locked or unopenable: not the file's fault, keep it
            db.close()
            raise
        except sqlite3.DatabaseError as err:
            db.close()
            raise StoreRefused(f"unreadable SQLite file ({err})") from None
        except StoreRefused:
            db.close()
            raise
        return db

    def _set_aside(self, reason: str) -> None:
        """Move the refused file (and its journal) aside; the next open starts afresh."""
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
        stamp = time.strftime("%Y%m%dT%H%M%S")
        moved = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while moved.exists():
            moved, n = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}"), n + 1
        self.path.replace(moved)
        journal = self.path.with_name(self.path.name + "-journal")
        if journal.exists():
            journal.replace(moved.with_name(moved.name + "-journal"))
        log.error(
            "arrival history store %s refused: %s; moved aside to %s, starting a fresh "
            "store (the forecaster starts from the meters' history)",
            self.path,
            reason,
            moved,
        )
        self.refused.append({"file": str(self.path), "reason": reason, "moved_to": str(moved)})

    def _run(self, fn: Callable[[sqlite3.Connection], T], default: T) -> T:
        """``fn(db)`` under the lock; a damaged file found now is set aside and ``fn`` retried
        once on a fresh store; a busy or unwritable file is logged and ``default`` returned."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._db is None:
                        self._open()
                    return fn(cast(sqlite3.Connection, self._db))  # _open() set it, or raised
                except sqlite3.OperationalError as err:  # locked, read-only, disk full: next time
                    log.warning("arrival history store %s: %s", self.path, err)
                    return default
                except sqlite3.DatabaseError as err:  # malformed: found only when read
                    if attempt or self.read_only:
                        raise
                    self._set_aside(f"damaged ({err})")
        return default

    # -- the interface ---------------------------------------------------------------------
    def append(self, model: str, minute_start_epoch: float, count: float) -> None:
        """One completed minute of ``model`` (idempotent per (model, minute))."""
        self.append_many(model, [(minute_start_epoch, count)])

    def append_many(self, model: str, rows: Iterable[tuple[float, float]]) -> int:
        """Completed minutes ``(minute start, epoch s; count)`` of ``model`` in one
        transaction, then the minutes older than ``keep_days`` before its newest pruned.
        Returns how many rows were written (0 when the store could not be written)."""
        data = []
        for t, c in rows:
            c = float(c)
            if not math.isfinite(c) or c < 0:
                raise ValueError(f"arrival count of {model!r} at {t}: must be finite and >= 0 (got {c})")
            data.append((str(model), epoch_minute(t), c))
        if not data:
            return 0

        def write(db: sqlite3.Connection) -> int:
            with db:
                db.execute("BEGIN")
                db.executemany(
                    "INSERT INTO arrivals (model, minute, count) VALUES (?, ?, ?) "
                    "ON CONFLICT (model, minute) DO UPDATE SET count = excluded.count",
                    data,
                )
                newest = db.execute("SELECT MAX(minute) FROM arrivals WHERE model = ?", (str(model),)).fetchone()[0]
                db.execute(
                    "DELETE FROM arrivals WHERE model = ? AND minute <= ?", (str(model), newest - self.keep_minutes)
                )
            return len(data)

        return self._run(write, 0)

    def load(self, model: str, minutes: int, end_minute: int | None = None) -> np.ndarray:
        """``model``'s counts of the ``minutes`` wall-clock minutes before ``end_minute``
        (exclusive; default: after its newest), oldest first; a minute never written is NaN
        (the caller decides what a gap means: the forecaster wants contiguous minutes)."""
        out = np.full(max(int(minutes), 0), np.nan)
        if out.size == 0:
            return out

        def read(db: sqlite3.Connection) -> np.ndarray:
            end = end_minute
            if end is None:
                newest = db.execute("SELECT MAX(minute) FROM arrivals WHERE model = ?", (str(model),)).fetchone()[0]
                if newest is None:
                    return out
                end = newest + 1
            start = int(end) - out.size
            for minute, count in db.execute(
                "SELECT minute, count FROM arrivals WHERE model = ? AND minute >= ? AND minute < ?",
                (str(model), start, int(end)),
            ):
                out[minute - start] = count
            return out

        return self._run(read, out)

    def models(self) -> list[str]:
        """The models the store holds minutes of, sorted."""
        return self._run(
            lambda db: [r[0] for r in db.execute("SELECT DISTINCT model FROM arrivals ORDER BY model")], []
        )

    def rows(self, model: str | None = None) -> int:
        """How many minutes the store holds (of ``model``, or of every model)."""
        q, args = (
            ("SELECT COUNT(*) FROM arrivals", ())
            if model is None
            else ("SELECT COUNT(*) FROM arrivals WHERE model = ?", (str(model),))
        )
        return self._run(lambda db: db.execute(q, args).fetchone()[0], 0)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
