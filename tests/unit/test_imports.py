"""The import rules of docs/architecture.md, checked on every module's source (ast: imports
inside functions count; `if TYPE_CHECKING:` imports do not, they never run).

- No import circles anywhere in controller/, agent/ and bench/ (the benchmark programs).
- The network agent (`topoagent`) never imports the training runtime (`topotrain`), torch or
  the controller; the contract (`topocontract`) imports neither torch nor the runtime nor the
  controller; the runtime never imports the controller.
- The controller imports of the runtime only its timing entry (`topotrain.timing`), and of the
  agent only its public contract (`PUBLIC_AGENT` below, the list docs/architecture.md gives).
- Nobody imports another module's private (`_name`) names.
- A function-level import of another module of the project says why in a comment (only to save
  start-up time, or to reach a module run as a child process's entry); the benchmark programs
  are exempt from this one rule.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# (directory the module names start from, the directories under it that hold project modules)
SOURCES = ((ROOT / "controller", ROOT / "controller"), (ROOT / "agent", ROOT / "agent"),
           (ROOT, ROOT / "bench"))

# The agent's public contract: what the controller (and the runtime) may import of it.
PUBLIC_AGENT = ("topoagent", "topoagent.protocol", "topoagent.cliutil", "topoagent.target",
                "topoagent.congestion", "topoagent.machinelock", "topoagent.state",
                "topoagent.zygote")


@dataclass(frozen=True)
class Edge:
    """One import statement's target, as found in `source` at `line`."""

    source: str
    target: str  # a project module, or an outside top-level package (e.g. "torch")
    name: str | None  # the imported name, for `from module import name` of a non-module
    in_function: bool
    line: int


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for src, under in SOURCES:
        for path in under.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skip.update(id(n) for sub in node.body for n in ast.walk(sub))
    return skip


def _function_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    return inside


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]):
    """(target module, imported name or None) for each name one import statement imports."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
        return
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield (sub, None) if sub in modules else (base, alias.name)


def _edges() -> list[Edge]:
    modules = _modules()
    edges = []
    for module, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        skip, inside = _type_checking_nodes(tree), _function_nodes(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
                continue
            for target, name in _targets(node, module, path.name == "__init__.py", modules):
                if target not in modules:
                    target = target.split(".")[0]
                edges.append(Edge(module, target, name, id(node) in inside, node.lineno))
    return edges


EDGES = _edges()
MODULES = _modules()


def _top(module: str) -> str:
    return module.split(".")[0]


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_graph_sees_the_packages():
    """The walk finds all five packages, the benchmarks' subpackages and their imports, those
    inside functions too (a broken walk passes everything)."""
    assert {_top(m) for m in MODULES} == {"topoctl", "topoagent", "topotrain", "topocontract",
                                          "bench"}
    assert {"bench.common", "bench.demo.run", "bench.demo.ovs"} <= set(MODULES)
    assert any(e.source == "topotrain.train" and e.target == "torch" for e in EDGES)
    assert any(e.in_function for e in EDGES)
    assert any(e.in_function and _top(e.source) == "bench" and e.target in MODULES
               for e in EDGES)


def test_no_import_circles():
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((e.source, e.target) for e in EDGES
                         if e.target in MODULES and e.target != e.source)
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, f"import circles (functions included): {circles}"


@pytest.mark.parametrize("package, forbidden", [
    ("topoagent", ("topotrain", "topoctl", "torch")),
    ("topocontract", ("topotrain", "topoctl", "torch")),
    ("topotrain", ("topoctl",)),
])
def test_one_way_dependencies(package, forbidden):
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES
           if _top(e.source) == package and _top(e.target) in forbidden]
    assert not bad, bad


def test_the_controller_imports_only_contracts():
    allowed = PUBLIC_AGENT + ("topocontract", "topotrain.timing")
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES
           if _top(e.source) == "topoctl" and _top(e.target) in ("topoagent", "topotrain")
           and not _within(e.target, allowed)]
    assert not bad, bad


def test_the_runtime_uses_only_the_agents_public_api():
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES
           if _top(e.source) == "topotrain" and _top(e.target) == "topoagent"
           and not _within(e.target, PUBLIC_AGENT)]
    assert not bad, bad


def test_no_private_names_across_modules():
    bad = [f"{e.source}:{e.line} imports {e.target}.{e.name}" for e in EDGES
           if e.name and e.name.startswith("_") and not e.name.startswith("__")
           and e.target in MODULES and e.target != e.source]
    assert not bad, bad


def test_function_level_imports_say_why():
    """A library module (controller, agent) importing a project module inside a function
    carries a comment on that line or the one above it (the start-up time it saves, or why it
    cannot be at the top). The benchmark programs (`bench`) are left out: they import the
    library where they use it so that `--help` and a usage error answer at once (their
    circles and private names are checked above)."""
    bad = []
    for e in EDGES:
        if not e.in_function or e.target not in MODULES or _top(e.source) == "bench":
            continue
        lines = MODULES[e.source].read_text().splitlines()
        if "#" not in lines[e.line - 1] and "#" not in lines[e.line - 2]:
            bad.append(f"{e.source}:{e.line} imports {e.target}")
    assert not bad, f"{len(bad)} function-level imports without a reason: {bad}"


def test_the_architecture_doc_names_the_public_contract():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [m for m in PUBLIC_AGENT + ("topotrain.timing", "topocontract") if f"`{m}" not in doc]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_tag_takes_the_planner_and_strategies_as_arguments():
    """TAG (`topoctl.tag`) is an algorithm package like the others: it never imports the
    planner or the strategies (their registry, or a strategy module), at the top or inside
    a function; the ``tag`` strategy's registration and `topoctl tag train` pass the
    contexts and the other strategies' functions in (`topoctl.tag.kit`)."""
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES
           if _within(e.source, ("topoctl.tag",))
           and _within(e.target, ("topoctl.planner", "topoctl.strategies"))]
    assert any(_within(m, ("topoctl.tag",)) for m in MODULES)  # the package is walked
    assert not bad, bad
