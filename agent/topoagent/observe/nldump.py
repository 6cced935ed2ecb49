"""Fast read-only rtnetlink dumps: links, IPv4 and IPv6 addresses, routes and rules, qdiscs, HTB
classes and u32 filters.

pyroute2 decodes every message into generic objects, about 0.15 ms each: on a host with
thousands of routes and rules that alone would break the agent's 0.3 s budget for a no-op
apply. Routes, rules and tc objects are the agent's biggest tables and have flat, stable layouts
(rtmsg / fib_rule_hdr / tcmsg followed by rtattrs), so they are read here with struct in one
pass, and a read-only call (`show`, `diff`, a no-op apply) never even imports pyroute2 (0.12 s
of start-up). Every write goes through pyroute2."""

from __future__ import annotations

import errno
import functools
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from topoagent.observe.uapi import (
    FRA_DPORT_RANGE,
    FRA_DST,
    FRA_FLOW,
    FRA_FWMARK,
    FRA_FWMASK,
    FRA_GOTO,
    FRA_IIFNAME,
    FRA_IP_PROTO,
    FRA_L3MDEV,
    FRA_OIFNAME,
    FRA_PRIORITY,
    FRA_PROTOCOL,
    FRA_SPORT_RANGE,
    FRA_SRC,
    FRA_SUPPRESS_IFGROUP,
    FRA_SUPPRESS_PREFIXLEN,
    FRA_TABLE,
    FRA_TUN_ID,
    FRA_UID_RANGE,
    IFA_ADDRESS,
    IFA_LOCAL,
    IFA_PROTO,
    IFADDRMSG,
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_IFNAME,
    IFLA_MTU,
    NETLINK_ROUTE,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTA_DST,
    RTA_GATEWAY,
    RTA_MULTIPATH,
    RTA_OIF,
    RTA_PREFSRC,
    RTA_PRIORITY,
    RTA_TABLE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTMSG,
    TCA_HTB_CEIL64,
    TCA_HTB_PARMS,
    TCA_HTB_RATE64,
    TCA_KIND,
    TCA_OPTIONS,
    TCA_U32_CLASSID,
    TCA_U32_SEL,
    TCMSG,
)

# selectors the schema cannot express: a rule carrying one is foreign and opaque
FRA_EXOTIC = {FRA_GOTO, FRA_FLOW, FRA_TUN_ID, FRA_L3MDEV, FRA_UID_RANGE, FRA_IP_PROTO,
              FRA_SPORT_RANGE, FRA_DPORT_RANGE}


@dataclass
class RawRoute:
    """An IPv4 or IPv6 route as dumped by rtnetlink: table, destination, metric, protocol,
    next hops."""

    table: int
    dst: str  # a.b.c.d/len
    metric: int
    proto: int
    type: int
    tos: int
    gateway: str | None
    oif: int | None
    prefsrc: str | None
    multipath: list[tuple[str | None, int, int]]  # (gateway, ifindex, weight)


@dataclass
class RawRule:
    """An IPv4 or IPv6 policy rule as dumped by rtnetlink."""

    priority: int
    action: int
    table: int
    tos: int
    src: str | None
    dst: str | None
    fwmark: int | None
    fwmask: int | None
    iif: str | None
    oif: str | None
    proto: int
    suppress_prefixlen: int | None
    suppress_ifgroup: int | None
    exotic: bool
    family: int = socket.AF_INET


def _attrs(buf: bytes, off: int, end: int) -> dict[int, bytes]:
    out = {}
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, off)
        if length < 4:
            break
        out[kind & 0x3FFF] = buf[off + 4: off + length]  # strip NLA_F_NESTED/NET_BYTEORDER
        off += (length + 3) & ~3
    return out




def _dump(sock: socket.socket, request: int, header: struct.Struct, *fields: int
          ) -> Iterator[tuple[tuple, dict[int, bytes]]]:
    """One dump: send `request` (an RTM_GET*) with `header` filled from `fields`, yield the
    (header fields, attributes) of every RTM_NEW* answer. Each GET is its NEW + 2."""
    for kind, buf in _messages(sock, request, header.pack(*fields)):
        if kind == request - 2:
            yield header.unpack_from(buf, 16), _attrs(buf, 16 + header.size, len(buf))


def _messages(sock: socket.socket, msg_type: int, payload: bytes) -> Iterator[tuple[int, bytes]]:
    """Yield (type, message) of each message answering one dump request."""
    seq = 1
    sock.send(struct.pack("=IHHII", 16 + len(payload), msg_type, NLM_F_REQUEST | NLM_F_DUMP,
                          seq, 0) + payload)
    while True:
        buf = sock.recv(1 << 20)
        off = 0
        while off + 16 <= len(buf):
            length, kind, _, _, _ = struct.unpack_from("=IHHII", buf, off)
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", buf, off + 16)
                if err:
                    raise OSError(-err, f"netlink dump failed: {errno.errorcode.get(-err)}")
                return
            yield kind, buf[off: off + length]
            off += (length + 3) & ~3


def _open() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((0, 0))
    return sock


