"""A rendered HostState moved onto Open vSwitch, for hosts the cluster marks `ovs: true`.

The host's cabled NICs become ports of one bridge (`BRIDGE`, userspace datapath: the only one
without the kernel module, as in the lab), and an internal port (`INTERNAL`) takes over their
fabric addresses; routes, policy-routing multipath and rp_filter that named a NIC name the
internal port (the kernel still picks the next hop's gateway; OVS's NORMAL action sends each
frame out the port where that gateway's MAC was learned). Per-destination QoS becomes OVS
queues on the same NICs (`driver: ovs`); the agent adds set_queue flows and, on the userspace
datapath, the equivalent tc filters. Pure; O(size of the state)."""

from __future__ import annotations

BRIDGE = "tpbr0"
INTERNAL = "tpovs0"


def ovs_host(state: dict, datapath_type: str = "netdev") -> dict:
    """The same host behind OVS (a new dict; `state` is not modified)."""
    nics = [i["name"] for i in state.get("interfaces", []) if i["name"] != "lo"]
    if not nics:
        return state
    out = dict(state)
    addrs, mtu, dad = [], None, None
    ifaces = []
    for i in state.get("interfaces", []):
        if i["name"] in nics:
            addrs += i.get("addresses", [])
            mtu = i.get("mtu", mtu)
            dad = i.get("dad", dad)  # IPv6: how the addresses are added moves with them
            ifaces.append({k: v for k, v in i.items() if k not in ("addresses", "dad")})
        else:
            ifaces.append(i)
    inner = {"name": INTERNAL, "addresses": addrs, **({"mtu": mtu} if mtu else {}), "up": True,
             **({"dad": dad} if dad is not None else {})}
    out["interfaces"] = ifaces + [inner]

    def dev(d):
        return INTERNAL if d in nics else d

    routes = []
    for r in state.get("routes", []):
        r = dict(r)
        if "dev" in r:
            r["dev"] = dev(r["dev"])
        if "nexthops" in r:
            r["nexthops"] = [{**h, "dev": dev(h["dev"])} if "dev" in h else h
                             for h in r["nexthops"]]
        routes.append(r)
    out["routes"] = routes
    sysctl = dict(state.get("sysctl", {}))
    if "rp_filter" in sysctl:
        rp = {k: v for k, v in sysctl["rp_filter"].items() if k not in nics}
        vals = [v for k, v in sysctl["rp_filter"].items() if k in nics]
        if vals:
            rp[INTERNAL] = max(vals)
        sysctl["rp_filter"] = rp
        out["sysctl"] = sysctl
    if "qos" in state:
        out["qos"] = [{**q, "driver": "ovs"} for q in state["qos"]]
    out["ovs"] = {"bridges": [{"name": BRIDGE, "datapath_type": datapath_type,
                               "ports": nics, "internal": [INTERNAL]}]}
    return out
