"""Property-based fuzzing of `topoctl lab ...` on the real kernel: `lab up` with damaged
cluster files and bad flags creates nothing; every other verb (status, status --plan, cut,
heal, measure, rewire, exec, down, and apply/run to a lab that lacks the plan's hosts) given
bad input leaves a live 3-host lab exactly as it was, read back with `ip -j` and `tc -j`.
Every case asserts the invariant of tests/fuzzgen.py (exit 1 with `topoctl: ...` lines, never
70, no traceback). Lab names start with `fz` (tests/integration/test_lab.py uses `it`)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from tests import netns as nsutil
from tests.fuzzgen import assert_clean, fuzz_settings, hostile, mutated, structural, topoctl
from topoagent.protocol import TopoError
from topoctl.lab import lab as labmod
from topoctl.spec.cluster_load import parse_cluster

pytestmark = pytest.mark.netns

EXAMPLES = int(os.environ.get("TOPO_FUZZ_LAB_EXAMPLES", "200"))
PLANS = Path(__file__).resolve().parents[2] / "plans"
TAG = os.getpid() % 10000
CLUSTER = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"fzc{TAG}",
           "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "cpu"}},
           "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                     for i in range(3)],
           "fabric": {"kind": "direct", "links": [
               {"a": f"h{i}:eth0", "b": f"h{(i + 1) % 3}:eth1"} for i in range(3)]}}
BAD_UP_FLAGS = [["--name", "BAD"], ["--name", "1abc"], ["--name", "a" * 12], ["--name", ""],
                ["--mgmt-net", "garbage"], ["--mgmt-net", "10.1.0.0/24"],
                ["--mgmt-net", "10.232.0.0/31"], ["--plan", "{missing}"], ["--plan", "{bytes}"],
                ["--plan", "{badfabric}"]]
PORTS = st.one_of(st.sampled_from(["h0", ":", "h0:", ":eth0", "h9:eth0", "h0:eth9", "h0:eth0:x",
                                   "nosuch:eth0", ""]), st.text(max_size=8))


def _prefixed(prefix: str) -> list[str]:
    """Namespaces and root links whose names start with `prefix`, as the kernel lists them."""
    links = [ln["ifname"] for ln in json.loads(nsutil.sh(["ip", "-j", "link"]).stdout)]
    return sorted(n for n in nsutil.list_netns() + links if n.startswith(prefix))


def _snapshot(lab: labmod.Lab) -> dict:
    """The lab as the kernel has it: every namespace's links and addresses, the wire's qdiscs
    (the cables' rates) and root links of the lab, plus its state file."""
    out: dict = {"names": _prefixed(f"tp-{lab.name}-"),
                 "state": (lab.state_dir / "lab.json").read_text()}
    for ns in [h.ns for h in lab.layout.hosts] + [lab.layout.wire_ns]:
        out[ns] = nsutil._strip([nsutil.ip_json(ns, "link", "show"),
                                 nsutil.ip_json(ns, "-4", "addr", "show")])
    out["tc"] = nsutil.tc_json(lab.layout.wire_ns, "qdisc", "show")
    return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("fzlabs")
    name = f"fz{TAG}"
    labmod.down(name, root)  # a crashed run of this pid's number (names are per pid)
    lab = labmod.up(parse_cluster(CLUSTER), name, root, with_ssh=False)
    try:
        yield lab
    finally:
        labmod.down(name, root)
        assert not _prefixed(f"tp-{name}-")


@fuzz_settings(EXAMPLES)
@given(cluster=st.one_of(mutated(st.just(CLUSTER)), structural(st.just(CLUSTER)),
                        hostile(st.just(CLUSTER)), st.binary(max_size=30)),
       flags=st.lists(st.sampled_from(BAD_UP_FLAGS), max_size=2))
def test_lab_up_with_bad_input_creates_nothing(cluster, flags):
    if not isinstance(cluster, bytes):
        try:
            parse_cluster(cluster)
            assume(flags)  # a valid cluster and no bad flag would build a lab: not this test
        except TopoError:
            pass
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        path = d / "c.yaml"
        path.write_bytes(cluster if isinstance(cluster, bytes) else yaml.safe_dump(cluster)
                         .encode())
        (d / "b.yaml").write_bytes(b"\xff\xfe")
        (d / "f.yaml").write_text(yaml.safe_dump({"fabric": {"kind": "direct", "links": [
            {"a": "h0:eth0", "b": "h7:eth1"}]}}))
        fl = [a.format(missing=d / "m.yaml", bytes=d / "b.yaml", badfabric=d / "f.yaml")
              for f in flags for a in f]
        names = {n for n in (cluster.get("name") if isinstance(cluster, dict) else None,
                             CLUSTER["name"], *fl[1::2]) if isinstance(n, str) and n}
        argv = ["lab", "up", str(path), "--no-ssh", "--state-dir", str(d / "labs"), *fl]
        rc, out, err = topoctl(argv)
        assert_clean(argv, rc, err, codes=(1,), out=out)
        for n in names:
            assert not _prefixed(f"tp-{n}-"), (argv, n)
        assert not list((d / "labs").glob("*/lab.json")), argv


def _lab_argv(verb: str, lab: labmod.Lab, d: Path, port: str, doc) -> list[str]:
    common = ["--lab", lab.name, "--state-dir", str(lab.state_dir.parent)]
    plan = str(d / "p.yaml")
    return {
        "status-plan": ["lab", "status", *common, "--plan", plan],
        "cut": ["lab", "cut", *common, port],
        "heal": ["lab", "heal", *common, port],
        "measure": ["lab", "measure", *common, port, "--time", "0.5"],
        "measure-flags": ["lab", "measure", *common, "--time", port or "nan"],
        "rewire": ["lab", "rewire", *common, plan],
        "exec": ["lab", "exec", *common, port or "h9", "true"],
        "down-bad-name": ["lab", "down", "--lab", port.upper() or "X",
                          "--state-dir", str(lab.state_dir.parent)],
        "apply": ["apply", "--dry-run", "--lab", lab.name, str(PLANS / "mlp-hetero8-plan.yaml")],
        "run": ["run", "--lab", lab.name, "--iterations", "1",
                str(PLANS / "mlp-hetero8-plan.yaml")],
    }[verb]


@fuzz_settings(EXAMPLES)
@given(verb=st.sampled_from(["status-plan", "cut", "heal", "measure", "measure-flags",
                             "rewire", "exec", "down-bad-name", "apply", "run"]),
       port=PORTS, doc=st.one_of(mutated(st.just({"fabric": CLUSTER["fabric"]})),
                                 st.binary(max_size=20)))
def test_lab_verbs_with_bad_input_change_nothing(lab, verb, port, doc):
    """Bad ports, flags, plan fabrics (junk at any depth), lab names, and plans for hosts the
    lab does not have: exit 1 (`status --plan` of a fabric that happens to be valid: 0 or 2),
    the lab exactly as before."""
    if verb in ("cut", "heal", "measure"):
        assume(port not in lab.layout.ports())  # a real port would really cut/measure
    if verb == "exec":
        assume((port or "h9") not in {h.name for h in lab.layout.hosts})
    if verb == "measure-flags":
        assume(port.strip() not in ("", "inf") and not _positive(port))
    if verb == "down-bad-name":
        assume(port.upper() != lab.name)
    if verb == "rewire" and not isinstance(doc, bytes):
        try:
            lab.cluster.with_fabric(doc.get("fabric"))
            assume(False)  # a valid fabric really re-cables: tests/integration/test_lab.py
        except TopoError:
            pass
    before = _snapshot(lab)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "p.yaml").write_bytes(doc if isinstance(doc, bytes) else yaml.safe_dump(doc)
                                   .encode())
        argv = _lab_argv(verb, lab, d, port, doc)
        rc, out, err = topoctl(argv)
    assert_clean(argv, rc, err, codes=(0, 1, 2) if verb == "status-plan" else (1,), out=out)
    assert _snapshot(lab) == before, argv


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


