"""Planned collectives as MSCCL programs (msccl-executor-nccl's XML), so that GPUs run the
schedule the plan scored instead of NCCL's own rings and trees.

`build.ProgramBuilder` turns per-rank steps with cross-thread-block dependencies into a
`topocontract.msccl.Program`; `ring` and `trees` are the AllReduce programs of the planner's
ring order and packed spanning trees. `topoctl export nccl` writes them; the executor's limits
are checked with `topocontract.msccl.check`."""
