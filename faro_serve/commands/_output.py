"""Output paths checked before the work: a run's result is not lost to a path that cannot
take it (checked only when writing, after minutes of simulation)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UsageError


def check_output_file(path: str | None, flag: str) -> None:
    """``flag path`` can be written as a file (``-`` and no path: stdout); opened to append,
    so an existing file is left as it is, and a new one removed again."""
    if not path or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot be written ({err.strerror or err})") from None
    if not existed:
        os.unlink(p)


def check_output_dir(path: str, flag: str, create: bool = True) -> None:
    """``flag path`` is, or can be made, a directory that takes files. ``create=False`` tries
    the nearest directory that exists instead of making it: the writer makes it, so a run that
    fails leaves no empty directory behind."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a directory")
    try:
        if create:
            p.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=p if create else _nearest_existing(p)).close()
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot be written ({err.strerror or err})") from None


def _nearest_existing(p: Path) -> Path:
    """``p`` or its nearest ancestor that exists (a file there: writing beneath it fails)."""
    p = p.absolute()
    while not p.exists():
        p = p.parent
    return p
