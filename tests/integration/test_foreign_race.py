"""Someone else's route appearing at a desired route's key after the agent looked (between its
observation and its netlink request, or while it lay crashed) is never overwritten: an apply
refuses it (the kernel's EEXIST on a create-only request) and reverts, and a journal replay
leaves it in place. Every assertion reads the host with iproute2."""

from __future__ import annotations

import pytest

from tests.integration.test_agent import Host, dump, host  # noqa: F401
from tests.netns import ip_json, sh
from topoagent.apply import transaction
from topoagent.apply.journal import restore
from topoagent.apply.kernel_ops import DelRoute
from topoagent.drivers.netlink import NetlinkDriver
from topoagent.state.host import parse_host_state
from topoagent.target import Target

pytestmark = pytest.mark.netns

BASE = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True}]}
NEW_ROUTE = {"dst": "10.236.9.0/24", "via": "10.231.1.2"}


def routes_at(ns: str, dst: str) -> list[dict]:
    return [r for r in ip_json(ns, "-4", "route", "show", "table", "all") if r["dst"] == dst]


def test_a_route_added_by_someone_else_after_the_agent_looked_is_refused(host: Host,  # noqa: F811
                                                                        monkeypatch):
    assert host.apply(BASE).returncode == 0
    real_plan = transaction.plan

    def plan_then_race(*args, **kwargs):
        result = real_plan(*args, **kwargs)  # the agent has looked: no route at the key yet
        sh(["ip", "-n", host.ns, "route", "add", "10.236.9.0/24", "via", "10.231.1.2",
            "proto", "static"])
        return result

    monkeypatch.setattr(transaction, "plan", plan_then_race)
    desired = parse_host_state({**BASE, "routes": [NEW_ROUTE],
                                "sysctl": {"ip_forward": True}})
    with pytest.raises(transaction.ApplyError) as failed:
        transaction.apply_state(Target(netns=host.ns), desired, probe=False)
    assert "10.236.9.0/24" in str(failed.value) and "exists" in str(failed.value)
    assert failed.value.reverted
    theirs = routes_at(host.ns, "10.236.9.0/24")
    assert [(r["protocol"], r["gateway"]) for r in theirs] == [("static", "10.231.1.2")]
    assert sh(["ip", "netns", "exec", host.ns, "cat",
               "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "0"  # reverted too


def test_a_journal_replay_leaves_someone_elses_route_at_the_key(host: Host):  # noqa: F811
    """A route the agent had (the journal's header lists it) whose key someone else took while
    the agent lay crashed (here a blackhole, which the agent cannot even express) stays theirs."""
    assert host.apply({**BASE, "routes": [NEW_ROUTE]}).returncode == 0
    target = Target(netns=host.ns)
    drv = NetlinkDriver(target)
    ours = parse_host_state({**BASE, "routes": [NEW_ROUTE]})
    sh(["ip", "-n", host.ns, "route", "del", "10.236.9.0/24"])
    sh(["ip", "-n", host.ns, "route", "add", "blackhole", "10.236.9.0/24", "proto", "static"])
    before = dump(host.ns)
    restore(drv, [], ours, [(ours.routes[0], 76)])
    assert [(r.get("type"), r["protocol"]) for r in routes_at(host.ns, "10.236.9.0/24")] == [
        ("blackhole", "static")]
    assert dump(host.ns)["route"] == before["route"]


def test_a_route_at_the_prefix_route_of_a_new_address_replaces_the_kernels(host: Host):  # noqa: F811
    """The kernel makes an address's prefix route itself during the apply: a desired route at
    its key (the same subnet, another source) must replace it, not be refused as someone
    else's."""
    state = {"interfaces": [{"name": "tpa0", "up": True,
                             "addresses": ["10.231.1.1/24", "10.231.5.1/24"]}],
             "routes": [{"dst": "10.231.5.0/24", "dev": "tpa0", "src": "10.231.1.1"}]}
    r = host.apply(state)
    assert r.returncode == 0, r.stderr
    got = routes_at(host.ns, "10.231.5.0/24")
    assert [(x["protocol"], x.get("prefsrc")) for x in got] == [("76", "10.231.1.1")], got


def test_a_journal_replay_does_not_put_a_deleted_route_back_over_someone_elses(
        host: Host):  # noqa: F811
    """The crashed apply deleted a route of the agent's (the journal's undo puts it back);
    while the agent lay crashed someone else put a blackhole at its key: the undo leaves it."""
    assert host.apply(BASE).returncode == 0
    target = Target(netns=host.ns)
    drv = NetlinkDriver(target)
    ours = parse_host_state({**BASE, "routes": [NEW_ROUTE]})
    sh(["ip", "-n", host.ns, "route", "add", "blackhole", "10.236.9.0/24", "proto", "static"])
    before = dump(host.ns)
    restore(drv, [DelRoute(ours.routes[0], 76).inverse()], ours, [])
    assert [(r.get("type"), r["protocol"]) for r in routes_at(host.ns, "10.236.9.0/24")] == [
        ("blackhole", "static")]
    assert dump(host.ns)["route"] == before["route"]
