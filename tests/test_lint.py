"""``ruff check`` is clean over the repository (issue 49, item 6): pyflakes, pycodestyle's
errors and warnings, import order, as ``[tool.ruff]`` in pyproject.toml selects. ruff is a
dev dependency pinned in requirements.lock, so ``make test`` and CI run it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent))


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    if RUFF is None:
        pytest.fail("ruff is not installed beside this Python: `make install` installs the dev extras")
    return subprocess.run([RUFF, "check", "--no-cache", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_ruff_check_is_clean():
    out = _ruff(".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_checker_sees_what_it_is_there_for(tmp_path):
    """The same settings on a file with an unused import and an undefined name: both named."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    out = _ruff(".", cwd=tmp_path)
    assert out.returncode == 1 and "F401" in out.stdout and "F821" in out.stdout, out.stdout
