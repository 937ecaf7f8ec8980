"""Typed, versioned messages at the router's edge (paper section 5).

On the direct data path the proxy's router (``proxy_queue.py``) and every model replica
(``direct.py``) report to the model's meter once a second, and the meter answers with what
the autoscaler set. These are the messages, one dataclass each, and :func:`decode` is the
one place their wire form is read: a missing or ill-typed field, an unknown event kind,
message type or version raises :class:`MessageError` naming it, instead of a default
silently standing in for it.

The wire stays cheap, since a report carries an event per request (thousands a second under
load): a message travels as a dict of builtins, ``{"v": VERSION, "type": ..., <fields>}``,
and each event as a tuple ``(kind, t, *fields)``; Ray pickles neither a class nor a
dataclass per event. This module is part of the package, so Ray's worker processes import
it wherever the producers run (the proxy, a replica shipped by value, the meter).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Union

from ..wire import check_version, flag, integer, number, numbers, optional, read_fields, text

VERSION = 3  # 2: a replica says where it runs the model (issue 47); 3: drain (issue 50)


class MessageError(ValueError):
    """A message that breaks its schema; the text names the message, the field and why."""


# -- events ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Arrival:
    """A request arrived in the proxy's queue, at Ray's ``created_at``."""

    t: float

    def wire(self) -> tuple:
        return ("a", self.t)


@dataclass(frozen=True, slots=True)
class Answered:
    """A request's answer left the replica: its end-to-end latency (arrival to answer)."""

    t: float
    latency_s: float

    def wire(self) -> tuple:
        return ("f", self.t, self.latency_s)


@dataclass(frozen=True, slots=True)
class GaveUp:
    """A queued request Ray stopped asking about (its client went away): no answer comes."""

    t: float

    def wire(self) -> tuple:
        return ("x", self.t)


@dataclass(frozen=True, slots=True)
class Processed:
    """A replica's processing time of one request; ``batch``: the size of the batch it
    timed (a batching replica only)."""

    t: float
    processing_s: float
    batch: int | None = None

    def wire(self) -> tuple:
        if self.batch is None:
            return ("p", self.t, self.processing_s)
        return ("p", self.t, self.processing_s, self.batch)


@dataclass(frozen=True, slots=True)
class Dropped:
    """A replica refused a request: ``reason`` as in its 503/413/400 answer."""

    t: float
    reason: str

    def wire(self) -> tuple:
        return ("d", self.t, self.reason)


@dataclass(frozen=True, slots=True)
class NetworkTime:
    """A client's network time, as its request declared it (``x-faro-network-ms``)."""

    t: float
    network_s: float

    def wire(self) -> tuple:
        return ("n", self.t, self.network_s)


Event = Union[Arrival, Answered, GaveUp, Processed, Dropped, NetworkTime]


# -- reports and the answer --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RouterReport:
    """The proxy's router to the meter: its events since the last report and its queue."""

    events: tuple[Event, ...]
    waiting: int  # queued, not on a replica
    dispatched: int  # replicas at work
    replicas: int  # replicas the router sees
    waiting_since: tuple[float, ...] | None = None  # a batching model: queued arrivals

    TYPE = "router"

    def wire(self) -> dict:
        return {
            "v": VERSION,
            "type": self.TYPE,
            "events": [e.wire() for e in self.events],
            "waiting": self.waiting,
            "dispatched": self.dispatched,
            "replicas": self.replicas,
            "waiting_since": None if self.waiting_since is None else list(self.waiting_since),
        }


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """A model replica to the meter: its events, and what it runs (None: not applicable)."""

    events: tuple[Event, ...]
    batch_size: int | None = None  # a batching replica: the batch size in force
    threads: int | None = None
    variant: str | None = None  # a task with variants: the one it serves
    held_peak: int | None = None  # most requests it held at once since the last report
    device: str | None = None  # where it runs the model ("cuda:0", "cpu"), if it says
    draining: bool | None = None  # it refuses new HTTP requests: the model drains (drain.py)
    busy: int | None = None  # HTTP requests it admitted and has not answered yet

    TYPE = "replica"

    def wire(self) -> dict:
        return {
            "v": VERSION,
            "type": self.TYPE,
            "events": [e.wire() for e in self.events],
            "batch_size": self.batch_size,
            "threads": self.threads,
            "variant": self.variant,
            "held_peak": self.held_peak,
            "device": self.device,
            "draining": self.draining,
            "busy": self.busy,
        }


