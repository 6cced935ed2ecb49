"""Event-driven simulation of one training iteration (or any task DAG) on a network.

Model (the level of TopoOpt's and TAG's simulators, with fair sharing instead of FIFO links):
- compute: one stream per device; a ready task runs when its device is free (ties: list order);
- communication: every transfer or collective step becomes a flow on its route (split over
  weighted multipaths); steps of one collective between the same two members use one
  connection and go in order (FIFO, as over gloo's/NCCL's per-peer connections), so a ring
  over uneven links pipelines instead of stalling; collectives that name a ``group`` (a
  process group) share one connection per pair, served in issue order (`sim.connections`:
  a collective's steps there wait until every one issued before it is done there); all
  flows in flight share links max-min
  fairly (`maxmin`), each
  (src, dst) aggregate also capped by `network.rate_caps`; a flow is delivered its path latency
  after its last byte leaves;
- devices in `network.cpu_pool` share its cores: a running compute task is then a fluid
  "flow" of CPU-seconds at most one core fast, all of them max-min fair over the cores
  (processor sharing, as the kernel schedules single-threaded processes); its device still
  runs one task at a time;
- with `network.cpu_pool.crowding` (`CpuPool`), a pooled compute task that is not
  ``Compute.communication`` gets through its CPU-seconds `network.crowded_cost` times slower
  while more CPU flows run than the pool has cores (it still takes its fair share of the
  cores: the rest is the caches refilled after the others ran); the runtimes' own CPU
  (``communication`` tasks, message CPU) is calibrated on the shared cores and is not slowed;
- with `network.cpu_pool.messages` (`CpuPool`: a collective runtime's CPU per message, the
  machine's calibration), every step of a collective between two pooled devices (unless the
  collective is ``own_cpu``) also costs its sender and its receiver `MessageCost.seconds` of
  its bytes, as CPU flows at each end on that device's communication thread (at most one
  core, ``("comm", dev)``; within the host's CPU quota when it has one) and the shared
  cores: first the per-message time (before the bytes go: posting, waking, the ring's
  lock-step), then the CPU per byte alongside the step's bytes; the step is delivered when
  its bytes and both ends' CPU are done (then its path latency). So every message costs the
  runtime's per-message time whatever its size (a ring round of a rank that sends one
  message and receives one: twice it, per bucket 2(n-1) rounds), and the communication the
  compute hides takes CPU from that compute when the cores are busy. The CPU for a step's
  bytes is spent as fast as the cores allow, not spread over the transfer (the same
  CPU-seconds, earlier); reduce adds and buffer copies are not charged;
- point-to-point transfers on a shaped network (`network.Link.credit`, the lab's HTB token
  credit): every credited link has a bucket, full at the start, that fills with the capacity
  its flows leave unused, up to the link's credit; a `Transfer` that starts passes at once
  as many bytes as every link of its path holds (taken from each), and only the rest flows.
  A collective's step empties the buckets of its path the same way but is not shortened:
  its runtime's own model charges the credit where it counts it (the tree runtime's,
  ``collective.trees.pipeline.predict`` through ``own_cpu`` collectives; gloo's ring steps
  run back to back and are not credited);
- a `Transfer` with a ``buffer`` (a socket's send buffer) also has a sender's part
  (`tasks.sent`), done as soon as at most ``buffer`` of its bytes are still to leave: a
  socket send returns once the kernel holds the rest, while the receiver waits for the last
  byte (the transfer itself);
- `network.speed` gives a device its compute rate (a host's `speed`): its tasks take
  duration / speed, and on a CPU pool its flows are capped at `speed` cores (the lab host's
  CPU quota) instead of one; a device of a host in `CpuPool.hosts` (several ranks under one
  quota) is instead capped at one core, and its host's devices together (compute and message
  CPU) at the host's quota, so a rank uses the share its idle host-mates leave;
- a task starts when all its dependencies are done (a collective's steps when their own step
  dependencies are delivered);
- a collective with ``member_done`` also completes each member's part (`tasks.member_done`)
  when every step that member sends or receives is delivered, so a rank's next task can wait
  for its own part only;
- a dependency on the previous iteration's task (`tasks.previous`) is ignored: one iteration
  runs from idle (`steady.steady_period` chains iterations and honours it);
- `SimResult.compute_time` is the busiest device's compute, tasks marked
  ``Compute.communication`` (a runtime's own CPU time) left out.
The rates are recomputed whenever the set of flows changes, so the result is exact for the
fluid model. Cost: O(E * (F + L)) with E events (completions at distinct times; a ring round in
which every member finishes together is one event), F flows in flight and L links.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from topoagent.protocol import TopoError
from topoctl.sim.connections import GroupConnections, connection_steps
from topoctl.sim.devices import split_device
from topoctl.sim.maxmin import maxmin_rates
from topoctl.sim.network import Network, crowded_cost, pool_host_quotas
from topoctl.sim.tasks import PREVIOUS, Collective, Compute, Task, Transfer, member_done, sent

_COMPUTE, _FLOW, _JOIN = 0, 1, 2


class SimError(TopoError, ValueError):
    """The tasks cannot run on the network (a transfer without a route, a cycle)."""


@dataclass
class SimResult:
    """Times in seconds. `exposed_comm` = iteration time not covered by the busiest device's
    compute; `comm_active` = time during which at least one flow was in flight."""

    iteration_time: float
    compute_time: float  # busiest device's total compute (`Compute.communication` left out)
    exposed_comm: float
    comm_active: float
    device_busy: dict[str, float] = field(default_factory=dict)
    link_bytes: dict[str, float] = field(default_factory=dict)
    link_utilisation: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)  # task id -> completion time
    start: dict[str, float] = field(default_factory=dict)  # task id -> time it became ready/ran
    # set when `iteration_time` is a steady-state period (`topoctl.sim.steady`): the time of
    # one iteration run alone, from idle devices to its last task
    isolated_iteration: float | None = None

    def breakdown(self) -> dict[str, float]:
        """Iteration time split into compute, exposed and active communication (seconds)."""
        return {"iteration_time": self.iteration_time, "compute": self.compute_time,
                "exposed_communication": self.exposed_comm, "communication_active":
                self.comm_active,
                "max_link_utilisation": max(self.link_utilisation.values(), default=0.0)} | (
                    {"isolated_iteration": self.isolated_iteration}
                    if self.isolated_iteration is not None else {})


_SHAPES: dict[tuple, tuple] = {}  # (steps tuple id, members) -> dependency structure (read-only)


class _Graph:
    """Tasks flattened to integer nodes: collective steps become flow nodes whose completion
    counts down their collective's join node (no per-step edges to the join)."""

    def __init__(self, tasks: Sequence[Task]):
        self.kind: list[int] = []
        self.label: list[str] = []  # task id (collective steps: their collective's id)
        self.device: dict[int, str] = {}
        self.duration: dict[int, float] = {}
        self.communication: set[int] = set()  # compute nodes that are a runtime's own time
        self.own_cpu: set[int] = set()  # join nodes of collectives that are `own_cpu`
        # join node of a collective with a process group -> (the group, its steps per pair)
        self.group: dict[int, tuple[str, dict[tuple[str, str], int]]] = {}
        self.src: list[str | None] = []
        self.dst: list[str | None] = []
        self.size: list[float] = []
        self.succ: list[list[int]] = []
        self.ndeps: list[int] = []
        self.owner: list[int] = []  # join node of a collective step, -1 otherwise
        self.offset: list[int] = []  # added to succ entries (collective steps: the first step)
        self.index: dict[str, int] = {}  # task id (and members' parts) -> node
        # transfer node with a ``buffer`` -> (its sender's part, `tasks.sent`; the buffer)
        self.sender_part: dict[int, tuple[int, float]] = {}
        index = self.index
        pending: list[tuple[int, tuple[str, ...], str]] = []
        for t in tasks:
            if t.id in index:  # (a member's part of a collective too)
                raise SimError(f"task id {t.id!r} used twice")
            if isinstance(t, Compute):
                n = self._add(_COMPUTE, t.id)
                self.device[n], self.duration[n] = t.device, t.duration
                if t.communication:
                    self.communication.add(n)
                pending.append((n, t.deps, t.id))
            elif isinstance(t, Transfer):
                n = self._add(_FLOW, t.id, t.src, t.dst, t.size)
                pending.append((n, t.deps, t.id))
                if t.buffer is not None:  # the sender's part: done by the engine (`_Run`)
                    part = sent(t.id)
                    if part in index:
                        raise SimError(f"task id {part!r} used twice")
                    k = self._add(_JOIN, part)
                    self.ndeps[k] = 1  # no dependency counts it down
                    index[part] = k
                    self.sender_part[n] = (k, max(0.0, float(t.buffer)))
            elif isinstance(t, Collective):
                n = self._collective(t, pending)
            else:
                raise SimError(f"unknown task type {type(t).__name__}")
            index[t.id] = n
        for n, deps, tid in pending:
            for d in deps:
                if d.startswith(PREVIOUS):  # the previous iteration's: done, from idle
                    continue
                if d not in index:
                    raise SimError(f"task {tid!r} depends on unknown task {d!r}")
                self.succ[index[d]].append(n)
                self.ndeps[n] += 1

    def name(self, node: int) -> str:
        if self.owner[node] >= 0:
            return f"{self.label[node]}/{node - self.offset[node]}"
        return self.label[node]

    def _add(self, kind: int, label, src: str | None = None, dst: str | None = None,
             size: float = 0.0) -> int:
        self.kind.append(kind)
        self.label.append(label)
        self.src.append(src)
        self.dst.append(dst)
        self.size.append(size)
        self.succ.append([])
        self.ndeps.append(0)
        self.owner.append(-1)
        self.offset.append(0)
        return len(self.kind) - 1

    def _collective(self, t: Collective, pending: list) -> int:
        sch = t.schedule
        steps = sch.steps
        m = len(steps)
        base = len(self.kind)
        join = base + m
        shape = _shape(steps, t.id, sch.members if t.member_done else None)
        _, succ_rel, roots, ndeps, srcs, dsts, sizes, parts = shape
        for i in roots:
            pending.append((base + i, t.deps, t.id))
        self.kind.extend([_FLOW] * m)
        self.label.extend([t.id] * m)
        self.offset.extend([base] * m)
        self.src.extend(srcs)
        self.dst.extend(dsts)
        scale = sch.scale
        self.size.extend(sizes if scale == 1.0 else [x * scale for x in sizes])
        self.succ.extend(succ_rel)  # relative to `offset`; shared by same-shaped collectives
        self.ndeps.extend(ndeps)
        self.owner.extend([join] * m)
        n = self._add(_JOIN, t.id)
        self.ndeps[n] = m
        if t.own_cpu:
            self.own_cpu.add(n)
        if t.group is not None:
            self.group[n] = (t.group, connection_steps(zip(srcs, dsts, strict=True)))
        if not m:
            pending.append((n, t.deps, t.id))
        # members' parts (join + 1 + k, as `_shape` numbered them): each waits for its steps
        for member, count in parts:
            part = member_done(t.id, member)
            if part in self.index:
                raise SimError(f"task id {part!r} used twice")
            k = self._add(_JOIN, part)
            self.ndeps[k] = count
            if not count:
                pending.append((k, t.deps, t.id))
            self.index[part] = k
        return n


