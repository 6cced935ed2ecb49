"""Model graphs: torch.fx capture with shapes, FLOPs and bytes per op (`capture`), per-op cost
(`cost`: roofline or measured), the profile cache (`cache`)."""

from topoctl.graph.ops import Op, OpGraph

__all__ = ["Op", "OpGraph"]
