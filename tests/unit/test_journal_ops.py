"""Every operation the agent can run survives the journal's JSON round trip (its inverse is
written there before the change): kernel operations and the OVS driver's."""

from __future__ import annotations

import dataclasses
import json

from topoagent.apply.journal import op_from_json, op_to_json
from topoagent.apply.kernel_ops import SetSysctl
from topoagent.apply.ovs import OvsDbWrite, OvsFilters, OvsFlows
from topoagent.drivers.ovsdb import BridgeConfig, DbConfig, PortConfig, PortQos


def same(a, b) -> bool:
    return type(a) is type(b) and all(getattr(a, f.name) == getattr(b, f.name)
                                      for f in dataclasses.fields(a))


def test_ovs_and_kernel_operations_round_trip():
    cfg = DbConfig({"tpbr0": BridgeConfig("netdev", (
        ("eth1", PortConfig(False, PortQos(100_000_000, ((1, 10_000, 50_000),)))),
        ("tpbr0-in", PortConfig(True))))})
    ops = [OvsDbWrite("unix:/tmp/db.sock", cfg, DbConfig()),
           OvsFlows("unix:/tmp/db.sock", "tpbr0", frozenset({"ip,nw_dst=10.231.0.2,actions=1"}),
                    frozenset(), frozenset({"priority=5,actions=drop"}), frozenset()),
           OvsFilters("eth1", frozenset({("10.231.0.2", "1:2")}), frozenset()),
           SetSysctl("net/ipv4/ip_forward", "1", "0")]
    for op in ops:
        for o in (op, op.inverse()):
            back = op_from_json(json.loads(json.dumps(op_to_json(o))))
            assert same(back, o), (back, o)