def _shape(steps: tuple, cid: str, members: Sequence[str] | None) -> tuple:
    """The dependency structure of `steps`, relative to the collective's first node (cached
    per steps tuple: same-shaped collectives share it). With `members`, every step also counts
    down the part of its sender and receiver: node ``len(steps) + 1 + k`` for ``members[k]``;
    the last item lists (member, steps it takes part in)."""
    key = (id(steps), tuple(members) if members is not None else None)
    shape = _SHAPES.get(key)
    if shape is not None and shape[0] is steps:
        return shape
    m = len(steps)
    succ_rel: list[list[int]] = [[] for _ in range(m)]
    roots = []
    for i, s in enumerate(steps):
        for d in s.deps:
            if not 0 <= d < i:
                raise SimError(f"{cid}: step {i} depends on step {d} (not earlier)")
            succ_rel[d].append(i)
        if not s.deps:
            roots.append(i)
    parts: list[tuple[str, int]] = []
    if members is not None:
        slot = {x: m + 1 + k for k, x in enumerate(members)}
        count = dict.fromkeys(members, 0)
        for i, s in enumerate(steps):
            for x in dict.fromkeys((s.src, s.dst)):
                if x not in slot:
                    raise SimError(f"{cid}: step {i} {s.src}->{s.dst} leaves the members")
                succ_rel[i].append(slot[x])
                count[x] += 1
        parts = list(count.items())
    shape = (steps, succ_rel, roots, [len(s.deps) for s in steps], [s.src for s in steps],
             [s.dst for s in steps], [s.size for s in steps], parts)
    if len(_SHAPES) > 64:
        _SHAPES.clear()
    _SHAPES[key] = shape  # holds `steps`, so the id stays unique
    return shape