@dataclass(frozen=True, slots=True)
class MeterAnswer:
    """The meter's answer to a report: what the autoscaler set (None: nothing), and
    ``refused``: why the report was refused, if it was (the sender logs it)."""

    drop_rate: float
    batch_in_force: int  # the proxy's router lets a replica hold two batches of this
    batch_size: int | None = None
    threads: int | None = None
    variant: str | None = None
    refused: str | None = None
    draining: bool = False  # refuse new HTTP requests (503 shutting_down): a shutdown drains

    TYPE = "meter-answer"

    def wire(self) -> dict:
        return {
            "v": VERSION,
            "type": self.TYPE,
            "drop_rate": self.drop_rate,
            "batch_in_force": self.batch_in_force,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "variant": self.variant,
            "refused": self.refused,
            "draining": self.draining,
        }


Message = Union[RouterReport, ReplicaReport, MeterAnswer]


# -- the decoder -------------------------------------------------------------------------
# per kind: the event class and its fields' checks, in wire order (trailing optional ones
# may be left out)
_EVENTS = {
    "a": (Arrival, (number,)),
    "f": (Answered, (number, number)),
    "x": (GaveUp, (number,)),
    "p": (Processed, (number, number, optional(integer))),
    "d": (Dropped, (number, text)),
    "n": (NetworkTime, (number, number)),
}
_EVENTS = {
    k: (cls, tuple(f.name for f in fields(cls)), checks, sum(1 for c in checks if not getattr(c, "optional", False)))
    for k, (cls, checks) in _EVENTS.items()
}  # + field names, fields required


def _events(v, where: str) -> tuple:
    """The events of a report (thousands a second under load: kept to plain loops)."""
    if not isinstance(v, (list, tuple)):
        raise MessageError(f"{where}: field 'events' must be a list of events (got {type(v).__name__})")
    out = []
    for i, ev in enumerate(v):
        spec = _EVENTS.get(ev[0]) if isinstance(ev, (list, tuple)) and ev and isinstance(ev[0], str) else None
        if spec is None:
            if not isinstance(ev, (list, tuple)) or not ev:
                raise MessageError(f"{where}: events[{i}] must be a tuple (kind, t, ...) (got {ev!r:.60})")
            raise MessageError(f"{where}: events[{i}] has unknown kind {ev[0]!r:.20} (known: {', '.join(_EVENTS)})")
        cls, names, checks, need = spec
        n = len(ev) - 1
        if not need <= n <= len(checks):
            raise MessageError(
                f"{where}: events[{i}] ({cls.__name__}) "
                + (
                    f"missing field {names[n]!r}"
                    if n < need
                    else f"has {n} fields, at most {len(checks)} ({', '.join(names)})"
                )
            )
        try:
            out.append(cls(*[check(x) for check, x in zip(checks, ev[1:])]))
        except TypeError as err:
            k = next(k for k, (c, x) in enumerate(zip(checks, ev[1:])) if _fails(c, x))
            raise MessageError(
                f"{where}: events[{i}] ({cls.__name__}) field {names[k]!r} must be {err} (got {ev[k + 1]!r:.40})"
            ) from None
    return tuple(out)


def _fails(check, x) -> bool:
    try:
        check(x)
    except TypeError:
        return True
    return False


# per message type: its class and each field's check (events are read by _events)
_MESSAGES = {
    RouterReport.TYPE: (
        RouterReport,
        "router report",
        {
            "events": _events,
            "waiting": integer,
            "dispatched": integer,
            "replicas": integer,
            "waiting_since": optional(numbers),
        },
    ),
    ReplicaReport.TYPE: (
        ReplicaReport,
        "replica report",
        {
            "events": _events,
            "batch_size": optional(integer),
            "threads": optional(integer),
            "variant": optional(text),
            "held_peak": optional(integer),
            "device": optional(text),
            "draining": optional(flag),
            "busy": optional(integer),
        },
    ),
    MeterAnswer.TYPE: (
        MeterAnswer,
        "meter answer",
        {
            "drop_rate": number,
            "batch_in_force": integer,
            "batch_size": optional(integer),
            "threads": optional(integer),
            "variant": optional(text),
            "refused": optional(text),
            "draining": flag,
        },
    ),
}


def decode(raw, *expect: type) -> Message:
    """The message ``raw`` (its wire form) as its dataclass; ``expect``: the classes the
    caller takes (default: any). Every field must be present (an optional one as None);
    :class:`MessageError` names the first one missing, ill-typed or unknown."""
    if not isinstance(raw, dict):
        raise MessageError(f"message: expected a dict, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in _MESSAGES:
        raise MessageError(f"message: unknown type {kind!r:.40} (known: {', '.join(_MESSAGES)})")
    cls, label, checks = _MESSAGES[kind]
    if expect and cls not in expect:
        raise MessageError(f"{label}: not expected here (expected {' or '.join(c.__name__ for c in expect)})")
    check_version(raw, VERSION, label, MessageError)
    where = f"{label} v{VERSION}"
    checks = {**checks, "events": lambda v: _events(v, where)} if "events" in checks else checks
    vals = read_fields(raw, checks, where, MessageError, envelope=("v", "type"))
    return cls(**vals)
