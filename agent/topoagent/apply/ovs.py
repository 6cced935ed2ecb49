"""The Open vSwitch part of check, diff and apply (the OVS driver's operations); observing it
is `topoagent.observe.ovs`.

Desired state = the `ovs` section plus every `qos` entry with `driver: ovs`:
- OVSDB (`drivers.ovsdb`): the agent's bridges (datapath type), ports (NICs as protected
  ports: the host routes, its bridge never switches between two NICs), internal ports, and per
  QoS port a linux-htb QoS (max-rate = link rate) with queue `id` per class (min-rate = rate,
  max-rate = ceil, burst = the agent's HTB token credit at the ceil, as the tc driver gives its
  classes: OVS's default of one frame starves a class of its rate whenever the kernel's timer
  runs late); HTB class 1:(id+1) carries queue `id`. One operation writes it all in one
  OVSDB transaction; its inverse writes the observed configuration back the same way.
- OpenFlow (`drivers.ofctl`): per bridge, the flows of the section (destination -> set_queue +
  output, or a select group over weighted next hops) plus, for each OVS class no flow names,
  `nw_dst=D -> set_queue, NORMAL`; one atomic bundle per bridge.
- The userspace datapath (datapath_type netdev, what runs without the kernel module) applies
  linux-htb but ignores set_queue: on its QoS ports the agent adds tc u32 destination filters
  (preference OVS_FILTER_PRIO) on the HTB qdisc OVS made, so the queues classify by
  destination anyway. `show` says which mechanism is in force per port.
Reading needs ovsdb-server (`Target.ovsdb`, default unix:/run/openvswitch/db.sock); a host
whose state has an `ovs` section and no reachable ovsdb-server is refused before any change.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import ClassVar

from topoagent.apply.kernel_ops import Op
from topoagent.drivers import ofctl
from topoagent.drivers.ovsdb import (
    BridgeConfig,
    DbConfig,
    OvsDb,
    PortConfig,
    PortQos,
    rundir,
)
from topoagent.observe.ovs import ObsOvs, tc_command
from topoagent.state.host import htb_credit
from topoagent.state.ovs import OVS_FILTER_PRIO, OVS_GROUP_BASE, OVS_HTB


def _nw(dst: str) -> str:
    return dst[:-3] if dst.endswith("/32") else dst


# --- desired -----------------------------------------------------------------------------------
def _queues(state) -> dict[str, list]:
    """OVS port -> its resolved classes (queue id = class id)."""
    return {q.dev: (q, q.resolved_classes()) for q in state.qos if q.driver == "ovs"}


def desired_db(state) -> DbConfig:
    """The OVSDB configuration the desired state asks for: bridges, ports and QoS queues."""
    cfg = DbConfig()
    if state.ovs is None:
        return cfg
    queues = _queues(state)
    mtus = {i.name: i.mtu for i in state.interfaces}
    for b in state.ovs.bridges:
        ports = []
        for p in b.ports:
            qos = None
            if p in queues:
                q, classes = queues[p]
                mtu = mtus.get(p) or 1500
                qos = PortQos(q.rate, tuple(sorted((c.id, c.rate, c.ceil,
                                                    8 * htb_credit(c.ceil, mtu))
                                                   for c in classes)))
            # protected: the bridge never switches frames between two NICs (the host routes;
            # on a direct fabric NORMAL would otherwise join all hosts' bridges into one
            # looping L2 domain and flood without end)
            ports.append((p, PortConfig(False, qos, protected=True)))
        ports += [(p, PortConfig(True, None)) for p in b.internal]
        cfg.bridges[b.name] = BridgeConfig(b.datapath_type, tuple(sorted(ports)))
    return cfg


def desired_openflow(state) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """bridge -> (flows, groups) in ovs-ofctl's canonical text."""
    out: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    if state.ovs is None:
        return out
    qid = {(dev, c.dst): c.id for dev, (_, cls) in _queues(state).items() for c in cls}

    def acts(port: str, dst: str, mac: str | None = None) -> str:
        a = [f"set_field:{mac}->eth_dst"] if mac else []
        if (port, dst) in qid:
            a.append(f"set_queue:{qid[(port, dst)]}")
        return ",".join(a + [f"output:{port}"])

    for b in state.ovs.bridges:
        flows, groups = set(), set()
        named = set()
        for i, f in enumerate(b.flows):
            match = f"priority={f.priority},ip,nw_dst={_nw(f.dst)}"
            named.add(f.dst)
            if f.output:
                flows.add(f"{match} actions={acts(f.output, f.dst)}")
                continue
            gid = OVS_GROUP_BASE + i + 1
            buckets = ",".join("bucket=" + (f"weight:{h.weight}," if h.weight != 1 else "")
                               + "actions=" + acts(h.port, f.dst, h.mac) for h in f.nexthops)
            groups.add(f"group_id={gid},type=select,{buckets}")
            flows.add(f"{match} actions=group:{gid}")
        for (port, dst), q in sorted(qid.items()):  # one id per dst (ovs_problems checks)
            if port in b.ports and dst not in named:
                flows.add(f"priority=100,ip,nw_dst={_nw(dst)} actions=set_queue:{q},NORMAL")
        out[b.name] = (frozenset(flows), frozenset(groups))
    return out


