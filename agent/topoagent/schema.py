"""The schema base shared by the agent's HostState and the controller's cluster and job files.

`Model`: pydantic models that reject unknown keys and are immutable. `validation_problems`
turns a pydantic ValidationError into (YAML path, message) pairs, the shape every error of both
programs uses (`routes[3].nexthops[0].via: not an IPv4 address`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from topoagent.protocol import TopoError


class Model(BaseModel):
    """Base of every typed document: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


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
