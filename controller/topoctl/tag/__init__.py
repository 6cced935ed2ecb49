"""TAG: a tree search over where each op-group runs and how its gradients meet.

After Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment" (IEEE TPDS 2023; code: ylxdzsw/tag). TAG's one home; it never imports the planner
or the strategies registry (`kit`: the other strategies' functions are passed in).

The pure parts, over plain data:

- `space`: the state/action space per op-group (replica set, sync kind, SFB, shares) restricted
  to what the runtime executes, the default completion of a partial state, the canonical plan of
  a complete state;
- `mcts`: Monte-Carlo tree search with PUCT over it (one level per op-group); `mcmc`: FlexFlow's
  Metropolis-Hastings walk; `lookahead`: the rollout completions of a staged node;
- `exhaustive`: every complete state, for checking the search on small cases;
- `features`, `gnn`, `prior`: the joint graph and the message-passing network that gives MCTS
  its prior (torch, imported lazily: planning with the uniform prior never imports torch).

The driver, on a planner context and a `kit.Kit`:

- `problem`: op-groups, the job's space, the joint graph;
- `evaluator`: the simulator-backed reward (cached per plan);
- `budget`: the one budget, counted by default, a wall clock only when the job sets one;
- `seeds`: the other strategies' plans the search starts from;
- `search`: anchors, the tree, the walk (`walk`), `run_search`;
- `emit`: the plan TAG emits; `strategy`: `plan(ctx, kit)`, the ``tag`` strategy;
- `train`, `clusters`: self-play training of the prior (`topoctl tag train`).
"""
