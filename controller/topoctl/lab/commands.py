"""The iproute2 batches that build a Layout, as plain lines (pure, unit-testable).

Everything goes through `ip -batch` / `tc -batch`: one process per namespace instead of one per
command, which is what keeps a 32-host lab inside its time budget. Rates are written in bit/s,
so what `tc -j` reads back compares exactly with the cluster file.
"""

from __future__ import annotations

from topoctl.lab.layout import Cable, Layout, SwitchPort, Uplink, mgmt6
from topoctl.lab.names import MGMT_IF, mgmt_bridge

HTB_HANDLE = "1:"
HTB_CLASS = "1:1"
# Token credit of a shaped cable, in seconds at its rate (HTB burst and cburst). tc's default is
# one 1600-byte packet: a jumbo frame then always empties the bucket, and whenever TCP's next
# packet is not yet queued when the class may send again (TCP small queues refill from softirq,
# late on a busy machine) the time is lost. A lock-step tree AllReduce on an 8-host ring at
# 200 Mbit/s then lost 4-20% depending on its chunk size (0.59 s at 26 kB, 0.70 s at 28 kB);
# 2 ms of credit left 0.58-0.62 s, 4 ms 0.58-0.59 s for every chunk tried.
BURST_S = 0.004


def _quantum(mtu: int) -> int:
    """Bytes of one full frame of `mtu` as HTB counts it (with the 14-byte Ethernet header)."""
    return max(mtu + 14, 1514)


def cable_credit(rate: int, mtu: int, burst_s: float = BURST_S) -> int:
    """Bytes of token credit of a cable shaped to `rate` bit/s with frames of `mtu`: `burst_s`
    at the rate, at least two full frames (HTB must hold one GSO/jumbo frame, and a slow
    cable's 4 ms are less than one: below 36 Mbit/s at MTU 9000 the frames set the credit)."""
    return max(int(rate * burst_s / 8), 2 * _quantum(mtu))


def cable_credit_s(rate: float, mtu: int, burst_s: float = BURST_S) -> float:
    """:func:`cable_credit` in seconds at the cable's rate (`rate` bit/s): the head start a
    cable that idled gives the next message (the tree runtime's cost model, ``credit_s``)."""
    return cable_credit(int(rate), mtu, burst_s) * 8.0 / rate if rate > 0 else 0.0


def root_batch(layout: Layout) -> list[str]:
    """Root namespace: namespaces, the management bridge, every veth (created in place)."""
    lab, mtu, w = layout.lab, layout.mtu, layout.wire_ns
    br = mgmt_bridge(lab)
    out = [f"netns add {w}"] + [f"netns add {h.ns}" for h in layout.hosts]
    out += [f"link add name {br} type bridge",
            f"link set {br} addrgenmode none",
            f"addr add {layout.gateway}/{layout.prefixlen()} dev {br}"]
    if layout.mgmt_ipv6:  # no duplicate detection: the lab's own, unique block
        out.append(f"addr add {mgmt6(layout.gateway)}/{layout.prefixlen6()} dev {br} nodad")
    out += [f"link set {br} up"]
    for h in layout.hosts:
        out += [f"link add name {h.mgmt_root_if} type veth peer name {MGMT_IF} netns {h.ns}",
                f"link set {h.mgmt_root_if} addrgenmode none",
                f"link set {h.mgmt_root_if} master {br} up"]
        for p in h.ports:
            out.append(f"link add name {p.nic} netns {h.ns} address {p.mac} mtu {mtu} "
                       f"type veth peer name {p.end} netns {w} mtu {mtu}")
    return out


def host_batch(layout: Layout, host: str, ipv6: bool = False) -> list[str]:
    """Inside one host: lo and the management port up with its address; fabric ports up with
    no address at all (not even an IPv6 link-local one): configuring them is the agent's job.
    `ipv6` (a cluster addressed in IPv6): the fabric ports get the kernel's link-local address
    (EUI-64 from the port's MAC), as every IPv6 interface has (RFC 4291): neighbour discovery
    for a packet whose source is not on the port (the training address on `lo`, a forwarded
    packet) sends its solicitation from the port's link-local address, and without one the
    kernel sends none and the next hop stays unresolved."""
    h = layout.host(host)
    out = ["link set lo up", f"link set {MGMT_IF} addrgenmode none",
           f"addr add {h.mgmt_ip}/{layout.prefixlen()} dev {MGMT_IF}"]
    if layout.mgmt_ipv6:
        out.append(f"addr add {mgmt6(h.mgmt_ip)}/{layout.prefixlen6()} dev {MGMT_IF} nodad")
    out += [f"link set {MGMT_IF} up"]
    mode = "eui64" if ipv6 else "none"
    for p in h.ports:
        out += [f"link set {p.nic} addrgenmode {mode}", f"link set {p.nic} up"]
    return out


