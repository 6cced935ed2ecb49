"""Every kernel operation has an inverse that restores what the host looked like before it.

Property-based (hypothesis): a host in a real namespace is put into a generated state A (by the
agent), then the diff to a generated state B is run one operation at a time through the netlink
driver, with an iproute2 / tc / /proc dump (tests.netns.host_dump, an independent reader) before
each; then the inverses run newest first, and after each the host must read exactly as it did
before the operation it undoes. This checks the inverses alone: no re-adding of routes the
kernel dropped and no settling diff (what `revert` adds on top for crashes and races).

States are drawn from the objects of test_agent.full_state and test_crash.new_state: both
interfaces' first addresses stay (the gateways of the routes stay reachable, so every B is
appliable), everything else (extra addresses, MTU, link state, sysctls, routes with multipath
and custom tables, rules, HTB classes and root rates) comes and goes; IPv6 objects of each kind
(addresses, routes with weighted multipath and a link-local gateway, rules of the ipv6 list,
classes for IPv6 destinations, the IPv6 sysctls) come and go beside them."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.integration.test_agent_ipv6 import dump6
from tests.integration.test_crash import new_state
from topoagent.apply.diff import diff
from topoagent.apply.kernel_ops import AddAddress, DelAddress, SetLink, SetSysctl
from topoagent.drivers.netlink import NetlinkDriver
from topoagent.observe.host import observe
from topoagent.state.host import parse_host_state
from topoagent.target import Target

pytestmark = pytest.mark.netns

EXAMPLES = int(os.environ.get("TOPO_INVERSE_EXAMPLES", "25"))
OLD, NEW = full_state(), new_state()


def _pool(key: str) -> list[dict]:
    out = []
    for item in OLD[key] + NEW[key]:
        if item not in out:
            out.append(copy.deepcopy(item))
    return out


ROUTES, RULES = _pool("routes"), _pool("rules")
# IPv6 objects beside them (a mixed host): routes with weighted multipath, rules of the ipv6
# list (same priorities as IPv4 ones: each family has its own), classes for IPv6 destinations
ROUTES += [
    {"dst": "2001:db8:9::2/128", "via": "2001:db8:1::2"},
    {"dst": "2001:db8:9::/64", "table": 100, "nexthops": [
        {"via": "2001:db8:1::2", "dev": "tpa0", "weight": 3},
        {"via": "2001:db8:3::2", "dev": "tpc0", "weight": 1}]},
    {"dst": "2001:db8:9::/64", "table": 200, "nexthops": [
        {"via": "2001:db8:1::2", "dev": "tpa0"}, {"via": "2001:db8:3::9", "dev": "tpc0",
                                                   "weight": 5}]},
    {"dst": "2001:db8:8::/64", "dev": "tpc0", "table": 1234567, "metric": 7},
    {"dst": "2001:db8:7::/64", "via": "fe80::2", "dev": "tpa0", "table": 100},
]
RULES6 = [
    {"priority": 1000, "from": "2001:db8:9::1/128", "to": "2001:db8:9::/64", "table": 100},
    {"priority": 1003, "fwmark": 9, "table": 200, "family": "ipv6"},
]
# two routes with the same key (dst, table, metric) cannot both be desired
ROUTES = list({(r["dst"], r.get("table", 254), r.get("metric")): r for r in ROUTES}.values())
RULES = list({r["priority"]: r for r in RULES}.values())


@st.composite
def host_states(draw) -> dict:
    """A valid, appliable HostState over the fixture's links tpa0, tpc0, tpd0 and lo."""
    tpa = ["10.231.1.1/24"] + draw(st.lists(st.sampled_from(["10.231.1.5/24", "10.231.1.9/24"]),
                                            unique=True, max_size=2))
    tpc = ["10.231.3.1/24"] + draw(st.lists(st.sampled_from(["10.231.3.7/24"]), max_size=1))
    tpa += ["2001:db8:1::1/64"] + draw(st.lists(st.sampled_from(["2001:db8:1::5/64"]),
                                                max_size=1))
    tpc += ["2001:db8:3::1/64"]
    lo = draw(st.lists(st.sampled_from(["10.236.9.1/32", "10.236.9.3/32"]), unique=True,
                       max_size=2))
    ifaces = [
        {"name": "tpa0", "addresses": tpa, "up": True, "dad": False,
         "mtu": draw(st.sampled_from([1400, 1500, 9000]))},
        {"name": "tpc0", "addresses": tpc, "up": True, "dad": False,
         "mtu": draw(st.sampled_from([1500, 9000]))},
        {"name": "tpd0", "up": draw(st.booleans())},
        {"name": "lo", "addresses": lo},
    ]
    routes = draw(st.lists(st.sampled_from(ROUTES), unique_by=lambda r: r["dst"] + str(
        r.get("table")), max_size=len(ROUTES)))
    # a preferred source must be one of the host's addresses
    routes = [r for r in routes if r.get("src", "10.236.9.1") + "/32" in lo or "src" not in r]
    qos_a = {"dev": "tpa0", "rate": draw(st.sampled_from(["300mbit", "400mbit"])),
             "classes": draw(st.lists(st.sampled_from([
                 {"dst": "10.236.9.2", "rate": "50mbit"},
                 {"id": 40, "dst": "10.236.9.0/24", "rate": "60mbit", "ceil": "150mbit"},
                 {"id": 41, "dst": "10.236.10.0/24", "rate": "80mbit"},
                 # rates whose token credit (4 ms) is above two jumbo frames, like the IPv4
                 # ones: below it the credit is two frames of the MTU the link has when the
                 # class is made, and an MTU change in between gives the inverse another
                 # (the agent's own diff accepts both: diff._starved)
                 {"id": 50, "dst": "2001:db8:9::2", "rate": "40mbit"},
                 {"id": 51, "dst": "2001:db8:9::/64", "rate": "50mbit", "ceil": "90mbit"}]),
                 unique_by=lambda c: c["dst"], max_size=5))}
    qos = [qos_a] + draw(st.lists(st.just({"dev": "tpc0", "rate": "1gbit", "classes": [
        {"dst": "10.236.9.0/24", "rate": "500mbit"}]}), max_size=1))
    return {
        "interfaces": ifaces,
        "sysctl": {"ip_forward": draw(st.booleans()),
                   "rp_filter": {"tpa0": draw(st.integers(0, 2))},
                   "multipath_hash_policy": draw(st.sampled_from([0, 1])),
                   "ipv6_forwarding": draw(st.booleans()),
                   "ipv6_multipath_hash_policy": draw(st.sampled_from([0, 1]))},
        "routes": routes,
        "rules": draw(st.lists(st.sampled_from(RULES), unique_by=lambda r: r["priority"],
                               max_size=len(RULES)))
        + draw(st.lists(st.sampled_from(RULES6), unique_by=lambda r: r["priority"],
                        max_size=len(RULES6))),
        "qos": qos,
    }


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(a=host_states(), b=host_states())
def test_every_operation_is_undone_by_its_inverse(host: Host, a: dict, b: dict):  # noqa: F811
    r = host.apply(a)
    assert r.returncode == 0, r.stdout + r.stderr
    target = Target(netns=host.ns)
    ops = diff(parse_host_state(b), observe(target))
    before: list[dict] = []
    with contextlib.closing(target.iproute()) as ipr:
        drv = NetlinkDriver(target, ipr)
        last = None  # the operation applied last: whether the kernel may still be following up
        for op in ops:
            before.append(_read(host.ns, settle=_may_settle(last)))
            op.apply(drv)
            last = op
        for k in reversed(range(len(ops))):
            inverse = ops[k].inverse()
            inverse.apply(drv)
            after = _read(host.ns, settle=_may_settle(inverse) or _may_settle(ops[k]))
            assert after == before[k], (f"inverse of {ops[k].describe()!r} (op {k}): "
                                        f"{_difference(before[k], after)}")


