"""A fast YAML emitter for plan documents (PyYAML's emitter needs minutes for the ~10^6 routes
of a 1,024-host plan; this needs seconds). Block style for structure, flow style for small flat
mappings and lists (a route is one line). Only what plans contain: dicts with string keys,
lists, str, int, float, bool, None. Strings are plain only when YAML 1.1 (PyYAML) reads them
back as the same string (IPv4 and IPv6 addresses and prefixes, names); otherwise JSON
double-quoted, which YAML reads identically. O(size of the document)."""

from __future__ import annotations

import json
import math
import re

_IPV4ISH = re.compile(r"^\d{1,3}(\.\d{1,3}){3}(/\d{1,2})?$")
# IPv6 text (8 groups, or `::`) that YAML 1.1 cannot take for a sexagesimal number (a hex letter
# or `::` in it) and that neither starts nor ends with `:` (a flow mapping would end there); MAC
# addresses (6 groups) stay quoted
_IPV6ISH = re.compile(r"^(?!.*:$)(?=[0-9a-f:]*(::|[a-f]))[0-9a-f]{1,4}"
                      r"(?=(?:[0-9a-f:]*::|(?::[0-9a-f]{1,4}){7}(?:/|$)))(:[0-9a-f]{0,4}){1,7}"
                      r"(/\d{1,3})?$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
_NUMBERISH = re.compile(r"^[-+]?[0-9_.]*([eE][-+]?[0-9_]+)?$|^0[xob]", re.IGNORECASE)
_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "nan", "inf"}
_FLOW_MAX = 110


_CACHE: dict[str, str] = {}


def scalar(v) -> str:
    """A scalar as YAML text, quoted only where YAML needs it."""
    if type(v) is str:
        r = _CACHE.get(v)
        if r is None:
            r = _string(v)
            if len(_CACHE) < 1_000_000:
                _CACHE[v] = r
        return r
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        r = repr(v)
        if "e" in r and "." not in r.split("e")[0]:
            m, e = r.split("e")
            r = f"{m}.0e{e}"
        return r
    return _string(str(v))


def _string(s: str) -> str:
    if _IPV4ISH.match(s) or _IPV6ISH.match(s) or (_NAME.match(s) and s.lower() not in _WORDS
                             and not _NUMBERISH.match(s)):
        return s
    return json.dumps(s)


def _flat(v) -> bool:
    return not isinstance(v, (dict, list))


def _flow_map(v: dict) -> str | None:
    parts = []
    n = 2
    cache = _CACHE
    for k, x in v.items():
        tx = type(x)
        if tx is str:
            sx = cache.get(x) or scalar(x)
        elif tx is dict or tx is list:
            return None
        else:
            sx = scalar(x)
        p = (cache.get(k) or scalar(k)) + ": " + sx
        n += len(p) + 2
        if n > _FLOW_MAX:
            return None
        parts.append(p)
    return "{" + ", ".join(parts) + "}"


def _flow(v) -> str | None:
    """Flow form if `v` is a flat mapping/list (or a list of flat mappings) and short; gives up
    as soon as it is too long."""
    if type(v) is dict:
        return _flow_map(v)
    if type(v) is not list:
        return scalar(v)
    if len(v) > _FLOW_MAX // 3:
        return None
    parts = []
    n = 2
    for x in v:
        if type(x) is dict:
            p = _flow_map(x)
            if p is None:
                return None
        elif type(x) is list:
            return None
        else:
            p = scalar(x)
        n += len(p) + 2
        if n > _FLOW_MAX:
            return None
        parts.append(p)
    return "[" + ", ".join(parts) + "]"


def _emit(v, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(v, dict):
        for k, x in v.items():
            key = scalar(k)
            if _flat(x) or (not x):
                out.append(f"{pad}{key}: {_flow(x) if x == {} or x == [] else scalar(x)}")
                continue
            f = _flow(x) if isinstance(x, list) or len(x) <= 4 else None
            if f is not None:
                out.append(f"{pad}{key}: {f}")
            else:
                out.append(f"{pad}{key}:")
                _emit(x, indent + 2, out)
    elif isinstance(v, list):
        for x in v:
            if _flat(x):
                out.append(f"{pad}- {scalar(x)}")
                continue
            f = _flow(x)
            if f is not None:
                out.append(f"{pad}- {f}")
            elif isinstance(x, dict) and x:
                sub: list[str] = []
                _emit(x, indent + 2, sub)
                sub[0] = f"{pad}- {sub[0][indent + 2:]}"
                out += sub
            else:
                out.append(f"{pad}-")
                _emit(x, indent + 2, out)
    else:
        out.append(pad + scalar(v))


def dump(doc) -> str:
    """The document as YAML text (block style, small flat collections in flow style)."""
    out: list[str] = []
    _emit(doc, 0, out)
    return "\n".join(out) + "\n"
