"""The joint graph TAG's GNN reads, and each action's descriptor for the prior's decoder.

TAG (Zhang et al., IEEE TPDS 2023) feeds one graph of op-group nodes and machine nodes to its
GNN, with edges for data flow (tensor bytes), machine links (bandwidth) and placement (the
group's time on that machine). Every edge carries a REAL feature here (the authors' code leaves
its tensor-edge features at zero, a comparison where an assignment was meant: not copied).
All features are dimensionless and O(1): times relative to the model's total on the fastest
host, bytes as transfer time on the median link relative to the same, bandwidths relative to
the fastest. Pure functions over plain data; O(groups * hosts + edges).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from topoctl.tag.space import Action, Space, State, split_sync, used_hosts

TYPES = ("dp:ring", "dp:trees", "dp:ring+shares", "dp:trees+shares", "dp:topoopt", "stage:none",
         "stage:ring", "stage:ps", "same", "ar", "sfb")
GROUP_DIM, HOST_DIM, CTX_DIM = 6, 4, 7


@dataclass(frozen=True)
class JointGraph:
    """Node features and typed edges (src, dst, feature) of the joint graph."""

    group_x: list[list[float]]
    host_x: list[list[float]]
    flow: list[tuple[int, int, float]]  # group -> group: bytes moved (as relative time)
    link: list[tuple[int, int, float]]  # host -> host: route bandwidth / the fastest
    place: list[tuple[int, int, float]]  # group -> host: the group's time there (relative)
    place_t: list[list[float]]  # [group][host] relative time (for action descriptors)


def joint_graph(times: list[list[float]], params: list[float], acts: list[float],
                linear: list[bool], flow_bytes: dict[tuple[int, int], float],
                bandwidth: dict[tuple[int, int], float], memory: list[float]) -> JointGraph:
    """The joint graph from plain data: `times[g][h]` seconds of group g's forward + backward
    on host h (at its speed), parameter and kept-activation bytes per group, SFB-eligible
    groups, bytes between groups, route bandwidth (bytes/s) between hosts, host memory."""
    ng, nh = len(times), len(times[0])
    per_host = [sum(times[g][h] for g in range(ng)) for h in range(nh)]
    ref = min(per_host) or 1.0
    bw_max = max(bandwidth.values(), default=1.0) or 1.0
    bws = sorted(bandwidth.values()) or [1.0]
    bw_med = bws[len(bws) // 2] or 1.0
    ptot, atot = sum(params) or 1.0, sum(acts) or 1.0
    need = 4 * ptot + atot
    gx = [[math.log1p(ng * min(times[g]) / ref), ng * params[g] / ptot / 4,
           ng * acts[g] / atot / 4, float(linear[g]), g / max(1, ng - 1),
           math.log1p(2 * params[g] / bw_med / ref)] for g in range(ng)]
    egress = [sum(b for (a, _), b in bandwidth.items() if a == h) for h in range(nh)]
    e_max = max(egress) or 1.0
    hx = [[ref / per_host[h], math.tanh(memory[h] / need / 4), egress[h] / e_max,
           sum(1 for (a, _) in bandwidth if a == h) / max(1, nh - 1)] for h in range(nh)]
    flow = [(u, v, math.log1p(b / bw_med / ref * ng)) for (u, v), b in sorted(flow_bytes.items())]
    link = [(a, b, bw / bw_max) for (a, b), bw in sorted(bandwidth.items())]
    # a group that costs nothing (inputs, views) is as fast everywhere
    rel = [[times[g][h] / min(times[g]) if min(times[g]) > 0 else 1.0 for h in range(nh)]
           for g in range(ng)]
    place = [(g, h, 1.0 / rel[g][h]) for g in range(ng) for h in range(nh)]
    return JointGraph(gx, hx, flow, link, place, rel)


@dataclass(frozen=True)
class ActionDesc:
    """What the decoder reads of one action: its type, the group it decides, its hosts, a
    parameter server, context numbers."""

    kind: int
    group: int
    hosts: tuple[int, ...]
    server: int  # -1: none
    ctx: tuple[float, ...]


def describe_action(space: Space, jg: JointGraph, state: State, a: Action) -> ActionDesc:
    """`a`'s descriptor at `state` (O(hosts))."""
    idx = {h: i for i, h in enumerate(space.hosts)}
    i, nh = len(state), len(space.hosts)
    server = -1
    if a[0] == "dp":
        kind, hosts = TYPES.index(f"dp:{a[1]}"), tuple(range(nh))
    elif a[0] == "stage":
        y, srv, _ = split_sync(a[2])  # trees: the ring's type (both all-reduce the stage)
        kind = TYPES.index(f"stage:{'ring' if y == 'trees' else y}")
        hosts = tuple(idx[h] for h in a[1])
        server = idx[srv] if srv else -1
    else:
        kind = TYPES.index(a[0])
        cur = next((s for s in reversed(state) if s[0] == "stage"), None)
        hosts = tuple(idx[h] for h in cur[1]) if cur else tuple(range(nh))
    rel = [jg.place_t[i][h] for h in hosts]
    used = len(used_hosts(state)) / nh
    stages = sum(1 for s in state if s[0] == "stage")
    sfb = float(a[0] == "sfb" or (a[0] == "dp" and a[2]))
    ctx = (i / max(1, space.groups - 1), used, len(hosts) / nh, stages / nh,
           1.0 / max(rel), 1.0 / (sum(rel) / len(rel)), sfb)
    return ActionDesc(kind, i, hosts, server, ctx)
