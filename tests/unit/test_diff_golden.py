"""Diff logic against golden files: tests/unit/golden/<case>/{current,foreign,desired}.yaml ->
ops.txt, and the revert of those operations (their inverses, newest first, as the agent runs
them when an apply fails or is rolled back) -> revert.txt. `current` holds objects the agent
owns (its mark), `foreign` objects someone else made. Regenerate after an intended change
with TOPO_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from topoagent.apply.diff import diff
from topoagent.observe.host import (
    IP6_FORWARD,
    IP_FORWARD,
    MULTIPATH_HASH6,
    Observed,
    ObsLink,
    ObsQos,
    ObsRoute,
    ObsRule,
    rp_filter_path,
)
from topoagent.state.host import RT_PROTO, HostState, QosClass, load_host_state

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())


def observed(owned: HostState, foreign: HostState, links: set[str]) -> Observed:
    """What observe() would return for a host holding these objects."""
    obs = Observed(sysctl={IP_FORWARD: "0", IP6_FORWARD: "0", MULTIPATH_HASH6: "0",
                           rp_filter_path("all"): "0"})
    for i, name in enumerate(sorted(links)):
        obs.links[name] = ObsLink(index=i + 1, name=name, mac=None, mtu=1500, up=False)
    for state, proto in ((foreign, 3), (owned, RT_PROTO)):
        for iface in state.interfaces:
            link = obs.links[iface.name]
            link.mtu = iface.mtu or link.mtu
            link.up = iface.up if iface.up is not None else link.up
            for a in iface.addresses:
                obs.addresses.setdefault(iface.name, {})[a] = proto
        for r in state.routes:
            obs.routes[r.key] = ObsRoute(route=r, proto=proto)
        for r in state.rules:
            obs.rules.append(ObsRule(rule=r, proto=proto, priority=r.priority,
                                     family=r.family))
        if state.sysctl.ip_forward is not None:
            obs.sysctl[IP_FORWARD] = "1" if state.sysctl.ip_forward else "0"
        if state.sysctl.ipv6_forwarding is not None:
            obs.sysctl[IP6_FORWARD] = "1" if state.sysctl.ipv6_forwarding else "0"
        if state.sysctl.ipv6_multipath_hash_policy is not None:
            obs.sysctl[MULTIPATH_HASH6] = str(state.sysctl.ipv6_multipath_hash_policy)
        for dev, v in state.sysctl.rp_filter.items():
            obs.sysctl[rp_filter_path(dev)] = str(v)
        for q in state.qos:
            classes = q.resolved_classes()
            obs.qos[q.dev] = ObsQos(
                dev=q.dev, rate=q.rate,
                classes={c.id: QosClass(id=c.id, dst="0.0.0.0/0", rate=c.rate, ceil=c.ceil)
                         for c in classes},
                filters={c.id: (c.dst, c.id) for c in classes})
    return obs


def _load(case: str, name: str) -> HostState:
    p = GOLDEN / case / f"{name}.yaml"
    return load_host_state(p.read_text(), str(p)) if p.exists() else HostState()


def _check(case: str, name: str, ops: list) -> None:
    text = "".join(f"{op.phase:11} {op.describe()}\n" for op in ops)
    expected = GOLDEN / case / name
    if os.environ.get("TOPO_UPDATE_GOLDEN"):
        expected.write_text(text)
    assert text == expected.read_text(), f"{expected} differs (TOPO_UPDATE_GOLDEN=1 rewrites)"


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    current, foreign, desired = (_load(case, n) for n in ("current", "foreign", "desired"))
    links = {i.name for s in (current, foreign, desired) for i in s.interfaces}
    links |= {q.dev for s in (current, foreign, desired) for q in s.qos}
    links |= {h.dev for s in (current, foreign, desired) for r in s.routes for h in r.hops()
              if h.dev}
    ops = diff(desired, observed(current, foreign, links))
    _check(case, "ops.txt", ops)
    _check(case, "revert.txt", [op.inverse() for op in reversed(ops)])
    if case == "noop":
        assert ops == []
    # applying the ops' result is the fixed point: the desired state as observed diffs to nothing
    assert diff(desired, observed(desired, foreign, links)) == [] or case == "foreign"
