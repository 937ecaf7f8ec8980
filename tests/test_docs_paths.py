"""Docs that stay true (issue 33, item 5): every file path and every module path the README
and docs/ name in code spans exists, so a renamed module breaks this test, not a reader.

A file path (``faro_serve/serving/app.py``, ``profiles/resnet34.json``) must be a file of the
repository; a module path (``faro_serve.serving.app``, ``autoscaler.contract.setting.Setting``,
``faro_serve.serving.app:model_app``, Ray's ``import_path`` form) must name a module of the
project and, past the module, attributes it has. Generated places (``runs/``, ``.venv``) and
templates (``<name>``) are not checked."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "results" / "README.md"]
TOP = ("faro_serve", "autoscaler", "forecasting", "deployments", "bench", "tests")
# where a documented file path may start: the repository's top level or the package's
# (``serving/stats.py``); other paths (Ray's sources, ``runs/`` outputs) are not ours
PLACES = {p.name for p in ROOT.iterdir()} | {p.name for p in (ROOT / "faro_serve").iterdir()}
PLACES -= {"runs", ".venv", ".git"}
ENTRY_POINT_GROUPS = {"faro_serve.policies", "faro_serve.forecasters"}  # names, not modules
SPAN = re.compile(r"`([^`\n]+)`")
FILE = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|yml|json|toml|txt|csv|png)")
MODULE = re.compile(r"(?:%s)(?:\.\w+)+(?::\w+(?:\.\w+)*)?" % "|".join(TOP))


def mentions() -> list[tuple[str, str, str]]:
    """(doc, kind, path) for every file or module path in a code span of the docs."""
    out = []
    for doc in DOCS:
        for span in SPAN.findall(doc.read_text()):
            for word in re.split(r"[\s,()=\[\]{}'\"]+", span):
                word = word.rstrip(".:;").replace("::", ":")  # a pytest node id: file:test
                if "<" in word or not word:
                    continue
                path, _, attr = word.partition(":")
                if FILE.fullmatch(path) and path.split("/")[0] in PLACES:
                    out.append((doc.name, "file", path))
                    if attr and path.endswith(".py") and path.split("/")[0] in TOP:
                        out.append((doc.name, "module", path[:-3].replace("/", ".") + ":" + attr))
                elif MODULE.fullmatch(word) and word not in ENTRY_POINT_GROUPS:
                    out.append((doc.name, "module", word))
    return out


def _module_file(parts: list[str]) -> bool:
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def resolve(path: str) -> str | None:
    """None when ``path`` names an existing module (and attributes), else what is missing."""
    mod, _, attr = path.partition(":")
    parts = mod.split(".")
    k = len(parts)
    while k > 0 and not _module_file(parts[:k]):
        k -= 1
    if k == 0:
        return f"no module {parts[0]}"
    rest = parts[k:] + (attr.split(".") if attr else [])
    if not rest:
        return None
    if len(parts[:k]) == 1 and not (ROOT / parts[0] / "__init__.py").is_file():
        return f"no module {'.'.join(parts[:2])}"
    obj = importlib.import_module(".".join(parts[:k]))
    for i, name in enumerate(rest):
        if not hasattr(obj, name):
            # a submodule not imported by its package, or a method named through its class
            if isinstance(obj, type(importlib)) and _module_file(parts[:k] + rest[: i + 1]):
                obj = importlib.import_module(".".join(parts[:k] + rest[: i + 1]))
                continue
            return f"{'.'.join(parts[:k] + rest[:i])} has no {name!r}"
        obj = getattr(obj, name)
    return None


ALL = mentions()


def test_the_docs_name_paths_at_all():
    """The scan finds what it should (a scan that finds nothing passes for nothing)."""
    kinds = {k for _, k, _ in ALL}
    assert kinds == {"file", "module"} and len(ALL) > 50
    assert ("README.md", "file", "deployments/pipeline.py") in ALL
    assert ("configuration.md", "file", "faro_serve/config.py") in ALL


@pytest.mark.parametrize("doc,path", sorted({(d, p) for d, k, p in ALL if k == "file"}))
def test_a_documented_file_exists(doc, path):
    # a path inside the package may be written from the package (``serving/stats.py``)
    assert (ROOT / path).exists() or (ROOT / "faro_serve" / path).exists(), f"{doc} names {path}, which does not exist"


@pytest.mark.parametrize("doc,path", sorted({(d, p) for d, k, p in ALL if k == "module"}))
def test_a_documented_module_path_resolves(doc, path):
    missing = resolve(path)
    assert missing is None, f"{doc} names {path}: {missing}"


def test_a_renamed_module_is_caught():
    assert resolve("faro_serve.serving.app:model_app") is None
    assert resolve("autoscaler.contract.setting.Setting.clamp") is None
    assert resolve("faro_serve.serving.app:no_such_app") is not None
    assert resolve("autoscaler.no_such_module") is not None