def _ip(b: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6 if len(b) == 16 else socket.AF_INET, b)


FAMILIES = (socket.AF_INET, socket.AF_INET6)
ANY = {socket.AF_INET: "0.0.0.0", socket.AF_INET6: "::"}


def dump_routes(sock: socket.socket) -> list[RawRoute]:
    """Every IPv4 and IPv6 route in every table, read with one rtnetlink dump per family."""
    out = []
    for fam in FAMILIES:
        for head, a in _dump(sock, RTM_GETROUTE, RTMSG, fam, 0, 0, 0, 0, 0, 0, 0, 0):
            if head[0] == fam:
                out.append(_raw_route(head, a))
    return out


def _raw_route(head: tuple, a: dict[int, bytes]) -> RawRoute:
    family, dst_len, _, tos, table, proto, _, rtype, _ = head
    multipath = []
    if RTA_MULTIPATH in a:
        mp, p = a[RTA_MULTIPATH], 0
        while p + 8 <= len(mp):
            ln, _, hops, ifindex = struct.unpack_from("=HBBi", mp, p)
            gw = _attrs(mp, p + 8, p + ln).get(RTA_GATEWAY)
            multipath.append((_ip(gw) if gw else None, ifindex, hops + 1))
            p += (ln + 3) & ~3
    return RawRoute(
        table=struct.unpack("=I", a[RTA_TABLE])[0] if RTA_TABLE in a else table,
        dst=f"{_ip(a[RTA_DST]) if RTA_DST in a else ANY[family]}/{dst_len}",
        metric=struct.unpack("=I", a[RTA_PRIORITY])[0] if RTA_PRIORITY in a else 0,
        proto=proto, type=rtype, tos=tos,
        gateway=_ip(a[RTA_GATEWAY]) if RTA_GATEWAY in a else None,
        oif=struct.unpack("=i", a[RTA_OIF])[0] if RTA_OIF in a else None,
        prefsrc=_ip(a[RTA_PREFSRC]) if RTA_PREFSRC in a else None,
        multipath=multipath,
    )


@dataclass
class RawLink:
    """A link as dumped by rtnetlink: index, name, MAC, MTU, state."""

    index: int
    name: str
    mac: str | None
    mtu: int
    flags: int


def dump_links(sock: socket.socket) -> list[RawLink]:
    """Every link of the namespace, read with one rtnetlink dump."""
    out = []
    for head, a in _dump(sock, RTM_GETLINK, IFINFOMSG, socket.AF_UNSPEC, 0, 0, 0, 0):
        _, _, index, flags, _ = head
        mac = a.get(IFLA_ADDRESS)
        out.append(RawLink(index, _name(a, IFLA_IFNAME) or f"if{index}",
                           ":".join(f"{b:02x}" for b in mac) if mac and len(mac) == 6 else None,
                           _u32(a, IFLA_MTU) or 0, flags))
    return out


def dump_addrs(sock: socket.socket) -> list[tuple[int, str, int]]:
    """(ifindex, address/len, protocol) of every IPv4 and IPv6 address."""
    out = []
    for fam in FAMILIES:
        for head, a in _dump(sock, RTM_GETADDR, IFADDRMSG, fam, 0, 0, 0, 0):
            family, prefixlen, _, _, index = head
            if family != fam:
                continue
            raw = a.get(IFA_LOCAL) or a.get(IFA_ADDRESS)
            if raw:
                out.append((index, f"{_ip(raw)}/{prefixlen}",
                            a[IFA_PROTO][0] if IFA_PROTO in a else 0))
    return out


def _u32(a: dict[int, bytes], key: int) -> int | None:
    return struct.unpack("=I", a[key])[0] if key in a else None


def _name(a: dict[int, bytes], key: int) -> str | None:
    # a link name is bytes to the kernel, any but "/", ":" and white space: surrogateescape
    # keeps every one (the same str the os module would give), so it still names its link
    return a[key].rstrip(b"\0").decode("utf-8", "surrogateescape") if key in a else None


def dump_rules(sock: socket.socket) -> list[RawRule]:
    """Every IPv4 and IPv6 policy rule, read with one rtnetlink dump per family."""
    out = []
    for fam in FAMILIES:
        for head, a in _dump(sock, RTM_GETRULE, RTMSG, fam, 0, 0, 0, 0, 0, 0, 0, 0):
            family, dst_len, src_len, tos, table, _, _, action, _ = head
            if family != fam:
                continue
            out.append(RawRule(
                priority=_u32(a, FRA_PRIORITY) or 0, action=action,
                table=_u32(a, FRA_TABLE) or table, tos=tos,
                src=f"{_ip(a[FRA_SRC])}/{src_len}" if FRA_SRC in a else None,
                dst=f"{_ip(a[FRA_DST])}/{dst_len}" if FRA_DST in a else None,
                fwmark=_u32(a, FRA_FWMARK), fwmask=_u32(a, FRA_FWMASK),
                iif=_name(a, FRA_IIFNAME), oif=_name(a, FRA_OIFNAME),
                proto=a[FRA_PROTOCOL][0] if FRA_PROTOCOL in a else 0,
                suppress_prefixlen=_u32(a, FRA_SUPPRESS_PREFIXLEN),
                suppress_ifgroup=_u32(a, FRA_SUPPRESS_IFGROUP),
                exotic=bool(FRA_EXOTIC & set(a)), family=family,
            ))
    return out


