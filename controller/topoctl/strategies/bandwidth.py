"""Post-pass ``+bandwidth``: per-destination rates and multipath on top of any strategy.

The base strategy's iteration traffic matrix (`bandwidth.paths.traffic_matrix`) and candidate
paths (the routed path plus one-detour alternatives on direct fabrics) go into the bandwidth LP
(`bandwidth.lp.allocate`; the job's `bandwidth.objective`: ``minmax``, all of the iteration's
transfers finish as early as possible, the thesis' bandwidth step, or ``proportional``). With
the job's `bandwidth.multipath: true` the candidates include one-hop detours; otherwise every
pair keeps its routed path and only the rates change. The result becomes
- QoS: on each source NIC one class per destination with its allocated rate (HTB rate; the
  ceiling is the rate itself, a hard cap, or the link rate, work-conserving: both are simulated
  and the faster is kept, so the post-pass never makes the plan slower in the simulator);
- multipath: destinations the LP splits over several first hops get weighted next hops in a
  policy-routing table (`TABLE`), looked up only for locally originated packets (rule
  ``iif lo``), so hosts forwarding a detour route it by the main table, as the LP assumed;
- the simulator's network: the LP's paths with their rates as weights, the rates as caps.

Declared as the post-pass ``bandwidth`` (`strategies.post_pass`): ``baseline+bandwidth``
(alias ``bandwidth``), ``trees+bandwidth``, and last after ``+shares``, ``+sfb`` or ``+disco``
(e.g. ``trees+shares+bandwidth``); `with_bandwidth(ctx, strategy)` applies it to any other.
"""

from __future__ import annotations

from topoagent.state.values import format_rate
from topoctl.bandwidth.classes import class_rows
from topoctl.bandwidth.classes import multipath as split_pairs
from topoctl.bandwidth.lp import allocate
from topoctl.bandwidth.paths import candidate_paths, traffic_matrix
from topoctl.render.addressing import assign_cluster
from topoctl.sim.devices import split_device
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric, tcp_efficiency
from topoctl.sim.network import Network

from . import PlanContext, Strategy, StrategyError, post_pass
from .devices import device_network

TABLE = 100  # policy-routing table of the multipath routes
RULE_PRIORITY = 1100  # `iif lo lookup TABLE`


