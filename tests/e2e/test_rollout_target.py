"""The operator's `--cluster FILE` beats a lab the plan names (issue 50 item 2): with a lab up
whose name is the plan's `metadata.cluster`, `apply/diff/status/run --cluster FILE` used that
lab and never read FILE, so a missing FILE was no error either. Now the flag wins, a missing or
unreadable FILE is an error naming it (exit 1, no host touched), and the target reached is
named (stderr; `target` in the --json report). Real lab (namespaces, no sshd), real files; the
bad files are a family: missing, empty, a directory, a FIFO, not UTF-8, not YAML, not a
cluster, an empty name."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.e2e.labs import CLUSTER, PLAN, dumps, topoctl, write_plan
from topoctl.lab import lab as labmod
from topoctl.spec.cluster_load import load_cluster

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab_dir = tmp_path_factory.mktemp("labs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_LAB_DIR", str(lab_dir))
        name = f"tg{os.getpid() % 10**5}"
        lab = labmod.up(load_cluster(CLUSTER), name=name, with_ssh=False)
        try:
            yield lab
        finally:
            labmod.down(name)


@pytest.fixture
def files(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(lab.state_dir.parent))
    doc = yaml.safe_load(PLAN.read_text())
    doc["metadata"]["cluster"] = lab.name  # the plan names the lab that is up
    doc["metadata"].pop("inventory", None)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "bytes.yaml").write_bytes(b"\xff\xfe\x00name: x\n")
    (tmp_path / "notyaml.yaml").write_text("hosts: [\n")
    (tmp_path / "notcluster.yaml").write_text("kind: Job\n")
    (tmp_path / "dir.yaml").mkdir()
    noaddr = yaml.safe_load(CLUSTER.read_text())  # a valid cluster file, no host addresses
    (tmp_path / "noaddr.yaml").write_text(yaml.safe_dump(noaddr))
    return write_plan(tmp_path, doc), tmp_path


BAD_FILES = ["missing.yaml", "empty.yaml", "dir.yaml", "fifo.yaml", "bytes.yaml",
             "notyaml.yaml", "notcluster.yaml"]


@pytest.mark.parametrize("bad", BAD_FILES)
@pytest.mark.parametrize("verb", ["status", "diff", "apply", "run"])
def test_a_bad_cluster_file_is_an_error_even_with_the_plan_s_lab_up(lab, files, verb, bad,
                                                                     capsys):
    plan, d = files
    before = dumps(lab) if verb == "apply" and bad == BAD_FILES[0] else None
    capsys.readouterr()
    assert topoctl(verb, plan, "--cluster", str(d / bad)) == 1
    err = capsys.readouterr().err
    assert str(d / bad) in err, err
    assert "Traceback" not in err and f"lab {lab.name}" not in err
    if before is not None:
        assert dumps(lab) == before


def test_the_operator_s_cluster_file_wins_and_the_target_is_named(lab, files, capsys):
    plan, d = files
    capsys.readouterr()
    # the plan's lab alone: used, and said so
    assert topoctl("--json", "status", plan) == 0
    out, err = capsys.readouterr()
    assert f"target: lab {lab.name} over its namespaces (the plan's metadata.cluster)" in err
    assert json.loads(out)["target"].startswith(f"lab {lab.name}")
    # a valid cluster file beside it: read (its hosts have no address: the error names it),
    # the lab not reached
    assert topoctl("status", plan, "--cluster", str(d / "noaddr.yaml")) == 1
    err = capsys.readouterr().err
    assert f"{d / 'noaddr.yaml'}.addresses: no address for" in err, err
    assert "target: lab" not in err
    # an empty name is an error; beside --lab (as `run --heal` takes them: the lab to reach,
    # the cluster to re-plan with) the lab is the target and the file is still read
    assert topoctl("status", plan, "--cluster", "") == 1
    assert "--cluster" in capsys.readouterr().err
    assert topoctl("status", plan, "--lab", lab.name, "--cluster", str(d / "noaddr.yaml")) == 0
    assert f"target: lab {lab.name} over its namespaces (--lab)" in capsys.readouterr().err
    assert topoctl("status", plan, "--lab", lab.name, "--cluster", str(d / "missing.yaml")) == 1
    assert "missing.yaml" in capsys.readouterr().err
