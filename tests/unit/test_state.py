"""HostState schema: canonical values, range checks, and errors that name the YAML path."""

from __future__ import annotations

import pytest

from topoagent.state.host import HostState, StateError, load_host_state, parse_host_state
from topoagent.state.values import format_rate, parse_rate


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(StateError) as e:
        load_host_state(text)
    return e.value.problems


def test_canonical_values():
    s = parse_host_state({
        "interfaces": [{"name": "eth1", "mac": "AA:BB:CC:00:11:22", "addresses": ["10.0.0.1/24"]}],
        "routes": [{"dst": "default", "via": "10.0.0.2", "table": "main"},
                   {"dst": "10.1.0.7", "dev": "eth1", "table": 100}],
        "rules": [{"priority": 1000, "from": "10.0.0.0/24", "table": 100}],
        "qos": [{"dev": "eth1", "rate": "1gbit",
                 "classes": [{"dst": "10.0.0.9", "rate": "250mbit"}]}],
    })
    assert s.interfaces[0].mac == "aa:bb:cc:00:11:22"
    assert s.routes[0].dst == "0.0.0.0/0" and s.routes[0].table == 254
    assert s.routes[1].dst == "10.1.0.7/32"
    assert s.rules[0].from_ == "10.0.0.0/24"
    assert s.qos[0].rate == 10**9
    cls = s.qos[0].resolved_classes()[0]
    assert (cls.id, cls.dst, cls.rate, cls.ceil) == (2, "10.0.0.9/32", 250 * 10**6, 10**9)


def test_yaml_round_trip():
    s = parse_host_state({
        "routes": [{"dst": "10.2.0.0/16", "nexthops": [{"via": "10.0.0.2", "weight": 3},
                                                       {"via": "10.0.0.3"}]}],
        "rules": [{"priority": 1001, "to": "10.2.0.0/16", "fwmark": 7, "table": 7}],
        "qos": [{"dev": "eth1", "rate": "100mbit", "classes": [{"dst": "10.2.0.1", "rate": 1500}]}],
    })
    assert load_host_state(s.to_yaml()) == s
    assert "from" not in s.to_yaml() or "from:" in s.to_yaml()


@pytest.mark.parametrize("text,rate", [("100mbit", 10**8), ("1.5gbit", 15 * 10**8),
                                      ("800kbit", 800_000), ("10mbps", 8 * 10**7), (4000, 4000)])
def test_rates(text, rate):
    assert parse_rate(text) == rate
    assert parse_rate(format_rate(rate)) == rate


@pytest.mark.parametrize("text,path,message", [
    ("routes:\n  - {dst: 10.0.0.0/8, via: 10.0.0.300}\n", "routes[0].via", "not an IPv4 address"),
    ("routes:\n  - dst: 10.0.0.0/8\n    nexthops:\n      - {via: 10.1.1.1}\n      - {via: x}\n",
     "routes[0].nexthops[1].via", "not an IPv4 address"),
    ("routes:\n  - {dst: 10.0.0.1/8, via: 10.0.0.2}\n", "routes[0].dst", "host bits set"),
    ("routes:\n  - {dst: 10.0.0.0/8, via: 10.0.0.2, table: 255}\n", "routes[0].table", "255"),
    ("routes:\n  - {dst: 10.0.0.0/8}\n", "routes[0]", "needs via, dev or nexthops"),
    ("interfaces:\n  - {name: eth0, colour: red}\n", "interfaces[0].colour", "unknown key"),
    ("interfaces:\n  - {name: this-name-is-too-long}\n", "interfaces[0].name", "interface name"),
    ("interfaces:\n  - {name: eth0, mtu: 20}\n", "interfaces[0].mtu", "greater than or equal"),
    ("interfaces:\n  - {name: eth0, addresses: 10.0.0.1/24}\n", "interfaces[0].addresses",
     "valid list"),
    ("interfaces:\n  - {name: eth0, mac: 'zz:00'}\n", "interfaces[0].mac", "not a MAC"),
    ("rules:\n  - {priority: 1000, table: 5}\n  - {priority: 1000, table: 6}\n", "rules[1]",
     "same priority as rules[0]"),
    ("rules:\n  - {priority: 32766, table: 5}\n", "rules[0].priority", "less than or equal"),
    ("qos:\n  - dev: eth0\n    rate: 100mbit\n    classes:\n      - {dst: 10.0.0.2, rate: 60mbit}\n"
     "      - {dst: 10.0.0.3, rate: 60mbit}\n", "qos[0]", "above the link rate"),
    ("qos:\n  - dev: eth0\n    rate: 100mbit\n    classes:\n      - {dst: 10.0.0.2, rate: 1gbit}\n",
     "qos[0]", "classes[0].rate: 1gbit is above the link rate 100mbit"),
    ("qos:\n  - {dev: eth0, rate: fast}\n", "qos[0].rate", "not a rate"),
    ("sysctl: {rp_filter: {eth0: 3}}\n", "sysctl.rp_filter.eth0", "less than or equal"),
    ("forwarding: {mode: magic}\n", "forwarding.mode", "kernel"),
    ("routes: [\n", "", "malformed YAML at line"),
    ("- 1\n- 2\n", "", "expected a mapping"),
])
def test_errors_name_the_path(text, path, message):
    found = problems(text)
    assert any(p == path and message in m for p, m in found), found


