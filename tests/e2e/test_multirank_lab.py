"""Hosts with several ranks, for real: lab fast4 with `gpus: {count: 2, type: cpu}` (8 ranks
on 4 host namespaces), a baseline plan run by `topoctl run` as rendered (a flat 8-rank ring)
and with the hierarchical AllReduce (`job.collective.hierarchical`, written by hand until the
planner renders it). Each rank reports what the kernel says of it (its CPU group from
/proc/self/cgroup) with its rank, local rank and bind address; the host groups' quotas are
read from the cgroup files, the routes between a host's ranks from `ip -j route get`; a
host's ranks' CPU stays under the host's quota. Over 20 steps the losses equal one process on
the whole batch."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from topoctl import cli
from topoctl.lab import cpu, names
from topoctl.lab import lab as labmod
from topoctl.planner import make_plan
from topoctl.rollout.run import run_job
from topoctl.rollout.transports.local import lab_transport
from topoctl.rollout.twophase import load_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

torch = pytest.importorskip("torch")

from topotrain.workload import data_seed, load_factory, random_inputs  # noqa: E402

pytestmark = pytest.mark.netns

PLANS = Path(__file__).resolve().parents[2] / "plans"
BACKEND = cpu.detect()
STEPS = 20
K = 2  # ranks per host
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "mrank",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 64, "features": 32,
                                              "classes": 4}},
       "batch": {"global": 32}, "parallelism": {"data": True}, "strategies": ["baseline"],
       "cost": {"method": "roofline"}, "launch": {"iterations": STEPS}}


def fast4_two_ranks() -> dict:
    doc = yaml.safe_load((PLANS / "fast4-cluster.yaml").read_text())
    doc["defaults"]["gpus"] = {"count": K, "type": "cpu"}
    doc["name"] = "fast4k2"
    return doc


def single_process(spec: dict) -> list[float]:
    """One process on the ranks' batches concatenated (rank order), the whole-batch loss."""
    seed, per = spec.get("seed", 0), spec["batch"]["per_rank"]
    torch.manual_seed(seed)
    model = load_factory(spec["model"]["factory"])(**spec["model"]["kwargs"])
    opt = torch.optim.SGD(model.parameters(), lr=spec.get("lr", 1e-3))
    gen, out = torch.Generator(), []
    for it in range(STEPS):
        parts = []
        for r in range(spec["world_size"]):
            gen.manual_seed(data_seed(seed, r, it))
            parts.append(random_inputs(spec["model"]["inputs"], per, gen)[0])
        opt.zero_grad()
        loss = model(torch.cat(parts)).float().pow(2).mean()
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def rank_events(lines: list[str]) -> list[dict]:
    """The ranks' events `run_job` echoed when verbose (`<host> [event N] <json>`), each with
    its host."""
    out = []
    for line in lines:
        host, _, rest = line.partition(" ")
        if rest.startswith("[event "):
            ev = json.loads(rest.partition("] ")[2])
            out.append(ev | {"host": host})
    return out


@pytest.fixture(scope="module")
def lab_and_plans(tmp_path_factory):
    if BACKEND is None:
        pytest.skip("no cgroup cpu controller on this machine")
    tmp = tmp_path_factory.mktemp("mrank")
    os.environ["TOPOCTL_LAB_DIR"] = str(tmp / "labs")
    cluster = parse_cluster(fast4_two_ranks())
    plan, _, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    flat = tmp / "flat.yaml"
    flat.write_text(yaml.safe_dump(plan, sort_keys=False))
    hier = dict(plan, job=dict(plan["job"]))
    hier["job"]["collective"] = dict(plan["job"]["collective"], hierarchical={"local_size": K})
    hpath = tmp / "hier.yaml"
    hpath.write_text(yaml.safe_dump(hier, sort_keys=False))
    name = f"mr{os.getpid() % 10**5}"
    lab = labmod.up(cluster, name=name, with_ssh=False)
    try:
        assert cli.main(["apply", str(flat), "--lab", lab.name]) == 0
        yield lab, plan, {"flat": flat, "hierarchical": hpath}
    finally:
        labmod.down(name)
        os.environ.pop("TOPOCTL_LAB_DIR", None)
    assert not [p for p in BACKEND.root.iterdir() if p.name.startswith(f"tp-{name}-")]


