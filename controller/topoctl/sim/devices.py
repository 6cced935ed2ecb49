"""Hosts with several devices in the simulator: each device is a node of its own (``h0/g3``,
`topoctl.collective.hierarchical.device_node`) joined to its host by the intra-host link (one
link each way at the device's bandwidth: NVSwitch, a PCIe root complex or the kernel's
loopback as a non-blocking switch with one port per device). The host node stays what it was:
where the fabric's cables end and where the strategies' compute tasks run (every device of a
host computes the same per-rank batch at once, so one task stands for all of them).

A device's traffic to another host leaves through the host: over the host's own routes when
its devices share the host's NICs, or, with rails (`gpus.nics: rails`), device i of a host
reaches device i of another through its NIC i's first hop (the rail switch both attach to).
O(devices) links; routes cached as the base network's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from topoctl.fabric.graph import FabricGraph
from topoctl.sim.fabric import arc_id
from topoctl.sim.network import Link, Network, Routes


@dataclass(frozen=True)
class HostDevices:
    """A host's devices for the simulator: how many, their intra-host link (bytes/s per device
    per direction, one-way latency in seconds) and with rails each device's first hop (the
    node its NIC is cabled to; None: the host's routes)."""

    count: int
    bandwidth: float
    latency: float
    rails: tuple[str | None, ...] | None = None


def split_device(node: str) -> tuple[str, int | None]:
    """(host, device index) of a device node ``h0/g3``; (node, None) for any other node."""
    host, sep, dev = node.partition("/g")
    if sep and dev.isdigit():
        return host, int(dev)
    return node, None


def rail_hops(fabric: FabricGraph, host: str, nics: list[str]) -> tuple[str | None, ...]:
    """The node each of `host`'s NICs `nics` is cabled to (device i's rail), None for a NIC
    without a cable."""
    peer: dict[str, str] = {}
    for ln in fabric.links:
        if ln.a == host and ln.a_nic:
            peer[ln.a_nic] = ln.b
        if ln.b == host and ln.b_nic:
            peer[ln.b_nic] = ln.a
    return tuple(peer.get(n) for n in nics)


def with_devices(network: Network, hosts: Mapping[str, HostDevices]) -> Network:
    """`network` with every device of `hosts` as a node of its own (module docstring); hosts
    not listed keep one node. The base network's links, caps and CPU pool are kept."""
    links = dict(network.links)
    for h, d in hosts.items():
        for i in range(d.count):
            dev = f"{h}/g{i}"
            for a, b in ((dev, h), (h, dev)):
                lid = arc_id(a, b)
                links[lid] = Link(lid, a, b, d.bandwidth, d.latency / 2)
    base = network

    def inter(hs: str, i: int | None, hd: str, j: int | None) -> Routes:
        """The routes between two hosts for device i of hs and device j of hd."""
        ds, dd = hosts.get(hs), hosts.get(hd)
        if (i is not None and i == j and ds is not None and dd is not None and ds.rails
                and dd.rails and i < len(ds.rails) and i < len(dd.rails)):
            rail = ds.rails[i]
            if rail is not None and rail == dd.rails[i]:
                hop = (arc_id(hs, rail), arc_id(rail, hd))
                if all(x in links for x in hop):
                    return [(1.0, hop)]
        return base.routes(hs, hd)

    def route(src: str, dst: str) -> Routes:
        hs, i = split_device(src)
        hd, j = split_device(dst)
        pre = (arc_id(src, hs),) if i is not None else ()
        post = (arc_id(hd, dst),) if j is not None else ()
        if hs == hd:
            return [(1.0, pre + post)]
        return [(w, pre + p + post) for w, p in inter(hs, i, hd, j)]

    return replace(network, links=links, router=route, _cache={})
