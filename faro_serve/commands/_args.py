"""Argument types and lists shared by the commands: a mistake named with its flag."""

from __future__ import annotations

import argparse
import math

from .errors import UsageError


def seed(text: str) -> int:
    """A random seed: a whole number >= 0 (numpy refuses negatives, without the flag's name)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {v})")
    return v


def job_list(text: str | None, flag: str = "--jobs") -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; None or "" -> None (every job); a list of nothing but
    commas is a mistake, not "every job"."""
    if not text:
        return None
    jobs = [j.strip() for j in text.split(",") if j.strip()]
    if not jobs:
        raise UsageError(f"{flag} {text!r} names no job (write job names separated by commas)")
    return jobs


def check_capacity(value: float, flag: str = "--capacity", at_least: float | None = None) -> None:
    """A capacity is a finite number of CPUs > 0, or >= ``at_least`` (``inf``/``nan`` parse
    as floats, and ``inf >= 1``)."""
    enough = value > 0 if at_least is None else value >= at_least
    if not (math.isfinite(value) and enough):
        bound = "> 0" if at_least is None else f">= {at_least:g}"
        raise UsageError(f"{flag} must be a finite number {bound} (got {value:g})")
