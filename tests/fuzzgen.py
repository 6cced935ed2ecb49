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

import yaml
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


@functools.lru_cache(maxsize=1)
def junk() -> st.SearchStrategy:
    """Any YAML-representable value: scalars of every type, lists and mappings of them. One
    strategy object, built once: a new `st.recursive` per draw was validated afresh each time
    (about a third of a `mutated` case's CPU); the values drawn are the same."""
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
    """A valid document with one to three values (at any depth) replaced by junk or deleted
    (`structural` empties or repeats a part instead)."""
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


@st.composite
def structural(draw, base: st.SearchStrategy) -> dict:
    """A valid document with one list or mapping (at any depth) emptied, or one list entry
    given twice: the shapes a schema accepts and code behind it may not expect (`hosts: []`,
    `command: []`, a host or a cable listed twice)."""
    doc = copy.deepcopy(draw(base))
    paths = [p for p in doc_paths(doc) if p and isinstance(_at(doc, p), (list, dict))]
    if not paths:
        return doc
    path = draw(st.sampled_from(paths))
    parent, value = _at(doc, path[:-1]), _at(doc, path)
    if isinstance(value, list) and value and draw(st.booleans()):
        value.append(copy.deepcopy(draw(st.sampled_from(value))))
    else:
        parent[path[-1]] = type(value)()
    return doc


def _at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _laughs(levels: int) -> str:
    """Nested aliases: about 40 bytes a level, 10**levels values."""
    items = ["&b0 [" + ",".join(["1"] * 10) + "]"]
    items += [f"&b{i} [" + ",".join([f"*b{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


# Values of the families the YAML loader refuses (topoagent.state.yamlload), as flow YAML that
# can stand for any value: nested aliases, a recursive alias, deep nesting, huge integers,
# numbers and booleans YAML 1.1 and 1.2 read differently, an undefined alias
HOSTILE_VALUES = [_laughs(7), _laughs(9), "&r [1, *r]", "&m {a: *m}", "[" * 80 + "]" * 80,
                  "9" * 4400, "-" + "1" * 70, "021450", "2:30:00", "1_500", "0b1010", "1:30.5",
                  "yes", "Off", "on", "*nosuch"]
_SLOT = "topoctl-fuzz-slot"


@st.composite
def hostile(draw, base: st.SearchStrategy) -> bytes:
    """A valid document (as YAML bytes) with one value at any depth replaced by one of
    HOSTILE_VALUES: the loader must refuse it naming the file, whatever the place."""
    doc = copy.deepcopy(draw(base))
    paths = [p for p in doc_paths(doc) if p]
    value = draw(st.sampled_from(HOSTILE_VALUES))
    if not paths:
        return value.encode()
    path = draw(st.sampled_from(paths))
    _at(doc, path[:-1])[path[-1]] = _SLOT
    return yaml.dump(doc, Dumper=_DUMPER, sort_keys=False).replace(_SLOT, value).encode()


# libyaml's emitter: the same bytes as yaml.safe_dump's pure-Python one on these documents
# (checked on the small plan, the 8-host plan and 3,000 generated clusters and jobs), ~10x
# less CPU per case
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


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
