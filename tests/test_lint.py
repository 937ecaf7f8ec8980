"""The linter, the formatter and the type checker over the repository (issue 49, item 6):
``ruff check`` (pyflakes, pycodestyle's errors and warnings and import order, as
``[tool.ruff]`` in pyproject.toml selects) and ``ruff format --check`` clean; no module
over 400 lines; mypy ``--strict`` on the Ray-free core (the config, the whole autoscaler
package: the policy contract, the live loop and its drivers, the policy catalogue, the
policies and Faro's parts; the engine and the forecasters), and ``--check-untyped-defs``
on the simulator. ruff and mypy are dev dependencies pinned in requirements.lock, so
``make test`` and CI run them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent))
MYPY = shutil.which("mypy", path=str(Path(sys.executable).parent))
STRICT = [
    "faro_serve/config.py",
    "autoscaler/contract",
    "autoscaler/driving",
    "autoscaler/catalogue",
    "autoscaler/policies",
    "autoscaler/faro",
]
CORE = ["faro_serve/engine", "forecasting"]
# the simulator: every function body checked (--check-untyped-defs), not every signature annotated
SIM = ["faro_serve/sim"]


def _ruff(*args: str, cwd: Path = ROOT, verb: str = "check") -> subprocess.CompletedProcess:
    if RUFF is None:
        pytest.fail("ruff is not installed beside this Python: `make install` installs the dev extras")
    return subprocess.run([RUFF, verb, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_check_is_clean():
    out = _ruff(".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_checker_sees_what_it_is_there_for(tmp_path):
    """The same settings on a file with an unused import and an undefined name: both named."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "bad.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    out = _ruff(".", cwd=tmp_path)
    assert out.returncode == 1 and "F401" in out.stdout and "F821" in out.stdout, out.stdout


def test_ruff_format_is_clean():
    """``ruff format --check``: the tree as the formatter writes it (``[tool.ruff.format]``)."""
    out = _ruff("--check", ".", verb="format")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_formatter_sees_what_it_is_there_for(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "loose.py").write_text("x = ( 1,2 )\n")
    out = _ruff("--check", ".", cwd=tmp_path, verb="format")
    assert out.returncode == 1 and "loose.py" in out.stdout, out.stdout


SKIP_DIRS = {"tests", "runs", "shared", "build", "dist", "node_modules"}


def test_no_module_is_over_400_lines():
    """Small modules named for what they hold: none of the product, bench or examples over
    400 lines (tests may be longer)."""
    long = []
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        if any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in rel.parts[:-1]):
            continue
        n = len(f.read_text().splitlines())
        if n > 400:
            long.append(f"{rel}: {n} lines")
    assert not long, long


def _mypy(*args: str, cache) -> subprocess.CompletedProcess:
    if MYPY is None:
        pytest.fail("mypy is not installed beside this Python: `make install` installs the dev extras")
    return subprocess.run(
        [MYPY, "--cache-dir", str(cache), *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "flag, paths",
    [("--strict", STRICT), ("--strict", CORE), ("--check-untyped-defs", SIM)],
    ids=["contract", "engine-forecasting", "simulator"],
)
def test_mypy_is_clean_on_the_core(flag, paths, tmp_path):
    out = _mypy(flag, *paths, cache=tmp_path)
    assert out.returncode == 0 and "Success" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]


def test_mypy_sees_a_type_error(tmp_path):
    """The same settings on a module that passes a str where an int is due: named."""
    bad = tmp_path / "bad_types.py"
    bad.write_text("def twice(n: int) -> int:\n    return 2 * n\n\n\ntwice('a')\n")
    out = _mypy("--strict", str(bad), cache=tmp_path / "cache")
    assert out.returncode == 1 and "arg-type" in out.stdout, out.stdout
