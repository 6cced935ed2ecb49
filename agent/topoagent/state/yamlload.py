"""The one YAML loader of both programs, with limits checked while the document is parsed.

A document is composed node by node from the parser's events (libyaml's when present), and the
composer counts as it goes, so a hostile document is refused before it costs anything:

- `MAX_NODES` values in all, aliases counted as the values they stand for (a 432-byte document
  of nested aliases stands for 10^8 values: every reader after the parser walks them all);
- `MAX_ALIASES` aliases; an alias inside the value it names (recursive) is refused;
- `MAX_DEPTH` levels of nesting;
- integers of at most `MAX_INT_DIGITS` digits (Python refuses to convert more than 4,300);
- numbers and booleans read the same in YAML 1.1 and 1.2, or are refused: PyYAML implements
  YAML 1.1, where `021450` (octal) and `2:30:00` (base 60) both mean 9000, `1_000` is 1000,
  `0b11` is 3 and `yes`/`no`/`on`/`off` are booleans; YAML 1.2 (and JSON, and most other
  tools) read those as other numbers or as text. Quoted, they are text.

Each refusal is an `InputLimit` with the YAML path of the value; `topoagent.state.host.load_yaml`
turns it into the StateError naming the file. The file itself is read by
`topoagent.state.host.read_text` (regular files and stdin only, at most `MAX_BYTES`)."""

from __future__ import annotations

import re

import yaml
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from topoagent.state.schema import yaml_path

MAX_BYTES = 16 * 2**20  # a HostState of 100,000 routes is about 6 MB
MAX_NODES = 1_000_000  # values, aliases expanded
MAX_ALIASES = 1_000
MAX_DEPTH = 64
MAX_INT_DIGITS = 64

INT_TAG, FLOAT_TAG, BOOL_TAG = (f"tag:yaml.org,2002:{t}" for t in ("int", "float", "bool"))
_CHECKED_TAGS = frozenset((INT_TAG, FLOAT_TAG, BOOL_TAG))  # the tags _scalar_problem reads
_INT_12 = re.compile(r"[-+]?(0|[1-9][0-9]*|0x[0-9a-fA-F]+)")  # YAML 1.2 core, as PyYAML reads
_OCTAL_11 = re.compile(r"[-+]?0[0-7_]+")
_BINARY_11 = re.compile(r"[-+]?0b[01_]+")

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: a 1,000-route state 10x faster


