"""TopoOpt-testbed forwarding rules (`forwarding.mode: tc-offload`): instead of the kernel's IP
forwarding, a forwarding host's RoCE NIC matches packets for a destination with tc flower,
rewrites the destination MAC to the next hop's port (pedit) and redirects them to the egress
port (mirred). One rule per (ingress port, destination) on every host; the next hop is the
host's first (ECMP) next hop toward the destination. O(hosts^2 * degree).

Only rendered here; the agent applies them where the kernel has cls_flower and act_pedit and
refuses clearly where it does not (this machine)."""

from __future__ import annotations

from topoagent.protocol import TopoError
from topoctl.fabric.graph import FabricGraph, lead_cable
from topoctl.sim.routing import NextHops


class OffloadError(TopoError):
    """tc-offload forwarding cannot be rendered (e.g. NIC MACs unknown)."""


def offload_rules(graph: FabricGraph, hops: NextHops, training: dict[str, str],
                  routes: dict[tuple[str, str], list[tuple[str, float]]] | None = None,
                  hosts: list[str] | None = None) -> dict[str, list[dict]]:
    """host -> forwarding rules (`topoagent.state.host.OffloadRule` as plain data)."""
    routes = routes or {}
    hosts = list(hosts or graph.hosts)
    mac = {(p.host, p.nic): p.mac for p in graph.ports}
    missing = sorted({f"{h}:{n}" for (h, n), m in mac.items() if not m and h in hosts
                      and any(ln.a == h and ln.a_nic == n or ln.b == h and ln.b_nic == n
                              for ln in graph.links)})
    if missing:
        raise OffloadError([("hosts", "forwarding tc-offload rewrites destination MACs, so "
                                      "every cabled NIC needs its mac in the cluster file; "
                                      f"missing: {', '.join(missing[:6])}"
                                      + (f" and {len(missing) - 6} more" if len(missing) > 6
                                         else ""))])
    out: dict[str, list[dict]] = {}
    for t in hosts:
        mine = sorted({ln.a_nic if ln.a == t else ln.b_nic for ln in graph.links
                       if t in (ln.a, ln.b)})
        rules = []
        for d in hosts:
            if d == t:
                continue
            nb = routes[(t, d)][0][0] if routes.get((t, d)) else hops.next_node(t, d)
            c = lead_cable(hops.bundles[(t, nb)])
            dev, peer_nic = (c.a_nic, c.b_nic) if c.a == t else (c.b_nic, c.a_nic)
            for ingress in mine:
                if ingress != dev:
                    rules.append({"dev": ingress, "dst": f"{training[d]}/32",
                                  "dst_mac": mac[(nb, peer_nic)], "redirect": dev})
        out[t] = rules
    return out


def tc_command(rule: dict) -> str:
    """The `tc` command line a rule stands for (documentation and explain output)."""
    return (f"tc filter add dev {rule['dev']} ingress protocol ip flower dst_ip {rule['dst']} "
            f"action pedit ex munge eth dst set {rule['dst_mac']} pipe "
            f"action mirred egress redirect dev {rule['redirect']}")
