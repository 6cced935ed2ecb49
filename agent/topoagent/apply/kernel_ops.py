"""Typed kernel operations (netlink): the diff's output, the apply's input, each with its exact
inverse. ("ops" in the agent means these; graph operators in the controller are `graph.ops`.)

An operation carries everything needed to undo it (the value it overwrites, the object it
deletes), so a failed apply is reverted by running the inverses of the operations already done,
newest first. `PHASES` fixes the dependency order: links before addresses, old routes gone
before addresses go, addresses before the routes through them, qdiscs before classes before
filters (and the reverse when deleting). A link goes down last: the kernel flushes the routes
through a link that goes down, and the agent's own deletions must find them first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from topoagent.state.host import RT_PROTO, QosClass, Route, Rule
from topoagent.state.values import format_rate
from topoagent.target import Target

PHASES = (
    "sysctl", "ovs-db", "link", "addr-add", "filter-del", "class-del", "qdisc-del", "rule-del",
    "route-del", "addr-del", "ovs-db-del", "route-set", "rule-add", "qdisc-set", "class-set",
    "filter-add", "ovs-flows", "ovs-filters", "link-down",
)  # ovs-*: topoagent.apply.ovs (bridges and internal ports before links; flows after everything)


class Driver(Protocol):
    """What an operation needs from the host; drivers.netlink implements it with pyroute2."""

    target: Target

    def set_sysctl(self, path: str, value: str) -> None:
        """Write `value` to /proc/sys/`path`."""

    def set_link(self, dev: str, mtu: int | None, up: bool | None) -> None:
        """Set `dev`'s MTU and/or up state (None: unchanged)."""

    def add_address(self, dev: str, address: str, proto: int) -> None:
        """Add `address` (a.b.c.d/len) to `dev` with protocol `proto`."""

    def del_address(self, dev: str, address: str) -> None:
        """Remove `address` from `dev`."""

    def set_route(self, route: Route, proto: int) -> None:
        """Create or replace `route` with protocol `proto`."""

    def del_route(self, route: Route, proto: int) -> None:
        """Delete `route`."""

    def add_rule(self, rule: Rule, proto: int) -> None:
        """Add policy rule `rule` with protocol `proto`."""

    def del_rule(self, rule: Rule, proto: int) -> None:
        """Delete policy rule `rule`."""

    def add_qdisc(self, dev: str, rate: int) -> None:
        """Add the agent's HTB root on `dev` with a root class at `rate`."""

    def set_root_rate(self, dev: str, rate: int) -> None:
        """Change the root class rate on `dev`."""

    def del_qdisc(self, dev: str) -> None:
        """Delete the agent's root qdisc on `dev`."""

    def set_class(self, dev: str, cls: QosClass) -> None:
        """Create or replace HTB class `cls` on `dev`."""

    def del_class(self, dev: str, minor: int) -> None:
        """Delete HTB class `minor` on `dev`."""

    def add_filter(self, dev: str, minor: int, dst: str) -> None:
        """Add the u32 filter for `dst` to class `minor` on `dev`."""

    def del_filter(self, dev: str, minor: int) -> None:
        """Delete the u32 filter of class `minor` on `dev`."""

    # requests: what the batched path sends (topoagent.drivers.nlwrite.Request each)
    def call(self, requests: list, stop: bool = False) -> list:
        """Send `requests` many per send; one acknowledgement (`.ok`, `.reason()`) each."""

    def run(self, requests: list) -> None:
        """Send `requests`; an exception naming the first the kernel refused."""

    def link_request(self, dev: str, mtu: int | None, up: bool | None) -> Any:
        """The request setting `dev`'s MTU and/or up state."""

    def address_request(self, delete: bool, dev: str, address: str, proto: int = 0,
                        nodad: bool = False) -> Any:
        """The request adding or deleting `address` on `dev`."""

    def route_request(self, delete: bool, route: Route, proto: int,
                      exclusive: bool = False) -> Any:
        """The request replacing (`exclusive`: creating only) or deleting `route`."""

    def rule_request(self, delete: bool, rule: Rule, proto: int) -> Any:
        """The request adding or deleting `rule`."""

    def qdisc_requests(self, dev: str, rate: int) -> list:
        """The requests adding the agent's HTB root and root class on `dev`."""

    def root_rate_request(self, dev: str, rate: int) -> Any:
        """The request changing the root class rate on `dev`."""

    def del_qdisc_request(self, dev: str) -> Any:
        """The request deleting the agent's root qdisc on `dev`."""

    def class_request(self, dev: str, cls: QosClass) -> Any:
        """The request creating or replacing HTB class `cls` on `dev`."""

    def del_class_request(self, dev: str, minor: int) -> Any:
        """The request deleting HTB class `minor` on `dev`."""

    def filter_request(self, delete: bool, dev: str, minor: int, dst: str) -> Any:
        """The request adding or deleting the u32 filter of class `minor` (for `dst`)."""


