"""HostState: the complete desired network state of one host (the agent's half of the plan).

Typed pydantic models that reject unknown keys. Every value is parsed and range-checked here, so
the rest of the agent works on canonical values: addresses as `a.b.c.d/len` strings, networks
with host bits clear, rates as integer bit/s, tables and priorities as integers. Errors come out
of `load_host_state` as `StateError`, one line per problem, each naming its YAML path
(`routes[3].nexthops[0].via: not an IPv4 address`). Every address, network, next hop, rule
and QoS destination may be IPv4 or IPv6; one object keeps to one family (a route's next hops
and source are of its destination's family, a rule's from and to of its family).

The controller imports this module to render plans: one schema, two users.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from topoagent.protocol import TopoError
from topoagent.state import yamlload
from topoagent.state.ovs import OvsState, ovs_problems
from topoagent.state.schema import FieldProblems, Model, validation_problems
from topoagent.state.values import (
    IP,
    IfName,
    IPIface,
    IPNet,
    IPv4Net,
    Mac,
    Rate,
    Table,
    family,
    format_rate,
    is_link_local,
)

# --- ownership marks: everything the agent creates carries one of these -------------------------
# route/rule/address protocol number: the kernel's own are < 20, routing daemons >= 42
RT_PROTO = 76
RULE_PRIORITY_MIN, RULE_PRIORITY_MAX = 1000, 32765  # 0, 32766, 32767 are the kernel's defaults
TC_MAJOR = 0x7470  # HTB root handle "7470:" ("tp"), only on interfaces listed under qos
IP6_DEFAULT_METRIC = 1024  # what the kernel gives an IPv6 route asked with metric 0
MAX_CLASSES = 0xFFF - 1  # HTB minors 2..0xFFF (1 is the root class; u32 node ids are 12 bits)


MAX_BYTES = yamlload.MAX_BYTES  # of a state, cluster, job or plan file (or stdin)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class StateError(TopoError, ValueError):
    """Invalid desired state; `problems` is a list of (yaml_path, message)."""


# Token credit of the agent's HTB classes: this long at the class's rate, at least two frames
# of the device, at most 30 s of the rate (the kernel keeps it as a 32-bit transmit time).
# pyroute2's default (one 1600-byte frame) is less than one jumbo frame or GSO packet, so a
# class sending at its rate waited for tokens after every packet: tworack8's trees+bandwidth
# plan (one class per destination) trained at 0.741 s per iteration against 0.554 s with this
# credit. The lab's cables had the same cause (topoctl lab, BURST_S).
HTB_BURST_S = 0.004


def htb_credit(rate: int, mtu: int) -> int:
    """Bytes of token credit of an agent HTB class at `rate` bit/s on a device of `mtu`."""
    return min(max(int(rate / 8 * HTB_BURST_S), 2 * (mtu + 14)), rate // 8 * 30)


_Model = Model  # the public schema base, short name inside this module


# --- the schema ----------------------------------------------------------------------------------
class Interface(_Model):
    """An existing link the agent configures (it never creates or renames links)."""

    name: IfName
    mac: Mac | None = None  # asserted: the link called `name` must have this MAC
    addresses: list[IPIface] = Field(default_factory=list)
    mtu: Annotated[int, Field(ge=68, le=65536)] | None = None  # lo has 65536
    up: bool | None = None
    # IPv6 duplicate address detection for the addresses the agent adds here: false adds them
    # usable at once (IFA_F_NODAD: a lab, or a cable whose far end the plan addresses too);
    # unset or true lets the kernel probe first (the address is tentative for a second or two)
    dad: bool | None = None

    @model_validator(mode="after")
    def _unique_addresses(self) -> Interface:
        if len(set(self.addresses)) != len(self.addresses):
            raise ValueError("addresses: listed twice")
        local = [(f"addresses[{j}]", f"{a} is link-local (fe80::/10): the kernel makes one per "
                  f"link and the agent leaves it alone")
                 for j, a in enumerate(self.addresses) if is_link_local(a)]
        if local:
            raise FieldProblems(local)
        return self


class Sysctl(_Model):
    """The sysctls the agent manages: ip_forward, rp_filter per interface, and the hash that
    spreads flows over a multipath route's next hops (`net.ipv4.fib_multipath_hash_policy`:
    0 source and destination address, the kernel's default, which puts every connection
    between two hosts on one next hop; 1 also the ports (L4), so several connections split by
    the weights; 2 and 3 the inner headers / a custom field set)."""

    ip_forward: bool | None = None
    rp_filter: dict[IfName, Annotated[int, Field(ge=0, le=2)]] = Field(default_factory=dict)
    multipath_hash_policy: Annotated[int, Field(ge=0, le=3)] | None = None
    # IPv6 (net.ipv6.conf.all.forwarding, net.ipv6.fib_multipath_hash_policy: the same values
    # as IPv4's). The kernel has no IPv6 rp_filter (reverse-path filtering of IPv6 is
    # netfilter's rpfilter match, which the agent does not manage)
    ipv6_forwarding: bool | None = None
    ipv6_multipath_hash_policy: Annotated[int, Field(ge=0, le=3)] | None = None


class Nexthop(_Model):
    """One next hop of a multipath route: gateway, device and weight."""

    via: IP | None = None
    dev: IfName | None = None
    weight: Annotated[int, Field(ge=1, le=256)] = 1

    @model_validator(mode="after")
    def _some_target(self) -> Nexthop:
        if self.via is None and self.dev is None:
            raise ValueError("a next hop needs via, dev or both")
        return self


class Route(_Model):
    """One route: a single next hop (`via`/`dev`) or weighted multipath (`nexthops`)."""

    dst: IPNet
    table: Table = 254
    metric: Annotated[int, Field(ge=0, lt=2**32)] = 0  # IPv6: 0 is the kernel's 1024
    via: IP | None = None
    dev: IfName | None = None
    nexthops: list[Nexthop] = Field(default_factory=list)
    src: IP | None = None

    @model_validator(mode="before")
    @classmethod
    def _ipv6_metric(cls, data: Any) -> Any:
        """The kernel gives an IPv6 route without a metric (or with 0) metric 1024: the route's
        key says so too, or the agent would never find the route it made."""
        dst = str(data.get("dst", "")) if isinstance(data, dict) else ""
        if ((":" in dst or dst == "default6")
                and data.get("metric", 0) in (0, None)
                and not isinstance(data.get("metric"), bool)):
            data = {**data, "metric": IP6_DEFAULT_METRIC}
        return data

    @model_validator(mode="after")
    def _one_family(self) -> Route:
        """Next hops and source of the destination's family; a link-local gateway with its
        link (it is ambiguous without one)."""
        fam = family(self.dst)
        problems = []
        hops = [(f"nexthops[{j}].", h) for j, h in enumerate(self.nexthops)] or [("", self)]
        for where, h in hops:
            if h.via is not None and family(h.via) != fam:
                problems.append((f"{where}via", f"an IPv{family(h.via)} next hop on an IPv{fam} "
                                 f"route ({self.dst})"))
            elif h.via is not None and is_link_local(h.via) and h.dev is None:
                problems.append((f"{where}via", f"link-local next hop {h.via} needs dev (the "
                                 f"link it is on)"))
        if self.src is not None and family(self.src) != fam:
            problems.append(("src", f"an IPv{family(self.src)} source on an IPv{fam} route"))
        if problems:
            raise FieldProblems(problems)
        return self

    @model_validator(mode="after")
    def _one_form(self) -> Route:
        if self.nexthops:
            if self.via is not None or self.dev is not None:
                raise ValueError("give either via/dev or nexthops, not both")
            if len(self.nexthops) < 2:
                raise ValueError("nexthops: needs two or more; a single next hop is via/dev")
            if len({(n.via, n.dev) for n in self.nexthops}) != len(self.nexthops):
                raise ValueError("nexthops: the same next hop is listed twice")
        elif self.via is None and self.dev is None:
            raise ValueError("a route needs via, dev or nexthops")
        return self

    @property
    def key(self) -> tuple[int, str, int]:
        """(table, dst, metric): what identifies a route in the kernel."""
        return (self.table, self.dst, self.metric)

    def hops(self) -> list[Nexthop]:
        """Next hops in one canonical form (single-hop routes as a one-element list)."""
        if self.nexthops:
            return sorted(self.nexthops, key=lambda n: (n.via or "", n.dev or ""))
        # via and dev are validated already: no second validation (diff calls this per route)
        return [Nexthop.model_construct(via=self.via, dev=self.dev, weight=1)]


class Rule(_Model):
    """A policy rule that looks up `table`; `from`/`to` absent means all."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    priority: Annotated[int, Field(ge=RULE_PRIORITY_MIN, le=RULE_PRIORITY_MAX)]
    from_: IPNet | None = Field(default=None, alias="from")
    to: IPNet | None = None
    fwmark: Annotated[int, Field(ge=1, lt=2**32)] | None = None
    iif: IfName | None = None
    oif: IfName | None = None
    table: Table
    # the kernel keeps IPv4 and IPv6 rules apart (one list each): given by from/to when they
    # are, else ipv4 unless said
    family: Literal["ipv4", "ipv6"] = "ipv4"

    @model_validator(mode="before")
    @classmethod
    def _family_from_networks(cls, data: Any) -> Any:
        if isinstance(data, dict) and "family" not in data and any(
                ":" in str(data.get(k) or "") for k in ("from", "from_", "to")):
            data = {**data, "family": "ipv6"}
        return data

    @model_validator(mode="after")
    def _one_family(self) -> Rule:
        want = 6 if self.family == "ipv6" else 4
        problems = [(key, f"an IPv{family(net)} network in an {self.family} rule")
                    for key, net in (("from", self.from_), ("to", self.to))
                    if net is not None and family(net) != want]
        if problems:
            raise FieldProblems(problems)
        return self

    @property
    def key(self) -> tuple[str, int]:
        """(family, priority): what identifies an agent rule (each family has its own list)."""
        return (self.family, self.priority)


