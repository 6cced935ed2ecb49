"""Ownership and intent on a real namespace: someone else's object with the key of a desired
one is an error naming it, rules naming missing links are refused at check, and an empty state
must say so (--allow-empty). Nothing changes on the host when refused."""

from __future__ import annotations

import pytest

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.netns import sh

pytestmark = pytest.mark.netns


def test_foreign_objects_with_a_desired_key_are_errors(host: Host):  # noqa: F811
    ns = host.ns
    sh(["ip", "-n", ns, "link", "set", "tpa0", "up"])
    sh(["ip", "-n", ns, "addr", "add", "10.231.1.1/24", "dev", "tpa0"])  # foreign (proto 0)
    sh(["ip", "-n", ns, "route", "add", "10.236.9.2/32", "via", "10.231.1.2", "metric", "0",
        "proto", "static"])  # same key as full_state's, other form (no src)
    sh(["ip", "-n", ns, "rule", "add", "priority", "1001", "to", "10.236.77.0/24",
        "table", "77"])
    before = dump(ns)
    state = full_state()
    state["interfaces"][0]["addresses"] = []
    state["interfaces"][2]["addresses"] = ["10.231.1.1/30"]  # the foreign IP on another link
    r = host.apply(state)
    assert r.returncode == 1, r.stderr
    assert ("routes[0]: a route the agent does not own has the same table/dst/metric: "
            "10.236.9.2/32 via 10.231.1.2 dev tpa0 (proto 4)") in r.stderr
    assert "rules[1].priority: a rule the agent does not own has priority 1001" in r.stderr
    assert "interfaces[2].addresses[0]: 10.231.1.1/24 on tpa0 has this IP" in r.stderr
    assert dump(ns) == before
    # an identical foreign object is what is desired: no conflict, and it stays foreign
    same = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True}],
            "routes": [{"dst": "10.236.9.2/32", "via": "10.231.1.2"}]}
    assert host.apply(same).returncode == 0
    assert dump(ns) == before


def test_rules_naming_missing_links_are_refused(host: Host):  # noqa: F811
    before = dump(host.ns)
    r = host.apply({"rules": [{"priority": 1000, "iif": "nosuch0", "table": 100},
                              {"priority": 1001, "oif": "nosuch1", "table": 100}]})
    assert r.returncode == 1
    assert "rules[0].iif: no such link: nosuch0" in r.stderr
    assert "rules[1].oif: no such link: nosuch1" in r.stderr
    assert dump(host.ns) == before


@pytest.mark.parametrize("text", ["", "null\n", "{}\n", "# nothing\n"])
def test_an_empty_state_must_say_so(host: Host, text: str):  # noqa: F811
    assert host.apply(full_state()).returncode == 0
    before = dump(host.ns)
    for verb in ("apply", "diff"):
        r = host.agent(verb, "-", stdin=text)
        assert r.returncode == 1 and "empty state" in r.stderr and "--allow-empty" in r.stderr
    assert dump(host.ns) == before
    assert host.agent("apply", "--allow-empty", "--detailed-exitcode", "-",
                      stdin=text).returncode == 2
    # a listed section is explicit intent
    assert host.apply({"routes": []}).returncode == 0