def desired_filters(state) -> dict[str, frozenset[tuple[str, str]]]:
    """netdev-bridge QoS port -> {(dst, HTB class)}: the tc stand-in for set_queue."""
    out: dict[str, frozenset[tuple[str, str]]] = {}
    if state.ovs is None:
        return out
    netdev = {p for b in state.ovs.bridges if b.datapath_type == "netdev" for p in b.ports}
    for dev, (_, classes) in _queues(state).items():
        if dev in netdev:
            out[dev] = frozenset((c.dst, f"1:{c.id + 1:x}") for c in classes)
    return out


# --- check and diff ----------------------------------------------------------------------------
def check_ovs(desired, ovs_obs: ObsOvs | None, db: str) -> list[tuple[str, str]]:
    """Problems (YAML path, message) that make the `ovs` section impossible on this host (e.g. no
    ovsdb-server)."""
    if desired.ovs is None:
        return []
    if ovs_obs is None:
        return [("ovs", f"no ovsdb-server answers at {db}: start Open vSwitch on this host "
                        "(or point the agent at it with --ovsdb), or drop the ovs section")]
    out = []
    snap = ovs_obs.snap
    for i, b in enumerate(desired.ovs.bridges):
        if snap.all_bridges.get(b.name) is False:
            out.append((f"ovs.bridges[{i}].name", f"bridge {b.name} exists and is not the "
                                                  "agent's (foreign bridges are left alone)"))
        for j, p in enumerate(b.ports):
            other = snap.all_ports.get(p)
            if other is not None and other != b.name and not snap.all_bridges.get(other):
                out.append((f"ovs.bridges[{i}].ports[{j}]", f"{p} is a port of foreign bridge "
                                                           f"{other}"))
    return out


def internal_ports(desired) -> set[str]:
    """Links the ovs section creates (they may not exist before the apply)."""
    return {p for b in desired.ovs.bridges for p in b.internal} if desired.ovs else set()


def diff_ovs(desired, ovs_obs: ObsOvs | None) -> list[Op]:
    """Operations taking the agent's OVS bridges, QoS, flows and filters to the desired state."""
    if ovs_obs is None:
        return []
    ops: list[Op] = []
    want = desired_db(desired)
    have = ovs_obs.snap.config
    db_changes = want.bridges != have.bridges
    if db_changes:
        ops.append(OvsDbWrite(ovs_obs.db, want, have))
    flows = desired_openflow(desired)
    for br in sorted(set(flows) | set(ovs_obs.openflow)):
        new = flows.get(br, (frozenset(), frozenset()))
        old = ovs_obs.openflow.get(br, (frozenset(), frozenset()))
        if br not in want.bridges:
            continue  # the bridge goes, with its flows and groups
        if new != old or (db_changes and br not in have.bridges):
            ops.append(OvsFlows(ovs_obs.db, br, new[0], new[1], old[0], old[1]))
    filters = desired_filters(desired)
    for dev in sorted(set(filters) | set(ovs_obs.filters)):
        new_f = filters.get(dev, frozenset())
        old_f = ovs_obs.filters.get(dev, frozenset())
        # a QoS rewrite makes OVS rebuild the qdisc, dropping filters: always re-add then
        if new_f != old_f or (db_changes and new_f):
            ops.append(OvsFilters(dev, new_f, old_f))
    return ops


def tx_offload_off(target, dev: str) -> None:
    """The userspace datapath does not fill in checksums a veth left to offload: TCP through
    the bridge stalls unless the NIC computes them in software (`ethtool -K dev tx off`)."""
    pre = ["ip", "netns", "exec", target.netns] if target.netns else []
    subprocess.run(pre + ["ethtool", "-K", dev, "tx", "off"], capture_output=True, timeout=30)


