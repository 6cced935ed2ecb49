"""Per-host compute: the lab's quota formula (`topoctl.lab.cpu`), its refusals, finding the
machine's CPU controller, joining a group before exec (a real shell, no root), the simulator's
per-device speed and the planner's use of `hosts[].speed` (hetero4-compute plans, plans
without speed unchanged)."""

from __future__ import annotations

import math
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from topoctl.lab import cpu
from topoctl.planner import host_speeds, lower_bound, make_plan, prepare
from topoctl.sim import Compute, Network
from topoctl.sim.engine import simulate
from topoctl.spec.cluster import ClusterError
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import load_job

PLANS = Path(__file__).resolve().parents[2] / "plans"
HETERO4 = PLANS / "hetero4-compute-cluster.yaml"


# --- the formula ---------------------------------------------------------------------------------
def test_no_speed_means_speed_one_and_a_fixed_share():
    """A cluster without `speed` counts every host as speed 1: each host has its share
    whether or not the others compute (8 hosts on 2 cores: a quarter core each, also for a
    host that runs alone), never the whole machine."""
    assert cpu.quotas({f"h{i}": None for i in range(8)}, 2) == {f"h{i}": 0.25 for i in range(8)}
    assert cpu.quotas({"a": None, "b": None}, 2) == {"a": 1.0, "b": 1.0}
    assert cpu.quotas({}, 2) == {}


@pytest.mark.parametrize("speeds,devices,cores,want", [
    # fast4 with gpus {count: 2}: 8 device shares on 2 cores, a quarter core per device
    ({f"h{i}": None for i in range(4)}, {f"h{i}": 2 for i in range(4)}, 2,
     {f"h{i}": 0.5 for i in range(4)}),
    # hetero4-compute with 2 devices a host: device-speeds sum to 5 on 2 cores
    ({"h0": 1.0, "h1": 0.5, "h2": 0.75, "h3": 0.25}, {h: 2 for h in ("h0", "h1", "h2", "h3")},
     2, {"h0": 0.8, "h1": 0.4, "h2": 0.6, "h3": 0.2}),
    # one host of 3 devices beside one of 1, 8 cores: a device never more than one core
    ({"a": None, "b": None}, {"a": 3, "b": 1}, 8, {"a": 3.0, "b": 1.0}),
    # a host without devices (its agent) counts as one
    ({"a": None, "b": None}, {"a": 2, "b": 0}, 2, {"a": 4 / 3, "b": 2 / 3}),
])
def test_a_host_with_k_devices_gets_k_device_shares(speeds, devices, cores, want):
    got = cpu.quotas(speeds, cores, devices)
    assert got == pytest.approx(want)
    assert sum(got.values()) <= cores + 1e-9
    per = cpu.device_quotas(speeds, cores, devices)
    assert per == pytest.approx({h: want[h] / max(1, devices[h]) for h in want})
    assert max(per.values()) <= 1.0 + 1e-9


def test_too_many_devices_are_refused_per_device():
    """16 hosts of 4 devices on 2 cores: 1/32 core per device, below the kernel's floor."""
    speeds = {f"h{i}": None for i in range(16)}
    problems = cpu.check_quotas(speeds, 2, devices={h: 4 for h in speeds})
    assert len(problems) == 16 and "per device" in problems[0][1]
    assert cpu.check_quotas(speeds, 2, devices={h: 1 for h in speeds}) == []


@pytest.mark.parametrize("speeds,cores,want", [
    # sum 1.75 <= 2 cores, fastest 1: speed s is s cores
    ({"a": 1.0, "b": 0.5, "c": 0.25}, 2, {"a": 1.0, "b": 0.5, "c": 0.25}),
    # a host without speed is 1; the fastest (2) gets one core, the others in proportion
    ({"a": 2.0, "b": None}, 2, {"a": 1.0, "b": 0.5}),
    # sum 2.5 > 2 cores: scaled to the cores (hetero4-compute)
    ({"h0": 1.0, "h1": 0.5, "h2": 0.75, "h3": 0.25}, 2, {"h0": 0.8, "h1": 0.4, "h2": 0.6,
                                                        "h3": 0.2}),
    # 8 hosts of speed 1 on 2 cores: a quarter core each
    ({f"h{i}": 1.0 for i in range(8)}, 2, {f"h{i}": 0.25 for i in range(8)}),
])
def test_quotas(speeds, cores, want):
    got = cpu.quotas(speeds, cores)
    assert got is not None and got.keys() == want.keys()
    for h in want:
        assert got[h] == pytest.approx(want[h])
    assert sum(got.values()) <= cores + 1e-9  # never more than the machine has
    assert max(got.values()) <= 1.0 + 1e-9  # a single-threaded rank can use all of it
    s = {h: (1.0 if v is None else v) for h, v in speeds.items()}
    a, b = sorted(s)[:2]
    assert got[a] / got[b] == pytest.approx(s[a] / s[b])  # the ratios hold


