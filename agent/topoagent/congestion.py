"""TCP congestion control of network namespaces, on kernels that restrict the choice.

A namespace other than the machine's own may make only the algorithms listed in the
machine-wide ``net.ipv4.tcp_allowed_congestion_control`` its default: any other fails with
EPERM even for root (Linux ``tcp_set_default_congestion_control``: non-initial namespaces get
only ``TCP_CONG_NON_RESTRICTED`` algorithms). The default algorithm of the machine is always
on that list; a machine whose default is BBR may leave cubic off it, while still having cubic
available (an AMD EPYC VM here: ``reno bbr`` allowed, ``reno bbr cubic``
available). The list only governs what may be *chosen*: a namespace keeps the default it was
given and its new sockets use it after the list changes back. So :func:`set_congestion_control`
widens the list for the moment of its writes and restores it at once; nothing machine-wide is
left changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from topoagent.machinelock import machine_lock
from topoagent.target import Target

__all__ = ["ALLOWED_SYSCTL", "AVAILABLE_SYSCTL", "CONGESTION_SYSCTL", "allowed_for_namespaces",
           "set_congestion_control"]

CONGESTION_SYSCTL = "net/ipv4/tcp_congestion_control"  # under /proc/sys, per namespace
ALLOWED_SYSCTL = "net/ipv4/tcp_allowed_congestion_control"  # machine-wide
AVAILABLE_SYSCTL = "net/ipv4/tcp_available_congestion_control"  # machine-wide


@contextlib.contextmanager
def allowed_for_namespaces(algorithm: str) -> Iterator[None]:
    """While inside, `algorithm` is on the machine's allowed list if this kernel has it and
    the list can be written (root); the list is restored on exit, also on error. One process
    at a time (a machine lock): a second one reading the widened list, then losing it when the
    first puts the old one back, would leave its namespaces on the machine's default."""
    with machine_lock("congestion"):
        yield from _widened(algorithm)


def _widened(algorithm: str) -> Iterator[None]:
    """`allowed_for_namespaces`' body, under its lock."""
    root = Target()
    allowed = root.read_sysctl(ALLOWED_SYSCTL)
    available = (root.read_sysctl(AVAILABLE_SYSCTL) or "").split()
    if allowed is None or algorithm in allowed.split() or algorithm not in available:
        yield
        return
    try:
        root.write_sysctl(ALLOWED_SYSCTL, f"{allowed} {algorithm}".strip())
    except OSError:  # not root: the namespaces keep what they inherit, and report it
        yield
        return
    try:
        yield
    finally:
        root.write_sysctl(ALLOWED_SYSCTL, allowed)


def set_congestion_control(netns_names: Iterable[str], algorithm: str) -> dict[str, str]:
    """Make `algorithm` the TCP congestion control of each named namespace; returns per
    namespace the one in effect afterwards (another one when this kernel lacks `algorithm`
    or the caller may not set it: the caller reports that)."""
    names = list(netns_names)
    with allowed_for_namespaces(algorithm):
        for ns in names:
            with contextlib.suppress(OSError):
                Target(netns=ns).write_sysctl(CONGESTION_SYSCTL, algorithm)
    return {ns: Target(netns=ns).read_sysctl(CONGESTION_SYSCTL) or "" for ns in names}
