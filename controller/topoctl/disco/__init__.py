"""DisCo: operator fusion and gradient buckets chosen together by a search (issue 35).

Pure functions over plain data, no I/O:
- `timeline`: the two-stream model of an iteration under a bucket partition, DDP's cap rule,
  MG-WFBP's merge and the exact optimum of the latency-bandwidth model (anchors);
- `search`: DisCo's best-first search with backtracking over (fusion option, partition);
- `autotune`: a Horovod-style Bayesian autotune of the fusion cap (an anchor);
- `fusion/`: the operator-fusion half, which regions of a model to compile as one and what a
  fused region costs (a cost model learned from regions measured on this CPU, `fusion/data/`).

The strategy (`topoctl.strategies.disco`) builds the inputs from a plan context and scores
candidates with the simulator.
"""