class InputLimit(Exception):
    """A document over a limit or in a form the loader refuses: `path` (YAML path) and
    `message`."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _int_problem(value: str) -> str | None:
    """Why an integer scalar is refused (None: it reads the same in YAML 1.1 and 1.2)."""
    digits = value.lstrip("+-")
    if len(digits) > MAX_INT_DIGITS:
        return f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})"
    if _INT_12.fullmatch(value):
        return None
    clean = value.replace("_", "")
    if ":" in value:
        return (f"{value} is a base-60 number in YAML 1.1 and text in YAML 1.2; quote it for "
                f"text, or write the number in decimal")
    if _BINARY_11.fullmatch(value):
        return f"{value} is binary in YAML 1.1 and text in YAML 1.2; write it in decimal"
    if _OCTAL_11.fullmatch(value):
        return (f"{value} is octal in YAML 1.1 ({int(clean, 8)}) "
                f"and decimal in YAML 1.2; write it without the leading zero, or quote it "
                f"for text")
    if "_" in value:
        return (f"{value} is {clean} in YAML 1.1 and text in YAML 1.2; write it without "
                f"underscores")
    return f"{value}: not an integer in YAML 1.2"


def _scalar_problem(tag: str, value: str) -> str | None:
    """Why a resolved scalar is refused, by its tag (int, float, bool)."""
    if tag == INT_TAG:
        return _int_problem(value)
    if tag == FLOAT_TAG and (":" in value or "_" in value):
        form = "base 60" if ":" in value else "underscores"
        return (f"{value} is a number in YAML 1.1 ({form}) and text in YAML 1.2; write the "
                f"number plainly, or quote it for text")
    if tag == BOOL_TAG and value.lower() not in ("true", "false"):
        return (f"{value} is a boolean in YAML 1.1 and text in YAML 1.2; write true or false, "
                f"or quote it for text")
    return None


class LimitedLoader(_Base):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader with the limits above; a duplicate key in a mapping is an error,
    not a silent last-wins. One document per stream."""

    def __init__(self, stream):
        super().__init__(stream)
        self.anchors: dict[str, Node] = {}
        self._open: set[int] = set()  # ids of the nodes being composed (recursion check)
        self._path: list = []
        self._nodes = 0
        self._aliases = 0
        self._tags: dict[tuple, str] = {}  # (scalar value, implicit) -> resolved tag

    # --- composing, counted --------------------------------------------------------------------
    def _where(self) -> str:
        if len(self._path) > 12:  # a refused depth: the way in is enough
            return yaml_path(tuple(self._path[:12])) + "..."
        return yaml_path(tuple(self._path))

    def _count(self, n: int) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise InputLimit(self._where(), f"more than {MAX_NODES} values (aliases counted as "
                                            f"the values they stand for)")

    def get_single_node(self):
        """The document's root node (None when empty); more than one document is an error."""
        self.get_event()  # stream start
        node = None
        if not self.check_event(StreamEndEvent):
            self.get_event()  # document start
            node = self.compose_node(None, None)
            self.get_event()  # document end
        if not self.check_event(StreamEndEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError("expected a single document in the stream",
                                              node.start_mark if node else None,
                                              "but found another document", event.start_mark)
        self.get_event()
        return node

    def compose_node(self, parent, index):
        """One node; an alias is the node it names, counted at its full size.

        The hot loop of every load (a 3-host plan is ~700 nodes): the next event is peeked
        once and dispatched on its class, and the path resolvers' descend/ascend are skipped
        when none is registered (they return at once then), so a node costs few Python calls;
        the checks and their order are those of PyYAML's composer plus the limits above."""
        event = self.peek_event()
        kind = event.__class__
        if kind is AliasEvent:
            return self._alias(self.get_event())
        if len(self._path) > MAX_DEPTH:
            raise InputLimit(self._where(), f"nested deeper than {MAX_DEPTH} levels")
        if event.anchor is not None and event.anchor in self.anchors:
            raise yaml.composer.ComposerError(
                "found duplicate anchor", self.anchors[event.anchor].start_mark,
                "second occurrence", event.start_mark)
        self._nodes += 1
        if self._nodes > MAX_NODES:
            self._count(0)
        resolving = bool(self.yaml_path_resolvers)
        if resolving:
            self.descend_resolver(parent, index)
        self.get_event()
        if kind is ScalarEvent:
            node = self._scalar(event)
        elif kind is SequenceStartEvent:
            node = self._sequence(event)
        else:
            node = self._mapping(event)
        if resolving:
            self.ascend_resolver()
        return node

    def _alias(self, event) -> Node:
        node = self.anchors.get(event.anchor)
        if node is None:
            raise yaml.composer.ComposerError(None, None, f"found undefined alias "
                                              f"{event.anchor!r}", event.start_mark)
        if id(node) in self._open:
            raise InputLimit(self._where(), f"alias *{event.anchor} is inside the value it "
                                            f"names (a recursive alias)")
        self._aliases += 1
        if self._aliases > MAX_ALIASES:
            raise InputLimit(self._where(), f"more than {MAX_ALIASES} aliases")
        self._count(node.topo_size)
        return node

    def _tag(self, kind: type, value, implicit) -> str:
        """The implicit tag of a node: PyYAML's resolver, remembered per (value, implicit) for
        scalars when no path resolver is registered (then the tag depends on nothing else, and
        a document repeats its keys and values many times)."""
        if kind is not ScalarNode or self.yaml_path_resolvers:
            return self.resolve(kind, value, implicit)
        key = (value, implicit)
        tag = self._tags.get(key)
        if tag is None:
            tag = self._tags[key] = self.resolve(kind, value, implicit)
        return tag

    def _scalar(self, event) -> ScalarNode:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self._tag(ScalarNode, event.value, event.implicit)
        if tag in _CHECKED_TAGS:
            problem = _scalar_problem(tag, event.value)
            if problem:
                raise InputLimit(self._where(), problem)
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
        node.topo_size = 1
        if event.anchor is not None:
            self.anchors[event.anchor] = node
        return node

    def _start(self, event, kind: type) -> Node:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolve(kind, None, event.implicit)
        node = kind(tag, [], event.start_mark, None, flow_style=event.flow_style)
        node.topo_size = 1
        if event.anchor is not None:
            self.anchors[event.anchor] = node
        self._open.add(id(node))
        return node

    def _end(self, node: Node) -> Node:
        node.end_mark = self.get_event().end_mark
        self._open.discard(id(node))
        return node

    def _sequence(self, event) -> SequenceNode:
        node = self._start(event, SequenceNode)
        path, items, compose, peek = self._path, node.value, self.compose_node, self.peek_event
        size = 1
        while peek().__class__ is not SequenceEndEvent:
            path.append(len(items))
            child = compose(node, len(items))
            path.pop()
            items.append(child)
            size += child.topo_size
        node.topo_size = size
        return self._end(node)

    def _mapping(self, event) -> MappingNode:
        node = self._start(event, MappingNode)
        path, pairs, compose, peek = self._path, node.value, self.compose_node, self.peek_event
        size = 1
        while peek().__class__ is not MappingEndEvent:
            key = compose(node, None)
            path.append(key.value if key.__class__ is ScalarNode else "?")
            value = compose(node, key)
            path.pop()
            pairs.append((key, value))
            size += key.topo_size + value.topo_size
        node.topo_size = size
        return self._end(node)

    # --- constructing --------------------------------------------------------------------------
    def construct_mapping(self, node, deep=False):
        """A mapping; a key given twice is an error naming it."""
        if isinstance(node, MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # unhashable key: the base constructor says so
                    continue
                if dup:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep)


def parse(text: str):
    """The one document of `text` as plain data; InputLimit or yaml.YAMLError when refused."""
    loader = LimitedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