def wire_ip_batch(layout: Layout) -> list[str]:
    """Wire namespace links: switch bridges, switch-port and uplink veths; ends up if cabled."""
    mtu = layout.mtu
    out = ["link set lo up"]
    for br in layout.bridges.values():
        out += [f"link add name {br} type bridge", f"link set {br} addrgenmode none",
                f"link set {br} up"]
    for s in layout.switch_ports:
        out += [f"link add name {s.shaped} mtu {mtu} type veth peer name {s.bport} mtu {mtu}",
                f"link set {s.shaped} addrgenmode none", f"link set {s.bport} addrgenmode none",
                f"link set {s.bport} master {s.bridge} up", f"link set {s.shaped} up"]
    for u in layout.uplinks:
        out += [f"link add name {u.leaf_end} mtu {mtu} type veth peer name {u.spine_end} "
                f"mtu {mtu}",
                f"link set {u.leaf_end} addrgenmode none",
                f"link set {u.spine_end} addrgenmode none",
                f"link set {u.leaf_end} master {layout.bridges[u.leaf]} up",
                f"link set {u.spine_end} master {layout.bridges[u.spine]} up"]
    for h in layout.hosts:
        for p in h.ports:
            out.append(f"link set {p.end} addrgenmode none")
    out += ends_state(layout, up=True)
    return out


def cabled_ends(layout: Layout) -> list[str]:
    """Every wire-namespace end of a cable or switch port of the layout."""
    ends = [e for c in layout.cables for e in (c.a_end, c.b_end)]
    return ends + [s.end for s in layout.switch_ports]


def ends_state(layout: Layout, up: bool, ends: list[str] | None = None) -> list[str]:
    """`ip -batch` lines setting the given wire ends (default: all cabled ends) up or down."""
    state = "up" if up else "down"
    return [f"link set {e} {state}" for e in (cabled_ends(layout) if ends is None else ends)]


def shape(dev: str, rate: int, mtu: int, latency: float = 0.0, loss: float = 0.0,
          netem: bool = False) -> list[str]:
    """Egress of `dev` limited to `rate` bit/s: an HTB class (handles GSO packets exactly) with
    `BURST_S` of token credit, with a netem leaf for delay/loss when the kernel has sch_netem."""
    quantum = _quantum(mtu)
    burst = cable_credit(rate, mtu)  # bytes (see BURST_S)
    out = [f"qdisc add dev {dev} root handle {HTB_HANDLE} htb default 1",
           f"class add dev {dev} parent {HTB_HANDLE} classid {HTB_CLASS} htb rate {rate}bit "
           f"ceil {rate}bit quantum {quantum} burst {burst} cburst {burst}"]
    if netem and (latency > 0 or loss > 0):
        args = f"delay {latency * 1e6:.0f}us" if latency > 0 else ""
        if loss > 0:
            args += f" loss {loss * 100:g}%"
        out.append(f"qdisc add dev {dev} parent {HTB_CLASS} handle 10: netem {args.strip()} "
                   f"limit 10000")
    return out


def redirect(src: str, dst: str) -> list[str]:
    """Everything arriving at `src` leaves through `dst` (a patch-panel connection)."""
    return [f"qdisc add dev {src} clsact",
            f"filter add dev {src} ingress protocol all pref 1 u32 match u32 0 0 "
            f"action mirred egress redirect dev {dst}"]


def unwire(dev: str) -> list[str]:
    """`tc -batch` lines removing the shaping and redirect of one wire end."""
    return [f"qdisc del dev {dev} root", f"qdisc del dev {dev} clsact"]


def cable_tc(c: Cable, mtu: int, netem: bool) -> list[str]:
    """`tc -batch` lines shaping both ends of a cable and redirecting each end's traffic to the
    other."""
    return (shape(c.a_end, c.rate, mtu, c.latency, c.loss, netem)
            + shape(c.b_end, c.rate, mtu, c.latency, c.loss, netem)
            + redirect(c.a_end, c.b_end) + redirect(c.b_end, c.a_end))


def switch_port_tc(s: SwitchPort, mtu: int, netem: bool) -> list[str]:
    """`tc -batch` lines shaping a switch port's two ends and redirecting between them."""
    return (shape(s.end, s.rate, mtu, s.latency, s.loss, netem)
            + shape(s.shaped, s.rate, mtu, s.latency, s.loss, netem)
            + redirect(s.end, s.shaped) + redirect(s.shaped, s.end))


def uplink_tc(u: Uplink, mtu: int, netem: bool) -> list[str]:
    """`tc -batch` lines shaping both ends of a leaf-spine uplink."""
    return (shape(u.leaf_end, u.rate, mtu, u.latency, 0.0, netem)
            + shape(u.spine_end, u.rate, mtu, u.latency, 0.0, netem))


def wire_tc_batch(layout: Layout, netem: bool) -> list[str]:
    """All `tc -batch` lines of the wire namespace: cables, switch ports and uplinks."""
    out: list[str] = []
    for c in layout.cables:
        out += cable_tc(c, layout.mtu, netem)
    for s in layout.switch_ports:
        out += switch_port_tc(s, layout.mtu, netem)
    for u in layout.uplinks:
        out += uplink_tc(u, layout.mtu, netem)
    return out
