"""The README stays a README and its Architecture section stays true (issue 49, item 5):
at most 200 lines, every document of docs/ on its map, and the modules it says import Ray
Serve are exactly those that do (read from the code's imports, function-level ones too).
File and module paths the docs name are checked in tests/test_docs_paths.py."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PACKAGES = ("faro_serve", "autoscaler", "forecasting", "deployments")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (``from ray import serve``: ray.serve)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _sources():
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            yield p.relative_to(ROOT).as_posix(), _imports(p)


def _uses(imports: set[str], module: str) -> bool:
    return any(m == module or m.startswith(module + ".") for m in imports)


def test_the_readme_is_at_most_200_lines():
    n = len(README.splitlines())
    assert n <= 200, f"README.md has {n} lines: move the detail to docs/"


def test_every_document_is_on_the_readmes_map():
    section = README[README.index("\n## Documents") :]
    linked = set(re.findall(r"\(docs/([\w-]+\.md)\)", section))
    docs = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert docs - linked == set(), f"not on the README's map: {sorted(docs - linked)}"
    assert linked - docs == set(), f"on the map but missing: {sorted(linked - docs)}"


def test_the_modules_the_readme_says_import_ray_serve_are_those_that_do():
    sentence = re.search(r"Ray Serve is\s+imported only by `faro_serve.serving` and.*?\.\s", README, re.S)
    assert sentence, "the Architecture section's sentence on Ray Serve's importers is gone"
    said = set(re.findall(r"`([\w/]+\.py)`", sentence.group(0)))
    actual = {
        path for path, imps in _sources() if _uses(imps, "ray.serve") and not path.startswith("faro_serve/serving/")
    }
    assert len(said) == 3 and said == actual, (said, actual)
    assert any(_uses(i, "ray.serve") for p, i in _sources() if p.startswith("faro_serve/serving/"))


def test_the_policies_the_engine_the_forecasters_and_the_simulator_never_import_ray():
    ray_free = ("autoscaler/", "faro_serve/engine/", "forecasting/", "faro_serve/sim/", "faro_serve/config.py")
    offenders = sorted(path for path, imps in _sources() if path.startswith(ray_free) and _uses(imps, "ray"))
    assert offenders == [], offenders


def test_no_two_modules_of_the_package_share_a_file_name():
    """One name per thing (issue 49, item 1): a file name means one kind of module wherever
    it is (``__init__.py``, ``__main__.py`` aside)."""
    seen: dict[str, list[str]] = {}
    for path, _ in _sources():
        name = path.rsplit("/", 1)[-1]
        if name not in ("__init__.py", "__main__.py"):
            seen.setdefault(name, []).append(path)
    shared = {n: p for n, p in seen.items() if len(p) > 1}
    assert shared == {}, shared
