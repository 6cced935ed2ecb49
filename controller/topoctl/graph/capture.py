"""Graph capture with torch.fx: symbolic trace + shape propagation on the `meta` device (no
memory, no compute), then per op its FLOPs, parameter bytes, activation bytes in/out and
data-flow edges. The backward pass is derived per op (`graph.flops.backward_flops`); gradient
bytes per parameter equal its bytes. O(nodes) after tracing."""

from __future__ import annotations

import functools
import importlib
import json
import math
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from topoagent.protocol import TopoError
from topoctl.catalog.build import build_model, make_inputs
from topoctl.catalog.registry import ENTRIES, InputSpec, resolve_params
from topoctl.graph.flops import backward_flops, forward_flops
from topoctl.graph.ops import VIEW_KINDS, Op, OpGraph

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CaptureError(TopoError, ValueError):
    """The model cannot be built, run or traced (the job's `model` section)."""


def _metas(meta: Any) -> list[TensorMetadata]:
    if isinstance(meta, TensorMetadata):
        return [meta]
    if isinstance(meta, (list, tuple)):
        return [m for x in meta for m in _metas(x)]
    return []


def _bytes(metas: list[TensorMetadata]) -> int:
    return sum(math.prod(m.shape) * m.dtype.itemsize for m in metas)


def _kind(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    if node.op == "call_module":
        return type(modules[node.target]).__name__.lower()
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target)).lower().strip("_")
    if node.op == "call_method":
        return str(node.target).lower()
    return node.op


def _attrs(node: fx.Node, modules: dict[str, nn.Module]) -> dict:
    if node.op != "call_module":
        return {}
    m = modules[node.target]
    out = {}
    for k in ("in_features", "in_channels", "groups", "kernel_size"):
        if hasattr(m, k):
            v = getattr(m, k)
            out[k] = tuple(v) if isinstance(v, (tuple, list)) else v
    out["bias"] = getattr(m, "bias", None) is not None
    return out


def _owned_params(node: fx.Node, gm: fx.GraphModule, seen: set[int]) -> list[tuple[str, int]]:
    if node.op == "call_module":
        items = list(gm.get_submodule(node.target).named_parameters(prefix=node.target))
    elif node.op == "get_attr":
        obj = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        items = [(str(node.target), obj)] if isinstance(obj, nn.Parameter) else []
    else:
        return []
    out = []
    for name, p in items:
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        out.append((name, p.numel() * p.dtype.itemsize))
    return out


