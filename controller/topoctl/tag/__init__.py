"""TAG: a tree search over where each op-group runs and how its gradients meet.

After Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment" (IEEE TPDS 2023; code: ylxdzsw/tag). Pure functions over plain data:

- `space`: the state/action space per op-group (replica set, sync kind, SFB, shares) restricted
  to what the runtime executes, the default completion of a partial state, the canonical plan of
  a complete state;
- `mcts`: Monte-Carlo tree search with PUCT over it (one level per op-group);
- `exhaustive`: every complete state, for checking the search on small cases;
- `gnn`: the joint-graph message-passing network that gives MCTS its prior (torch, imported
  lazily: planning with the uniform prior never imports torch).

The simulator-backed reward and the plan TAG emits live in `topoctl.strategies.tag`.
"""
