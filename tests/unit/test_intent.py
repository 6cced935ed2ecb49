"""Loose input is an error at validation, not a guess: duplicate YAML keys, booleans as
numbers, addresses without a prefix, one IP on two links, rates HTB cannot express."""

from __future__ import annotations

import pytest

from topoagent.state.host import StateError, load_host_state, load_yaml

BAD = {
    "duplicate key": ("routes: []\nroutes: []\n", "duplicate key 'routes'"),
    "nested duplicate key": ("sysctl: {ip_forward: true, ip_forward: false}\n",
                             "duplicate key 'ip_forward'"),
    "true as a metric": ("routes: [{dst: 10.0.0.0/8, dev: lo, metric: true}]\n",
                         "routes[0].metric: expected a number or text, not true/false"),
    "true as an rp_filter": ("sysctl: {rp_filter: {all: true}}\n",
                             "sysctl.rp_filter: expected a number"),
    "true as a table": ("rules: [{priority: 1000, table: true}]\n", "rules[0].table"),
    "address without prefix": ("interfaces: [{name: a0, addresses: [10.231.0.1]}]\n",
                               "interfaces[0].addresses[0]: not an IPv4 address with prefix"),
    "one IP on two links": (
        "interfaces:\n  - {name: a0, addresses: [10.231.0.1/24]}\n"
        "  - {name: b0, addresses: [10.231.0.1/30]}\n",
        "interfaces[1].addresses[0]: 10.231.0.1 is already at interfaces[0].addresses[0]"),
    "rate HTB cannot express": ("qos: [{dev: a0, rate: 8bit}]\n",
                                "qos[0].rate: rate out of range (1kbit"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_loose_input_is_an_error_naming_the_path(case: str):
    text, message = BAD[case]
    with pytest.raises(StateError) as e:
        load_host_state(text)
    assert message in str(e.value)


def test_booleans_where_booleans_belong_still_parse():
    s = load_host_state("interfaces: [{name: a0, up: true}]\nsysctl: {ip_forward: false}\n")
    assert s.interfaces[0].up is True and s.sysctl.ip_forward is False


def test_yaml_merge_keys_are_not_duplicates():
    assert load_yaml("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n") == {"a": {"b": 1},
                                                                 "c": {"b": 1, "d": 2}}
