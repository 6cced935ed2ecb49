"""The simulator's task DAG for a placed graph: `microbatches` copies of the graph, node i of
micro-batch m a Compute on its device (forward + backward), every edge between devices a
Transfer of its bytes over the network's route between the two hosts. Devices run ready tasks
in (micro-batch, node order) priority, so micro-batches pipeline through the placement.
O(microbatches * (n + E)) tasks."""

from __future__ import annotations

from topoctl.placement.problem import PlacementProblem
from topoctl.sim.tasks import Compute, Task, Transfer


def placed_tasks(p: PlacementProblem, assign: list[int], hosts: list[str]) -> list[Task]:
    """`hosts[d]`: the network node of device d."""
    preds = p.preds()
    tasks: list[Task] = []
    for m in range(p.microbatches):
        for j in range(len(p.nodes)):
            deps = []
            for i in preds[j]:
                if assign[i] == assign[j]:
                    deps.append(f"c{m}.{i}")
                else:
                    tid = f"t{m}.{i}.{j}"
                    tasks.append(Transfer(tid, hosts[assign[i]], hosts[assign[j]],
                                          p.edges[(i, j)], (f"c{m}.{i}",)))
                    deps.append(tid)
            tasks.append(Compute(f"c{m}.{j}", hosts[assign[j]], p.cost[j][assign[j]],
                                 tuple(deps)))
    return tasks
