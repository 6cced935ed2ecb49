"""Plain-data op graph: what the planner knows about a model after capture."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Op:
    """One fx node. FLOPs count a multiply-add as 2. Bytes are for the captured batch.

    `kind` is the module class or function name in lower case (`linear`, `conv2d`, `matmul`,
    `add`, `view`, ...); `params` are the fully qualified parameter names this op owns (the
    gradients it produces in the backward pass); `inputs` name the producer ops (data-flow
    edges). `bwd_flops` is the backward pass of this op: grad of inputs plus grad of weights."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    out_shape: tuple[int, ...]
    flops: float
    bwd_flops: float
    in_bytes: int
    out_bytes: int
    param_bytes: int = 0
    params: tuple[tuple[str, int], ...] = ()  # (qualified name, bytes)
    # the module paths called around the op, outermost first (fx's module stack; a container
    # that is never called, a ModuleList, is not among them): operator fusion compiles modules
    scopes: tuple[str, ...] = ()

    @property
    def scope(self) -> str:
        """The innermost module the op runs in (its path; "" for the root)."""
        return self.scopes[-1] if self.scopes else ""

    @property
    def is_view(self) -> bool:
        """Whether the op only reshapes or views memory (no compute, no new activation)."""
        return self.kind in VIEW_KINDS


VIEW_KINDS = frozenset({"placeholder", "output", "view", "reshape", "permute", "transpose",
                        "flatten", "getitem", "size", "contiguous", "expand", "unsqueeze",
                        "squeeze", "get_attr", "getattr", "chunk", "split", "t"})


@dataclass
class OpGraph:
    """Ops in topological order (the fx order), for `batch` samples of dtype width `dtype_bytes`."""

    model: str
    batch: int
    dtype_bytes: int
    ops: list[Op] = field(default_factory=list)

    @property
    def flops(self) -> float:
        """Forward FLOPs of the whole graph per rank and iteration."""
        return sum(o.flops for o in self.ops)

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs of the whole graph."""
        return sum(o.bwd_flops for o in self.ops)

    @property
    def param_bytes(self) -> int:
        """Bytes of all parameters (= the gradient bytes an AllReduce carries)."""
        return sum(o.param_bytes for o in self.ops)

    def by_name(self) -> dict[str, Op]:
        """Op name -> op."""
        return {o.name: o for o in self.ops}

    def edges(self) -> list[tuple[str, str, int]]:
        """Data-flow edges (producer, consumer, bytes of the producer's output)."""
        ops = self.by_name()
        return [(i, o.name, ops[i].out_bytes) for o in self.ops for i in o.inputs if i in ops]

    def gradient_order(self) -> list[tuple[str, str, int]]:
        """(op, parameter, gradient bytes) in the order the backward pass produces them
        (reverse topological order): the order DDP-style buckets fill."""
        out = []
        for o in reversed(self.ops):
            if o.params:
                out += [(o.name, p, b) for p, b in reversed(o.params)]
        return out

    def to_dict(self) -> dict:
        """The graph as JSON-ready data (`from_dict` reads it back)."""
        return {"model": self.model, "batch": self.batch, "dtype_bytes": self.dtype_bytes,
                "ops": [o.__dict__ | {"inputs": list(o.inputs), "out_shape": list(o.out_shape),
                                      "params": [list(p) for p in o.params],
                                      "scopes": list(o.scopes)}
                        for o in self.ops]}

    @classmethod
    def from_dict(cls, d: dict) -> OpGraph:
        """The graph `to_dict` wrote."""
        ops = [Op(**(o | {"inputs": tuple(o["inputs"]), "out_shape": tuple(o["out_shape"]),
                          "params": tuple(tuple(p) for p in o["params"]),
                          "scopes": tuple(o.get("scopes", ()))}))
               for o in d["ops"]]
        return cls(d["model"], d["batch"], d["dtype_bytes"], ops)
