"""The HostState `ovs` section: Open vSwitch bridges the agent owns on the host.

```yaml
ovs:
  bridges:
    - name: tpbr0
      datapath_type: netdev        # userspace datapath (no kernel module), or system
      ports: [eth0, eth1]          # fabric NICs attached to the bridge
      internal: [tpin0]            # internal ports: give them the fabric address (interfaces)
      flows:                       # locally originated IPv4 by destination
        - {dst: 10.236.0.2/32, output: eth0}
        - {dst: 10.236.0.3/32, nexthops: [{port: eth0, weight: 3}, {port: eth1, weight: 1}]}
qos:                               # per-destination queues: the same qos section as tc, with
  - {dev: eth0, driver: ovs, rate: 100mbit, classes: [{dst: 10.236.0.2/32, rate: 40mbit}]}
```

Each `qos` entry with `driver: ovs` becomes a QoS row (type linux-htb, max-rate = the link rate)
on the port `dev` with one Queue per class (min-rate = rate, max-rate = ceil); a flow whose
output (or next-hop bucket) is that port and whose destination has a class there gets
`set_queue` before `output`. `nexthops` become an OpenFlow select group (weighted multipath;
`mac` rewrites the destination MAC for a next hop on another cable). Validation across sections
lives in `ovs_problems` (called by HostState).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from topoagent.state.schema import Model
from topoagent.state.values import IfName, IPv4Net, Mac

OVS_OWNER = "topo-agent"  # external_ids:topoctl-owner on every OVSDB row the agent creates
OVS_COOKIE = 0x7470  # OpenFlow cookie of every flow the agent adds
OVS_GROUP_BASE = 0x74700000  # select group ids: base + flow position + 1
OVS_FILTER_PRIO = 0x7470  # tc filter preference of the agent's u32 filters on OVS's HTB
OVS_HTB = "1:"  # the root handle OVS gives its linux-htb qdisc



Port = IfName
Net = IPv4Net


class OvsNexthop(Model):
    """One bucket of a select group: out of `port`, `weight` (1..65535), optionally with the
    destination MAC rewritten to `mac` (a next hop that is not the kernel's ARP answer)."""

    port: Port
    weight: Annotated[int, Field(ge=1, le=65535)] = 1
    mac: Mac | None = None


class OvsFlow(Model):
    """IPv4 to `dst` leaves by `output`, or by a weighted select group over `nexthops`."""

    dst: Net
    priority: Annotated[int, Field(ge=1, le=65535)] = 100
    output: Port | None = None
    nexthops: list[OvsNexthop] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_action(self) -> OvsFlow:
        if (self.output is None) == (not self.nexthops):
            raise ValueError("give output or nexthops (one of them)")
        if self.nexthops and len(self.nexthops) < 2:
            raise ValueError("nexthops: needs two or more; a single one is output")
        return self


class OvsBridge(Model):
    """A bridge the agent owns: datapath type, attached ports and internal ports."""

    name: Port
    datapath_type: Literal["system", "netdev"] = "system"
    ports: list[Port] = Field(default_factory=list)
    internal: list[Port] = Field(default_factory=list)
    flows: list[OvsFlow] = Field(default_factory=list)

    @model_validator(mode="after")
    def _checks(self) -> OvsBridge:
        problems = []
        names = [self.name, *self.ports, *self.internal]
        if len(set(names)) != len(names):
            problems.append("a port is listed twice (or named like the bridge)")
        known = set(self.ports) | set(self.internal)
        for i, f in enumerate(self.flows):
            for p in ([f.output] if f.output else [h.port for h in f.nexthops]):
                if p not in known:
                    problems.append(f"flows[{i}]: port {p} is not a port of bridge {self.name}")
        keys = [(f.dst, f.priority) for f in self.flows]
        if len(set(keys)) != len(keys):
            problems.append("flows: two flows share dst and priority")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class OvsState(Model):
    """The HostState `ovs` section: the bridges the agent owns."""

    bridges: list[OvsBridge] = Field(default_factory=list)

    def port_bridge(self) -> dict[str, str]:
        """Every port and internal port -> its bridge."""
        return {p: b.name for b in self.bridges for p in (*b.ports, *b.internal)}


def ovs_problems(state) -> list[tuple[str, str]]:
    """Cross-section checks of a HostState: one QoS driver per port (OVS owns the qdiscs of its
    ports), OVS queues only on ports OVS has, bridges and ports named once."""
    out: list[tuple[str, str]] = []
    ports = state.ovs.port_bridge() if state.ovs else {}
    seen: dict[str, str] = {}
    if state.ovs:
        for i, b in enumerate(state.ovs.bridges):
            for p in (b.name, *b.ports, *b.internal):
                if p in seen:
                    out.append((f"ovs.bridges[{i}]", f"{p} already in bridge {seen[p]}"))
                seen.setdefault(p, b.name)
    for i, q in enumerate(state.qos):
        if q.driver == "ovs" and q.dev not in ports:
            out.append((f"qos[{i}].dev", f"driver ovs, but {q.dev} is not a port of any ovs "
                                         "bridge (ovs.bridges[].ports)"))
        elif q.driver == "tc" and q.dev in ports:
            out.append((f"qos[{i}].driver", f"tc on {q.dev}, a port of ovs bridge "
                                            f"{ports[q.dev]}: OVS owns its ports' qdiscs; use "
                                            "driver: ovs"))
    # a destination without its own flow gets `set_queue:ID, NORMAL`: the queue is chosen
    # before the port, so its class id must be the same on every port of the bridge
    explicit = {f.dst for b in (state.ovs.bridges if state.ovs else []) for f in b.flows}
    ids: dict[tuple[str, str], tuple[int, str]] = {}
    for i, q in enumerate(state.qos):
        if q.driver != "ovs" or q.dev not in ports:
            continue
        for j, c in enumerate(q.resolved_classes()):
            key = (ports[q.dev], c.dst)
            if c.dst in explicit:
                continue
            if key in ids and ids[key][0] != c.id:
                out.append((f"qos[{i}].classes[{j}].id", f"{c.dst} has class id {c.id} here "
                            f"and {ids[key][0]} on {ids[key][1]} (same bridge): give it one id"))
            ids.setdefault(key, (c.id, q.dev))
    return out