@dataclass
class RawTc:
    """A qdisc, class or filter: tcmsg fields, kind and the raw TCA_OPTIONS attributes."""

    ifindex: int
    handle: int
    parent: int
    info: int
    kind: str | None
    options: dict[int, bytes]


def dump_tc(sock: socket.socket, request: int, ifindex: int = 0, parent: int = 0) -> list[RawTc]:
    """`request` is RTM_GETQDISC, RTM_GETTCLASS or RTM_GETTFILTER."""
    out = []
    for head, a in _dump(sock, request, TCMSG, socket.AF_UNSPEC, ifindex, 0, parent, 0):
        _, idx, handle, par, info = head
        opts = a.get(TCA_OPTIONS, b"")
        out.append(RawTc(idx, handle, par, info, _name(a, TCA_KIND),
                         _attrs(opts, 0, len(opts))))
    return out


def htb_rates(tc: RawTc) -> tuple[int, int]:
    """(rate, ceil) in bit/s of an HTB class. tc_htb_opt starts with two tc_ratespec of
    12 bytes whose last field is the rate in bytes/s; the 64-bit attributes win when set."""
    parms = tc.options.get(TCA_HTB_PARMS, b"\0" * 24)
    rate = struct.unpack_from("=I", parms, 8)[0]
    ceil = struct.unpack_from("=I", parms, 20)[0]
    if TCA_HTB_RATE64 in tc.options:
        rate = struct.unpack("=Q", tc.options[TCA_HTB_RATE64])[0]
    if TCA_HTB_CEIL64 in tc.options:
        ceil = struct.unpack("=Q", tc.options[TCA_HTB_CEIL64])[0]
    return rate * 8, ceil * 8


@functools.cache
def ticks_per_us() -> float:
    """The kernel's packet-scheduler clock (``/proc/net/psched``: ticks <-> microseconds, as
    tc computes it): HTB keeps a class's credit as a transmit time in these ticks."""
    try:
        t2us, us2t, clock_res = (int(x, 16) for x in
                                 open("/proc/net/psched").read().split()[:3])
    except (OSError, ValueError):
        return 15.625  # the kernel's values since 2.6.x with hrtimers: 1000 / 64 * 1
    if clock_res == 1_000_000_000:  # as iproute2's tc_core_init
        t2us = us2t
    return t2us / us2t * clock_res / 1e6


def htb_credit_bytes(tc: RawTc) -> tuple[int, int]:
    """(burst, cburst) in bytes of an HTB class: tc_htb_opt's buffer and cbuffer (after the
    two 12-byte tc_ratespec) are transmit times at the rate and the ceiling, in scheduler
    ticks."""
    parms = tc.options.get(TCA_HTB_PARMS, b"\0" * 32)
    if len(parms) < 32:
        return 0, 0
    buffer, cbuffer = struct.unpack_from("=II", parms, 24)
    rate, ceil = htb_rates(tc)
    per_us = ticks_per_us()
    return (round(buffer / per_us * 1e-6 * rate / 8),
            round(cbuffer / per_us * 1e-6 * ceil / 8))


def u32_single_key(tc: RawTc) -> tuple[int, int, int, int] | None:
    """(classid, mask, value, offset) of a u32 filter with exactly one 32-bit key."""
    parsed = u32_keys(tc)
    if parsed is None or len(parsed[1]) != 1:
        return None
    classid, ((mask, val, off),) = parsed
    return classid, mask, val, off


def u32_keys(tc: RawTc) -> tuple[int, list[tuple[int, int, int]]] | None:
    """(classid, [(mask, value, offset)...]) of a u32 filter with a class and plain keys.

    tc_u32_sel: flags, offshift, nkeys (u8 each), pad, offmask (be16), off (u16), offoff,
    hoff (s16), hmask (be32) = 16 bytes, then nkeys tc_u32_key {__be32 mask, __be32 val,
    int off, int offmask} with off in host byte order."""
    sel = tc.options.get(TCA_U32_SEL)
    classid = tc.options.get(TCA_U32_CLASSID)
    if sel is None or classid is None or len(sel) < 16 + 16 * sel[2] or sel[2] == 0:
        return None
    keys = []
    for k in range(sel[2]):
        mask, val = struct.unpack_from(">II", sel, 16 + 16 * k)
        off, offmask = struct.unpack_from("=ii", sel, 24 + 16 * k)
        if offmask:
            return None
        keys.append((mask, val, off))
    return struct.unpack("=I", classid)[0], keys


def open_in(inside) -> socket.socket:
    """A dump socket in the target's namespace (`inside` is Target.inside: a socket belongs
    to the namespace it was created in)."""
    with inside():
        return _open()
