"""The simulator: one event-driven model that scores every strategy.

- `maxmin`: max-min fair rates of flows over capacitated links (progressive filling).
- `network`: `Network` = directed links with capacity (bytes/s) and latency, a router giving
  weighted paths between two nodes, per-(src, dst) rate caps (QoS ceilings).
- `schedules`: the collective interface (simulated schedules; the runtime collectives are
  `topotrain.collectives`). A collective is a `Schedule`: point-to-point `Step`s
  (src, dst, bytes) with dependencies between steps. Ring AllReduce is one implementation; tree
  schedules plug in by returning a `Schedule` too.
- `tasks`: what a strategy hands the engine: `Compute` (a device busy for a duration),
  `Transfer` (bytes from a node to a node), `Collective` (a Schedule), each with dependencies.
- `engine.simulate(tasks, network)` -> `SimResult` (iteration time, breakdown, link use).
- `steady.steady_period(tasks, network)`: iterations back to back, each rank starting the next
  when its own part is done (collectives with `member_done`): the training period.
- `routing` (hop-count shortest paths over a cluster fabric, next-hop matrix) and `fabric`
  (a `Network` built from a cluster fabric and a routing).
"""

from topoctl.sim.engine import SimResult, simulate
from topoctl.sim.maxmin import maxmin_rates
from topoctl.sim.network import Link, Network
from topoctl.sim.schedules import Schedule, Step, ring_allreduce
from topoctl.sim.tasks import Collective, Compute, Transfer

__all__ = ["Collective", "Compute", "Link", "Network", "Schedule", "SimResult", "Step",
           "Transfer", "maxmin_rates", "ring_allreduce", "simulate"]