def host_pairs(demand: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Bytes per (src host, dst host): the devices of hosts with several ranks summed into
    their host's pair (`sim.devices` nodes), traffic inside a host left out (it never reaches
    a NIC)."""
    out: dict[tuple[str, str], float] = {}
    for (a, b), v in demand.items():
        ha, hb = split_device(a)[0], split_device(b)[0]
        if ha != hb:
            out[(ha, hb)] = out.get((ha, hb), 0.0) + v
    return out


def _weights(values: list[float]) -> list[int]:
    top = max(values)
    return [max(1, min(256, round(256 * v / top))) for v in values]


@post_pass("bandwidth", applies_to=("baseline", "trees"), after=("shares", "sfb", "disco"))
def with_bandwidth(ctx: PlanContext, base: Strategy, objective: str | None = None,
                   multipath: bool | None = None) -> Strategy:
    """`base` with per-destination rates (and, with `multipath`, weighted multipath) from the
    bandwidth LP; `objective` and `multipath` default to the job's `bandwidth` section."""
    spec = ctx.job.bandwidth
    objective = spec.objective if objective is None else objective
    multipath = spec.multipath if multipath is None else multipath
    demand = host_pairs(traffic_matrix(base.tasks))
    paths = candidate_paths(base.hops, sorted(demand), detours=multipath)
    eff = tcp_efficiency(base.fabric.mtu)
    # with multipath (L4 hash: connections spread by weight) a bundle's cables all count
    plain = network_from_fabric(base.fabric, base.hops, cpu_pool=base.network.cpu_pool,
                                spread_bundles=multipath)
    cap = {k: ln.capacity for k, ln in plain.links.items()}
    alloc = allocate(demand, paths, cap, objective)
    rows = class_rows(alloc, base.hops.bundles, eff, spread_bundles=multipath)
    # a pair whose rate leaves by several NICs (detours, or a bundle of parallel cables) gets a
    # weighted route and the kernel's L4 hash only when multipath was asked for: gloo has one
    # connection per peer, so the hash puts all of it on one next hop, and with unequal cables
    # that was the slow one in two of three hetero8 demo runs (trees+bandwidth 1.84-1.87 s
    # against 1.02-1.05 s, the h2-h3 bundle of 200 and 50 Mbit/s); without multipath the main
    # table's route (the plain plan's, over the bundle's lead cable) carries the pair
    bundled = split_pairs(rows)
    split = bundled if multipath else {}
    # weighted next hops need a host at the far end of each first hop; through a switch the
    # next hop is not known here (found by the fuzz suite: it was a KeyError, a traceback)
    via_switch = sorted((s, d, r.dev, r.peer) for (s, d), lst in split.items() for r in lst
                        if r.peer_nic is None)
    if via_switch:
        s, d, dev, sw = via_switch[0]
        raise StrategyError(f"the bandwidth LP splits {s} -> {d} over several NICs, one of "
                            f"them ({dev}) into switch {sw}: multipath through a switch is not "
                            "supported; use the strategy without +bandwidth on this fabric")
    routed = {p: [(r, path) for path, r in lst] for p, lst in alloc.rates.items()}

    def route(src: str, dst: str):
        return routed.get((src, dst)) or plain.router(src, dst)

    caps = {p: alloc.total(p) for p in alloc.rates}
    # hosts of several ranks: their devices' traffic takes the hosts' routes and caps
    hard = device_network(ctx, Network(plain.links, route, caps, plain.cpu_pool))
    soft = device_network(ctx, Network(plain.links, route, cpu_pool=plain.cpu_pool))
    t_hard = simulate(base.tasks, hard, record=False).iteration_time
    t_soft = simulate(base.tasks, soft, record=False).iteration_time
    # a hard cap only where the simulator says it helps: on a tie it only takes the runtime's
    # headroom away (hetero8 demo, trees+bandwidth with ceilings at the rates on a tie: two
    # runs of three measured 1.84 s against 1.02-1.04 s for the same trees on the quiet
    # Xeon)
    ceil_is_rate = t_hard < t_soft * (1 - 1e-9) and not (bundled and not multipath)
    speed = {(p.host, p.nic): p.speed for p in base.fabric.ports}
    extra: dict[str, dict] = {}
    addr = assign_cluster(base.fabric, ctx.cluster.addressing)
    per_dev: dict[tuple[str, str], list[dict]] = {}
    order = {h: i for i, h in enumerate(base.fabric.hosts)}
    for r in sorted(rows, key=lambda r: (r.src, r.dev, r.dst)):
        # one class id per destination on every NIC (an OVS queue is chosen before the port)
        c = {"id": 2 + order[r.dst], "dst": addr.host_net(r.dst),
             "rate": format_rate(r.rate)}
        if not ceil_is_rate:
            c["ceil"] = format_rate(speed[(r.src, r.dev)])
        per_dev.setdefault((r.src, r.dev), []).append(c)
    for (h, dev), cls in per_dev.items():
        q = {"dev": dev, "rate": format_rate(speed[(h, dev)]), "classes": cls}
        extra.setdefault(h, {}).setdefault("qos", []).append(q)
    for (s, d), lst in sorted(split.items()):
        ws = _weights([r.rate for r in lst])
        hops = [{"via": addr.ip(r.peer, r.peer_nic), "dev": r.dev, "weight": w}
                for r, w in zip(lst, ws, strict=True)]
        ex = extra.setdefault(s, {})
        ex.setdefault("routes", []).append({"dst": addr.host_net(d), "table": TABLE,
                                            "src": addr.training[s], "nexthops": hops})
        if "rules" not in ex:
            ex["rules"] = [{"priority": RULE_PRIORITY, "iif": "lo", "table": TABLE}
                           | ({"family": "ipv6"} if addr.version == 6 else {})]
        # the kernel's default hash (addresses only) puts every connection between two hosts
        # on one next hop; with the ports hashed too, connections split by the weights
        ex.setdefault("sysctl", {})[addr.hash_sysctl] = 1
    # hosts in the middle of a detour forward for others
    transit = {ln.split(">", 1)[1] for lst in alloc.rates.values() for path, _ in lst
               for ln in path[:-1]} & set(base.fabric.hosts) - base.hops.transit_hosts()
    for h in sorted(transit):
        extra.setdefault(h, {}).setdefault("sysctl", {})[addr.forward_sysctl] = True
    for h, sections in base.extra.items():
        for k, items in sections.items():
            if isinstance(items, dict):
                extra.setdefault(h, {})[k] = items | extra.get(h, {}).get(k, {})
            else:
                extra.setdefault(h, {}).setdefault(k, [])[:0] = list(items)
    notes = dict(base.notes) | {"bandwidth": {
        "objective": objective, "multipath": multipath, "lp_comm_time": alloc.time,
        "pairs": len(demand),
        "multipath_pairs": len(split), "ceil": "rate" if ceil_is_rate else "link",
        "classes": [[r.src, r.dst, r.dev, r.rate] for r in rows]}}
    return Strategy(name=f"{base.name}+bandwidth", fabric=base.fabric, hops=base.hops,
                    network=hard if ceil_is_rate else soft, tasks=base.tasks,
                    collective=base.collective, buckets=base.buckets,
                    bucket_cap=base.bucket_cap, routes=base.routes,
                    rates={}, extra=extra, notes=notes)