# --- operations --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class OvsDbWrite(Op):
    """The agent's whole OVSDB configuration, written in one transaction."""

    db: str
    new: DbConfig
    old: DbConfig

    @property
    def phase(self) -> str:  # type: ignore[override]
        """When the write runs: bridges only going away after addresses and routes, else first."""
        # only bridges going away: after the addresses and routes on their internal ports
        gone = set(self.old.bridges) - set(self.new.bridges)
        same = all(self.old.bridges.get(b) == c for b, c in self.new.bridges.items())
        return "ovs-db-del" if gone and same else "ovs-db"

    def apply(self, drv) -> None:
        client = OvsDb(self.db)
        try:
            client.write(self.new)
        finally:
            client.close()
        for bc in self.new.bridges.values():
            if bc.datapath_type == "netdev":
                for p, pc in bc.ports:
                    if not pc.internal:
                        tx_offload_off(drv.target, p)

    def inverse(self) -> Op:
        return OvsDbWrite(self.db, self.old, self.new)

    def describe(self) -> str:
        parts = []
        for name in sorted(set(self.new.bridges) | set(self.old.bridges)):
            n, o = self.new.bridges.get(name), self.old.bridges.get(name)
            if n is None:
                parts.append(f"delete bridge {name}")
            elif o is None:
                parts.append(f"add bridge {name} ({n.datapath_type}: "
                             + ", ".join(p for p, _ in n.ports) + ")")
            elif n != o:
                q = [p for p, c in n.ports if c.qos and c.qos != o.port_map().get(p,
                                                                                 PortConfig()).qos]
                parts.append(f"update bridge {name}" + (f" (queues on {', '.join(q)})"
                                                        if q else ""))
        return "ovsdb: " + "; ".join(parts)


@dataclass(frozen=True, eq=False)
class OvsFlows(Op):
    """Replace the agent's flows and groups on one bridge in one OpenFlow bundle."""

    phase: ClassVar[str] = "ovs-flows"
    db: str
    bridge: str
    flows: frozenset
    groups: frozenset
    old_flows: frozenset
    old_groups: frozenset

    def apply(self, drv) -> None:
        ofctl.replace(rundir(self.db), self.bridge, self.flows, self.groups, self.old_flows,
                      self.old_groups)

    def inverse(self) -> Op:
        return OvsFlows(self.db, self.bridge, self.old_flows, self.old_groups, self.flows,
                        self.groups)

    def describe(self) -> str:
        return (f"openflow {self.bridge}: {len(self.flows)} flows, {len(self.groups)} select "
                f"groups (were {len(self.old_flows)}, {len(self.old_groups)})")


@dataclass(frozen=True, eq=False)
class OvsFilters(Op):
    """tc u32 destination filters on the HTB qdisc OVS owns (userspace datapath)."""

    phase: ClassVar[str] = "ovs-filters"
    dev: str
    new: frozenset
    old: frozenset

    def apply(self, drv) -> None:
        t = drv.target
        subprocess.run(tc_command(t, "filter", "del", "dev", self.dev, "parent", OVS_HTB, "prio",
                           str(OVS_FILTER_PRIO), "protocol", "ip"), capture_output=True,
                       timeout=30)  # none there is fine
        for dst, flowid in sorted(self.new):
            p = subprocess.run(tc_command(t, "filter", "add", "dev", self.dev, "parent", OVS_HTB,
                                   "prio", str(OVS_FILTER_PRIO), "protocol", "ip", "u32",
                                   "match", "ip", "dst", dst, "flowid", flowid),
                               capture_output=True, text=True, timeout=30)
            if p.returncode != 0:
                raise RuntimeError(f"tc filter on {self.dev} to {dst}: {p.stderr.strip()}")

    def inverse(self) -> Op:
        return OvsFilters(self.dev, self.old, self.new)

    def describe(self) -> str:
        return (f"tc u32 on OVS htb {self.dev}: {len(self.new)} destination filters "
                f"(were {len(self.old)}; the userspace datapath ignores set_queue)")


# --- show: the observed state as HostState sections ----------------------------------------------


# every operation of this driver (the journal's settle step leaves these to their inverses)
OVS_OPS = (OvsDbWrite, OvsFlows, OvsFilters)
