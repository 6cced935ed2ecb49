"""Cross-checks of a cluster file beyond its schema, each problem with its YAML path."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from topoagent.state import format_rate
from topoctl.spec.cluster import LAB_MANAGEMENT, DirectFabric, parse_port_ref

if TYPE_CHECKING:
    from topoctl.spec.cluster import Cluster


def check_cluster(c: Cluster) -> list[tuple[str, str]]:
    """Cross-field problems of a schema-valid cluster, each as (YAML path, message): duplicate
    names, missing NIC speeds, unknown GPU types, ports that do not exist or are cabled twice,
    switch trees that are not trees, address ranges that do not fit."""
    problems: list[tuple[str, str]] = []
    hosts: dict[str, int] = {}
    for i, h in enumerate(c.hosts):
        if h.name in hosts:
            problems.append((f"hosts[{i}].name", f"{h.name} is also hosts[{hosts[h.name]}]"))
        hosts.setdefault(h.name, i)
        seen: dict[str, int] = {}
        for j, n in enumerate(h.nics):
            if n.name in seen:
                problems.append((f"hosts[{i}].nics[{j}].name",
                                 f"{n.name} is also hosts[{i}].nics[{seen[n.name]}]"))
            seen.setdefault(n.name, j)
            if n.speed is None and c.defaults.nic_speed is None:
                problems.append((f"hosts[{i}].nics[{j}].speed",
                                 "missing (and no defaults.nic_speed)"))
        if h.ovsdb is not None and not (c.defaults.ovs if h.ovs is None else h.ovs):
            problems.append((f"hosts[{i}].ovsdb", f"{h.name} does not run Open vSwitch "
                                                  "(set ovs: true, or drop ovsdb)"))
        g = h.gpus or c.defaults.gpus
        if g.type != "cpu" and c.gpu_types and g.type not in c.gpu_types:
            problems.append((f"hosts[{i}].gpus.type",
                             f"{g.type} is not in gpu_types ({', '.join(sorted(c.gpu_types))})"))
    if c.defaults.gpus.type != "cpu" and c.gpu_types and c.defaults.gpus.type not in c.gpu_types:
        problems.append(("defaults.gpus.type", f"{c.defaults.gpus.type} is not in gpu_types"))
    if problems:
        return problems
    nics = {h.name: {n.name: n for n in h.nics} for h in c.hosts}

    def port(path: str, ref: str) -> bool:
        h, n = parse_port_ref(ref)
        if h not in nics:
            problems.append((path, f"no host {h}"))
            return False
        if n not in nics[h]:
            problems.append((path, f"host {h} has no NIC {n} ({', '.join(nics[h])})"))
            return False
        return True

    def speed(ref: str) -> int:
        h, n = parse_port_ref(ref)
        return nics[h][n].speed or c.defaults.nic_speed  # type: ignore[return-value]

    used: dict[str, str] = {}

    def use(path: str, ref: str) -> None:
        if ref in used:
            problems.append((path, f"{ref} is already cabled at {used[ref]}"))
        used.setdefault(ref, path)

    f = c.fabric
    if isinstance(f, DirectFabric):
        for i, ln in enumerate(f.links):
            ok = [port(f"fabric.links[{i}].{e}", getattr(ln, e)) for e in ("a", "b")]
            if not all(ok):
                continue
            if parse_port_ref(ln.a)[0] == parse_port_ref(ln.b)[0]:
                problems.append((f"fabric.links[{i}]", "both ends on the same host"))
            use(f"fabric.links[{i}].a", ln.a)
            use(f"fabric.links[{i}].b", ln.b)
            slow = min(speed(ln.a), speed(ln.b))
            if ln.bandwidth and ln.bandwidth > slow:
                problems.append((f"fabric.links[{i}].bandwidth",
                                 f"{format_rate(ln.bandwidth)} is above the NIC speed "
                                 f"{format_rate(slow)}"))
    else:
        sw = {s.name: i for i, s in enumerate(f.switches)}
        for i, s in enumerate(f.switches):
            if sw[s.name] != i:
                problems.append((f"fabric.switches[{i}].name",
                                 f"{s.name} is also fabric.switches[{sw[s.name]}]"))
            if s.name in nics:
                problems.append((f"fabric.switches[{i}].name", f"{s.name} is also a host name"))
            if s.uplink is not None:
                if s.uplink not in sw:
                    problems.append((f"fabric.switches[{i}].uplink", f"no switch {s.uplink}"))
                elif s.uplink == s.name or f.switches[sw[s.uplink]].uplink is not None:
                    problems.append((f"fabric.switches[{i}].uplink",
                                     "must name a top-level switch (two levels at most)"))
                if s.uplink_bandwidth is not None and s.oversubscription is not None:
                    problems.append((f"fabric.switches[{i}]",
                                     "give uplink_bandwidth or oversubscription, not both"))
            elif s.uplink_bandwidth is not None or s.oversubscription is not None:
                problems.append((f"fabric.switches[{i}]",
                                 "uplink_bandwidth/oversubscription need an uplink"))
        if not f.attach and len(f.switches) > 1:
            problems.append(("fabric.attach", "needed when there is more than one switch"))
        for i, at in enumerate(f.attach):
            path = f"fabric.attach[{i}]"
            if at.switch not in sw:
                problems.append((f"{path}.switch", f"no switch {at.switch}"))
            if ":" in at.port:
                try:
                    parse_port_ref(at.port)
                except ValueError as e:
                    problems.append((f"{path}.port", str(e)))
                    continue
                refs = [at.port] if port(f"{path}.port", at.port) else []
            elif at.port in nics:
                refs = [f"{at.port}:{n}" for n in nics[at.port]]
            else:
                problems.append((f"{path}.port", f"no host {at.port}"))
                continue
            for ref in refs:
                use(f"{path}.port", ref)
                if at.bandwidth and at.bandwidth > speed(ref):
                    problems.append((f"{path}.bandwidth",
                                     f"{format_rate(at.bandwidth)} is above the NIC speed "
                                     f"{format_rate(speed(ref))} of {ref}"))
    if c.bandwidth_matrix:
        for src, row in c.bandwidth_matrix.items():
            if src not in nics:
                problems.append((f"bandwidth_matrix.{src}", f"no host {src}"))
            for dst in row:
                if dst not in nics:
                    problems.append((f"bandwidth_matrix.{src}.{dst}", f"no host {dst}"))
                elif dst == src:
                    problems.append((f"bandwidth_matrix.{src}.{dst}", "a host to itself"))
    mgmt = c.addressing.management
    if mgmt is not None:
        net = ipaddress.IPv4Network(mgmt)
        if not net.subnet_of(ipaddress.IPv4Network(LAB_MANAGEMENT)):
            problems.append(("addressing.management", f"{mgmt} is outside {LAB_MANAGEMENT}"))
        elif net.num_addresses - 3 < len(c.hosts):
            problems.append(("addressing.management",
                             f"{mgmt} is too small for {len(c.hosts)} hosts"))
    return problems