@dataclass(frozen=True)
class Op:
    """A typed kernel operation: `apply` runs it through a driver, `inverse` undoes it, `describe`
    says it."""

    phase: ClassVar[str]

    def requests(self, drv: Driver) -> list | None:
        """The netlink requests that perform the operation, in order, or None when it is not
        (only) requests (a sysctl, a link, OVS): then `apply` performs it. Operations that are
        requests are sent many per send (topoagent.apply.batch)."""
        return None

    def apply(self, drv: Driver) -> None:
        """Perform the operation through `drv`."""
        reqs = self.requests(drv)
        if reqs is None:
            raise NotImplementedError
        drv.run(reqs)

    def inverse(self) -> Op:
        """The operation that undoes this one (it carries the values it restores)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The operation as one human-readable line."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """The operation as JSON-ready data: class, phase and description."""
        return {"op": type(self).__name__, "phase": self.phase, "what": self.describe()}


@dataclass(frozen=True)
class SetSysctl(Op):
    """Write a sysctl under /proc/sys/net (`old` is the value the inverse restores). `late`: the
    sysctl of a link this apply creates (an OVS internal port), written once the link exists."""

    path: str
    value: str
    old: str
    late: bool = False

    @property
    def phase(self) -> str:  # type: ignore[override]
        """`sysctl` (first), or `link` (after the OVS bridges and their ports) when `late`."""
        return "link" if self.late else "sysctl"

    def apply(self, drv: Driver) -> None:
        drv.set_sysctl(self.path, self.value)

    def inverse(self) -> Op:
        return SetSysctl(self.path, self.old, self.value, self.late)

    def describe(self) -> str:
        return f"sysctl {self.path.replace('/', '.')} = {self.value} (was {self.old})"


@dataclass(frozen=True)
class SetLink(Op):
    """Set a link's MTU and/or up/down state (the old values are kept for the inverse)."""

    dev: str
    mtu: int | None
    up: bool | None
    old_mtu: int | None
    old_up: bool | None

    @property
    def phase(self) -> str:  # type: ignore[override]
        """`link-down` when the link goes down (late in the order), else `link`."""
        return "link-down" if self.up is False else "link"

    def requests(self, drv: Driver) -> list | None:
        return [drv.link_request(self.dev, self.mtu, self.up)]

    def inverse(self) -> Op:
        return SetLink(self.dev, self.old_mtu, self.old_up, self.mtu, self.up)

    def describe(self) -> str:
        parts = []
        if self.mtu is not None:
            parts.append(f"mtu {self.mtu} (was {self.old_mtu})")
        if self.up is not None:
            was = "up" if self.old_up else "down"
            parts.append(("up" if self.up else "down") + f" (was {was})")
        return f"link {self.dev}: " + ", ".join(parts)


@dataclass(frozen=True)
class AddAddress(Op):
    """Add an address to a link with the agent's protocol mark."""

    phase: ClassVar[str] = "addr-add"
    dev: str
    address: str
    proto: int = RT_PROTO
    nodad: bool = False  # IPv6: usable at once, without duplicate address detection

    def requests(self, drv: Driver) -> list | None:
        return [drv.address_request(False, self.dev, self.address, self.proto, self.nodad)]

    def inverse(self) -> Op:
        return DelAddress(self.dev, self.address, self.proto)

    def describe(self) -> str:
        return f"add address {self.address} dev {self.dev}" + " nodad" * self.nodad


@dataclass(frozen=True)
class DelAddress(Op):
    """Remove an address from a link."""

    phase: ClassVar[str] = "addr-del"
    dev: str
    address: str
    proto: int = RT_PROTO

    def requests(self, drv: Driver) -> list | None:
        if "." in self.address:  # IPv4: the promote_secondaries dance (drivers.netlink)
            return None
        return [drv.address_request(True, self.dev, self.address)]

    def apply(self, drv: Driver) -> None:
        drv.del_address(self.dev, self.address)

    def inverse(self) -> Op:
        # an IPv6 address put back was on the link a moment ago: no second detection (it
        # would be tentative, unusable as a route's source, for a second or two)
        return AddAddress(self.dev, self.address, self.proto, nodad=":" in self.address)

    def describe(self) -> str:
        return f"delete address {self.address} dev {self.dev}"