def test_prefix_for_plans():
    with pytest.raises(StateError) as e:
        parse_host_state({"routes": [{"dst": "10.0.0.0/8", "via": "nope"}]}, prefix="hosts.h3")
    assert e.value.problems[0][0] == "hosts.h3.routes[0].via"


def test_empty_document_is_empty_state():
    assert load_host_state("") == HostState()


def test_ipv6_canonical_values():
    s = parse_host_state({
        "interfaces": [{"name": "eth1", "addresses": ["2001:DB8:0:0::1/64", "10.0.0.1/24"],
                        "dad": False}],
        "routes": [{"dst": "default6", "via": "2001:db8::2"},
                   {"dst": "2001:db8:9::1", "dev": "eth1", "metric": 5},
                   {"dst": "2001:db8:a::/48", "via": "fe80::1", "dev": "eth1"}],
        "rules": [{"priority": 1000, "from": "2001:db8::/32", "table": 100},
                  {"priority": 1000, "from": "10.0.0.0/24", "table": 100},
                  {"priority": 1001, "fwmark": 3, "family": "ipv6", "table": 100}],
        "qos": [{"dev": "eth1", "rate": "1gbit",
                 "classes": [{"dst": "2001:db8:9::9", "rate": "250mbit"}]}],
    })
    assert s.interfaces[0].addresses[0] == "2001:db8::1/64"
    # the kernel's metric for an IPv6 route asked with none: the key says it too
    assert s.routes[0].dst == "::/0" and s.routes[0].metric == 1024
    assert s.routes[1].dst == "2001:db8:9::1/128" and s.routes[1].metric == 5
    assert [r.family for r in s.rules] == ["ipv6", "ipv4", "ipv6"]
    assert s.qos[0].resolved_classes()[0].dst == "2001:db8:9::9/128"
    assert load_host_state(s.to_yaml()) == s


@pytest.mark.parametrize("text,path,message", [
    ("routes: [{dst: 10.0.0.0/8, via: '2001:db8::1'}]\n", "routes[0].via",
     "an IPv6 next hop on an IPv4 route"),
    ("routes: [{dst: '2001:db8::/32', nexthops: [{via: 10.0.0.1}, {via: '2001:db8::2'}]}]\n",
     "routes[0].nexthops[0].via", "an IPv4 next hop on an IPv6 route"),
    ("routes: [{dst: '2001:db8::/129', dev: eth0}]\n", "routes[0].dst", "over /128"),
    ("routes: [{dst: '2001:db8::/32', via: 'fe80::1'}]\n", "routes[0].via",
     "link-local next hop fe80::1 needs dev"),
    ("routes: [{dst: '2001:db8::/32', via: '2001:db8::1', src: 10.0.0.1}]\n", "routes[0].src",
     "an IPv4 source on an IPv6 route"),
    ("interfaces: [{name: eth0, addresses: ['fe80::1/64']}]\n", "interfaces[0].addresses[0]",
     "link-local"),
    ("interfaces: [{name: eth0, addresses: ['2001:db8::1']}]\n", "interfaces[0].addresses[0]",
     "with prefix length"),
    ("rules: [{priority: 1000, to: 10.0.0.0/8, family: ipv6, table: 5}]\n", "rules[0].to",
     "an IPv4 network in an ipv6 rule"),
    ("rules: [{priority: 1000, to: '2001:db8::/32', table: 5}, "
     "{priority: 1000, from: '2001:db8:1::/48', table: 6}]\n", "rules[1]",
     "same priority as rules[0]"),
    ("routes: [{dst: '2001:db8::1/32', dev: eth0}]\n", "routes[0].dst", "host bits set"),
    ("routes: [{dst: '2001:db8::zz/64', dev: eth0}]\n", "routes[0].dst",
     "not an IPv6 network"),
])
def test_ipv6_errors_name_the_path(text, path, message):
    found = problems(text)
    assert any(p == path and message in m for p, m in found), found