def simulate(tasks: Sequence[Task], network: Network, record: bool = True,
             memo: bool = True) -> SimResult:
    """Run the task DAG to completion on `network`; see the module docstring for the model.

    `record=False` skips per-task start/finish times (saves memory on large runs; collectives'
    and top-level tasks' finish times are always kept). `memo=False` recomputes every rate
    allocation (for testing the memo)."""
    run = _Run(_Graph(tasks), network, memo)
    run.run()
    return run.result(record)


def _messages(network: Network):
    """The pool's `MessageCost`, or None (no pool, or none)."""
    return network.cpu_pool.messages if network.cpu_pool is not None else None


def _crowding(network: Network) -> float:
    """The pool's `CpuPool.crowding` (0 without a pool)."""
    return float(network.cpu_pool.crowding) if network.cpu_pool is not None else 0.0


def _capacities(network: Network) -> tuple[dict, frozenset[str]]:
    """The capacity of everything flows share: the links, the (src, dst) rate caps (pseudo
    links ``("cap", src, dst)``) and, with a CPU pool, its cores (``("cores",)``), each
    pooled device's one core (``("core", dev)``), each shared host CPU quota
    (``("quota", host)``, `CpuPool.hosts`) and, when it prices messages, each pooled
    device's communication thread's (``("comm", dev)``); and the pooled devices."""
    capacity: dict = {k: ln.capacity for k, ln in network.links.items()}
    for k, v in network.rate_caps.items():
        capacity[("cap",) + k] = v
    pooled: frozenset[str] = frozenset()
    if network.cpu_pool is not None:
        pooled = network.cpu_pool.devices
        capacity[("cores",)] = float(max(1, network.cpu_pool.cores))
        quotas = pool_host_quotas(network.cpu_pool)
        for h, (q, _) in quotas.items():
            capacity[("quota", h)] = q
        for dev in pooled:  # one core, or the device's CPU quota (`Network.speed`)
            capacity[("core", dev)] = network.speed.get(dev, 1.0)
            host, index = split_device(dev)
            if host in quotas:  # a rank: one core within its host's quota (all its ranks: k)
                q, k = quotas[host]
                capacity[("core", dev)] = min(1.0 if index is not None else float(k), q)
            if _messages(network) is not None:
                capacity[("comm", dev)] = 1.0
    return capacity, pooled