def route_text(r: Route) -> str:
    """A route as `ip route` would print it."""
    hops = " ".join(
        "nexthop" * bool(r.nexthops) + (f" via {h.via}" if h.via else "")
        + (f" dev {h.dev}" if h.dev else "") + (f" weight {h.weight}" if r.nexthops else "")
        for h in r.hops()
    )
    table = "" if r.table == 254 else f" table {r.table}"
    metric = f" metric {r.metric}" if r.metric else ""
    src = f" src {r.src}" if r.src else ""
    return f"{r.dst}{table}{metric} {hops.strip()}{src}"


@dataclass(frozen=True)
class SetRoute(Op):
    """Add or replace a route (replace keeps the (table, dst, metric) key, so it is atomic).

    `exclusive`: the diff saw no route at this key, so the kernel must create it, not replace
    one: a route someone else added there after the agent looked is refused (EEXIST), never
    overwritten (it could not be given back: the rollback would delete it). Inverses and
    journal replays replace (they must be idempotent: after a crash the route may be there)."""

    phase: ClassVar[str] = "route-set"
    route: Route
    proto: int = RT_PROTO
    old: Route | None = None
    old_proto: int = 0
    exclusive: bool = False

    def requests(self, drv: Driver) -> list | None:
        return [drv.route_request(False, self.route, self.proto, self.exclusive)]

    def inverse(self) -> Op:
        if self.old is None:
            return DelRoute(self.route, self.proto)
        return SetRoute(self.old, self.old_proto, self.route, self.proto)

    def describe(self) -> str:
        verb = "add" if self.old is None else "replace"
        return f"{verb} route {route_text(self.route)}"


@dataclass(frozen=True)
class DelRoute(Op):
    """Delete a route (the inverse puts it back with its protocol)."""

    phase: ClassVar[str] = "route-del"
    route: Route
    proto: int = RT_PROTO

    def requests(self, drv: Driver) -> list | None:
        return [drv.route_request(True, self.route, self.proto)]

    def inverse(self) -> Op:
        return SetRoute(self.route, self.proto)

    def describe(self) -> str:
        return f"delete route {route_text(self.route)}"


def rule_text(r: Rule) -> str:
    """A policy rule as `ip rule` would print it."""
    parts = [f"priority {r.priority}", f"from {r.from_ or 'all'}"]
    if r.to:
        parts.append(f"to {r.to}")
    if r.fwmark:
        parts.append(f"fwmark {r.fwmark:#x}")
    if r.iif:
        parts.append(f"iif {r.iif}")
    if r.oif:
        parts.append(f"oif {r.oif}")
    parts.append(f"lookup {r.table}")
    return ("-6 " if r.family == "ipv6" else "") + " ".join(parts)


@dataclass(frozen=True)
class AddRule(Op):
    """Add a policy rule with the agent's protocol mark."""

    phase: ClassVar[str] = "rule-add"
    rule: Rule
    proto: int = RT_PROTO

    def requests(self, drv: Driver) -> list | None:
        return [drv.rule_request(False, self.rule, self.proto)]

    def inverse(self) -> Op:
        return DelRule(self.rule, self.proto)

    def describe(self) -> str:
        return f"add rule {rule_text(self.rule)}"


@dataclass(frozen=True)
class DelRule(Op):
    """Delete a policy rule."""

    phase: ClassVar[str] = "rule-del"
    rule: Rule
    proto: int = RT_PROTO

    def requests(self, drv: Driver) -> list | None:
        return [drv.rule_request(True, self.rule, self.proto)]

    def inverse(self) -> Op:
        return AddRule(self.rule, self.proto)

    def describe(self) -> str:
        return f"delete rule {rule_text(self.rule)}"


@dataclass(frozen=True)
class AddQdisc(Op):
    """The agent's HTB root (handle TC_MAJOR:) with root class :1 at the link rate."""

    phase: ClassVar[str] = "qdisc-set"
    dev: str
    rate: int

    def requests(self, drv: Driver) -> list | None:
        return drv.qdisc_requests(self.dev, self.rate)

    def inverse(self) -> Op:
        return DelQdisc(self.dev, self.rate)

    def describe(self) -> str:
        return f"add htb qdisc dev {self.dev} link rate {format_rate(self.rate)}"


