"""The documentation names only files and modules that exist, so it cannot rot silently.

Checked in README.md and docs/*.md: every path starting with `controller/`, `agent/`, `bench/`,
`tests/`, `docs/`, `plans/`, `playbooks/` or `vagrant/`; every `topoctl/...py` /
`topoagent/...py` path (relative to the packages); every dotted module name `topoctl.x.y` /
`topoagent.x.y` and `bench.x.y` (as `python -m bench.x.y` runs it: a module, or a name defined
or imported at the top of one). Placeholders
(`strategies/<name>.py`) are checked up to the placeholder.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = {"topoctl": ROOT / "controller" / "topoctl", "topoagent": ROOT / "agent" / "topoagent",
            "bench": ROOT / "bench"}

PATH = re.compile(r"(?<![\w./-])((?:controller|agent|bench|tests|docs|plans|playbooks|vagrant)/"
                  r"[\w./<>-]*)")
PKG_PATH = re.compile(r"(?<![\w./-])((?:topoctl|topoagent)/[\w/]*\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:topoctl|topoagent)(?:\.[A-Za-z_]\w*)+)")
# the benchmarks' modules (`python -m bench.trees.scale`); upper case is a placeholder (bench.NAME)
BENCH_DOTTED = re.compile(r"(?<![\w./-])(bench(?:\.[a-z_][a-z0-9_]*)+)\b(?!\.[A-Z<])")


def _mentions(pattern: re.Pattern) -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for m in pattern.finditer(doc.read_text()):
            found = m.group(1)
            if "<" in found:  # a placeholder: check the directory it is in
                found = found[:found.index("<")].rsplit("/", 1)[0] + "/"
            out.append((doc.relative_to(ROOT).as_posix(), found.rstrip(".")))
    return sorted(set(out))


def test_there_is_something_to_check():
    assert (ROOT / "docs" / "architecture.md") in DOCS
    assert len(_mentions(PATH)) > 50 and len(_mentions(DOTTED)) > 5
    assert ("docs/results.md", "bench.demo.median") in _mentions(BENCH_DOTTED)


@pytest.mark.parametrize(("doc", "path"), _mentions(PATH))
def test_repository_paths_exist(doc, path):
    assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


@pytest.mark.parametrize(("doc", "path"), _mentions(PKG_PATH))
def test_package_paths_exist(doc, path):
    pkg, rest = path.split("/", 1)
    assert (PACKAGES[pkg] / rest).exists(), f"{doc} names {path}, which does not exist"


@functools.cache
def _top_names(module: Path) -> frozenset[str]:
    """Names a module defines or imports at its top level (its attributes, without importing)."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names |= set(ast.literal_eval(node.value))  # lazy names (module __getattr__)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    here = PACKAGES[parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        if (here / part).is_dir():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            here = here / f"{part}.py"
            rest = parts[i + 1:]
            return not rest or rest[0] in _top_names(here)
        init = here / "__init__.py"
        return here.is_dir() and init.is_file() and part in _top_names(init)
    return True


@pytest.mark.parametrize(("doc", "name"), _mentions(DOTTED) + _mentions(BENCH_DOTTED))
def test_module_names_exist(doc, name):
    assert _resolves(name), f"{doc} names {name}, which is no module or name in one"