def test_quota_too_small_is_refused_with_its_path():
    many = {f"h{i}": 1.0 for i in range(64)}  # 2/64 core each < 0.05
    problems = cpu.check_quotas(many, 2)
    assert [p for p, _ in problems] == [f"hosts[{i}].speed" for i in range(64)]
    assert "below the smallest CPU quota" in problems[0][1]
    one = cpu.check_quotas({"a": 1.0, "b": 0.01, "c": None}, 2, {"a": 0, "b": 1, "c": 2})
    assert [p for p, _ in one] == ["hosts[1].speed"]
    assert cpu.check_quotas({"a": 1.0, "b": 0.05}, 2) == []  # exactly the smallest quota
    assert cpu.check_quotas({"a": None}, 2) == []


def test_quota_us_and_period():
    assert cpu.quota_us(0.25) == cpu.PERIOD_US // 4
    assert cpu.quota_us(1.0) == cpu.PERIOD_US
    assert cpu.MIN_QUOTA_US / cpu.PERIOD_US == pytest.approx(0.05)


@pytest.mark.parametrize("speed", [0, -1, 17, "fast", True])
def test_bad_speed_in_the_cluster_file_names_its_path(speed):
    data = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "c",
            "hosts": [{"name": "h0", "nics": [{"name": "eth0"}]},
                      {"name": "h1", "speed": speed, "nics": [{"name": "eth0"}]}],
            "fabric": {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth0"}]}}
    with pytest.raises(ClusterError) as e:
        parse_cluster(data)
    assert e.value.path == "hosts[1].speed", str(e.value)


# --- the machine ---------------------------------------------------------------------------------
def test_detect_prefers_v2_with_cpu_then_v1(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory pids\n")  # no cpu: hybrid like this machine
    v1 = str(tmp_path / "cpu")
    mounts = [(str(v2), "cgroup2", "rw"), (v1, "cgroup", "rw,relatime,cpu")]
    assert cpu.detect(mounts) == cpu.CpuBackend("v1", Path(v1))
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert cpu.detect(mounts) == cpu.CpuBackend("v2", v2)
    assert cpu.detect([(v1, "cgroup", "rw,cpuacct")]) is None  # cpuacct is not cpu
    assert cpu.detect([]) is None


def test_this_machine_has_a_cpu_controller():
    """What the lab tests need; `mount | grep cgroup` on this machine shows v1 `cpu`."""
    mounts = Path("/proc/self/mounts").read_text()
    if "cgroup" not in mounts:
        pytest.skip("no cgroup file system mounted here (the lab's quotas need one)")
    b = cpu.detect()
    assert b is not None
    assert (b.root / ("cpu.cfs_quota_us" if b.kind == "v1" else "cgroup.controllers")).exists() \
        or b.kind == "v1"


def test_join_argv_writes_the_pid_of_the_program_it_execs(tmp_path):
    procs = tmp_path / "cgroup.procs"  # a plain file stands in for the kernel's
    out = subprocess.run(cpu.join_argv(procs, ["sh", "-c", "echo $$"]), capture_output=True,
                         text=True, check=True).stdout
    assert procs.read_text().strip() == out.strip()  # exec: the same process
    bad = subprocess.run(cpu.join_argv(tmp_path / "no" / "such", ["echo", "ran"]),
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "ran" not in bad.stdout  # cannot join: does not run


# --- the simulator -------------------------------------------------------------------------------
def _net(**kw) -> Network:
    return Network({}, lambda a, b: [], **kw)


def test_sim_speed_scales_compute():
    tasks = [Compute("a1", "a", 1.0), Compute("b1", "b", 1.0), Compute("a2", "a", 0.5, ("a1",))]
    plain = simulate(tasks, _net())
    fast = simulate(tasks, _net(speed={"a": 0.25, "b": 2.0}))
    assert plain.iteration_time == pytest.approx(1.5)
    assert fast.finish["a2"] == pytest.approx(6.0)
    assert fast.finish["b1"] == pytest.approx(0.5)
    assert fast.compute_time == pytest.approx(6.0)
    assert simulate(tasks, _net(speed={})).iteration_time == plain.iteration_time


def test_sim_speed_caps_pooled_compute_at_the_quota():
    """A lab pool of 2 cores: the quotas 1, 0.5, 0.25 are each a device's cap; with 1 core
    shared by caps 0.8 and 0.4 max-min gives 0.6 and 0.4 (the kernel's CFS with equal weights
    and quotas does the same)."""
    tasks = [Compute(d, d, 1.0) for d in "abc"]
    pool = (frozenset("abc"), 2)
    r = simulate(tasks, _net(cpu_pool=pool, speed={"a": 1.0, "b": 0.5, "c": 0.25}))
    assert [r.finish[d] for d in "abc"] == pytest.approx([1.0, 2.0, 4.0])
    two = [Compute(d, d, 1.2) for d in "ab"]
    r = simulate(two, _net(cpu_pool=(frozenset("ab"), 1), speed={"a": 0.8, "b": 0.4}))
    # b at 0.4 until done at 3.0; a at 0.6 until b is done (1.8 of 1.2 CPU-s: done at 2.0)
    assert r.finish["a"] == pytest.approx(2.0) and r.finish["b"] == pytest.approx(3.0)


# --- the planner ---------------------------------------------------------------------------------
def _no_speed(path: Path, tmp_path: Path) -> Path:
    text = path.read_text()
    for s in ("1.0", "0.5", "0.75", "0.25"):
        text = text.replace(f", speed: {s}", "")
    assert "speed:" not in text.split("hosts:")[1]
    out = tmp_path / "nospeed-cluster.yaml"
    out.write_text(text)
    return out


def test_hetero4_compute_plans_with_each_host_at_its_speed(tmp_path):
    cluster, job = load_cluster(HETERO4), load_job(PLANS / "mlp-job.yaml")
    assert {h.name: h.speed for h in cluster.hosts} == {"h0": 1.0, "h1": 0.5, "h2": 0.75,
                                                      "h3": 0.25}
    doc, ctx, evals = make_plan(cluster, job, use_cache=False)
    _, ctx0, evals0 = make_plan(load_cluster(_no_speed(HETERO4, tmp_path)), job,
                                use_cache=False)
    assert host_speeds(ctx) == {"h0": 1.0, "h1": 0.5, "h2": 0.75, "h3": 0.25}
    assert host_speeds(ctx0) == {}
    r, r0 = evals[0].result, evals0[0].result
    # the slowest host (a quarter as fast) is the busiest: 4x the equal hosts' compute
    assert r.compute_time == pytest.approx(4 * r0.compute_time, rel=1e-9)
    assert r.device_busy["h0"] == pytest.approx(r0.device_busy["h0"], rel=1e-9)
    assert r.device_busy["h1"] == pytest.approx(2 * r0.device_busy["h1"], rel=1e-9)
    assert r.iteration_time > r0.iteration_time
    assert doc["metadata"]["prediction"]["compute"] == pytest.approx(r.compute_time, rel=1e-5)
    b, b0 = lower_bound(ctx, evals[0].strategy)[0], \
        lower_bound(ctx0, evals0[0].strategy)[0]
    assert b >= b0


def test_lab_timed_hosts_get_the_labs_quota():
    """Ranks timed for the lab (a CPU pool): the sim caps each host at the quota `lab up`
    gives it, from the same formula over all the cluster's hosts and the profile's cores."""
    cluster, job = load_cluster(HETERO4), load_job(PLANS / "mlp-job.yaml")
    ctx = prepare(cluster, job, use_cache=False)
    pooled = replace(ctx, cpu_pool=(frozenset(ctx.hosts), ctx.lab.cores))
    want = cpu.quotas({h.name: h.speed for h in cluster.hosts}, ctx.lab.cores)
    assert host_speeds(pooled) == want
    assert math.isclose(sum(want.values()), min(ctx.lab.cores, 2.5))


def test_lab_timed_hosts_without_speed_get_a_fixed_share():
    """fast4 states no speed: timed for the lab, every host is capped at its fixed share (a
    quarter of 2 cores each), not the whole machine; with 2 devices a host, each rank at its
    device share (an eighth)."""
    cluster, job = load_cluster(PLANS / "fast4-cluster.yaml"), load_job(PLANS / "mlp-job.yaml")
    ctx = prepare(cluster, job, use_cache=False)
    pooled = replace(ctx, cpu_pool=(frozenset(ctx.hosts), ctx.lab.cores))
    share = min(1.0, ctx.lab.cores / 4)
    assert host_speeds(pooled) == pytest.approx({h: share for h in ctx.hosts})
    two = parse_cluster(yaml.safe_load((PLANS / "fast4-cluster.yaml").read_text())
                        | {"defaults": {"nic_speed": "1gbit", "latency": "0ms",
                                        "gpus": {"count": 2, "type": "cpu"}}})
    ctx2 = prepare(two, job, use_cache=False)
    pooled2 = replace(ctx2, cpu_pool=(frozenset(ctx2.hosts), ctx2.lab.cores))
    assert host_speeds(pooled2) == pytest.approx({h: min(1.0, ctx.lab.cores / 8)
                                                  for h in ctx2.hosts})


def test_gpu_hosts_keep_their_roofline():
    data = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "g",
            "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "A100"}},
            "hosts": [{"name": "h0", "speed": 0.5, "nics": [{"name": "eth0"}]},
                      {"name": "h1", "nics": [{"name": "eth0"}]}],
            "fabric": {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth0"}]}}
    ctx = prepare(parse_cluster(data), load_job(PLANS / "mlp-job.yaml"), use_cache=False)
    assert host_speeds(ctx) == {}


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_backend_writes_and_reads_the_kernels_files(kind, tmp_path):
    """The files each hierarchy's interface has, written to a plain directory (v2 is not
    mounted with `cpu` on this machine: this is the only run its path gets here)."""
    b = cpu.CpuBackend(kind, tmp_path)
    b.create("tp-x-h-h0", 0.2)
    b.create("tp-x-h-h1", None)
    g0, g1 = tmp_path / "tp-x-h-h0", tmp_path / "tp-x-h-h1"
    if kind == "v1":
        assert (g0 / "cpu.cfs_quota_us").read_text() == "4000"
        assert (g0 / "cpu.cfs_period_us").read_text() == str(cpu.PERIOD_US)
        assert (g1 / "cpu.cfs_quota_us").read_text() == "-1"
    else:
        assert (g0 / "cpu.max").read_text() == f"4000 {cpu.PERIOD_US}"
        assert (g1 / "cpu.max").read_text() == f"max {cpu.PERIOD_US}"
    assert b.limit("tp-x-h-h0") == (4000, cpu.PERIOD_US)
    assert b.limit("tp-x-h-h1") == (None, cpu.PERIOD_US)
    assert b.limit("tp-x-h-h9") is None
    (g0 / "cgroup.procs").write_text("12\n34\n")
    (g0 / "cpu.stat").write_text("nr_periods 10\nnr_throttled 3\nthrottled_time 99\n")
    assert b.members("tp-x-h-h0") == [12, 34] and b.members("tp-x-h-h9") == []
    assert b.stat("tp-x-h-h0")["nr_throttled"] == 3
    assert b.procs("tp-x-h-h0") == g0 / "cgroup.procs"


def test_backend_create_fails_clearly(tmp_path):
    from topoctl.lab.netops import LabError

    b = cpu.CpuBackend("v1", tmp_path / "missing" / "root")
    with pytest.raises(LabError, match="cannot set up CPU group"):
        b.create("tp-x-h-h0", 0.5)


def test_no_cpu_controller_refuses_speeds_but_not_a_plain_cluster():
    from topoctl.lab.lab import check_cpu

    with pytest.raises(ClusterError) as e:
        check_cpu(load_cluster(HETERO4), None, 2)
    assert e.value.path == "hosts[0].speed" and "no cgroup CPU controller" in str(e.value)
    check_cpu(load_cluster(PLANS / "hetero8-cluster.yaml"), None, 2)  # no speed: allowed
    with pytest.raises(ClusterError) as e:  # 64 hosts on 2 cores: below the smallest quota
        check_cpu(parse_cluster({
            "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "many",
            "defaults": {"nic_speed": "100mbit"},
            "hosts": [{"name": f"h{i}", "speed": 1, "nics": [{"name": "eth0"}]}
                      for i in range(64)],
            "fabric": {"kind": "direct", "links": []}}), cpu.CpuBackend("v1", Path("/x")), 2)
    assert e.value.path == "hosts[0].speed" and len(e.value.problems) == 64
