"""`topoctl topology`: strides, links, diameter, mean hops; bad input exits 1 with a message."""

from __future__ import annotations

import json

import pytest

from topoctl import cli


def test_topology_json_at_128_degree_4(capsys):
    assert cli.main(["topology", "--hosts", "128", "--degree", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strides"] == [1, 15] and out["diameter"] == 8
    assert out["geometric"] == {"strides": [1, 13], "diameter": 10, "mean_hops": 5.622047}
    assert len(out["links"]) == 256 and 5.3 < out["mean_hops"] < 5.4
    assert out["links"][0] == {"a": "h0:p0", "b": "h1:p1", "kind": "ring", "stride": 1}


def test_topology_text_with_group_sizes(capsys):
    assert cli.main(["topology", "-n", "12", "-d", "4", "--group-sizes", "12,6"]) == 0
    out = capsys.readouterr().out
    assert "groups of 6: strides [2]" in out and "diameter" in out


@pytest.mark.parametrize("argv,msg", [
    (["-n", "1", "-d", "4"], "at least 2 servers"),
    (["-n", "12", "-d", "6", "--ports", "4"], "larger than the 4 ports"),
    (["-n", "12", "-d", "4", "--group-sizes", "5"], "cannot be laid out"),
    (["-n", "12", "-d", "4", "--group-sizes", "12,6,4"], "need 6 ports"),
])
def test_topology_bad_input(argv, msg, capsys):
    assert cli.main(["topology", *argv]) == 1
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