@dataclass(frozen=True)
class SetRootRate(Op):
    """Change the rate of the agent's HTB root class on a device."""

    phase: ClassVar[str] = "qdisc-set"
    dev: str
    rate: int
    old: int

    def requests(self, drv: Driver) -> list | None:
        return [drv.root_rate_request(self.dev, self.rate)]

    def inverse(self) -> Op:
        return SetRootRate(self.dev, self.old, self.rate)

    def describe(self) -> str:
        return (f"set link rate dev {self.dev} {format_rate(self.rate)} "
                f"(was {format_rate(self.old)})")


@dataclass(frozen=True)
class DelQdisc(Op):
    """Remove the agent's whole tree from an interface; the inverse rebuilds it exactly."""

    phase: ClassVar[str] = "qdisc-del"
    dev: str
    rate: int
    classes: tuple[QosClass, ...] = field(default=())  # with dst filled in from the filters

    def requests(self, drv: Driver) -> list | None:
        return [drv.del_qdisc_request(self.dev)]

    def inverse(self) -> Op:
        return RestoreQdisc(self.dev, self.rate, self.classes)

    def describe(self) -> str:
        return f"delete htb qdisc dev {self.dev} ({len(self.classes)} classes)"


@dataclass(frozen=True)
class RestoreQdisc(Op):
    """Recreate a deleted agent HTB tree (root rate and classes): the inverse of deleting it."""

    phase: ClassVar[str] = "qdisc-set"
    dev: str
    rate: int
    classes: tuple[QosClass, ...] = field(default=())

    def requests(self, drv: Driver) -> list | None:
        out = drv.qdisc_requests(self.dev, self.rate)
        for c in self.classes:
            out += [drv.class_request(self.dev, c),
                    drv.filter_request(False, self.dev, c.id, c.dst)]
        return out

    def inverse(self) -> Op:
        return DelQdisc(self.dev, self.rate, self.classes)

    def describe(self) -> str:
        return f"restore htb qdisc dev {self.dev} ({len(self.classes)} classes)"


def class_text(dev: str, c: QosClass) -> str:
    """An HTB class as text: device, id, destination, rate and ceiling."""
    return (f"dev {dev} class {c.id} to {c.dst} rate {format_rate(c.rate)} "
            f"ceil {format_rate(c.ceil or c.rate)}")


@dataclass(frozen=True)
class SetClass(Op):
    """Create or change an HTB class (`old`: the class it replaces, for the inverse)."""

    phase: ClassVar[str] = "class-set"
    dev: str
    cls: QosClass
    old: QosClass | None = None

    def requests(self, drv: Driver) -> list | None:
        return [drv.class_request(self.dev, self.cls)]

    def inverse(self) -> Op:
        if self.old is None:
            return DelClass(self.dev, self.cls)
        return SetClass(self.dev, self.old, self.cls)

    def describe(self) -> str:
        return f"{'add' if self.old is None else 'change'} {class_text(self.dev, self.cls)}"


@dataclass(frozen=True)
class DelClass(Op):
    """Delete an HTB class."""

    phase: ClassVar[str] = "class-del"
    dev: str
    cls: QosClass

    def requests(self, drv: Driver) -> list | None:
        return [drv.del_class_request(self.dev, self.cls.id)]

    def inverse(self) -> Op:
        return SetClass(self.dev, self.cls)

    def describe(self) -> str:
        return f"delete {class_text(self.dev, self.cls)}"


@dataclass(frozen=True)
class AddFilter(Op):
    """Add the u32 filter sending traffic for `dst` to class `minor`."""

    phase: ClassVar[str] = "filter-add"
    dev: str
    minor: int
    dst: str

    def requests(self, drv: Driver) -> list | None:
        return [drv.filter_request(False, self.dev, self.minor, self.dst)]

    def inverse(self) -> Op:
        return DelFilter(self.dev, self.minor, self.dst)

    def describe(self) -> str:
        return f"add filter dev {self.dev} dst {self.dst} -> class {self.minor}"


@dataclass(frozen=True)
class DelFilter(Op):
    """Delete the u32 filter of class `minor` (the last of its family takes its u32
    preference along: drivers.netlink.NetlinkDriver.filter_request)."""

    phase: ClassVar[str] = "filter-del"
    dev: str
    minor: int
    dst: str

    def requests(self, drv: Driver) -> list | None:
        return [drv.filter_request(True, self.dev, self.minor, self.dst)]

    def inverse(self) -> Op:
        return AddFilter(self.dev, self.minor, self.dst)

    def describe(self) -> str:
        return f"delete filter dev {self.dev} dst {self.dst} -> class {self.minor}"


def ordered(ops: list[Op]) -> list[Op]:
    """Dependency order (stable within a phase)."""
    rank = {p: i for i, p in enumerate(PHASES)}
    return sorted(ops, key=lambda op: rank[op.phase])
