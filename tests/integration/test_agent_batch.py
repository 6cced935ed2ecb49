"""Kernel programming in batches: many rtnetlink requests per send, each answer matched to its
operation by sequence number (topoagent.drivers.nlwrite, topoagent.apply.batch).

A batch the kernel refuses in the middle must still name the refused object, and the
transaction must take back exactly what was done: the operations before the refused one and
the ones after it in the same send (the kernel goes on after an error). The host is read with
iproute2 (`ip -j`, `tc -j`: tests.netns.host_dump), not with the agent's observer."""

from __future__ import annotations

import copy
import json

import pytest

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.integration.test_crash import operations
from tests.netns import ip_json
from topoagent.drivers import nlwrite
from topoagent.drivers.netlink import NetlinkDriver
from topoagent.state.host import RT_PROTO, Route
from topoagent.target import Target

pytestmark = pytest.mark.netns

BAD_SRC = "10.99.99.99"  # on no link of the host: the kernel refuses it as a preferred source


def same_host(a: dict, b: dict) -> bool:
    """Whether two host dumps say the same, with tc's lists read as sets: HTB lists its classes
    in hash order, and the hash table grows as classes are added (and never shrinks), so a
    class deleted and put back can be listed elsewhere."""
    def norm(d: dict) -> dict:
        return {k: [sorted(map(json.dumps, x)) if isinstance(x, list) else x for x in v]
                if k.startswith("tc ") else v for k, v in d.items()}
    return norm(a) == norm(b)


def many_routes(n: int, bad: int | None = None) -> list[dict]:
    """`n` routes in table 300 via the peer; route `bad` asks for a source the host lacks."""
    out = []
    for i in range(n):
        r = {"dst": f"10.238.{i // 250}.{i % 250}/32", "via": "10.231.1.2", "table": 300}
        if i == bad:
            r["src"] = BAD_SRC
        out.append(r)
    return out


def test_a_batch_refused_in_the_middle_reverts_exactly_and_names_the_object(host: Host):  # noqa: F811
    assert host.apply(full_state()).returncode == 0
    original = dump(host.ns)
    state = copy.deepcopy(full_state())
    # a mixed change: an address, an MTU, 600 routes (the 301st refused), rules and classes
    # after them, a route of the old state replaced and one deleted before them
    state["interfaces"][0]["addresses"].append("10.231.1.7/24")
    state["interfaces"][1]["mtu"] = 8000
    state["routes"] = state["routes"][:2] + many_routes(600, bad=300)
    state["routes"][0]["via"] = "10.231.3.2"
    state["rules"] += [{"priority": 2000 + i, "to": f"10.238.0.{i}/32", "table": 300}
                       for i in range(50)]
    state["qos"][0]["classes"] += [{"dst": f"10.238.1.{i}", "rate": "1mbit"} for i in range(40)]

    n = operations(host, state)
    r = host.apply(state, "--no-probe")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    # the refused object by name, with the kernel's reason
    assert f"add route 10.238.1.50/32 table 300 via 10.231.1.2 src {BAD_SRC}" in r.stderr, r.stderr
    assert "invalid" in r.stderr.lower(), r.stderr
    # every operation but the refused one took effect (one send: the kernel goes on after
    # an error), and each was undone by its inverse: the count names them all
    assert f"reverted {n - 1} operations; host is as before" in r.stderr, (n, r.stderr)
    assert same_host(dump(host.ns), original)
    assert not ip_json(host.ns, "-4", "route", "show", "table", "300")
    assert not (host.state_dir / "journal").exists()
    # the same change without the bad source applies, and the host reads as asked
    state["routes"][302].pop("src")
    r = host.apply(state, "--no-probe")
    assert r.returncode == 0, r.stderr
    assert len(ip_json(host.ns, "-4", "route", "show", "table", "300")) == 600


def test_the_kernel_goes_on_after_a_refused_request_and_each_answer_is_matched(host: Host):  # noqa: F811
    """The channel's contract, read back with `ip -j`: in one send, the requests before and
    after a refused one take effect and are reported so; only the refused one carries an
    error (with the kernel's text)."""
    assert host.apply(full_state()).returncode == 0
    drv = NetlinkDriver(Target(netns=host.ns))
    try:
        routes = [Route.model_validate(r) for r in many_routes(9, bad=4)]
        acks = drv.call([drv.route_request(False, r, RT_PROTO) for r in routes])
        assert [a.ok for a in acks] == [True] * 4 + [False] + [True] * 4
        assert acks[4].error > 0 and acks[4].reason()
        got = {r["dst"] for r in ip_json(host.ns, "-4", "route", "show", "table", "300")}
        assert got == {r.dst.removesuffix("/32") for i, r in enumerate(routes) if i != 4}
        # with stop, nothing after a chunk with an error is sent
        drv.channel.max_requests = 3
        again = [Route.model_validate(r) for r in many_routes(9, bad=1)]
        acks = drv.call([drv.route_request(True, r, RT_PROTO) for r in again[:1]]
                        + [drv.route_request(False, r, RT_PROTO) for r in again[1:]],
                        stop=True)
        assert acks[0].ok and not acks[1].ok and acks[2].ok
        assert all(a is nlwrite.NOT_SENT for a in acks[3:])
    finally:
        drv.close()