def test_every_host_has_its_fixed_device_shares(lab_and_plans):
    """No host states a speed: each is speed 1 with 2 devices, 8 device shares on the
    machine's cores, written into the kernel's quota files."""
    lab, _, _ = lab_and_plans
    want = cpu.quota_us(min(1.0, cpu.machine_cores() / 8) * K)
    for h in ("h0", "h1", "h2", "h3"):
        assert BACKEND.limit(f"tp-{lab.name}-h-{h}") == (want, cpu.PERIOD_US), h


def test_ranks_between_a_hosts_ranks_take_loopback(lab_and_plans):
    """Both ranks of a host bind its training address: the kernel routes between them over
    `lo` (the fast link), and to another host's address over a fabric port."""
    lab, plan, _ = lab_and_plans
    procs = plan["job"]["processes"]
    a0, a1 = procs["h0"][0]["bind_address"], procs["h1"][0]["bind_address"]
    assert procs["h0"][1]["bind_address"] == a0
    ns = names.host_ns(lab.name, "h0")
    for dst, local in ((a0, True), (a1, False)):
        r = subprocess.run(["ip", "-n", ns, "-j", "route", "get", dst, "from", a0],
                           capture_output=True, text=True, check=True)
        dev = json.loads(r.stdout)[0]["dev"]
        assert (dev == "lo") is local, (dst, dev)


@pytest.mark.parametrize("variant", ["flat", "hierarchical"])
def test_two_ranks_per_host_train_as_one_process(lab_and_plans, variant):
    lab, plan, paths = lab_and_plans
    groups = {h: names.cpu_group(lab.name, h) for h in ("h0", "h1", "h2", "h3")}
    throttled0 = {h: BACKEND.stat(g).get("nr_throttled", 0) for h, g in groups.items()}
    lines: list[str] = []
    transport = lab_transport(lab)
    try:
        res = run_job(load_plan(str(paths[variant])), transport, iterations=STEPS,
                      out=lines.append, verbose=True, timeout=900)
    finally:
        transport.close()
    assert res.exit_code == 0, "\n".join(lines[-40:])
    result = res.to_dict()
    assert result["synchronous"] is True
    events = rank_events(lines)
    starts = {e["rank"]: e for e in events if e["event"] == "start"}
    assert sorted(starts) == list(range(8))
    procs = plan["job"]["processes"]
    for h, specs in procs.items():
        assert [s["local_rank"] for s in specs] == list(range(K))
        for s in specs:
            ev = starts[s["rank"]]
            assert ev["host"] == h and ev["local_rank"] == s["local_rank"]
            assert ev["bind"] == s["bind_address"]
            assert ev["cpu_group"] == f"/{groups[h]}", ev  # the kernel's word
            assert ev["world"] == 8
    # a host's ranks: the CPU they used (their own process_time) while training, never above
    # the host's quota over the time they trained (a hard cap); the kernel throttled them
    iters = [e for e in events if e["event"] == "iter"]
    for h, g in groups.items():
        quota = BACKEND.limit(g)[0] / cpu.PERIOD_US
        mine = [e for e in iters if e["host"] == h]
        used = sum(e["cpu_seconds"] for e in mine)
        span = max(sum(e["seconds"] for e in mine if e["rank"] == s["rank"])
                   for s in procs[h])
        assert used <= quota * span * 1.1 + 0.05, (h, used / span, quota)
        assert BACKEND.stat(g).get("nr_throttled", 0) > throttled0[h], h
    # losses: the mean of the ranks' losses per step equals one process on the whole batch
    assert len(iters) == 8 * STEPS
    got = [sum(e["loss"] for e in iters if e["iter"] == it) / 8 for it in range(STEPS)]
    want = single_process(plan["job"])
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    if variant == "hierarchical":  # the hook ran (its per-bucket timings)
        assert result["allreduce"] and all(b["seconds"] > 0 for b in result["allreduce"])
