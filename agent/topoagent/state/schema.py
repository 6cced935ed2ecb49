"""The schema base shared by the agent's HostState and the controller's cluster and job files.

`Model`: pydantic models that reject unknown keys and are immutable. `validation_problems`
turns a pydantic ValidationError into (YAML path, message) pairs, the shape every error of both
programs uses (`routes[3].nexthops[0].via: not an IPv4 address`).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from topoagent.protocol import TopoError


class FieldProblems(TopoError, ValueError):
    """Problems found by a model-level validator, each under its field's path (a ValueError,
    so pydantic reports it like any other validation error)."""


class Model(BaseModel):
    """Base of every typed document: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_as_number(cls, data: Any) -> Any:
        """`true` where a number or a name is expected is an error (pydantic's lax mode would
        read it as 1); nested models check their own fields."""
        if not isinstance(data, dict):
            return data
        problems = []
        for name, field in cls.model_fields.items():
            key = field.alias if field.alias in data else name
            if key in data and _has_bool(data[key]) and not _allows_bool(field.annotation):
                problems.append((key, "expected a number or text, not true/false"))
        if problems:
            raise FieldProblems(problems)
        return data


def _has_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_bool(x) for x in v)
    if isinstance(v, dict):
        return any(_has_bool(x) for x in v.values()) or any(isinstance(k, bool) for k in v)
    return False


def _allows_bool(t: Any) -> bool:
    """Whether type annotation `t` accepts booleans somewhere (bool itself, Any, or a model,
    which validates its own fields)."""
    if t is bool or t is Any or t is object:
        return True
    if isinstance(t, type):
        return issubclass(t, BaseModel)
    if isinstance(t, str):
        return True  # an unresolved forward reference: do not guess
    args = typing.get_args(t)
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return _allows_bool(args[0])
    if origin in (typing.Union, types.UnionType) or args:
        return any(_allows_bool(a) for a in args)
    return False


def yaml_path(loc: tuple) -> str:
    """('routes', 3, 'nexthops', 0, 'via') -> 'routes[3].nexthops[0].via'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "from_":
            out += ".from"
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_problems(err: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """Every error of `err` as (YAML path under `prefix`, message); a TopoError raised inside a
    validator contributes its own problems below the validator's path."""
    out = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and "[" in p)]  # drop union tags
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        ctx_err = e.get("ctx", {}).get("error")
        if isinstance(ctx_err, TopoError):
            base = ".".join(filter(None, [prefix, yaml_path(tuple(loc))]))
            out += [(".".join(filter(None, [base, p])) if p else base, m)
                    for p, m in ctx_err.problems]
            continue
        path = yaml_path(tuple(loc))
        out.append((".".join(filter(None, [prefix, path])), msg))
    return out