@pytest.mark.parametrize(("argv", "says"), [
    # found by these fuzzers: tracebacks (exit 70) before the fixes of this branch
    (["lab", "status", "--lab", "BAD"], "topoctl: --lab: lab name 'BAD'"),
    (["lab", "down", "--lab", "1x"], "topoctl: --lab: lab name '1x'"),
    (["lab", "up", str(PLANS / "hetero8-cluster.yaml"), "--lab", "BAD_NAME"], "--lab"),
    (["lab", "up", str(PLANS / "hetero8-cluster.yaml"), "--mgmt-net", "garbage"],
     "topoctl: --mgmt-net: not an IPv4 network"),
    # accepted before: a lab outside the README's 10.232.0.0/16
    (["lab", "up", str(PLANS / "hetero8-cluster.yaml"), "--name", "fzx", "--mgmt-net",
      "10.1.0.0/24"], "topoctl: --mgmt-net: 10.1.0.0/24 is outside 10.232.0.0/16"),
    # the audit's: /dev/zero grew without bound, a directory or a FIFO was read
    (["lab", "up", "/dev/zero", "--name", "fzx"], "topoctl: /dev/zero: not a regular file"),
    (["lab", "up", "/", "--name", "fzx"], "topoctl: /: not a regular file (a directory)"),
    (["lab", "up", str(PLANS / "hetero8-cluster.yaml"), "--name", "fzx", "--plan",
      "/dev/zero"], "topoctl: /dev/zero: not a regular file"),
])
def test_found_lab_flags(tmp_path, argv, says):
    rc, _, err = topoctl([*argv, "--state-dir", str(tmp_path)])
    assert rc == 1 and says in err and "Traceback" not in err, err
    assert not _prefixed("tp-fzx-")


@pytest.mark.parametrize(("args", "says"), [
    (["measure", "--time", "nan"], "topoctl: --time: expected seconds"),  # was exit 70
    (["measure", "--jobs", "-1"], "topoctl: --jobs:"),  # was accepted
    (["measure", "h0:eth9"], "no port h0:eth9"),  # measured nothing, exit 0
    (["rewire", "{plan}"], "topoctl: {plan}: fabric.links[0].b:"),  # did not name the file
])
def test_found_on_a_live_lab(lab, tmp_path, args, says):
    plan = tmp_path / "p.yaml"
    plan.write_text(yaml.safe_dump({"fabric": {"kind": "direct", "links": [
        {"a": "h0:eth0", "b": 5}]}}))
    before = _snapshot(lab)
    rc, _, err = topoctl(["lab", args[0], "--lab", lab.name, "--state-dir",
                          str(lab.state_dir.parent), *[a.format(plan=plan) for a in args[1:]]])
    assert rc == 1 and says.format(plan=plan) in err and "Traceback" not in err, err
    assert _snapshot(lab) == before