class _WhereTracer(fx.Tracer):
    """A symbolic tracer that remembers which module it is inside and the last op it
    recorded, so a failed trace can name where it stopped (module path, class, last op)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.failed_in: str | None = None  # innermost module when the trace raised
        self.last: str | None = None

    def call_module(self, m, forward, args, kwargs):
        path = self.path_of_module(m)
        self.stack.append(f"{path or '<root>'} ({type(m).__name__})")
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.stack[-1]
            raise
        finally:
            self.stack.pop()

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        self.last = node.name
        return node

    def where(self) -> str:
        inside = self.failed_in or "the model's forward"
        return inside + (f", after op {self.last}" if self.last else "")


class _WhereProp(ShapeProp):
    """ShapeProp that remembers the node it is running (to name where the model failed)."""

    current: fx.Node | None = None

    def run_node(self, n: fx.Node):
        self.current = n
        return super().run_node(n)


def root_cause(e: BaseException) -> BaseException:
    """The exception under torch's wrappers (ShapeProp raises a RuntimeError of its own whose
    text is a node dump ending in "Original traceback: None"; the model's error is its
    cause)."""
    seen = set()
    while (e.__cause__ or e.__context__) is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return e


def input_failure(name: str, inputs: tuple[torch.Tensor, ...], node: fx.Node | None,
                  e: BaseException) -> str:
    """One readable line for a model that fails on its inputs: the inputs as given (per
    sample), the op it failed at (its module path or function) and the cause."""
    cause = root_cause(e)
    text = " ".join(str(cause).split()) or type(cause).__name__
    given = ", ".join(f"{tuple(t.shape[1:])} {str(t.dtype).removeprefix('torch.')}"
                      + (f" values {int(t.min())}..{int(t.max())}"
                         if t.device.type != "meta" and not t.dtype.is_floating_point
                         and t.numel() else "")
                      for t in inputs)
    where = ""
    if node is not None and node.op == "call_module":
        where = f" at module {node.target!r}"
    elif node is not None:
        what = node.target if isinstance(node.target, str) else getattr(
            node.target, "__name__", str(node.target))
        where = f" at op {node.name} ({what})"
    return (f"{name} cannot take the inputs model.inputs gives (per sample: {given}){where}: "
            f"{type(cause).__name__}: {text[:400]}")


def capture(model: nn.Module, inputs: tuple[torch.Tensor, ...], name: str = "model") -> OpGraph:
    """Trace `model` and propagate shapes of `inputs` (on any device; `meta` is cheapest)."""
    tracer = _WhereTracer()
    try:
        gm = fx.GraphModule(model, tracer.trace(model), type(model).__name__)
    except Exception as e:  # fx raises many types for untraceable control flow
        raise CaptureError(f"torch.fx cannot trace {name}: stopped in {tracer.where()}: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                           ) from None
    prop = _WhereProp(gm)
    try:
        prop.propagate(*inputs)
    except Exception as e:  # noqa: BLE001 - the model's own code raised: say what and where
        raise CaptureError([("inputs", input_failure(name, inputs, prop.current, e))]
                           ) from None
    modules = dict(gm.named_modules())
    out_bytes: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    seen: set[int] = set()
    ops = []
    batch = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 1
    dtype_bytes = 4
    for node in gm.graph.nodes:
        metas = _metas(node.meta.get("tensor_meta"))
        shape = tuple(metas[0].shape) if metas else ()
        kind = _kind(node, modules)
        ins = [a.name for a in node.all_input_nodes]
        params = _owned_params(node, gm, seen)
        if params:
            dtype_bytes = params[0][1] // max(1, math.prod(_param_shape(gm, params[0][0])))
        view = kind in VIEW_KINDS or node.op in ("placeholder", "output", "get_attr")
        ob = 0 if node.op == "output" else _bytes(metas)
        ib = sum(out_bytes.get(i, 0) for i in ins)
        f = 0.0 if view else forward_flops(kind, shape, [shapes.get(i, ()) for i in ins],
                                           _attrs(node, modules))
        pb = sum(b for _, b in params)
        ops.append(Op(name=node.name, kind=kind, inputs=tuple(ins), out_shape=shape, flops=f,
                      bwd_flops=backward_flops(f, pb > 0), in_bytes=ib, out_bytes=ob,
                      param_bytes=pb, params=tuple(params), scopes=_scopes(node)))
        out_bytes[node.name], shapes[node.name] = ob, shape
    return OpGraph(model=name, batch=batch, dtype_bytes=dtype_bytes, ops=ops)


def _scopes(node: fx.Node) -> tuple[str, ...]:
    """The module paths called around `node`, outermost first (fx records the module stack as
    it traces; operator fusion compiles modules, `topocontract.fusion`)."""
    return tuple(k for k in (node.meta.get("nn_module_stack") or {}) if k)


def _param_shape(gm: fx.GraphModule, qualified: str) -> tuple[int, ...]:
    return tuple(gm.get_parameter(qualified).shape)


def load_factory(path: str):
    """`pkg.module:callable` -> the callable; errors say which half is wrong."""
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise CaptureError(f"expected pkg.module:factory, got {path!r}")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise CaptureError(f"cannot import {mod_name}: {e}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise CaptureError(f"{mod_name} has no callable {attr}")
    return fn


def capture_catalog(name: str, params: dict, batch: int, dtype: str = "float32",
                    device: str = "meta") -> OpGraph:
    """Capture a catalog model for `batch` samples (per device) without allocating it.

    Remembered per (model, params, batch, dtype, device) for the process: one `topoctl plan`
    captures the same model at the same batch more than once (the context, then each timing
    of the lab's ranks and stages), and fx tracing plus shape propagation is the bulk of
    planning a small model. The caller gets its own OpGraph (ops are frozen)."""
    if name not in ENTRIES:
        raise CaptureError(f"unknown model {name!r} (catalog: {', '.join(ENTRIES)})")
    try:
        key = json.dumps(params, sort_keys=True)
        same = json.loads(key) == params
    except (TypeError, ValueError):
        same = False
    if not same:  # not plain JSON data (the key would not stand for it): capture afresh
        return _capture_catalog(name, params, batch, dtype, device)
    g = _captured(name, key, batch, dtype, device)
    return OpGraph(model=g.model, batch=g.batch, dtype_bytes=g.dtype_bytes, ops=list(g.ops))


@functools.lru_cache(maxsize=32)
def _captured(name: str, params_json: str, batch: int, dtype: str, device: str) -> OpGraph:
    return _capture_catalog(name, json.loads(params_json), batch, dtype, device)


def _capture_catalog(name: str, params: dict, batch: int, dtype: str, device: str) -> OpGraph:
    model = build_model(name, params, device).to(DTYPES[dtype])
    specs = [_typed(s, dtype) for s in ENTRIES[name].inputs(resolve_params(name, params))]
    return capture(model, make_inputs(specs, batch, device), name)


def capture_factory(path: str, specs: list[InputSpec], batch: int, dtype: str = "float32",
                    device: str = "meta", kwargs: dict | None = None) -> OpGraph:
    """Capture the module a `pkg.module:callable` factory returns (called with `kwargs`) at `batch`
    samples; CaptureError when it is no nn.Module or cannot be traced."""
    fn = load_factory(path)
    with torch.device(device):
        model = fn(**(kwargs or {}))
    if not isinstance(model, nn.Module):
        raise CaptureError(f"{path} returned {type(model).__name__}, not a torch.nn.Module")
    model = model.to(device).to(DTYPES[dtype])
    return capture(model, make_inputs([_typed(s, dtype) for s in specs], batch, device), path)


def _typed(s: InputSpec, dtype: str) -> InputSpec:
    return InputSpec(s.shape, dtype if s.dtype.startswith("float") else s.dtype, s.high)
