"""Foreign state on a real namespace: what the agent does not own stays opaque and untouched.

A route of any type (blackhole, unreachable, prohibit, ...) holding a desired route's
table/dst/metric is an error naming it, never replaced; links with any legal name (`v=0`,
`v#0`, `vé0`, bytes that are not UTF-8) neither break `show` nor any apply, and their
addresses and routes are neither changed nor deleted. Every assertion reads the host with
iproute2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.netns import ip_json, sh

pytestmark = pytest.mark.netns


KINDS = {"blackhole": "10.236.9.2/32", "unreachable": "10.236.9.3/32",
         "prohibit": "10.236.9.4/32"}


def test_foreign_routes_of_other_types_are_never_replaced(host: Host):  # noqa: F811
    """Found by the audit: a blackhole with a desired route's key was replaced ("add route")
    and later deleted by rollback."""
    ns = host.ns
    for kind, dst in KINDS.items():
        sh(["ip", "-n", ns, "route", "add", kind, dst, "proto", "static"])
    state = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True}],
             "routes": [{"dst": dst, "via": "10.231.1.2"} for dst in KINDS.values()]}
    before = dump(ns)
    for verb in ("diff", "apply"):
        r = host.agent(verb, "-", stdin=yaml.safe_dump(state))
        assert r.returncode == 1 and "Traceback" not in r.stderr, (verb, r.stdout, r.stderr)
        for i, (kind, dst) in enumerate(KINDS.items()):
            assert (f"topo-agent: <stdin>: routes[{i}]: a route the agent does not own has "
                    f"the same table/dst/metric: {kind} {dst} (proto 4)") in r.stderr, r.stderr
        assert dump(ns) == before
    # the agent's own objects come and go around them; the foreign routes stay through rollback
    assert host.apply(dict(state, routes=[])).returncode == 0
    assert host.apply({"routes": []}, "--allow-empty").returncode == 0
    assert host.agent("rollback").returncode == 0
    assert sorted((r.get("type"), r["dst"]) for r in ip_json(ns, "-4", "route", "show")
                  if r["dst"].startswith("10.236.9.")) == sorted(
        (kind, dst.removesuffix("/32")) for kind, dst in KINDS.items())


def _odd_links(ns: str) -> None:
    """Two veth pairs with names the schema cannot spell, an address and a route on one, a
    rule naming another: all legal Linux."""
    sh(["ip", "-n", ns, "link", "add", "v=0", "type", "veth", "peer", "name", "v#0"])
    sh(["ip", "-n", ns, "link", "add", "vé0", "type", "veth", "peer", "name", "v\udcff0"])
    sh(["ip", "-n", ns, "link", "set", "v=0", "up"])
    sh(["ip", "-n", ns, "addr", "add", "10.231.7.1/24", "dev", "v=0"])
    sh(["ip", "-n", ns, "route", "add", "10.236.70.0/24", "via", "10.231.7.2", "dev", "v=0"])
    sh(["ip", "-n", ns, "rule", "add", "priority", "1700", "iif", "v#0", "table", "70"])


def test_links_with_any_legal_name_leave_the_host_manageable(host: Host):  # noqa: F811
    ns = host.ns
    _odd_links(ns)
    r = host.agent("show")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    shown = yaml.safe_load(r.stdout)
    assert {"tpa0", "tpc0", "lo"} <= {i["name"] for i in shown["interfaces"]}
    assert host.diff(r.stdout).stdout.strip() == "nothing to do"
    foreign = dump(ns)
    state = full_state()
    assert host.apply(state, "--detailed-exitcode").returncode == 2
    now = dump(ns)
    for key in ("route", "rule", "addr"):
        missing = [x for x in foreign[key] if x not in now[key] and
                   ("v=0" in str(x) or "v#0" in str(x) or "10.236.70" in str(x))]
        assert not missing, (key, missing)
    assert host.apply({}, "--allow-empty").returncode == 0
    assert host.agent("rollback").returncode == 0
    after = ip_json(ns, "-4", "route", "show", "10.236.70.0/24")
    assert [r["dev"] for r in after] == ["v=0"]
    assert any(r.get("iif") == "v#0" for r in ip_json(ns, "-4", "rule", "show"))


def test_a_desired_object_colliding_with_one_on_an_odd_link_is_an_error(host: Host):  # noqa: F811
    ns = host.ns
    _odd_links(ns)
    sh(["ip", "-n", ns, "link", "set", "vé0", "up"])
    sh(["ip", "-n", ns, "addr", "add", "10.231.8.1/24", "dev", "vé0"])
    sh(["ip", "-n", ns, "link", "set", "v\udcff0", "up"])
    sh(["ip", "-n", ns, "route", "add", "10.236.71.0/24", "dev", "v\udcff0", "table", "9"])
    before = dump(ns)
    state = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24", "10.231.8.1/24"]}],
             "routes": [{"dst": "10.236.70.0/24", "via": "10.231.1.2"},
                        {"dst": "10.236.71.0/24", "dev": "tpa0", "table": 9}]}
    r = host.apply(state)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("routes[0]: a route the agent does not own has the same table/dst/metric: "
            "10.236.70.0/24 via 10.231.7.2 dev 'v=0'") in r.stderr, r.stderr
    assert ("routes[1]: a route the agent does not own has the same table/dst/metric: "
            "10.236.71.0/24 table 9 dev 'v\\xff0'") in r.stderr, r.stderr
    assert ("interfaces[0].addresses[1]: 10.231.8.1/24 on 'vé0' has this IP and is not the "
            "agent's") in r.stderr, r.stderr
    assert dump(ns) == before


def test_show_reads_a_loopback_below_the_ipv4_minimum_mtu(make_netns):
    """lo takes any MTU (IPv4 leaves a link below 68): `show` leaves the MTU out."""
    ns = make_netns()
    sh(["ip", "-n", ns, "link", "set", "lo", "mtu", "10"])
    r = Host(ns, "", Path("/nonexistent"), Path("/nonexistent")).agent("show")
    assert r.returncode == 0, r.stderr
    lo = next(i for i in yaml.safe_load(r.stdout)["interfaces"] if i["name"] == "lo")
    assert "mtu" not in lo