class _Run:
    """One simulation in progress: the nodes' progress, the devices, the flows in flight and the
    pending events. `run` is the event loop; the other methods are its steps.

    The order of every operation and of every iteration (dicts, heaps, stacks) is part of the
    result: floating-point sums depend on it, and so do ties between simultaneous events."""

    def __init__(self, g: _Graph, network: Network, memo: bool):
        n = len(g.kind)
        self.g = g
        self.network = network
        self.memo = memo
        self.waiting = list(g.ndeps)  # dependencies not done yet, per node
        self.finish = [math.nan] * n  # NaN: not done yet
        self.start = [math.nan] * n
        self.capacity, self.pooled = _capacities(network)
        self.messages = _messages(network)
        self.crowding = _crowding(network)
        self.cores = network.cpu_pool.cores if network.cpu_pool is not None else 0
        # pooled devices sharing their host's CPU quota -> its pseudo link (`CpuPool.hosts`)
        quotas = pool_host_quotas(network.cpu_pool)
        self.host_quota: dict[str, tuple] = {
            d: (("quota", split_device(d)[0]),) for d in self.pooled
            if split_device(d)[0] in quotas}
        # a host node's compute task stands for all its ranks computing at once
        self.host_ranks = {h: k for h, (_, k) in quotas.items() if h in self.pooled}
        self.model_cpu: set[int] = set()  # flows of pooled model compute (`crowded_cost`)
        self.link_bytes = dict.fromkeys(network.links, 0.0)
        self.busy: dict[str, float] = {}
        self.compute_busy: dict[str, float] = {}  # the model's compute only (not `communication`)
        self.dev_queue: dict[str, list[int]] = {}  # ready compute nodes per device (a heap)
        self.dev_running: dict[str, int | None] = {}
        self.events: list[tuple[float, int, int]] = []  # (time, seq, node): completion/delivery
        self.seq = 0  # ties between events at the same time go in push order
        # flows in flight: fid -> [remaining, rate, size, node, latency, slack]; fid -> the links
        # (and pseudo links) it crosses
        self.flows: dict[int, list] = {}
        self.flow_links: dict[int, tuple] = {}
        # the same flows' paths as small integers (same order as `flows`), and how many
        # flows each path has in flight: the rate memo's key without hashing the paths
        self.flow_pid: dict[int, int] = {}
        self.path_id: dict[tuple, int] = {}
        self.in_flight: dict[int, int] = {}
        self.fid_counter = 0
        self.cpu_flows = 0  # flows that are pooled compute, not bytes
        self.subflows_left = [0] * n  # flows of a node still in flight
        self.now = 0.0
        self.comm_active = 0.0
        self.dirty = False  # the set of flows changed since the rates were computed
        self.done_stack: list[int] = []  # nodes done now whose successors are not yet released
        self.plans: dict[tuple, list] = {}  # (src, dst) -> `_route_plan`
        self.rate_memo: dict = {}  # multiset of path ids in flight -> rate per path id
        self.conn_queue: dict[tuple, deque] = {}  # busy connections -> steps waiting for them
        self.shared = GroupConnections()  # the connections of collectives with a group
        self.posted: set[int] = set()  # charged steps whose per-message CPU has started
        self.posting: set[int] = set()  # ... and is still running
        # token credit (`Link.credit`): link -> its bucket's size, what it holds (full: the
        # links idled before), and the bytes/s its flows use (at the last rate update)
        self.credit = {k: ln.credit for k, ln in network.links.items() if ln.credit > 0}
        self.tokens = dict(self.credit)
        self.load: dict[str, float] = {}
        # transfers whose sender's part waits: node -> (that part, buffer, its flow ids)
        self.sending: dict[int, tuple[int, float, list[int]]] = {}

    # --- the event loop --------------------------------------------------------------------------
    def run(self) -> None:
        """Release the nodes without dependencies, then advance from event to event (a flow's
        last byte, a timed completion or delivery) until nothing is in flight."""
        waiting = self.waiting
        for node in range(len(waiting)):
            if waiting[node] == 0:
                self.ready(node)
        while self.done_stack:
            self.complete(self.done_stack.pop())
        while self.flows or self.events:
            if self.dirty:
                self._update_rates()
            dt = self._next_step()
            finished = self._drain(dt)
            self.now += dt
            if self.sending:
                self._senders_done()
            self._end_flows(finished)
            self._deliver_events()

    def _update_rates(self) -> None:
        """Give every flow in flight its max-min fair rate."""
        # rates depend only on the set of paths in flight (max-min gives flows on the same path
        # the same rate), which repeats round after round in a collective: memoise
        key = frozenset(self.in_flight.items())  # the multiset of paths (their ids)
        by_path = self.rate_memo.get(key) if self.memo else None
        if by_path is None:
            rates = maxmin_rates(self.flow_links, self.capacity)
            by_path = {pid: rates[fid] for fid, pid in self.flow_pid.items()}
            if len(self.rate_memo) > 4096:
                self.rate_memo.clear()
            self.rate_memo[key] = by_path
        for f, pid in zip(self.flows.values(), self.flow_pid.values(), strict=True):
            f[1] = by_path[pid]
        if self.crowding and self.model_cpu and self.cpu_flows > self.cores:
            slow = crowded_cost(self.crowding, self.cpu_flows, self.cores)
            for fid in self.model_cpu:  # its share of the cores gets less of its work done
                self.flows[fid][1] /= slow
        self.dirty = False
        if self.credit:  # what the flows leave of each credited link fills its bucket
            load = dict.fromkeys(self.credit, 0.0)
            for f, p in zip(self.flows.values(), self.flow_links.values(), strict=True):
                for ln in p:
                    if ln in load:
                        load[ln] += f[1]
            self.load = load

    def _next_step(self) -> float:
        """Seconds to the next event: the first flow to finish at its rate, or the first
        pending event."""
        t_flow = min([f[0] / f[1] for f in self.flows.values() if f[1] > 0], default=math.inf)
        for _, buf, fids in self.sending.values():  # a sender's part when `buffer` remain
            rem, rate = self._to_send(fids)
            if rate > 0:
                t_flow = min(t_flow, max(0.0, rem - buf) / rate)
        t_event = self.events[0][0] - self.now if self.events else math.inf
        dt = min(t_flow, t_event)
        if dt == math.inf:
            raise SimError("deadlock: flows with zero rate and nothing else to do")
        return dt

    def _drain(self, dt: float) -> list[int]:
        """Move every flow on by `dt` seconds at its rate (and fill the credited links'
        buckets with what the flows leave); the flows that are done by then."""
        if self.credit:
            load, tokens, cap = self.load, self.tokens, self.capacity
            for ln, most in self.credit.items():
                if tokens[ln] < most:
                    tokens[ln] = min(most, tokens[ln] + max(0.0, cap[ln] - load.get(ln, 0.0)) * dt)
        if not self.flows:
            return []
        if len(self.flows) > self.cpu_flows:  # bytes in flight, not only pooled compute
            self.comm_active += dt
        finished = []
        for fid, f in self.flows.items():
            f[0] -= f[1] * dt
            if f[0] <= f[5]:  # relative and absolute slack for rounding (`_add_flow`)
                finished.append(fid)
        return finished

    def _end_flows(self, finished: list[int]) -> None:
        """Retire `finished` flows; a node whose last flow ended is delivered after its path's
        latency (at once without one)."""
        for fid in finished:
            f = self.flows.pop(fid)
            if self.flow_links.pop(fid)[-1] == ("cores",):
                self.cpu_flows -= 1
                self.model_cpu.discard(fid)
            pid = self.flow_pid.pop(fid)
            if self.in_flight[pid] == 1:
                del self.in_flight[pid]
            else:
                self.in_flight[pid] -= 1
            self.dirty = True
            node = f[3]
            self.subflows_left[node] -= 1
            if self.subflows_left[node] == 0 and node in self.posting:  # now its bytes
                self.posting.discard(node)
                self.send(node)
            elif self.subflows_left[node] == 0:
                self.release(node)
                if f[4] > 0:
                    self.push(self.now + f[4], node)
                else:
                    self.complete(node)

    def _senders_done(self) -> None:
        """Complete the sender's parts (`tasks.sent`) of transfers that have at most their
        buffer still to leave."""
        done = [node for node, (_, buf, fids) in self.sending.items()
                if self._handed_over(node, buf, self._to_send(fids)[0])]
        for node in done:
            self.complete(self.sending.pop(node)[0])

    def _deliver_events(self) -> None:
        """Complete the nodes whose events are due (a tolerance for rounding in `now`)."""
        events = self.events
        while events and events[0][0] <= self.now + 1e-12:
            _, _, node = heapq.heappop(events)
            self.complete(node)

    # --- nodes -----------------------------------------------------------------------------------
    def push(self, t: float, node: int) -> None:
        """Schedule `node` to complete at time `t`."""
        heapq.heappush(self.events, (t, self.seq, node))
        self.seq += 1

    def ready(self, node: int) -> None:
        """All of `node`'s dependencies are done: queue it on its device, send it, or (a join)
        complete it."""
        g = self.g
        k = g.kind[node]
        self.start[node] = self.now
        if k == _COMPUTE:
            dev = g.device[node]
            heapq.heappush(self.dev_queue.setdefault(dev, []), node)
            self.start_device(dev)
        elif k == _JOIN:
            self.done_stack.append(node)
        elif self._take_connection(node):
            self.send(node)

    def _take_connection(self, node: int) -> bool:
        """Whether flow node `node` may send now. A collective's steps between two members
        share one connection and go in order (FIFO): a step that finds it busy waits in its
        queue until `release`. Collectives of one process group share the connection, in
        issue order (`sim.connections`)."""
        g = self.g
        j = g.owner[node]
        if j < 0:
            return True
        grp = g.group.get(j)
        if grp is not None:
            self.shared.issue(j, *grp)
            return self.shared.take((grp[0], g.src[node], g.dst[node]), j, node)
        ck = (j, g.src[node], g.dst[node])
        q = self.conn_queue.get(ck)
        if q is not None:
            q.append(node)
            return False
        self.conn_queue[ck] = deque()
        return True

    def start_device(self, dev: str) -> None:
        """Run `dev`'s next ready task if it is idle: a timed event, or on a CPU pool a flow of
        CPU-seconds over its core and the shared cores."""
        q = self.dev_queue.get(dev)
        if self.dev_running.get(dev) is not None or not q:
            return
        g = self.g
        node = heapq.heappop(q)
        self.dev_running[dev] = node
        self.start[node] = self.now
        d = g.duration[node]
        rate = self.network.speed.get(dev)
        # busy time at the device's speed (its CPU quota on a pool): d CPU-seconds at speed 1
        wall = d if rate is None else d / rate
        self.busy[dev] = self.busy.get(dev, 0.0) + wall
        if node not in g.communication:
            self.compute_busy[dev] = self.compute_busy.get(dev, 0.0) + wall
        if dev in self.pooled and d > 0:  # CPU-seconds on the shared cores
            cpu = d * self.host_ranks.get(dev, 1)
            fid = self._add_flow(node, cpu, (("core", dev), *self.host_quota.get(dev, ()),
                                             ("cores",)), 0.0)
            if node not in g.communication:
                self.model_cpu.add(fid)
            self.subflows_left[node] = 1
            self.cpu_flows += 1
            self.dirty = True
        else:
            self.push(self.now + wall, node)

    def send(self, node: int) -> None:
        """Start flow node `node`'s bytes: one flow per path of its route with bytes to carry.
        With none (no bytes, or all paths empty) it is only delayed by the shortest latency.
        A step whose ends' CPU is charged (`_charge_cpu`) first spends the per-message time
        at both ends (`_end_flows` then sends it again), then its bytes go alongside the
        CPU its bytes cost each end."""
        g = self.g
        src, dst, size = g.src[node], g.dst[node], g.size[node]
        plan = self.plans.get((src, dst))
        if plan is None:
            plan = self.plans[(src, dst)] = _route_plan(self.network, src, dst, g.name(node))
        charge = size > 0 and self._charge_cpu(node) and any(p[1] for p in plan)
        if charge and node not in self.posted:  # the message's fixed CPU, at both ends
            self.posted.add(node)
            self.posting.add(node)
            self._cpu_flows(node, self.messages.per_message_s, 0.0)
            self.subflows_left[node] = 2
            return
        started = 0
        fids = []
        for frac, path, key, lat in plan:
            part = size * frac
            if part <= 0 or not path:
                continue
            for ln in path:
                self.link_bytes[ln] += part
            if self.credit:  # what the path's buckets hold passes at once (transfers)
                part -= self._spend_credit(path, part, g.owner[node] < 0)
                if part <= 1e-9 * size + 1e-6:
                    continue
            fids.append(self._add_flow(node, part, key, lat))
            started += 1
        if node in g.sender_part:
            self._sender_part(node, fids)
        if started and charge:  # each end's CPU for the bytes, while they travel
            self._cpu_flows(node, size / self.messages.bytes_per_s, min(p[3] for p in plan))
            started += 2
        if started:
            self.subflows_left[node] = started
            self.dirty = True
            return
        self.release(node)
        lat = min((p[3] for p in plan), default=0.0)
        if lat > 0:
            self.push(self.now + lat, node)
        else:
            self.done_stack.append(node)

    def _spend_credit(self, path: tuple, nbytes: float, grant: bool) -> float:
        """Take up to `nbytes` from the token buckets of every link of `path` (as much as the
        emptiest holds; nothing when a link has no credit); the bytes that pass at once: those
        with `grant` (a point-to-point transfer), else none (module docstring)."""
        tokens = self.tokens
        c = min(nbytes, min((tokens.get(ln, 0.0) for ln in path), default=0.0))
        if c <= 0:
            return 0.0
        for ln in path:
            tokens[ln] -= c
        return c if grant else 0.0

    def _sender_part(self, node: int, fids: list[int]) -> None:
        """Transfer `node` started with flows `fids`: its sender's part is done now if at most
        its buffer is still to leave, else when that much is left (`_senders_done`)."""
        k, buf = self.g.sender_part[node]
        if self._handed_over(node, buf, self._to_send(fids)[0]):
            self.done_stack.append(k)
        else:
            self.sending[node] = (k, buf, fids)

    def _to_send(self, fids: list[int]) -> tuple[float, float]:
        """(bytes still in flight, their rate) over a transfer's flows `fids` (ended ones: 0)."""
        rem = rate = 0.0
        for fid in fids:
            f = self.flows.get(fid)
            if f is not None:
                rem, rate = rem + f[0], rate + f[1]
        return rem, rate

    def _handed_over(self, node: int, buf: float, rem: float) -> bool:
        """Whether transfer `node`'s sender is done: at most its `buf` bytes (the socket's send
        buffer) are still to leave (with `_add_flow`'s slack for rounding)."""
        return rem <= buf + 1e-9 * self.g.size[node] + 1e-6

    def _cpu_flows(self, node: int, seconds: float, latency: float) -> None:
        """Two flows of `seconds` CPU-seconds for step `node`: its sender's and its receiver's,
        each on that device's communication thread (and CPU quota) and the shared cores."""
        for end in (self.g.src[node], self.g.dst[node]):
            # the rank's own CPU quota, or its host's that its host-mates share
            quota = self.host_quota.get(end) or (
                (("core", end),) if end in self.network.speed else ())
            self._add_flow(node, seconds, (("comm", end), *quota, ("cores",)), latency)
        self.cpu_flows += 2
        self.dirty = True

    def _charge_cpu(self, node: int) -> bool:
        """Whether flow node `node` costs its ends' CPU (`CpuPool.messages`): a step of a
        collective that is not ``own_cpu`` between two pooled devices."""
        g = self.g
        return (self.messages is not None and g.owner[node] >= 0
                and g.owner[node] not in g.own_cpu and g.src[node] != g.dst[node]
                and g.src[node] in self.pooled and g.dst[node] in self.pooled)

    def _add_flow(self, node: int, size: float, links: tuple, latency: float) -> int:
        """A new flow in flight for `node`: `size` to carry over `links`, delivered `latency`
        after its last byte; its id."""
        self.fid_counter += 1
        fid = self.fid_counter
        # [remaining, rate, size, node, latency, done when remaining <= this]
        self.flows[fid] = [size, 0.0, size, node, latency, 1e-9 * size + 1e-6]
        self.flow_links[fid] = links
        pid = self.path_id.get(links)
        if pid is None:
            pid = self.path_id[links] = len(self.path_id)
        self.flow_pid[fid] = pid
        self.in_flight[pid] = self.in_flight.get(pid, 0) + 1
        return fid

    def release(self, node: int) -> None:
        """The node's last byte left: its connection takes the next queued step."""
        g = self.g
        j = g.owner[node]
        grp = g.group.get(j) if j >= 0 else None
        if grp is not None:
            nxt = self.shared.release((grp[0], g.src[node], g.dst[node]), j)
            if nxt is not None:
                self.send(nxt)
        elif j >= 0:
            ck = (j, g.src[node], g.dst[node])
            q = self.conn_queue[ck]
            if q:
                self.send(q.popleft())
            else:
                del self.conn_queue[ck]

    def complete(self, node: int) -> None:
        """`node` is done now: finish it and everything that completes with it (joins, nodes
        without time of their own), releasing the successors that no longer wait."""
        g, finish, waiting, done_stack = self.g, self.finish, self.waiting, self.done_stack
        succ, owner, kind, offset = g.succ, g.owner, g.kind, g.offset
        done_stack.append(node)
        while done_stack:
            x = done_stack.pop()
            if finish[x] == finish[x]:  # not NaN: already done
                continue
            finish[x] = self.now
            if kind[x] == _COMPUTE:
                dev = g.device[x]
                self.dev_running[dev] = None
                self.start_device(dev)
            b = offset[x]
            for s in succ[x]:
                s += b
                waiting[s] -= 1
                if waiting[s] == 0:
                    self.ready(s)
            j = owner[x]
            if j >= 0:  # a collective step counts down its collective's join
                waiting[j] -= 1
                if waiting[j] == 0:
                    self.ready(j)

    # --- the result ------------------------------------------------------------------------------
    def result(self, record: bool) -> SimResult:
        """The `SimResult` of a finished run; SimError if some node never ran."""
        g, finish, n = self.g, self.finish, len(self.finish)
        unfinished = [g.name(i) for i in range(n) if math.isnan(finish[i])]
        if unfinished:
            raise SimError(f"tasks never ran (dependency cycle?): {', '.join(unfinished[:5])}")
        total = max(finish, default=0.0)
        compute = max(self.compute_busy.values(), default=0.0)
        links = self.network.links
        util = {k: (b / (links[k].capacity * total) if total > 0 else 0.0)
                for k, b in self.link_bytes.items()}
        top = {tid: finish[i] for tid, i in g.index.items()}
        started = {tid: self.start[i] for tid, i in g.index.items()}
        res = SimResult(total, compute, max(0.0, total - compute), self.comm_active, self.busy,
                        self.link_bytes, util, top, started)
        if record:
            res.finish = {g.name(i): finish[i] for i in range(n)} | top
        return res


def _route_plan(network: Network, src: str, dst: str, what: str) -> list:
    """[(fraction of the bytes, path, links incl. the rate-cap pseudo link, latency)]."""
    try:
        routes = network.routes(src, dst)
    except LookupError as e:
        raise SimError(f"{what}: {e}") from None
    wsum = sum(w for w, _ in routes) or 1.0
    # a device's traffic counts in its host's per-destination cap (`sim.devices`)
    hs, hd = split_device(src)[0], split_device(dst)[0]
    cap = (("cap", hs, hd),) if (hs, hd) in network.rate_caps else ()
    return [(w / wsum, path, (path + cap) if path else (), network.latency(path))
            for w, path in routes]
