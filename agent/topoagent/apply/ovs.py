"""The Open vSwitch part of observe, check, diff and apply (the OVS driver's operations).

Desired state = the `ovs` section plus every `qos` entry with `driver: ovs`:
- OVSDB (`drivers.ovsdb`): the agent's bridges (datapath type), ports (NICs as protected
  ports: the host routes, its bridge never switches between two NICs), internal ports, and per
  QoS port a linux-htb QoS (max-rate = link rate) with queue `id` per class (min-rate = rate,
  max-rate = ceil); HTB class 1:(id+1) carries queue `id`. One operation writes it all in one
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

import json
import subprocess
from dataclasses import dataclass, field
from typing import ClassVar

from topoagent.apply.kernel_ops import Op
from topoagent.drivers import ofctl
from topoagent.drivers.ovsdb import (
    BridgeConfig,
    DbConfig,
    DbSnapshot,
    OvsDb,
    OvsDbError,
    PortConfig,
    PortQos,
    reachable,
    rundir,
)
from topoagent.state.ovs import OVS_GROUP_BASE

OVS_FILTER_PRIO = 0x7470  # tc filter preference of the agent's u32 filters on OVS's HTB
OVS_HTB = "1:"  # the root handle OVS gives its linux-htb qdisc


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
    for b in state.ovs.bridges:
        ports = []
        for p in b.ports:
            qos = None
            if p in queues:
                q, classes = queues[p]
                qos = PortQos(q.rate, tuple(sorted((c.id, c.rate, c.ceil) for c in classes)))
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


# --- observed ----------------------------------------------------------------------------------
@dataclass
class ObsOvs:
    """The observed Open vSwitch state: the database snapshot, the agent's flows and groups, the tc
    filters."""

    db: str
    snap: DbSnapshot
    openflow: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    filters: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)


def _tc(target, *args: str) -> list[str]:
    pre = ["tc", "-n", target.netns] if target.netns else ["tc"]
    return pre + list(args)


def read_filters(target, dev: str) -> frozenset[tuple[str, str]]:
    """The agent's u32 filters on the HTB qdisc OVS made on `dev`, as (destination, class) pairs."""
    p = subprocess.run(_tc(target, "-j", "filter", "show", "dev", dev, "parent", OVS_HTB),
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0 or not p.stdout.strip():
        return frozenset()
    out = set()
    for f in json.loads(p.stdout):
        o = f.get("options", {})
        m = o.get("match")
        if f.get("pref") != OVS_FILTER_PRIO or not m or m.get("off") != 16 or "flowid" not in o:
            continue
        mask = int(m["mask"], 16)
        val = int(m["value"], 16)
        net = f"{(val >> 24) & 255}.{(val >> 16) & 255}.{(val >> 8) & 255}.{val & 255}" \
              f"/{bin(mask).count('1')}"
        out.add((net, o["flowid"]))
    return frozenset(out)


def observe_ovs(target) -> ObsOvs | None:
    """The agent's OVS state, or None when no ovsdb-server answers at `target.ovsdb`."""
    db = target.ovs_db
    if not reachable(db):
        return None
    try:
        client = OvsDb(db, timeout=5.0)
    except OvsDbError:
        return None
    try:
        snap = client.snapshot()
    finally:
        client.close()
    obs = ObsOvs(db, snap)
    rd = rundir(db)
    for name, bc in snap.config.bridges.items():
        obs.openflow[name] = ofctl.dump(rd, name)
        if bc.datapath_type == "netdev":
            for pname, pc in bc.ports:
                if pc.qos is not None:
                    obs.filters[pname] = read_filters(target, pname)
    return obs


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
        subprocess.run(_tc(t, "filter", "del", "dev", self.dev, "parent", OVS_HTB, "prio",
                           str(OVS_FILTER_PRIO), "protocol", "ip"), capture_output=True,
                       timeout=30)  # none there is fine
        for dst, flowid in sorted(self.new):
            p = subprocess.run(_tc(t, "filter", "add", "dev", self.dev, "parent", OVS_HTB,
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
def _flow_parts(flow: str) -> tuple[int, str, str] | None:
    """`priority=P,ip,nw_dst=D actions=A` (the form desired_openflow writes and ovs-ofctl prints
    back) -> (P, D as a network, A); None for any other flow."""
    match, sep, actions = flow.partition(" actions=")
    fields = dict(f.partition("=")[::2] for f in match.split(","))
    if not sep or set(fields) != {"priority", "ip", "nw_dst"}:
        return None
    dst = fields["nw_dst"]
    return int(fields["priority"]), dst if "/" in dst else f"{dst}/32", actions


def _out_actions(actions: str) -> tuple[str | None, int | None, str | None]:
    """`[set_field:MAC->eth_dst,][set_queue:Q,]output:PORT` -> (PORT, Q, MAC)."""
    port = queue = mac = None
    for a in actions.split(","):
        if a.startswith("output:"):
            port = a[len("output:"):].strip('"')
        elif a.startswith("set_queue:"):
            queue = int(a[len("set_queue:"):])
        elif a.startswith("set_field:") and a.endswith("->eth_dst"):
            mac = a[len("set_field:"):-len("->eth_dst")]
    return port, queue, mac


def _group_buckets(group: str) -> tuple[int, list[tuple[str | None, int, int | None, str | None]]]:
    """`group_id=G,type=select,bucket=[weight:W,]actions=...,...` -> (G, [(port, weight, queue,
    mac)])."""
    head, *buckets = group.split(",bucket=")
    gid = int(head.split(",", 1)[0].split("=", 1)[1])
    out = []
    for b in buckets:
        weight = 1
        if b.startswith("weight:"):
            w, _, b = b.partition(",")
            weight = int(w[len("weight:"):])
        port, queue, mac = _out_actions(b.removeprefix("actions="))
        out.append((port, weight, queue, mac))
    return gid, out


def observed_sections(ovs_obs: ObsOvs | None) -> tuple[dict | None, list[dict]]:
    """The agent's OVS state as HostState data: the `ovs` section and the `qos` entries with
    `driver: ovs` (one per port with a QoS), so that `topo-agent show` output applied again is
    a no-op. The inverse of desired_db / desired_openflow / desired_filters: a queue's
    destination comes from the tc filter on its class (userspace datapath), else from the flow
    that sets it (`output` or a select-group bucket), else from the bridge's
    `set_queue:Q,NORMAL` flow; a flow with a select group is put back at the position its group
    id encodes. Queues whose destination no flow or filter names are left out."""
    if ovs_obs is None:
        return None, []
    bridges, qos = [], []
    for name, bc in sorted(ovs_obs.snap.config.bridges.items()):
        flows, groups = ovs_obs.openflow.get(name, (frozenset(), frozenset()))
        buckets = dict(_group_buckets(g) for g in groups)
        dst_of: dict[tuple[str, int], str] = {}  # (port, queue) -> destination
        normal: dict[int, list[str]] = {}  # queue -> destinations of set_queue:Q,NORMAL flows
        outputs, grouped = [], {}
        for f in sorted(flows):
            parts = _flow_parts(f)
            if parts is None:
                continue
            prio, dst, actions = parts
            if actions.endswith(",NORMAL") and actions.startswith("set_queue:"):
                normal.setdefault(int(actions.split(",")[0][len("set_queue:"):]), []).append(dst)
            elif actions.startswith("group:"):
                gid = int(actions[len("group:"):])
                hops = []
                for port, weight, queue, mac in buckets.get(gid, []):
                    hops.append({"port": port, "weight": weight, **({"mac": mac} if mac else {})})
                    if queue is not None:
                        dst_of[(port, queue)] = dst
                grouped[gid - OVS_GROUP_BASE - 1] = {"dst": dst, "priority": prio,
                                                     "nexthops": hops}
            else:
                port, queue, _ = _out_actions(actions)
                outputs.append({"dst": dst, "priority": prio, "output": port})
                if queue is not None:
                    dst_of[(port, queue)] = dst
        ordered: list[dict] = []
        rest = iter(outputs)
        for i in range(max(grouped, default=-1) + 1):  # group flows where their ids say
            ordered.append(grouped[i] if i in grouped else next(rest, None))
        ordered = [f for f in ordered if f is not None] + list(rest)
        for f in ordered:
            if f["priority"] == 100:
                del f["priority"]
        ports = [p for p, pc in bc.ports if not pc.internal]
        internal = [p for p, pc in bc.ports if pc.internal]
        bridges.append({"name": name, "datapath_type": bc.datapath_type, "ports": ports,
                        **({"internal": internal} if internal else {}),
                        **({"flows": ordered} if ordered else {})})
        for pname, pc in bc.ports:
            if pc.qos is None:
                continue
            by_class = {cls: d for d, cls in ovs_obs.filters.get(pname, ())}
            classes = []
            for q, lo, hi in pc.qos.queues:
                dst = (by_class.get(f"1:{q + 1:x}") or dst_of.get((pname, q))
                       or (normal[q][0] if len(normal.get(q, [])) == 1 else None))
                if dst is not None:
                    classes.append({"id": q, "dst": dst, "rate": lo, "ceil": hi})
            qos.append({"dev": pname, "driver": "ovs", "rate": pc.qos.max_rate,
                        "classes": classes})
    return {"bridges": bridges}, qos


def show_ovs(ovs_obs: ObsOvs | None) -> dict | None:
    """What `topo-agent show` prints under `ovs_observed`: the agent's bridges, QoS queues,
    flows and groups, and per QoS port the classification mechanism in force."""
    if ovs_obs is None:
        return None
    out: dict = {"db": ovs_obs.db, "bridges": []}
    for name, bc in sorted(ovs_obs.snap.config.bridges.items()):
        flows, groups = ovs_obs.openflow.get(name, (frozenset(), frozenset()))
        ports = []
        for pname, pc in bc.ports:
            p: dict = {"name": pname, **({"internal": True} if pc.internal else {})}
            if pc.qos:
                p["qos"] = {"type": "linux-htb", "max_rate": pc.qos.max_rate,
                            "queues": [{"id": q, "min_rate": lo, "max_rate": hi}
                                       for q, lo, hi in pc.qos.queues]}
                p["classification"] = (
                    "tc u32 dst filters on the OVS htb (netdev datapath ignores set_queue)"
                    if bc.datapath_type == "netdev" else "openflow set_queue")
                if bc.datapath_type == "netdev":
                    p["tc_filters"] = [{"dst": d, "class": c}
                                       for d, c in sorted(ovs_obs.filters.get(pname, ()))]
            ports.append(p)
        out["bridges"].append({"name": name, "datapath_type": bc.datapath_type, "ports": ports,
                               "flows": sorted(flows), "groups": sorted(groups)})
    foreign = sorted(n for n, owned in ovs_obs.snap.all_bridges.items() if not owned)
    if foreign:
        out["foreign_bridges"] = foreign
    return out


# every operation of this driver (the journal's settle step leaves these to their inverses)
OVS_OPS = (OvsDbWrite, OvsFlows, OvsFilters)
