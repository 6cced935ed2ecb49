"""The cabling a direct-connect lab really has, read from the kernel, against a plan's `fabric`.

Observation uses nothing the lab wrote down (lab.json): a host port is a veth whose peer sits in
the wire namespace (`ip -j link`: `link_index`, `link_netnsid`, resolved with `ip netns
list-id`); a cable is a pair of wire ends whose ingress is redirected to each other (`tc -j
filter show ... ingress`: a mirred redirect `to_dev`), shaped by the HTB class on each end's
egress (`tc class show`), up or cut by the ends' link state. So a rewire that went wrong, a
hand-made `tc` change or a cut shows up as it is.

`compare` is pure: planned and observed cables in, missing / extra / mismatched out.
`kernel_rates` reads the HTB rate each wire end is shaped at (also for `lab.status`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from topoagent.state.values import parse_rate
from topoctl.lab import commands, names, netops


@dataclass(frozen=True)
class SeenCable:
    """A cable as the kernel has it: ports `a`, `b` (host:nic); bit/s shaped on the way a->b
    (egress of b's wire end) and b->a, None when unshaped; `one_way` when only one end
    redirects to the other; `up` when both wire ends are up."""

    a: str
    b: str
    rate_ab: int | None
    rate_ba: int | None
    up: bool = True
    one_way: bool = False


@dataclass(frozen=True)
class PlannedCable:
    """A cable of the plan's fabric: ports `a`, `b` (host:nic) and its rate in bit/s."""

    a: str
    b: str
    rate: int


@dataclass
class CablingReport:
    """Planned cabling against the observed one. Cables are named `a--b` with the ports in
    the plan's order (observed-only cables: sorted)."""

    missing: list[dict] = field(default_factory=list)  # planned, not in the kernel
    extra: list[dict] = field(default_factory=list)  # in the kernel, not planned
    mismatched: list[dict] = field(default_factory=list)  # both, but rate/state differ
    matching: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the lab is cabled exactly as planned."""
        return not (self.missing or self.extra or self.mismatched)

    def as_dict(self) -> dict:
        """Plain data (`topoctl lab status --plan --json`)."""
        return asdict(self) | {"ok": self.ok}


def _key(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def compare(planned: list[PlannedCable], seen: list[SeenCable]) -> CablingReport:
    """Missing (planned cable absent: no redirect pair between its two ports, e.g. one of them
    is cabled to another port), extra (observed pair not in the plan), mismatched (both ends
    right but a direction shaped at another rate or unshaped, cut, or redirected one way only).
    O(P + S)."""
    by_key = {_key(c.a, c.b): c for c in seen}
    rep = CablingReport()
    planned_keys = set()
    for p in planned:
        k = _key(p.a, p.b)
        planned_keys.add(k)
        name = f"{p.a}--{p.b}"
        s = by_key.get(k)
        if s is None:
            elsewhere = sorted(f"{c.a}--{c.b}" for c in seen
                               if {c.a, c.b} & {p.a, p.b})
            rep.missing.append({"cable": name, "rate": p.rate, "ports_cabled_to": elsewhere})
            continue
        rates = (s.rate_ab, s.rate_ba) if s.a == p.a else (s.rate_ba, s.rate_ab)
        problems = []
        for (x, y), r in zip(((p.a, p.b), (p.b, p.a)), rates, strict=True):
            if r != p.rate:
                problems.append(f"{x}->{y} shaped at {_fmt(r)}, planned {_fmt(p.rate)}")
        if s.one_way:
            problems.append("redirected one way only")
        if not s.up:
            problems.append("cut (a wire end is down)")
        if problems:
            rep.mismatched.append({"cable": name, "rate": p.rate, "kernel_rate": list(rates),
                                   "problems": problems})
        else:
            rep.matching.append(name)
    for s in seen:
        if _key(s.a, s.b) not in planned_keys:
            a, b = sorted((s.a, s.b))
            rates = [s.rate_ab, s.rate_ba] if a == s.a else [s.rate_ba, s.rate_ab]
            rep.extra.append({"cable": f"{a}--{b}", "kernel_rate": rates, "up": s.up})
    rep.extra.sort(key=lambda d: d["cable"])
    return rep


def _fmt(rate: int | None) -> str:
    if rate is None:
        return "no shaping"
    return f"{rate / 1e6:g}mbit"


def observe(lab_name: str, hosts: list[str]) -> list[SeenCable]:
    """The direct cables of lab `lab_name` as the kernel has them (its `hosts` by name; the
    namespaces are found by the lab's naming rule). Ports whose wire end redirects nowhere are
    not cabled."""
    wire = names.wire_ns(lab_name)
    # which namespace each nsid of a host namespace is
    port_of: dict[int, str] = {}  # wire ifindex -> host:nic
    for h in hosts:
        ns = names.host_ns(lab_name, h)
        ids = _nsids(ns)
        for ln in netops.ip_json("link", "show", ns=ns):
            if ln.get("ifname") == names.MGMT_IF or "link_index" not in ln:
                continue
            if ids.get(ln.get("link_netnsid")) != wire:
                continue
            port_of[int(ln["link_index"])] = f"{h}:{ln['ifname']}"
    links = {int(ln["ifindex"]): ln for ln in netops.ip_json("link", "show", ns=wire)}
    name_of = {idx: ln["ifname"] for idx, ln in links.items()}
    index_of = {v: k for k, v in name_of.items()}
    ends = {idx: name_of[idx] for idx in port_of if idx in name_of}
    target: dict[str, str] = {}  # wire end -> wire end its ingress is redirected to
    for dev in ends.values():
        for f in netops.tc_json("filter", "show", "dev", dev, "ingress", ns=wire):
            for act in (f.get("options") or {}).get("actions", []):
                if act.get("kind") == "mirred" and act.get("mirred_action") == "redirect":
                    target[dev] = act.get("to_dev")
    rates = kernel_rates(wire, sorted(ends.values()))
    out = []
    done: set[frozenset[str]] = set()
    for src, dst in sorted(target.items()):
        k = frozenset((src, dst))
        if k in done or dst not in index_of or index_of[dst] not in port_of:
            continue
        done.add(k)
        a, b = port_of[index_of[src]], port_of[index_of[dst]]
        up = all("UP" in links[index_of[e]].get("flags", []) for e in (src, dst))
        # a->b leaves through dst's egress; b->a through src's
        out.append(SeenCable(a, b, rates.get(dst), rates.get(src), up,
                             one_way=target.get(dst) != src))
    return out


def kernel_rates(ns: str, devs: list[str]) -> dict[str, int]:
    """dev -> HTB rate (bit/s) of class 1:1, read back from the kernel with `tc class show`
    (text: this iproute2 prints no JSON for HTB classes)."""
    lines = [f"class show dev {d}" for d in devs]
    p = netops.run(["tc", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n", check=False)
    it = iter(p.stdout.splitlines())
    out = {}
    # one output line per HTB class, in batch order; devices without a class print nothing,
    # so match each line's device by asking per device only when counts differ
    rows = [ln for ln in it if ln.startswith(f"class htb {commands.HTB_CLASS} ")]
    if len(rows) == len(devs):
        for d, ln in zip(devs, rows, strict=True):
            out[d] = _rate_of(ln)
        return out
    for d in devs:
        q = netops.run(["tc", "-n", ns, "class", "show", "dev", d], check=False).stdout
        for ln in q.splitlines():
            if ln.startswith(f"class htb {commands.HTB_CLASS} "):
                out[d] = _rate_of(ln)
    return out


def _rate_of(line: str) -> int:
    words = line.split()
    return parse_rate(words[words.index("rate") + 1])


def _nsids(ns: str) -> dict[int, str]:
    """nsid -> namespace name, as seen from namespace `ns` (`ip netns list-id`)."""
    p = netops.run(["ip", "-n", ns, "netns", "list-id"], check=False)
    out = {}
    for line in p.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nsid" and "name:" in words:
            out[int(words[1])] = words[words.index("name:") + 1].rstrip(")")
    return out


def planned_cables(fabric_graph) -> list[PlannedCable]:
    """The direct cables of a fabric graph (`Cluster.graph()`, e.g. of a cluster re-cabled by
    `Cluster.with_fabric(plan['fabric'])`)."""
    return [PlannedCable(f"{ln.a}:{ln.a_nic}", f"{ln.b}:{ln.b_nic}", int(ln.capacity))
            for ln in fabric_graph.links]