# operations the kernel follows up on its own schedule (a link's carrier, IPv6 duplicate address
# detection and the prefix routes of its addresses, per-link IPv6 settings a sysctl copies); a
# route, rule, qdisc, class or filter operation is complete when its netlink acknowledgement is
ASYNC_FOLLOW_UP = (SetLink, AddAddress, DelAddress, SetSysctl)


def _may_settle(op: object) -> bool:
    return op is None or isinstance(op, ASYNC_FOLLOW_UP)


def _read(ns: str, settle: bool = True) -> dict:
    """The host dump, once it is settled where the last operation leaves the kernel work to
    finish on its own (`settle`: dumped again until two reads agree), in an order-free form:
    each link's addresses in address order, because the kernel keeps secondary addresses in
    insertion order (an address deleted and added back comes last; no inverse can restore that
    short of re-adding every later one, and it matters only for which secondary
    `promote_secondaries` promotes), and tc's classes and filters in handle order, because tc
    lists them in the order of its hash buckets' insertion."""
    d = _ordered({**dump(ns), **dump6(ns)})
    for _ in range(20 if settle else 0):
        time.sleep(0.05)
        again = _ordered({**dump(ns), **dump6(ns)})
        if again == d:
            return d
        d = again
    return d


def _u32_table_free(f: dict) -> dict:
    """A u32 filter without its hash table's number: the kernel numbers a preference's table
    itself when the preference is made (800:, 801:, ... in order of making), and a
    preference deleted and made again (the last IPv6 class goes and comes back) may get
    another; the agent names filters by preference and node, never by table."""
    opts = f.get("options")
    if not isinstance(opts, dict) or "fh" not in opts:
        return f
    opts = dict(opts, fh=opts["fh"].split(":", 1)[1] if ":" in opts["fh"] else opts["fh"])
    opts.pop("key_ht", None)
    return dict(f, options=opts)


def _ordered(d: dict) -> dict:
    # a link that was never up has no qdisc ("noop"); the kernel gives it its default one
    # (a veth's: noqueue, handle 0:) the first time it goes up, and keeps it after it goes
    # down again: not configuration, and no inverse of "up" could take it away
    for link in d["link"]:
        if link.get("qdisc") == "noop":
            link["qdisc"] = "noqueue"
    for key in d:
        if key.startswith("tc ") and d[key]:
            d[key][0] = [q for q in d[key][0]
                         if not (q.get("kind") == "noqueue" and q.get("handle") == "0:")]
            d[key][2] = [_u32_table_free(f) for f in d[key][2]]
    for link in d["addr"]:
        link["addr_info"] = sorted(link.get("addr_info", []), key=lambda a: a.get("local", ""))
    for key in d:
        if key.startswith("tc "):
            d[key] = [sorted(part, key=lambda x: json.dumps(x, sort_keys=True))
                      for part in d[key]]
    return d


def _difference(want: dict, got: dict) -> str:
    """The dump sections that differ, item by item (the assertion message)."""
    out = []
    for key in sorted(set(want) | set(got)):
        w, g = want.get(key), got.get(key)
        if w == g:
            continue
        if isinstance(w, list) and isinstance(g, list):
            out.append(f"{key}: missing {[x for x in w if x not in g]}, "
                       f"extra {[x for x in g if x not in w]}")
        else:
            out.append(f"{key}: {w!r} -> {g!r}")
    return "; ".join(out)
