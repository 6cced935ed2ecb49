"""Scalar values of the HostState schema: interface names, MAC addresses, IPv4 and IPv6
addresses and networks, rates and routing tables, each a parser that raises ValueError with a
message naming the value (pydantic turns it into a problem at the value's YAML path). Used by
every section's model."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, PlainSerializer

TABLE_NAMES = {"main": 254, "default": 253}
LOCAL_TABLE = 255

# --------------------------------------------------------------------------------
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@+-]{1,15}$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?\s*$", re.IGNORECASE)
_RATE_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
# HTB keeps a rate in bytes/s and its burst as a 32-bit transmit time: at 1 byte/s that time
# overflows (8bit failed at apply); 1kbit is comfortably inside what the kernel can express
MIN_RATE = 1000


def is_ifname(v: object) -> bool:
    """Whether `v` is a name the schema can spell (1-15 of [A-Za-z0-9_.:@+-]). The kernel
    allows more (`v=0`, `vé0`, bytes that are not UTF-8): such links are someone else's and
    the agent leaves them and everything on them alone."""
    return isinstance(v, str) and bool(_IFNAME.match(v)) and v not in (".", "..")


def ifname(v: str) -> str:
    """An interface name as the kernel accepts it (1-15 characters)."""
    if not is_ifname(v):
        raise ValueError(f"not an interface name (1-15 of [A-Za-z0-9_.:@+-]): {v!r}")
    return v


def name_text(name: str) -> str:
    """A link name for a message: as is when the schema can spell it, else quoted with bytes
    that are not printable UTF-8 escaped (observe decodes names with surrogateescape)."""
    if is_ifname(name):
        return name
    raw = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "'" + "".join(c if c.isprintable() else ascii(c)[1:-1] for c in raw) + "'"


def mac(v: str) -> str:
    """A MAC address, lower case."""
    v = str(v).lower()
    if not _MAC.match(v):
        raise ValueError(f"not a MAC address: {v!r}")
    return v


def ipv4(v: Any) -> str:
    """An IPv4 address in its canonical spelling."""
    try:
        return str(ipaddress.IPv4Address(str(v)))
    except ValueError:
        raise ValueError(f"not an IPv4 address: {v!r}") from None


def ipv4_interface(v: Any) -> str:
    """`a.b.c.d/len` (host address plus prefix length). The prefix is required: a bare address
    would silently become a /32 with no connected route."""
    if not isinstance(v, str) or "/" not in v:
        raise ValueError(f"not an IPv4 address with prefix length (a.b.c.d/len): {v!r}")
    try:
        return str(ipaddress.IPv4Interface(str(v)))
    except ValueError:
        raise ValueError(f"not an IPv4 address with prefix length: {v!r}") from None


def ipv4_network(v: Any) -> str:
    """A network with host bits clear; `default` is 0.0.0.0/0; a bare address means /32."""
    s = str(v)
    if s == "default":
        return "0.0.0.0/0"
    try:
        return str(ipaddress.IPv4Network(s, strict=True))
    except ValueError as e:
        if "host bits set" in str(e):
            raise ValueError(f"{s} has host bits set") from None
        raise ValueError(f"not an IPv4 network: {v!r}") from None


def ip(v: Any) -> str:
    """An IPv4 or IPv6 address in its canonical spelling (IPv6 compressed, lower case)."""
    s = str(v)
    if ":" not in s:
        return ipv4(v)
    try:
        return str(ipaddress.IPv6Address(s))
    except ValueError:
        raise ValueError(f"not an IPv6 address: {v!r}") from None


def ip_interface(v: Any) -> str:
    """`a.b.c.d/len` or `x:y::z/len` (host address plus prefix length)."""
    if not isinstance(v, str) or ":" not in v:
        return ipv4_interface(v)
    if "/" not in v:
        raise ValueError(f"not an IPv6 address with prefix length (x::y/len): {v!r}")
    _prefix_in_range(v, 128)
    try:
        return str(ipaddress.IPv6Interface(v))
    except ValueError:
        raise ValueError(f"not an IPv6 address with prefix length: {v!r}") from None


def _prefix_in_range(s: str, most: int) -> None:
    plen = s.rpartition("/")[2]
    if plen.isdigit() and int(plen) > most:
        raise ValueError(f"prefix length /{plen} is over /{most}: {s!r}")


def ip_network(v: Any) -> str:
    """An IPv4 or IPv6 network with host bits clear; `default` is 0.0.0.0/0 and `default6`
    ::/0; a bare address means /32 or /128."""
    s = str(v)
    if s == "default6":
        return "::/0"
    if ":" not in s:
        return ipv4_network(v)
    _prefix_in_range(s, 128)
    try:
        return str(ipaddress.IPv6Network(s, strict=True))
    except ValueError as e:
        if "host bits set" in str(e):
            raise ValueError(f"{s} has host bits set") from None
        raise ValueError(f"not an IPv6 network: {v!r}") from None


def family(text: str) -> int:
    """4 or 6: the family of an address or network in canonical text."""
    return 6 if ":" in text else 4


def is_link_local(text: str) -> bool:
    """Whether an IPv6 address (or address/len) is link-local (fe80::/10): the kernel's, one
    per link, never the agent's."""
    return ":" in text and ipaddress.IPv6Address(text.partition("/")[0]).is_link_local


def parse_rate(v: Any) -> int:
    """Rates as tc writes them (`100mbit`, `1.5gbit`, `800kbit`) or integers, in bit/s.

    `bps` means bytes per second, as in tc(8)."""
    if isinstance(v, bool):
        raise ValueError(f"not a rate: {v!r}")
    if isinstance(v, int):
        bits = v
    else:
        m = _RATE.match(str(v))
        if not m:
            raise ValueError(f"not a rate (e.g. 100mbit, 2gbit): {v!r}")
        bits = float(m.group(1)) * _RATE_SCALE[m.group(2).lower()]
        if (m.group(3) or "bit").lower() == "bps":
            bits *= 8
        bits = int(round(bits))
    if not MIN_RATE <= bits <= 4 * 10**12:
        raise ValueError(f"rate out of range (1kbit .. 4tbit; HTB cannot express less): {v!r}")
    return bits


def format_rate(bits: int) -> str:
    """bit/s in tc's spelling with the largest exact unit (`100mbit`, `1500kbit`)."""
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


def routing_table(v: Any) -> int:
    """A routing table number (`main` and `default` by name; not local)."""
    if isinstance(v, str) and v in TABLE_NAMES:
        return TABLE_NAMES[v]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not a routing table (an integer, main or default): {v!r}")
    if v == LOCAL_TABLE or not 1 <= v < 2**32:
        raise ValueError(f"table {v} out of range (1..2^32-1, not 255/local)")
    return v


IfName = Annotated[str, AfterValidator(ifname)]
Mac = Annotated[str, AfterValidator(mac)]
IPv4 = Annotated[str, AfterValidator(ipv4)]
IPv4Iface = Annotated[str, AfterValidator(ipv4_interface)]
IPv4Net = Annotated[str, AfterValidator(ipv4_network)]
IP = Annotated[str, AfterValidator(ip)]  # IPv4 or IPv6
IPIface = Annotated[str, AfterValidator(ip_interface)]
IPNet = Annotated[str, AfterValidator(ip_network)]
Rate = Annotated[int, BeforeValidator(parse_rate), PlainSerializer(format_rate, return_type=str)]
Table = Annotated[int, BeforeValidator(routing_table)]
