"""Fusion regions of an op graph: module subtrees the runtime compiles as one
(`topocontract.fusion`), chosen on the planner's side.

Why modules and not `graph.coarsen`'s op-groups: coarsening contracts any chain of ops (and
cheap neighbours) into a group, which is the right unit for placement, but such a group can
cross a module boundary (a ResNet block's last ReLU with the next block's first convolution),
and the runtime can only compile, in place and with its parameters' names kept, a module's
forward. So a region is a module; `choose_regions` cuts the module tree with coarsening's cap
(a node worth more than total / `parts` is split, gamma in `graph.coarsen`) and keeps what
fusion can use (at least two compute ops). An op-group of coarsening then lies inside one
region or across two neighbouring ones.

`choose_regions`: top-down from the root; a region costing more than total / `parts` is
replaced by its child modules when the children with two compute ops or more carry at least
half its cost (otherwise splitting would lose most of its fusion: a Sequential of single
layers, a block of one convolution each); regions with fewer than two compute ops are dropped.
Deterministic; O(ops x depth + regions x children)."""

from __future__ import annotations

from topocontract.fusion import inside, region_of
from topoctl.graph.cost import OpCost
from topoctl.graph.ops import OpGraph


def module_tree(graph: OpGraph, costs: dict[str, OpCost]
                ) -> tuple[dict[str, float], dict[str, int], dict[str, list[str]]]:
    """(module -> fwd+bwd seconds of its compute ops, module -> count of its compute ops,
    module -> its child modules that run compute ops, in model order)."""
    cost: dict[str, float] = {}
    count: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    for op in graph.ops:
        if op.is_view:
            continue
        c = costs.get(op.name, OpCost(0.0, 0.0))
        chain = ["", *op.scopes]  # the modules called around it, the root first
        for i, m in enumerate(chain):
            cost[m] = cost.get(m, 0.0) + c.fwd + c.bwd
            count[m] = count.get(m, 0) + 1
            kids = children.setdefault(m, [])
            if i + 1 < len(chain) and chain[i + 1] not in kids:
                kids.append(chain[i + 1])
    return cost, count, children


def choose_regions(graph: OpGraph, costs: dict[str, OpCost], parts: int = 8
                   ) -> tuple[str, ...]:
    """The regions of fusion mode ``groups`` (module paths in model order; the root never:
    that is mode ``whole``). Empty when the model has no module worth compiling alone."""
    cost, count, children = module_tree(graph, costs)
    if not cost:
        return ()
    cap = cost[""] / parts
    out, todo = [], [""]
    while todo:
        r = todo.pop(0)
        kids = children.get(r, [])
        fusable = sum(cost[k] for k in kids if count[k] >= 2)
        if r == "" or (cost[r] > cap and kids and fusable >= cost[r] / 2):
            todo = kids + todo  # children in model order, before the rest
        elif count[r] >= 2:
            out.append(r)
    return tuple(out)


def op_regions(graph: OpGraph, regions: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Op name -> the region it is compiled in, for the ops inside some region (views
    included: inductor folds them into the region's kernels). O(ops x regions)."""
    out = {}
    for op in graph.ops:
        if op.kind in ("placeholder", "output"):
            continue
        r = region_of(op.scope, regions)
        if r is not None:
            out[op.name] = r
    return out


def modules_with_ops(graph: OpGraph, min_ops: int = 2) -> list[str]:
    """Every module path running at least `min_ops` compute ops, in model order, the root
    first; a module running the same ops as its parent is left out (it is the same region):
    the regions the cost model is trained on."""
    _cost, count, _children = module_tree(graph, {})
    out = []
    for m in count:
        parent = m.rsplit(".", 1)[0] if "." in m else ""
        if count[m] >= min_ops and (m == "" or count[parent] != count[m]):
            out.append(m)
    return out


OP_FIELDS = ("kind", "flops", "bwd_flops", "in_bytes", "out_bytes", "param_bytes")


def region_ops(graph: OpGraph, region: str) -> list[dict]:
    """The ops of `graph` inside module `region` as plain data (`OP_FIELDS` and ``inputs``: the
    indices of their producers inside the region), in graph order: what the cost model reads
    (`topoctl.disco.fusion.model`). O(ops)."""
    ops = [o for o in graph.ops if o.kind not in ("placeholder", "output")
           and inside(o.scope, region)]
    index = {o.name: i for i, o in enumerate(ops)}
    return [{f: getattr(o, f) for f in OP_FIELDS}
            | {"inputs": [index[i] for i in o.inputs if i in index]} for o in ops]
