"""`topoctl export nccl`: the files, NCCL's ring equal to the planned ring link for link, the
bytes each rank pair carries equal to the simulator's ring, and the refusals (exit 1, the limit
and the way out named). The programs' results are tests/integration/test_msccl_executor.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from topocontract.msccl import Limits, from_xml, link_chunks
from topoctl.cli import main
from topoctl.render.nccl import ExportError, export_nccl, nccl_ranks
from topoctl.rollout.twophase import load_plan
from topoctl.sim.schedules import ring_allreduce as sim_ring

PLANS = Path(__file__).resolve().parents[2] / "plans"
RING_PLANS = sorted(PLANS.glob("*-plan.yaml"))


def rank_hosts(plan: dict) -> dict[int, str]:
    return {p["rank"]: h for h, ps in plan["job"]["processes"].items() for p in ps}


@pytest.mark.parametrize("path", RING_PLANS, ids=lambda p: p.stem)
def test_nccl_ring_is_the_planned_ring_and_moves_the_simulated_bytes(path):
    plan = load_plan(path)
    order = plan["job"]["collective"]["order"]
    ranks = nccl_ranks(plan)
    n = len(ranks)
    host_of = {ranks[r]: h for r, h in rank_hosts(plan).items()}  # NCCL rank -> host
    # NCCL's ring sends rank i -> i+1; the planner's ring sends order[i] -> order[i-1]
    assert [(host_of[i], host_of[(i + 1) % n]) for i in range(n)] == sorted(
        ((order[i], order[i - 1]) for i in range(n)),
        key=lambda e: [host_of[r] for r in range(n)].index(e[0]))
    prog = export_nccl(plan).programs["allreduce-ring"]
    size = 1000.0 * n
    got = {(host_of[a], host_of[b]): c * size / prog.nchunksperloop
           for (a, b), c in link_chunks(prog).items()}
    want: dict[tuple[str, str], float] = {}
    sched = sim_ring(order, size)
    for st in sched.steps:
        want[(st.src, st.dst)] = want.get((st.src, st.dst), 0.0) + st.size * sched.scale
    assert got == pytest.approx(want)


def test_export_writes_env_topology_and_programs(tmp_path, capsys):
    plan = PLANS / "mlp-switch8-plan.yaml"
    out = tmp_path / "nccl"
    assert main(["export", "nccl", str(plan), "--cluster", str(PLANS / "switch8-cluster.yaml"),
                 "-o", str(out), "--remote-dir", "/opt/nccl", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["hosts"] == 8 and summary["ranks"] == 8
    assert summary["programs"]["allreduce-ring"]["max_steps"] == 15  # 2n-1
    env = dict(line.split("=", 1) for line in (out / "h3" / "rank0.env").read_text().split())
    ranks = yaml.safe_load((out / "ranks.yaml").read_text())["nccl_rank"]
    assert env["RANK"] == str(ranks[3]) and env["WORLD_SIZE"] == "8"
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert env["NCCL_TOPO_FILE"] == "/opt/nccl/h3/topo.xml"
    assert env["MSCCL_XML_FILES"] == "/opt/nccl/h3/msccl/allreduce-ring.xml"
    topo = (out / "h3" / "topo.xml").read_text()
    assert '<net name="eth0" dev="0" speed="100"' in topo  # switch8's 100mbit NICs
    prog = from_xml((out / "h3" / "msccl" / "allreduce-ring.xml").read_text())
    assert prog.ngpus == 8 and prog.coll == "allreduce"


def test_a_program_over_the_executor_limits_is_refused_with_the_way_out(tmp_path, capsys):
    plan = str(PLANS / "resnet50-topoopt12-plan.yaml")  # 12 ranks: 23 steps a thread block
    assert main(["export", "nccl", plan, "-o", str(tmp_path / "x"), "--max-steps", "16"]) == 1
    err = capsys.readouterr().err
    assert "23 steps" in err and "MSCCL_MAX_NUM_STEPS" in err and "coarsen" in err
    assert not (tmp_path / "x").exists()
    with pytest.raises(ExportError):
        export_nccl(load_plan(plan), limits=Limits(max_steps=16))


def test_bad_plan_and_output_are_named(tmp_path, capsys):
    bad = tmp_path / "plan.yaml"
    bad.write_text("apiVersion: topoctl/v1\nkind: Plan\n")
    assert main(["export", "nccl", str(bad), "-o", str(tmp_path / "o")]) == 1
    assert str(bad) in capsys.readouterr().err
    other = str(PLANS / "fast4-cluster.yaml")  # h0-h3 only: switch8's h4-h7 are not in it
    assert main(["export", "nccl", str(PLANS / "mlp-switch8-plan.yaml"), "--cluster", other,
                 "-o", str(tmp_path / "o2")]) == 1
    assert "--cluster" in (err := capsys.readouterr().err) and "host h4 is not in cluster" in err
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["export", "nccl", str(RING_PLANS[0]), "-o", str(afile)]) == 1
    assert "is not a directory" in capsys.readouterr().err


def hierarchical_plan(hosts: int = 4, local: int = 2) -> dict:
    """switch8's plan with its ranks regrouped as `hosts` hosts of `local` ranks, as a plan for
    hosts with several devices renders them (`job.collective.hierarchical`)."""
    plan = load_plan(PLANS / "mlp-switch8-plan.yaml")
    names = [f"h{i}" for i in range(hosts)]
    procs = {h: [{**plan["job"]["processes"]["h0"][0], "rank": i * local + j, "local_rank": j}
                 for j in range(local)] for i, h in enumerate(names)}
    plan["job"] |= {"processes": procs, "world_size": hosts * local}
    plan["job"]["collective"] |= {"order": names, "hierarchical": {"local_size": local}}
    return plan


@pytest.mark.parametrize("hosts,local", [(4, 2), (2, 4), (3, 3)])
def test_hierarchical_plans_export_one_ring_per_shard_between_hosts(hosts, local):
    plan = hierarchical_plan(hosts, local)
    export = export_nccl(plan)
    prog = export.programs["allreduce-hierarchical"]
    assert prog.nchunksperloop == hosts * local and prog.nchannels == 2
    host_of = {export.ranks[r]: h for r, h in rank_hosts(plan).items()}
    size = float(prog.nchunksperloop)  # one byte a chunk
    sent_out = {r: 0.0 for r in host_of}
    sent_in = {r: 0.0 for r in host_of}
    for (a, b), chunks in link_chunks(prog).items():
        (sent_in if host_of[a] == host_of[b] else sent_out)[a] += chunks
    # each rank: 2(H-1)/H of its shard S/k across hosts, 2(k-1)/k of S inside the host
    assert list(sent_out.values()) == pytest.approx(
        [2 * (hosts - 1) / hosts * size / local] * len(sent_out))
    assert list(sent_in.values()) == pytest.approx([2 * (local - 1) / local * size] * len(sent_in))
