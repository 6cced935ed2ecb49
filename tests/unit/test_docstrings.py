"""Every public module-level function and class of both packages, and every public method of
a public class, has a docstring saying what it does or returns (public: the name has no
leading underscore; read with ast, nothing imported); overrides of a documented base method
inherit its docstring. No docstring points outside the repository."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "controller" / "topoctl", ROOT / "agent" / "topoagent"]
OUTSIDE = ("../shared", "shared/notes", "seed 003")  # notes that are not in this repository


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py"))


def _public(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                not node.name.startswith("_"):
            yield node


def test_there_are_modules():
    assert len(_modules()) > 100


def test_public_functions_and_classes_have_docstrings():
    missing = []
    for path in _modules():
        for node in _public(ast.parse(path.read_text())):
            if not (ast.get_docstring(node) or "").strip():
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert not missing, "no docstring:\n" + "\n".join(missing)


def test_docstrings_point_inside_the_repository():
    bad = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
        for node in nodes:
            doc = ast.get_docstring(node) or ""
            bad += [f"{path.relative_to(ROOT)}: {getattr(node, 'name', '<module>')}: {w!r}"
                    for w in OUTSIDE if w in doc]
    assert not bad, "docstrings naming notes outside the repository:\n" + "\n".join(bad)


def test_public_methods_have_docstrings_or_inherit_one():
    """A public method of a public class has a docstring, unless it overrides a documented
    method of a base class in these packages (Op.apply, .inverse, ...) or torch's
    nn.Module.forward."""
    trees = {p: ast.parse(p.read_text()) for p in _modules()}
    documented: dict[str, set[str]] = {}  # class name -> its methods with a docstring
    for tree in trees.values():
        for c in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            documented.setdefault(c.name, set()).update(
                m.name for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                and ast.get_docstring(m))
    missing = []
    for path, tree in trees.items():
        for c in _public(tree):
            if not isinstance(c, ast.ClassDef):
                continue
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in c.bases]
            for m in c.body:
                if not isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                        m.name.startswith("_") or ast.get_docstring(m):
                    continue
                if any(m.name in documented.get(b, ()) for b in bases):
                    continue
                if m.name == "forward" and "Module" in bases:
                    continue
                missing.append(f"{path.relative_to(ROOT)}:{m.lineno}: {c.name}.{m.name}")
    assert not missing, "no docstring:\n" + "\n".join(missing)
