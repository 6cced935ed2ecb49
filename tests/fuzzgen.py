"""Shared pieces of the fuzz suites (hypothesis): junk values, documents with junk at any
depth, the in-process CLI call and the one invariant every case asserts.

Invariant (README "No traceback on bad input", issue 11): a verb answers any input with a
documented exit code, never 70 (a bug) and never a traceback; an error is one
`topoctl: FILE: yaml.path: message` line per problem (usage errors: argparse's usage and
`topoctl VERB: error: ...`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from topoagent.cliutil import error_lines
from topoagent.protocol import EXIT_BUG, TopoError
from topoctl import cli as topoctl_cli

RANDOM = os.environ.get("TOPO_FUZZ_RANDOM") == "1"


def fuzz_settings(examples: int) -> settings:
    """Reproducible example sets (derandomized) unless TOPO_FUZZ_RANDOM=1; no deadline (the
    machine is shared), no health checks on slow or large generation."""
    return settings(max_examples=examples, deadline=None, derandomize=not RANDOM,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def junk() -> st.SearchStrategy:
    """Any YAML-representable value: scalars of every type, lists and mappings of them."""
    leaves = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
              | st.text(max_size=10))
    return st.recursive(leaves, lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)


def doc_paths(doc, prefix=()):
    """Every path to a value inside `doc`, containers included."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from doc_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from doc_paths(v, (*prefix, i))


@st.composite
def mutated(draw, base: st.SearchStrategy) -> dict:
    """A valid document with one to three values (at any depth) replaced by junk or deleted."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in doc_paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(junk())
    return doc


@functools.lru_cache(maxsize=1)
def _full_parser():
    """topoctl's real parser with every verb, built once: building it is ~60% of a cheap fuzz
    case."""
    return _build_parser()


def _parser(modules: list[str] | None = None):
    """`build_parser` for `main`: the full parser whatever verb modules the call asks for."""
    return _full_parser()


_build_parser = topoctl_cli.build_parser


def topoctl(argv: list[str]) -> tuple[int, str, str]:
    """`topoctl ARGV` in process (no interpreter start per case, the parser built once):
    (exit code, stdout, stderr); argparse's usage errors come back as their exit code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(topoctl_cli, "build_parser", _parser):
        try:
            rc = topoctl_cli.main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def assert_clean(argv: list[str], rc: int, err: str, codes: tuple[int, ...] = (0, 1),
                 names: str | None = None, out: str = "") -> None:
    """The invariant: a documented code, no traceback, errors as `topoctl...: ` lines (with
    --json: one error document on stdout, `out`); with `names`, an exit 1 must name that file
    (the input that was damaged)."""
    assert rc != EXIT_BUG and "Traceback" not in err + out, (argv, rc, err)
    assert rc in codes, (argv, rc, err)
    if rc != 1:
        return
    if "--json" in argv and out.strip().startswith("{"):
        doc = json.loads(out)
        assert doc.get("ok") is False and doc.get("problems"), (argv, out)
        err = "\n".join(error_lines("topoctl", TopoError(
            [(p["path"], p["message"]) for p in doc["problems"]], source=doc["source"] or "")))
    # "\n" only: a junk key may hold \x1e and the like, which str.splitlines splits on
    lines = [ln for ln in err.split("\n") if ln and not ln.startswith((" ", "usage:"))]
    assert lines and all(ln.startswith("topoctl") for ln in lines), (argv, err)
    if names is not None and "usage:" not in err:
        assert names in err, (argv, names, err)
