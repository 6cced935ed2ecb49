"""The management path: after an apply, `ip route get` for the controller (and configured
probes) must be what it was, or the apply is reverted and says why; an owned address that the
connection does not depend on can go without --force-mgmt."""

from __future__ import annotations

import pytest

from tests.integration.test_agent import Host, dump, host  # noqa: F401
from tests.netns import ip_json, sh, tc_classes, tc_json

pytestmark = pytest.mark.netns

MGMT = ("--mgmt", "10.231.1.2,10.231.1.1")
BASE = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True},
                       {"name": "tpc0", "addresses": ["10.231.3.1/24"], "up": True},
                       {"name": "tpd0", "up": True}]}


def test_a_rule_diverting_all_traffic_is_reverted(host: Host):  # noqa: F811
    assert host.apply(BASE).returncode == 0
    before = dump(host.ns)
    divert = dict(BASE, routes=[{"dst": "default", "via": "10.231.3.2", "table": 100}],
                  rules=[{"priority": 1000, "table": 100}])
    # the static guard cannot see it (no main-table change, no link touched)...
    assert host.agent(*MGMT, "diff", "--detailed-exitcode", "-", stdin=_y(divert)).returncode == 2
    r = host.agent(*MGMT, "apply", "--no-probe", "-", stdin=_y(divert))
    # ... the path check does
    assert r.returncode == 1, r.stderr
    assert "management path changed (ip route get): 10.231.1.2:" in r.stderr
    assert "via 10.231.3.2" in r.stderr and "reverted" in r.stderr
    assert dump(host.ns) == before
    # a probe address is watched the same way, without any SSH connection
    r = host.agent("--mgmt-probe", "10.231.1.2", "apply", "--no-probe", "-", stdin=_y(divert))
    assert r.returncode == 1 and "management path changed" in r.stderr
    assert dump(host.ns) == before
    r = host.agent(*MGMT, "--force-mgmt", "apply", "--no-probe", "-", stdin=_y(divert))
    assert r.returncode == 0
    assert any(x.get("table") == "100" for x in ip_json(host.ns, "-4", "rule", "show"))


def test_an_owned_address_beside_the_management_one_can_go(host: Host):  # noqa: F811
    # the agent's /32 with the server's IP, then the (foreign) management /24 beside it
    own = {"interfaces": [{"name": "lo", "addresses": ["10.231.1.1/32"]}]}
    assert host.apply(own).returncode == 0
    sh(["ip", "-n", host.ns, "link", "set", "tpa0", "up"])
    sh(["ip", "-n", host.ns, "addr", "add", "10.231.1.1/24", "dev", "tpa0"])
    # a desired address whose IP a foreign one holds is an error naming it
    r = host.agent(*MGMT, "apply", "-", stdin=_y(
        {"interfaces": [{"name": "tpc0", "addresses": ["10.231.1.1/30"]}]}))
    assert r.returncode == 1 and "10.231.1.1/24 on tpa0 has this IP" in r.stderr
    # removing the agent's own one does not touch the connection: no --force-mgmt needed
    r = host.agent(*MGMT, "apply", "-", stdin=_y({"interfaces": [{"name": "tpc0"}]}))
    assert r.returncode == 0, r.stderr
    lo = ip_json(host.ns, "-4", "addr", "show", "dev", "lo")
    assert all(i["local"] != "10.231.1.1" for a in lo for i in a["addr_info"])
    # the one the connection depends on is still refused (here: the agent's, alone)
    sh(["ip", "-n", host.ns, "addr", "del", "10.231.1.1/24", "dev", "tpa0"])
    assert host.apply({"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"]}]}
                      ).returncode == 0
    r = host.agent(*MGMT, "apply", "-", stdin=_y({"interfaces": [{"name": "tpc0"}]}))
    assert r.returncode == 1 and "refusing to delete address 10.231.1.1/24" in r.stderr


def _y(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d)


def _shaped(cls_dst: str, rate: str, dev: str = "tpa0") -> dict:
    return dict(BASE, qos=[{"dev": dev, "rate": "1gbit", "classes": [
        {"dst": "10.231.1.99", "rate": "100mbit"}, {"dst": cls_dst, "rate": rate}]}])


def test_shaping_the_management_peer_below_the_floor_is_refused(host: Host):  # noqa: F811
    """A QoS class that holds the management peer (the controller, 10.231.1.2 over tpa0) at
    less than the floor (10mbit unless --mgmt-floor) is refused before anything changes,
    naming the YAML path; classes for other peers, or on another NIC, are not."""
    assert host.apply(BASE).returncode == 0
    before = dump(host.ns)
    for dst, rate in (("10.231.1.2", "1kbit"), ("10.231.1.0/24", "5mbit")):
        for verb in ("diff", "apply"):  # prepare (diff) refuses it as apply does
            r = host.agent(*MGMT, verb, "-", stdin=_y(_shaped(dst, rate)))
            assert r.returncode == 1, (verb, r.stderr)
            assert f"<stdin>: qos[0].classes[1].rate: {rate} for {dst} holds the management " \
                   "peer 10.231.1.2" in r.stderr, r.stderr
            assert "below the management floor 10mbit" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
    assert dump(host.ns) == before
    assert tc_json(host.ns, "qdisc", "show", "dev", "tpa0")[0]["kind"] != "htb"
    # a forwarding rule that would steal the connection's packets on their way in
    steal = dict(BASE, forwarding={"mode": "tc-offload", "rules": [
        {"dev": "tpa0", "dst": "10.231.1.0/24", "dst_mac": "02:00:00:00:00:01",
         "redirect": "tpc0"}]})
    r = host.agent(*MGMT, "apply", "-", stdin=_y(steal))
    assert r.returncode == 1 and "<stdin>: forwarding.rules[0].dst:" in r.stderr, r.stderr
    assert dump(host.ns) == before
    # the same class for another peer, or on a NIC the connection does not use: applied
    for state in (_shaped("10.231.1.3", "1kbit"), _shaped("10.231.1.2", "1kbit", dev="tpc0")):
        r = host.agent(*MGMT, "apply", "--no-probe", "-", stdin=_y(state))
        assert r.returncode == 0, r.stderr
    assert host.apply(BASE).returncode == 0
    # the floor is configurable; --force-mgmt overrides the guard
    r = host.agent(*MGMT, "--mgmt-floor", "2mbit", "apply", "--no-probe", "-",
                   stdin=_y(_shaped("10.231.1.0/24", "5mbit")))
    assert r.returncode == 0, r.stderr
    assert {c["handle"]: c["rate"] for c in tc_classes(host.ns, "tpa0")}["7470:3"] == 5_000_000
    r = host.agent(*MGMT, "--force-mgmt", "apply", "--no-probe", "-",
                   stdin=_y(_shaped("10.231.1.2", "1kbit")))
    assert r.returncode == 0, r.stderr
