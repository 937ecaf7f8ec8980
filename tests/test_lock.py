"""The install is locked: requirements.lock pins every dependency and `make install` obeys it.

A fresh clone's `make test` must build the same environment every day (issue 23: an
unpinned transitive dependency made a test pass one day and fail the next).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def lock_pins() -> list[tuple[str, str, Marker | None]]:
    """(name, version, marker) for each pin line of the lock."""
    pins = []
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;\s*(.+))?", line)
        assert m, f"requirements.lock: not a pin: {line!r}"
        pins.append((canonicalize_name(m[1]), m[2], Marker(m[3]) if m[3] else None))
    return pins


def test_every_dependency_is_pinned_in_the_lock():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    pinned = {name for name, _, _ in lock_pins()}
    missing = [r for r in wanted if canonicalize_name(Requirement(r).name) not in pinned]
    assert not missing, f"not in requirements.lock (run `make lock`): {missing}"
    # a pin for this interpreter exists for every name (markers may split one name in many)
    here = {name for name, _, marker in lock_pins() if marker is None or marker.evaluate()}
    assert {canonicalize_name(Requirement(r).name) for r in wanted} <= here


def test_installed_versions_are_the_locked_ones():
    """What `make install` put into this environment is exactly what the lock says."""
    wrong = []
    for name, version, marker in lock_pins():
        if marker is not None and not marker.evaluate():
            continue
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name} not installed (locked {version})")
            continue
        if Version(got).public != Version(version).public:  # torch's +cu130 label is the build
            wrong.append(f"{name} {got} (locked {version})")
    assert not wrong, "installed versions differ from requirements.lock: " + ", ".join(wrong)
