"""Cross-checks of a cluster file beyond its schema, each problem with its YAML path.

`Cluster` runs them when it is validated, so this module reads the file's pieces from
`spec.cluster_parts` and knows `Cluster` itself only as a type."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from topoagent.state.values import format_rate
from topoctl.graph.devices import DEVICES
from topoctl.spec.cluster_parts import (
    LAB_MANAGEMENT,
    LAB_MANAGEMENT6,
    DirectFabric,
    Gpus,
    SwitchedFabric,
    parse_port_ref,
)

# RFC 6890: "this network", loopback, link-local, multicast and reserved (with broadcast)
SPECIAL_USE = [ipaddress.IPv4Network(n) for n in
               ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3")]
# RFC 6890 for IPv6: unspecified and loopback, IPv4-mapped, link-local (the kernel's, one per
# link) and multicast
SPECIAL_USE6 = [ipaddress.IPv6Network(n) for n in
                ("::/127", "::ffff:0:0/96", "fe80::/10", "ff00::/8")]

if TYPE_CHECKING:
    from topoctl.spec.cluster import Cluster


def check_cluster(c: Cluster) -> list[tuple[str, str]]:
    """Cross-field problems of a schema-valid cluster, each as (YAML path, message): duplicate
    names, missing NIC speeds, unknown GPU types, ports that do not exist or are cabled twice,
    switch trees that are not trees, address ranges that do not fit."""
    checks = _Checks(c)
    checks.hosts()
    if checks.problems:  # the fabric checks look ports up by host and NIC name
        return checks.problems
    f = c.fabric
    if isinstance(f, DirectFabric):
        checks.cables(f)
    else:
        switches = checks.switches(f)
        checks.attachments(f, switches)
    checks.bandwidth_matrix()
    checks.management()
    checks.pools()
    checks.pools6()
    return checks.problems


class _Checks:
    """The checks of one cluster: each step appends its problems to `problems`, in the order of
    the file; `used` remembers which entry cabled each port, to report a port cabled twice."""

    def __init__(self, c: Cluster):
        self.c = c
        self.problems: list[tuple[str, str]] = []
        self.nics = {h.name: {n.name: n for n in h.nics} for h in c.hosts}
        self.used: dict[str, str] = {}  # HOST:NIC -> YAML path of the entry that cabled it

    # --- steps -----------------------------------------------------------------------------------
    def hosts(self) -> None:
        """Unique host and NIC names, NIC speeds, OVSDB remotes only where OVS runs, known GPU
        types."""
        c, problems = self.c, self.problems
        hosts: dict[str, int] = {}
        self.macs()
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
            where = f"hosts[{i}].gpus" if h.gpus is not None else "defaults.gpus"
            self.gpus(where, g, len(h.nics), h.name)
        if not any(h.gpus is None for h in c.hosts):  # still checked: hosts may use it later
            self.gpus("defaults.gpus", c.defaults.gpus, None, None)

    def gpus(self, where: str, g: Gpus, nics: int | None, host: str | None) -> None:
        """A gpus section: a known device type when the cluster has a table (the built-in
        types plus its `gpu_types`), and with `nics: rails` one NIC per device."""
        known = set(DEVICES) | set(self.c.gpu_types)
        if g.type != "cpu" and self.c.gpu_types and g.type not in known:
            problem = (f"{where}.type", f"{g.type} is neither a built-in device type nor in "
                                        f"gpu_types (known: {', '.join(sorted(known))}, cpu)")
            if problem not in self.problems:
                self.problems.append(problem)
        if g.nics == "rails" and nics is not None and nics < g.count:
            self.problems.append((f"{where}.nics", f"rails bind device i to NIC i: {host} has "
                                                   f"{g.count} devices and {nics} NICs"))

    def cables(self, f: DirectFabric) -> None:
        """A direct fabric: both ends of every cable exist, on two hosts, cabled once, and the
        cable is not faster than its slower NIC."""
        problems = self.problems
        for i, ln in enumerate(f.links):
            ok = [self.port(f"fabric.links[{i}].{e}", getattr(ln, e)) for e in ("a", "b")]
            if not all(ok):
                continue
            if parse_port_ref(ln.a)[0] == parse_port_ref(ln.b)[0]:
                problems.append((f"fabric.links[{i}]", "both ends on the same host"))
            self.use(f"fabric.links[{i}].a", ln.a)
            self.use(f"fabric.links[{i}].b", ln.b)
            slow = min(self.speed(ln.a), self.speed(ln.b))
            if ln.bandwidth and ln.bandwidth > slow:
                problems.append((f"fabric.links[{i}].bandwidth",
                                 f"{format_rate(ln.bandwidth)} is above the NIC speed "
                                 f"{format_rate(slow)}"))

    def switches(self, f: SwitchedFabric) -> dict[str, int]:
        """A switched fabric's switches: unique names apart from the hosts', at most two levels
        (a leaf's uplink names a top-level switch), uplink settings only with an uplink, and
        `attach` when there is more than one switch. Returns switch name -> first index."""
        problems = self.problems
        sw = {s.name: i for i, s in enumerate(f.switches)}
        for i, s in enumerate(f.switches):
            path = f"fabric.switches[{i}]"
            if sw[s.name] != i:
                problems.append((f"{path}.name", f"{s.name} is also fabric.switches[{sw[s.name]}]"))
            if s.name in self.nics:
                problems.append((f"{path}.name", f"{s.name} is also a host name"))
            if s.uplink is not None:
                if s.uplink not in sw:
                    problems.append((f"{path}.uplink", f"no switch {s.uplink}"))
                elif s.uplink == s.name or f.switches[sw[s.uplink]].uplink is not None:
                    problems.append((f"{path}.uplink",
                                     "must name a top-level switch (two levels at most)"))
                if s.uplink_bandwidth is not None and s.oversubscription is not None:
                    problems.append((path, "give uplink_bandwidth or oversubscription, not both"))
            elif s.uplink_bandwidth is not None or s.oversubscription is not None:
                problems.append((path, "uplink_bandwidth/oversubscription need an uplink"))
        if not f.attach and len(f.switches) > 1:
            problems.append(("fabric.attach", "needed when there is more than one switch"))
        return sw

    def attachments(self, f: SwitchedFabric, switches: dict[str, int]) -> None:
        """Every `attach` entry names a known switch and existing ports (HOST:NIC, or a bare
        HOST for all its NICs), each attached once, at most at its NIC's speed."""
        problems = self.problems
        for i, at in enumerate(f.attach):
            path = f"fabric.attach[{i}]"
            if at.switch not in switches:
                problems.append((f"{path}.switch", f"no switch {at.switch}"))
            if ":" in at.port:
                try:
                    parse_port_ref(at.port)
                except ValueError as e:
                    problems.append((f"{path}.port", str(e)))
                    continue
                refs = [at.port] if self.port(f"{path}.port", at.port) else []
            elif at.port in self.nics:
                refs = [f"{at.port}:{n}" for n in self.nics[at.port]]
            else:
                problems.append((f"{path}.port", f"no host {at.port}"))
                continue
            for ref in refs:
                self.use(f"{path}.port", ref)
                if at.bandwidth and at.bandwidth > self.speed(ref):
                    problems.append((f"{path}.bandwidth",
                                     f"{format_rate(at.bandwidth)} is above the NIC speed "
                                     f"{format_rate(self.speed(ref))} of {ref}"))

    def macs(self) -> None:
        """Each NIC's MAC (where given) is a unicast address no other NIC has: a frame to a
        MAC two NICs share reaches either, and the kernel gives no link a multicast one."""
        seen: dict[str, str] = {}
        for i, h in enumerate(self.c.hosts):
            for j, n in enumerate(h.nics):
                if n.mac is None:
                    continue
                where = f"hosts[{i}].nics[{j}].mac"
                if int(n.mac[:2], 16) & 1 or n.mac == "00:00:00:00:00:00":
                    self.problems.append((where, f"{n.mac} is not a unicast address"))
                elif n.mac in seen:
                    self.problems.append((where, f"{n.mac} is also {seen[n.mac]}"))
                seen.setdefault(n.mac, where)

    def bandwidth_matrix(self) -> None:
        """`bandwidth_matrix` rows and columns name hosts, never a host to itself."""
        for src, row in (self.c.bandwidth_matrix or {}).items():
            if src not in self.nics:
                self.problems.append((f"bandwidth_matrix.{src}", f"no host {src}"))
            for dst in row:
                if dst not in self.nics:
                    self.problems.append((f"bandwidth_matrix.{src}.{dst}", f"no host {dst}"))
                elif dst == src:
                    self.problems.append((f"bandwidth_matrix.{src}.{dst}", "a host to itself"))

    def management(self) -> None:
        """The lab's management subnet lies inside `LAB_MANAGEMENT` and has room for every host
        besides its network, broadcast and gateway (the root bridge's) addresses."""
        c, mgmt = self.c, self.c.addressing.management
        if mgmt is None:
            return
        net = ipaddress.IPv4Network(mgmt)
        if not net.subnet_of(ipaddress.IPv4Network(LAB_MANAGEMENT)):
            self.problems.append(("addressing.management", f"{mgmt} is outside {LAB_MANAGEMENT}"))
        elif net.num_addresses - 3 < len(c.hosts):
            self.problems.append(("addressing.management",
                                  f"{mgmt} is too small for {len(c.hosts)} hosts"))

    def pools(self) -> None:
        """The fabric, training and management pools are apart (a host would get one IP on two
        links) and outside the special-use ranges (this network, loopback, link-local,
        multicast and reserved)."""
        a = self.c.addressing
        pools = [(name, ipaddress.IPv4Network(net)) for name, net in
                 (("fabric", a.fabric), ("training", a.training), ("management", a.management))
                 if net is not None]
        for i, (name, net) in enumerate(pools):
            special = next((s for s in SPECIAL_USE if net.overlaps(s)), None)
            if special is not None:
                self.problems.append((f"addressing.{name}", f"{net} overlaps {special}, a "
                                      f"special-use range"))
            for other, onet in pools[:i]:
                if net.overlaps(onet):
                    self.problems.append((f"addressing.{name}", f"{net} overlaps the {other} "
                                          f"pool {onet}"))

    def pools6(self) -> None:
        """The IPv6 pools (checked whatever the family, so switching it on later is no
        surprise): apart, outside the special-use ranges and the lab's IPv6 management block,
        the fabric pool holds /64s (one per cable or switched domain) and the training pool
        one /128 per host."""
        a = self.c.addressing
        fab, tr = ipaddress.IPv6Network(a.fabric6), ipaddress.IPv6Network(a.training6)
        for name, net in (("fabric6", fab), ("training6", tr)):
            special = next((s for s in SPECIAL_USE6 if net.overlaps(s)), None)
            if special is not None:
                self.problems.append((f"addressing.{name}", f"{net} overlaps {special}, a "
                                      f"special-use range"))
        if fab.prefixlen > 64:
            self.problems.append(("addressing.fabric6", f"{fab} is longer than /64: every cable "
                                  "or switched domain gets a /64"))
        if tr.num_addresses - 1 < len(self.c.hosts):
            self.problems.append(("addressing.training6",
                                  f"{tr} is too small for {len(self.c.hosts)} hosts"))
        if fab.overlaps(tr):
            self.problems.append(("addressing.training6", f"{tr} overlaps the fabric6 pool "
                                  f"{fab}"))
        mgmt6 = ipaddress.IPv6Network(LAB_MANAGEMENT6)
        for name, net in (("fabric6", fab), ("training6", tr)):
            if net.overlaps(mgmt6):
                self.problems.append((f"addressing.{name}", f"{net} overlaps {mgmt6}, the "
                                      "IPv6 management addresses of an IPv6-only lab"))

    # --- ports -----------------------------------------------------------------------------------
    def port(self, path: str, ref: str) -> bool:
        """Whether HOST:NIC `ref` exists; a problem at `path` when it does not."""
        h, n = parse_port_ref(ref)
        if h not in self.nics:
            self.problems.append((path, f"no host {h}"))
            return False
        if n not in self.nics[h]:
            self.problems.append((path, f"host {h} has no NIC {n} ({', '.join(self.nics[h])})"))
            return False
        return True

    def speed(self, ref: str) -> int:
        """The speed of existing port `ref` in bit/s (its own, else defaults.nic_speed)."""
        h, n = parse_port_ref(ref)
        return self.nics[h][n].speed or self.c.defaults.nic_speed  # type: ignore[return-value]

    def use(self, path: str, ref: str) -> None:
        """Port `ref` is cabled by the entry at `path`: a problem if an earlier one cabled it."""
        if ref in self.used:
            self.problems.append((path, f"{ref} is already cabled at {self.used[ref]}"))
        self.used.setdefault(ref, path)
