"""`topo-agent show` reads the agent's OVS state back as HostState sections
(`topoagent.observe.ovs.observed_sections`): for states the driver writes, desired -> what OVSDB and
OpenFlow hold -> shown -> desired again is the identity (the real-OVS test is
tests/integration/test_ovs_agent.py::test_show_round_trips_the_ovs_section)."""

from __future__ import annotations

import pytest

from topoagent.apply.ovs import desired_db, desired_filters, desired_openflow
from topoagent.drivers.ovsdb import DbSnapshot
from topoagent.observe.ovs import ObsOvs, observed_sections
from topoagent.state.host import HostState, parse_host_state

NH = [{"port": "eth0", "weight": 3, "mac": "0c:42:a1:00:00:01"}, {"port": "eth1"}]


def _state(datapath: str, flows: list[dict]) -> HostState:
    return parse_host_state({
        "qos": [{"dev": "eth0", "driver": "ovs", "rate": "100mbit", "classes": [
                    {"id": 2, "dst": "10.236.0.2/32", "rate": "20mbit", "ceil": "50mbit"},
                    {"id": 3, "dst": "10.236.0.3/32", "rate": "40mbit"}]},
                {"dev": "eth1", "driver": "ovs", "rate": "50mbit", "classes": [
                    {"id": 2, "dst": "10.236.0.2/32", "rate": "10mbit"},
                    {"id": 5, "dst": "10.236.1.0/24", "rate": "10mbit"}]}],
        "ovs": {"bridges": [{"name": "tpbr0", "datapath_type": datapath,
                             "ports": ["eth0", "eth1"], "internal": ["tpovs0"],
                             "flows": flows}]}})


def _observed(st: HostState) -> ObsOvs:
    return ObsOvs("unix:/x/db.sock", DbSnapshot(desired_db(st), {"tpbr0": True}, {}),
                  desired_openflow(st), desired_filters(st))


@pytest.mark.parametrize("datapath", ["system", "netdev"])
@pytest.mark.parametrize("flows", [
    [],
    [{"dst": "10.236.0.3/32", "output": "eth0"}],
    [{"dst": "10.236.0.9/32", "output": "eth1", "priority": 200},
     {"dst": "10.236.0.7/32", "nexthops": NH},
     {"dst": "10.236.0.3/32", "output": "eth0"},
     {"dst": "10.236.0.8/32", "nexthops": NH}],
])
def test_shown_sections_are_the_desired_state(datapath, flows):
    st = _state(datapath, flows)
    section, qos = observed_sections(_observed(st))
    shown = parse_host_state({"ovs": section, "qos": qos})
    assert desired_db(shown) == desired_db(st)
    assert desired_openflow(shown) == desired_openflow(st)
    assert desired_filters(shown) == desired_filters(st)


def test_a_queue_no_flow_names_is_left_out():
    st = _state("system", [])
    obs = _observed(st)
    obs.openflow = {"tpbr0": (frozenset(), frozenset())}  # flows deleted behind our back
    _, qos = observed_sections(obs)
    assert [q["classes"] for q in qos] == [[], []]


def test_no_ovsdb_no_sections():
    assert observed_sections(None) == (None, [])
