"""Probes: ICMP echo to many next hops at once, and the payload of the management-path probe.

Next hops are chosen before a change (only addresses that answer now) and checked after it: a
plan that cuts a working next hop is reverted. One raw socket, all echoes sent together, one
shared deadline, so probing a hundred next hops costs one timeout, not a hundred.

The management-path probe (`topo-agent confirm-probe`, then `confirm --probe -`) moves
`PROBE_BYTES` of random text from the host to its controller and back over the connection the
controller uses (SSH): a small confirmation still passes a path shaped to 1 kbit/s, half a
megabyte each way does not, within `PROBE_WITHIN_S`. The agent keeps only the digest of what it
sent; the controller proves it received every byte by sending them back."""

from __future__ import annotations

import base64
import hashlib
import os
import select
import socket
import struct
import sys
import time

from topoagent.protocol import TopoError
from topoagent.target import Target

PROBE_BYTES = 512 * 1024  # each way: 4 s at 1 Mbit/s, 70 min at 1 kbit/s
MIN_PROBE_BYTES = 256 * 1024  # smaller is no probe of the path: it fits a TCP window or two
MAX_PROBE_BYTES = 16 * 1024 * 1024
PROBE_WITHIN_S = 15.0  # from sending the payload to having it back; two agent starts included
MAX_PROBE_WITHIN_S = 120.0


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def _echo(ident: int, seq: int, kind: int = 8) -> bytes:
    """An ICMP (kind 8) or ICMPv6 (kind 128: the kernel fills in its checksum) echo request."""
    header = struct.pack("!BBHHH", kind, 0, 0, ident, seq)
    payload = b"topo-agent probe"
    check = _checksum(header + payload) if kind == 8 else 0
    return struct.pack("!BBHHH", kind, 0, check, ident, seq) + payload


def ping_many(target: Target, addresses: list[str], timeout: float = 0.5,
              tries: int = 2) -> set[str]:
    """The subset of `addresses` (IPv4 and IPv6) that answered an ICMP echo within `timeout`
    seconds (both families at once: one timeout)."""
    v4 = [a for a in addresses if ":" not in a]
    v6 = [a for a in addresses if ":" in a]
    socks = []
    with target.inside():  # the socket belongs to the namespace it was created in
        if v4:
            socks.append((socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
                          v4, 8, 0))
        if v6:
            socks.append((socket.socket(socket.AF_INET6, socket.SOCK_RAW,
                                        socket.IPPROTO_ICMPV6), v6, 128, 129))
    ident = os.getpid() & 0xFFFF
    answered: set[str] = set()
    try:
        for attempt in range(tries):
            for sock, addrs, kind, _ in socks:
                for seq, addr in enumerate(a for a in addrs if a not in answered):
                    try:
                        sock.sendto(_echo(ident, attempt * 10000 + seq, kind), (addr, 0))
                    except OSError:
                        pass  # unreachable now: simply no answer
            deadline = time.monotonic() + timeout / tries
            while len(answered) < len(addresses):
                left = deadline - time.monotonic()
                ready = select.select([s for s, *_ in socks], [], [], left)[0] if left > 0 else []
                if not ready:
                    break
                for sock, addrs, _, reply in socks:
                    if sock in ready:
                        _answer(sock, addrs, ident, reply, answered)
    finally:
        for sock, *_ in socks:
            sock.close()
    return answered


def _answer(sock: socket.socket, addrs: list[str], ident: int, reply: int,
            answered: set[str]) -> None:
    """Read one packet; add its source to `answered` when it is our echo reply."""
    packet, peer = sock.recvfrom(2048)
    src = peer[0]
    ihl = (packet[0] & 0x0F) * 4 if sock.family == socket.AF_INET else 0  # v6: no header
    if len(packet) < ihl + 8:
        return
    kind, _, _, rid, _ = struct.unpack_from("!BBHHH", packet, ihl)
    if kind == reply and rid == ident and src in addrs:
        answered.add(src)


def probe_payload(nbytes: int) -> str:
    """`nbytes` (rounded up to a multiple of 4) of random base64 text: incompressible (an SSH
    link that compresses cannot shrink it) and free of whitespace and quoting in JSON."""
    return base64.b64encode(os.urandom((nbytes + 3) // 4 * 3)).decode("ascii")


def probe_digest(text: str) -> str:
    """The SHA-256 of a probe payload, surrounding whitespace ignored (a shell pipe adds a
    newline)."""
    return hashlib.sha256(text.strip().encode("ascii", "replace")).hexdigest()


def read_probe(path: str, limit: int = 2 * MAX_PROBE_BYTES) -> tuple[str, float]:
    """The payload sent back (a file, or "-" for stdin) and the wall-clock time it was all
    there; TopoError when it cannot be read or exceeds `limit` bytes (not a probe)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise TopoError(f"cannot read the probe: {e.strerror or e}", source=path) from None
    done = time.time()
    if len(data) > limit:
        raise TopoError(f"the probe is larger than {limit} bytes: not a probe",
                        source="<stdin>" if path == "-" else path)
    return data.decode("ascii", "replace"), done
