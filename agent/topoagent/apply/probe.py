"""Reachability probes: ICMP echo to many addresses at once from inside the target.

Chosen before a change (only addresses that answer now), checked after it: a plan that cuts a
working next hop is reverted. One raw socket, all echoes sent together, one shared deadline, so
probing a hundred next hops costs one timeout, not a hundred."""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from topoagent.target import Target


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def _echo(ident: int, seq: int) -> bytes:
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    payload = b"topo-agent probe"
    return struct.pack("!BBHHH", 8, 0, _checksum(header + payload), ident, seq) + payload


def ping_many(target: Target, addresses: list[str], timeout: float = 0.5,
              tries: int = 2) -> set[str]:
    """The subset of `addresses` that answered an ICMP echo within `timeout` seconds."""
    if not addresses:
        return set()
    with target.inside():  # the socket belongs to the namespace it was created in
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    answered: set[str] = set()
    try:
        for attempt in range(tries):
            pending = [a for a in addresses if a not in answered]
            if not pending:
                break
            for seq, addr in enumerate(pending):
                try:
                    sock.sendto(_echo(ident, attempt * 10000 + seq), (addr, 0))
                except OSError:
                    pass  # unreachable now: simply no answer
            deadline = time.monotonic() + timeout / tries
            while len(answered) < len(addresses):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([sock], [], [], left)[0]:
                    break
                packet, (src, _) = sock.recvfrom(2048)
                ihl = (packet[0] & 0x0F) * 4
                kind, _, _, rid, _ = struct.unpack_from("!BBHHH", packet, ihl)
                if kind == 0 and rid == ident and src in addresses:
                    answered.add(src)
    finally:
        sock.close()
    return answered