class QosClass(_Model):
    """Egress traffic of the interface towards `dst` gets `rate`, borrowing up to `ceil`."""

    # HTB minor and u32 node id (12 bits), so at most 4094 classes per interface
    id: Annotated[int, Field(ge=2, le=0xFFF)] | None = None  # default: position + 2
    dst: IPNet
    rate: Rate
    ceil: Rate | None = None  # default: the link rate


class Qos(_Model):
    """Per-destination egress QoS: an HTB tree, one class per destination, u32 dst filters."""

    dev: IfName
    driver: Literal["tc", "ovs"] = "tc"  # ovs: queues of an OVS port (see ovs_state)
    rate: Rate  # the link rate: root class; classes borrow up to their ceil below it
    classes: Annotated[list[QosClass], Field(max_length=MAX_CLASSES)] = Field(
        default_factory=list)

    @model_validator(mode="after")
    def _fits_link(self) -> Qos:
        problems = []
        ids = [c.id for c in self.classes if c.id is not None]
        if len(set(ids)) != len(ids):
            problems.append("classes: two classes share an id")
        dsts = [c.dst for c in self.classes]
        if len(set(dsts)) != len(dsts):
            problems.append("classes: two classes share a dst")
        for i, c in enumerate(self.classes):
            if c.dst in ("0.0.0.0/0", "::/0"):  # a u32 filter without keys: read as none
                problems.append(f"classes[{i}].dst: {c.dst} is all traffic, which the link "
                                f"rate (qos rate) already shapes; a class is for some "
                                f"destinations")
            if c.rate > self.rate:
                problems.append(f"classes[{i}].rate: {format_rate(c.rate)} is above the link rate "
                                f"{format_rate(self.rate)}")
            if c.ceil is not None and c.ceil > self.rate:
                problems.append(f"classes[{i}].ceil: {format_rate(c.ceil)} is above the link rate "
                                f"{format_rate(self.rate)}")
            if c.ceil is not None and c.ceil < c.rate:
                problems.append(f"classes[{i}].ceil: below its rate")
        total = sum(c.rate for c in self.classes)
        if total > self.rate:
            problems.append(f"classes: rates sum to {format_rate(total)}, above the link rate "
                            f"{format_rate(self.rate)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def resolved_classes(self) -> list[QosClass]:
        """Classes with their id and ceil filled in (ids default to position + 2)."""
        used = {c.id for c in self.classes if c.id is not None}
        out, nxt = [], 2
        for c in self.classes:
            cid = c.id
            if cid is None:
                while nxt in used:
                    nxt += 1
                cid, nxt = nxt, nxt + 1
            # validated values: no second validation (the diff resolves 2,560 classes twice)
            out.append(QosClass.model_construct(id=cid, dst=c.dst, rate=c.rate,
                                                ceil=c.ceil or self.rate))
        return out


class OffloadRule(_Model):
    """One TopoOpt-testbed forwarding rule: packets arriving on `dev` for `dst` get destination
    MAC `dst_mac` (tc pedit) and leave by `redirect` (tc mirred), i.e.
    `tc filter add dev DEV ingress protocol ip flower dst_ip DST action pedit ex munge eth dst
    set DST_MAC pipe action mirred egress redirect dev REDIRECT`."""

    dev: IfName
    dst: IPv4Net
    dst_mac: Mac
    redirect: IfName


class Forwarding(_Model):
    """How this host forwards traffic for others (TopoOpt's host-based forwarding).

    `kernel`: IP forwarding in the kernel. `tc-offload`: RoCE NICs forward in hardware through tc
    flower rules with pedit (`rules`); rendered and validated here, applied only where the
    kernel has them."""

    mode: Literal["kernel", "tc-offload"] = "kernel"
    rules: list[OffloadRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules_need_offload(self) -> Forwarding:
        if self.rules and self.mode != "tc-offload":
            raise StateError([("rules", "offload rules need mode: tc-offload")])
        return self


class HostState(_Model):
    """The whole desired network state of one host: interfaces, sysctls, routes, rules, QoS,
    forwarding, OVS."""

    interfaces: list[Interface] = Field(default_factory=list)
    sysctl: Sysctl = Field(default_factory=Sysctl)
    routes: list[Route] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)
    qos: list[Qos] = Field(default_factory=list)
    forwarding: Forwarding | None = None
    ovs: OvsState | None = None

    @model_validator(mode="after")
    def _cross_checks(self) -> HostState:
        problems = _duplicates("interfaces", [i.name for i in self.interfaces], "name")
        problems += ovs_problems(self)
        problems += _duplicates("routes", [r.key for r in self.routes], "table/dst/metric")
        problems += _duplicates("rules", [r.key for r in self.rules], "priority")
        problems += _duplicates("qos", [q.dev for q in self.qos], "dev")
        if problems:
            raise StateError(problems)
        return self

    def to_dict(self) -> dict:
        """The state as plain data (aliases, no unset values)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)

    def to_yaml(self) -> str:
        """The state as HostState YAML text."""
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False,
                         default_flow_style=False)


def _shared_ips(interfaces: list[Interface]) -> list[tuple[str, str]]:
    """One IP on two links (or twice on one, with two prefixes) is ambiguous: an error."""
    seen: dict[str, str] = {}
    out = []
    for i, iface in enumerate(interfaces):
        for j, a in enumerate(iface.addresses):
            ip = a.split("/")[0]
            where = f"interfaces[{i}].addresses[{j}]"
            if ip in seen:
                out.append((where, f"{ip} is already at {seen[ip]}"))
            else:
                seen[ip] = where
    return out


def _duplicates(section: str, keys: list, what: str) -> list[tuple[str, str]]:
    seen: dict = {}
    out = []
    for i, k in enumerate(keys):
        if k in seen:
            out.append((f"{section}[{i}]", f"same {what} as {section}[{seen[k]}]"))
        else:
            seen[k] = i
    return out


# --- loading -------------------------------------------------------------------------------------
def parse_host_state(data: Any, prefix: str = "") -> HostState:
    """Validate plain data (as loaded from YAML) into a HostState; `prefix` is prepended to
    every error path (the controller passes `hosts.h3`)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise StateError([(prefix, f"expected a mapping of HostState keys, got {kind}")])
    try:
        state = HostState.model_validate(data)
    except ValidationError as e:
        raise StateError(validation_problems(e, prefix)) from None
    # a host may have one IP on two links (someone else put it there): `show` and the journal
    # must describe that, so this is a check of desired documents, not of the model
    shared = _shared_ips(state.interfaces)
    if shared:
        raise StateError([(".".join(filter(None, [prefix, p])), m) for p, m in shared])
    return state


def load_yaml(text: str, source: str = "<input>") -> Any:
    """Parse YAML (or JSON) within the loader's limits (`topoagent.state.yamlload`: values,
    aliases, depth, integer digits, no YAML 1.1-only numbers or booleans); StateError naming
    `source` and the YAML path (or line and column) when refused, malformed, or when a mapping
    repeats a key."""
    if len(text) > MAX_BYTES:
        raise StateError([("", f"larger than {MAX_BYTES} bytes")], source=source)
    try:
        return yamlload.parse(text)
    except yamlload.InputLimit as e:
        raise StateError([(e.path, e.message)], source=source) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(e, "problem", None) or str(e)
        raise StateError([("", f"malformed YAML at {where}: {problem}")], source=source) from None


def decode_text(data: bytes, source: str) -> str:
    """UTF-8 bytes -> text; StateError naming `source` and the offending byte otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StateError([("", f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
                               f"{e.start}")], source=source) from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """What a file of `mode` is when it is not a regular file (None when it is)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return f"not a regular file ({kind}); give a file, or - for stdin"


def _read_regular(path: str | Path) -> bytes:
    """At most MAX_BYTES + 1 bytes of a regular file. FIFOs and devices are refused before
    they are read (a FIFO without a writer would block, /dev/zero never ends); the open
    itself does not block (O_NONBLOCK) and the check is repeated on what was opened."""
    try:
        kind = _not_regular(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise StateError([("", e.strerror or str(e))], source=str(path)) from None
    if kind is not None:
        raise StateError([("", kind)], source=str(path))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        kind = _not_regular(st.st_mode) or (
            f"larger than {MAX_BYTES} bytes" if st.st_size > MAX_BYTES else None)
        if kind is not None:
            raise StateError([("", kind)], source=str(path))
        try:
            return f.read(MAX_BYTES + 1)
        except OSError as e:
            raise StateError([("", e.strerror or str(e))], source=str(path)) from None


def read_text(path: str | Path) -> str:
    """The UTF-8 text of a regular file, or of stdin when `path` is "-", at most MAX_BYTES;
    StateError naming the file when it cannot be read, is not a regular file, is larger or is
    not UTF-8."""
    source = "<stdin>" if str(path) == "-" else str(path)
    data = sys.stdin.buffer.read(MAX_BYTES + 1) if source == "<stdin>" else _read_regular(path)
    if len(data) > MAX_BYTES:
        raise StateError([("", f"larger than {MAX_BYTES} bytes")], source=source)
    return decode_text(data, source)


def load_yaml_file(path: str | Path) -> Any:
    """Read and parse a YAML (or JSON) file ("-": stdin); StateError naming the file when it
    cannot be read, is not a regular file, is too large, is not UTF-8, is malformed or over a
    limit of the loader."""
    source = "<stdin>" if str(path) == "-" else str(path)
    return load_yaml(read_text(path), source)


def load_host_state(text: str, source: str = "<input>") -> HostState:
    """Parse and validate HostState YAML text; StateError (naming `source`) when invalid."""
    try:
        return parse_host_state(load_yaml(text, source))
    except StateError as e:
        raise e.at(source) from None
