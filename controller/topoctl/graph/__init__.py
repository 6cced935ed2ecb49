"""Model graphs: torch.fx capture with shapes, FLOPs and bytes per op (`capture`, `flops`),
per-op cost (`cost`: roofline or measured; `devices`: the roofline table), the job glue and
profile cache (`profile`, `cache`), coarsening and co-location for placement (`coarsen`)."""

from topoctl.graph.ops import Op, OpGraph

__all__ = ["Op", "OpGraph"]
