"""The layering contract of pyproject.toml ([tool.importlinter]) holds, checked by
import-linter over the real import graph: serving -> autoscaler -> engine/forecasting ->
config, and no Ray below serving."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent))


def _lint(*args: str) -> subprocess.CompletedProcess:
    if LINT is None:
        pytest.skip("import-linter is not installed (it needs Python 3.11+; `make install` adds it)")
    return subprocess.run([LINT, "--no-cache", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_layering_contract_is_kept():
    out = _lint()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_the_checker_sees_a_broken_layer(tmp_path):
    """The same checker on a contract the code does not keep (the simulator drives the
    policies, so it imports them): reported broken, naming the import."""
    cfg = tmp_path / "contract.toml"
    cfg.write_text(
        '[tool.importlinter]\nroot_packages = ["faro_serve", "autoscaler"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "no policies in the simulator"\n'
        'type = "forbidden"\nsource_modules = ["faro_serve.sim"]\n'
        'forbidden_modules = ["autoscaler"]\n'
    )
    out = _lint("--config", str(cfg))
    assert out.returncode == 1
    assert "faro_serve.sim.runner -> autoscaler" in out.stdout
