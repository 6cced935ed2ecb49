"""The management guard and Open vSwitch: a bridge that would take the management NIC (the
link the connection to the controller leaves by) is refused, naming the YAML path, with real
ovsdb-server + ovs-vswitchd (the fixture of test_ovs_agent.py) read back with ovs-vsctl; the
same bridge on the other NICs is applied."""

from __future__ import annotations

import pytest

from tests.integration.test_ovs_agent import OvsHost, host, state  # noqa: F401
from tests.netns import ip_json, sh

pytestmark = pytest.mark.netns

# the management connection: the controller 10.231.11.2 (the peer) reached over tpa0
MGMT = ("--mgmt", "10.231.11.2,10.231.11.1")


def test_a_bridge_taking_the_management_nic_is_refused(host: OvsHost):  # noqa: F811
    sh(["ip", "-n", host.ns, "addr", "add", "10.231.11.1/24", "dev", "tpa0"])
    sh(["ip", "-n", host.peer, "addr", "add", "10.231.11.2/24", "dev", "tpb0"])
    before = host.ovs_dump()
    r = host.agent(*MGMT, "apply", "--no-probe", "-",
                   stdin=_y(state(ports=("tpc0", "tpa0"))))
    assert r.returncode == 1, r.stderr
    assert "<stdin>: ovs.bridges[0].ports[1]: tpa0 carries the management connection " \
           "10.231.11.2 -> 10.231.11.1" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert host.ovs_dump() == before
    assert "tpbr1" not in host.vsctl("list-br")
    addrs = {i["local"] for a in ip_json(host.ns, "-4", "addr", "show", "dev", "tpa0")
             for i in a["addr_info"]}
    assert addrs == {"10.231.11.1"}
    # the bridge without the management NIC is fine
    r = host.agent(*MGMT, "apply", "--no-probe", "-", stdin=_y(state(ports=("tpc0",))))
    assert r.returncode == 0, r.stderr
    assert host.vsctl("list-ports", "tpbr1").split() == ["tpc0", "tpin0"]


def _y(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d)
