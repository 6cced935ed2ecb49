"""Observing the agent's Open vSwitch state: the OVSDB rows it owns, its OpenFlow flows and
select groups, and the tc u32 filters it adds on the HTB qdisc OVS makes on netdev-datapath
ports (see `topoagent.apply.ovs` for why); read back as HostState sections (`observed_sections`)
and shown per port (`show_ovs`)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field

from topoagent.drivers import ofctl
from topoagent.drivers.ovsdb import DbSnapshot, OvsDb, OvsDbError, reachable, rundir
from topoagent.state.ovs import OVS_FILTER_PRIO, OVS_GROUP_BASE, OVS_HTB


# ----------------------------------------------------------------------------------
@dataclass
class ObsOvs:
    """The observed Open vSwitch state: the database snapshot, the agent's flows and groups, the tc
    filters."""

    db: str
    snap: DbSnapshot
    openflow: dict[str, tuple[frozenset[str], frozenset[str]]] = field(default_factory=dict)
    filters: dict[str, frozenset[tuple[str, str]]] = field(default_factory=dict)


def tc_command(target, *args: str) -> list[str]:
    """`tc ARGS` run inside the target's namespace."""
    pre = ["tc", "-n", target.netns] if target.netns else ["tc"]
    return pre + list(args)


def read_filters(target, dev: str) -> frozenset[tuple[str, str]]:
    """The agent's u32 filters on the HTB qdisc OVS made on `dev`, as (destination, class) pairs."""
    p = subprocess.run(tc_command(target, "-j", "filter", "show", "dev", dev, "parent", OVS_HTB),
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
            for q, lo, hi, _burst in pc.qos.queues:
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
                                       for q, lo, hi, _burst in pc.qos.queues]}
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
