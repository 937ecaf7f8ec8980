"""Strict reading of the messages that cross a process boundary (paper section 5): the
router's and the replicas' reports to a model's meter (``faro_serve.serving.messages``) and
the meter's report to the autoscaler (``faro_serve.meter_report``).

Every field must be present (an optional one as null), each passes its check, an unknown
one is refused, and the error names the first problem, so a key renamed on one side raises
instead of silently becoming a default. A check takes the value and returns it in its type,
or raises ``TypeError`` with what it should be ("a finite number"). Imports nothing of the
project: every process that sends or reads a message imports it cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

Check = Callable[[object], object]


def number(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError("a finite number")
    return float(v)


def integer(v) -> int:
    """A count: an integer >= 0 (a JSON number with no fraction counts)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 0:
        raise TypeError("an integer >= 0")
    return int(v)


def flag(v) -> bool:
    if not isinstance(v, bool):
        raise TypeError("true or false")
    return v


def text(v) -> str:
    if not isinstance(v, str):
        raise TypeError("a string")
    return v


def numbers(v) -> tuple:
    if not isinstance(v, (list, tuple)):
        raise TypeError("a list of numbers")
    return tuple(number(x) for x in v)


def optional(check: Check) -> Check:
    """``check``, or None."""

    def opt(v):
        return None if v is None else check(v)

    opt.__name__ = check.__name__
    opt.optional = True
    return opt


def is_optional(check: Check) -> bool:
    return getattr(check, "optional", False)


def check_version(raw: Mapping, version: int, label: str, error: type[Exception], hint: str = "") -> None:
    """``raw["v"]`` must be ``version``; otherwise ``error`` says which it got."""
    v = raw.get("v")
    if type(v) is not int or v != version:
        raise error(f"{label}: version {v!r:.20} is not supported ({hint or f'this side speaks v{version}'})")


def read_fields(
    raw: Mapping, checks: Mapping[str, Check], where: str, error: type[Exception], envelope: Iterable[str] = ("v",)
) -> dict:
    """Every field of ``checks`` read from ``raw`` through its check; ``envelope``: keys
    beside the fields (the version, a type tag). ``error`` names the first field unknown,
    missing or ill-typed."""
    unknown = sorted(set(raw) - set(checks) - set(envelope))
    if unknown:
        raise error(f"{where}: unknown field {unknown[0]!r}")
    vals = {}
    for name, check in checks.items():
        if name not in raw:
            raise error(f"{where}: missing field {name!r}")
        try:
            vals[name] = check(raw[name])
        except TypeError as err:
            what = f"{err} or null" if is_optional(check) else str(err)
            raise error(f"{where}: field {name!r} must be {what} (got {raw[name]!r:.40})") from None
    return vals
