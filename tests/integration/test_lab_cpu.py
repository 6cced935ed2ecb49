"""Per-host compute in the lab on the real kernel: `lab up` of a cluster whose hosts differ in
speed gives every host its own CPU group with the quota the formula gives; a process started
through `lab exec` lands in its host's group, the host's sshd, its sessions and the lab
transport's agent do not but are told the group their ranks join (read from /proc/PID/cgroup;
tests/e2e/test_multirank_lab.py checks that launched ranks are in it); a busy loop is held to
its quota (the kernel's cpu.stat counts the throttling); `down` removes the groups, also after
a crash; a speed the machine cannot give is refused before anything is created. Every check
reads the kernel's files, not the lab's bookkeeping."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests import netns as nsutil
from topoctl import cli
from topoctl.lab import cpu
from topoctl.lab import lab as labmod
from topoctl.rollout.transports.local import lab_transport
from topoctl.spec.cluster_load import load_cluster

pytestmark = pytest.mark.netns

PLANS = Path(__file__).resolve().parents[2] / "plans"
HETERO4 = PLANS / "hetero4-compute-cluster.yaml"
BACKEND = cpu.detect()
needs_cpu = pytest.mark.skipif(BACKEND is None, reason="no cgroup cpu controller on this "
                                                       "machine (the quotas need one)")


def _name(tag: str) -> str:
    return f"it{tag}{nsutil.pid_tag()}"  # as tests/integration/test_lab.py: leftovers by pid


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_test_groups():
    """CPU groups of crashed earlier runs of these tests (lab `it<tag><pid in base 36>`, pid
    no longer alive), also those whose namespaces are gone already: `down` by the lab's name."""
    if BACKEND is not None and os.geteuid() == 0:
        for path in cpu.list_groups("tp-it"):
            lab = Path(path).name[3:].split("-", 1)[0]
            m = re.fullmatch(r"it[a-z]([0-9a-z]{1,5})", lab)
            if m and int(m.group(1), 36) != os.getpid() and \
                    not os.path.exists(f"/proc/{int(m.group(1), 36)}"):
                labmod.down(lab, "/nonexistent")
    yield


def _cpu_cgroup(pid: int | str) -> str:
    """The cpu controller's group of process `pid`, as /proc/PID/cgroup says (v1: the line
    naming `cpu`; v2: the `0::` line)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    for ln in lines:
        _, ctrl, path = ln.split(":", 2)
        if BACKEND is not None and BACKEND.kind == "v1" and "cpu" in ctrl.split(","):
            return path
        if BACKEND is not None and BACKEND.kind == "v2" and ctrl == "":
            return path
    raise AssertionError(f"no cpu group line in /proc/{pid}/cgroup: {lines}")


def _groups(prefix: str) -> list[str]:
    """Directories named `prefix...` in the machine's CPU hierarchy (an independent listing)."""
    assert BACKEND is not None
    return sorted(p.name for p in BACKEND.root.iterdir() if p.name.startswith(prefix))


@pytest.fixture(scope="module")
def hetero4(tmp_path_factory):
    if BACKEND is None:
        pytest.skip("no cgroup cpu controller on this machine")
    root = tmp_path_factory.mktemp("labs")
    name = _name("c")
    try:
        yield labmod.up(load_cluster(HETERO4), name, root)
    finally:
        labmod.down(name, root)
        assert _groups(f"tp-{name}-") == []
        assert not [n for n in nsutil.list_netns() if n.startswith(f"tp-{name}-")]


@needs_cpu
def test_quota_files_hold_the_formulas_values(hetero4):
    """hetero4-compute: speeds 1, 0.5, 0.75, 0.25 sum to 2.5 > 2 cores: 0.8, 0.4, 0.6, 0.2
    cores, i.e. 16000, 8000, 12000, 4000 us per 20000 us."""
    want = {"h0": 16000, "h1": 8000, "h2": 12000, "h3": 4000}
    if cpu.machine_cores() != 2:
        q = cpu.quotas({h.name: h.speed for h in hetero4.cluster.hosts}, cpu.machine_cores())
        want = {h: cpu.quota_us(c) for h, c in q.items()}
    for h, quota in want.items():
        g = BACKEND.group(f"tp-{hetero4.name}-h-{h}")
        if BACKEND.kind == "v1":
            assert int((g / "cpu.cfs_quota_us").read_text()) == quota, h
            assert int((g / "cpu.cfs_period_us").read_text()) == cpu.PERIOD_US
        else:
            assert (g / "cpu.max").read_text().split() == [str(quota), str(cpu.PERIOD_US)]


@needs_cpu
def test_sshd_and_its_sessions_run_outside_the_group_and_name_it_for_the_ranks(hetero4):
    for h in hetero4.layout.hosts:
        group = f"/tp-{hetero4.name}-h-{h.name}"
        pid = (hetero4.state_dir / "run" / f"sshd-{h.name}.pid").read_text().split()[0]
        assert _cpu_cgroup(pid) != group
        # a session's command (what the agent is, over the ssh transport): outside the group,
        # told the group its ranks join (topoagent.process.launch, $TOPO_RANK_CGROUP)
        out = subprocess.run(["ssh", "-F", str(hetero4.ssh_config), h.name,
                              "cat /proc/self/cgroup; echo cg=$TOPO_RANK_CGROUP; "
                              'test -f "$TOPO_RANK_CGROUP" && echo visible'],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        lines = [ln for ln in out.splitlines() if ln.count(":") >= 2]
        want = (f":cpu:{group}" if BACKEND.kind == "v1" else f"0::{group}")
        assert not any(ln.endswith(want) for ln in lines), out
        assert f"cg={BACKEND.procs(group.lstrip('/'))}" in out.splitlines(), out
        assert "visible" in out.splitlines(), out  # in sshd's own /sys (lab.show_cpu_groups...)


@needs_cpu
def test_exec_joins_the_group_and_the_lab_transports_agent_names_it(hetero4):
    for h in ("h0", "h3"):
        group = f"/tp-{hetero4.name}-h-{h}"
        # `topoctl lab exec` / Lab.exec: a child of the program still in the group
        r = hetero4.exec(h, ["sh", "-c", "sleep 0 & cat /proc/self/cgroup"], check=True)
        assert any(ln.split(":", 2)[2] == group and
                   ("cpu" in ln.split(":")[1].split(",") or BACKEND.kind == "v2")
                   for ln in r.stdout.splitlines())
        # the lab transport starts the agent outside the group, naming it for the ranks
        t = lab_transport(hetero4)
        argv = ["sh", "-c", "echo $$ $TOPO_RANK_CGROUP; sleep 5"]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **t.env[h]})
        try:
            pid, procs = p.stdout.readline().split()
            assert _cpu_cgroup(pid) != group
            assert int(pid) not in BACKEND.members(f"tp-{hetero4.name}-h-{h}")
            assert procs == str(BACKEND.procs(group.lstrip("/")))
        finally:
            p.kill()
            p.wait()
        if h == "h3":  # the agent's fork server (topoagent.zygote) too: a child of this process
            assert t.agent(h, ["show"]).rc == 0
            assert t.zygote is not None and t.zygote.pid is not None
            assert _cpu_cgroup(str(t.zygote.pid)) != group
        t.close()


@needs_cpu
def test_a_busy_loop_is_held_to_its_quota(hetero4):
    """h3 has 0.2 of a core: a 1 s busy loop gets at most that (plus one period's slack), and
    the kernel counts the periods it throttled the group in. (A lower bound would depend on
    what else runs on the shared machine; the cap does not.)"""
    group = f"tp-{hetero4.name}-h-h3"
    before = BACKEND.stat(group).get("nr_throttled", 0)
    r = hetero4.exec("h3", ["python3", "-c",
                            "import time\nt, c = time.time(), time.process_time()\n"
                            "while time.time() - t < 1.0: pass\n"
                            "print((time.process_time() - c) / (time.time() - t))"],
                     check=True, timeout=30)
    share = float(r.stdout.strip())
    assert share <= 0.2 + cpu.PERIOD_US / 1e6 + 0.02, share
    assert BACKEND.stat(group).get("nr_throttled", 0) > before


@needs_cpu
def test_status_shows_each_hosts_speed_and_share(hetero4, capsys):
    assert cli.main(["lab", "status", "--lab", hetero4.name, "--state-dir",
                     str(hetero4.state_dir.parent), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    by = {h["name"]: h for h in st["hosts"]}
    assert by["h3"]["speed"] == 0.25 and by["h0"]["speed"] == 1.0
    for h in by.values():
        assert h["cpu_quota_us"] / h["cpu_period_us"] == pytest.approx(h["cpu_share"], abs=1e-4)
        assert h["cpu_procs"] == 0  # no rank runs: sshd and the agent are outside the group
    assert st["cpu"]["backend"] == BACKEND.kind and st["cpu"]["period_us"] == cpu.PERIOD_US
    assert cli.main(["lab", "status", "--lab", hetero4.name, "--state-dir",
                     str(hetero4.state_dir.parent)]) == 0
    text = capsys.readouterr().out
    assert " 0.25 " in text and "cgroup" in text


@needs_cpu
def test_a_lab_without_speeds_gives_every_host_a_fixed_share(tmp_path):
    """hetero8 states no speed: every host is speed 1, 8 shares of the machine's cores (a
    quarter core each on 2). A busy loop on h5 running alone (the other hosts idle) is held
    to its share, not the whole machine: the kernel throttles it."""
    name = _name("u")
    c = load_cluster(PLANS / "hetero8-cluster.yaml")
    share = min(1.0, cpu.machine_cores() / 8)
    try:
        lab = labmod.up(c, name, tmp_path, with_ssh=False)
        assert lab.cpu is not None and lab.cpu["quotas"] == {f"h{i}": share for i in range(8)}
        assert len(_groups(f"tp-{name}-")) == 8
        assert BACKEND.limit(f"tp-{name}-h-h0") == (cpu.quota_us(share), cpu.PERIOD_US)
        group = f"tp-{name}-h-h5"
        before = BACKEND.stat(group).get("nr_throttled", 0)
        r = lab.exec("h5", ["python3", "-c",
                            "import time\nt, c = time.time(), time.process_time()\n"
                            "while time.time() - t < 1.0: pass\n"
                            "print((time.process_time() - c) / (time.time() - t))"],
                     check=True, timeout=30)
        rate = float(r.stdout.strip())
        assert rate <= share + cpu.PERIOD_US / 1e6 + 0.02, rate
        assert BACKEND.stat(group).get("nr_throttled", 0) > before
        r = lab.exec("h5", ["cat", "/proc/self/cgroup"], check=True)
        assert f"/tp-{name}-h-h5" in r.stdout
    finally:
        labmod.down(name, tmp_path)
    assert _groups(f"tp-{name}-") == []


@needs_cpu
def test_down_removes_a_half_built_labs_groups_and_processes(tmp_path):
    """A crash after the groups were made: no lab.json, a namespace and a process inside a
    group. `down` finds all of it by the lab's prefix."""
    name = _name("k")
    ns = f"tp-{name}-h-h0"
    nsutil.sh(["ip", "netns", "add", ns])
    try:
        BACKEND.create(ns, 0.5)
        BACKEND.create(f"tp-{name}-h-h1", None)
        p = subprocess.Popen(cpu.join_argv(BACKEND.procs(ns), ["ip", "netns", "exec", ns,
                                                               "sleep", "600"]))
        deadline = time.monotonic() + 5
        while p.pid not in BACKEND.members(ns) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.pid in BACKEND.members(ns)
        # one that joined its group but never entered the namespace (as a host's process does
        # for a moment, between the two): only the group knows it
        q = subprocess.Popen(cpu.join_argv(BACKEND.procs(f"tp-{name}-h-h1"), ["sleep", "600"]))
        while q.pid not in BACKEND.members(f"tp-{name}-h-h1") and time.monotonic() < deadline:
            time.sleep(0.02)
        got = labmod.down(name, tmp_path)
        assert got["cpu_groups"] == 2 and got["processes"] >= 1
        assert p.wait(timeout=10) != 0  # killed
        assert q.wait(timeout=10) != 0
        assert _groups(f"tp-{name}-") == []
    finally:
        with contextlib.suppress(Exception):
            labmod.down(name, tmp_path)


@needs_cpu
def test_a_speed_the_machine_cannot_give_is_refused_before_anything_exists(tmp_path):
    name = _name("r")
    data = load_cluster(HETERO4).to_dict()
    data["hosts"][2]["speed"] = 0.01  # 0.01 * 0.8 core < 0.05: below the smallest quota
    f = tmp_path / "tiny-cluster.yaml"
    f.write_text(yaml.safe_dump(data))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["lab", "up", str(f), "--name", name, "--state-dir", str(tmp_path),
                         "--no-ssh"])
    assert code == 1
    msg = err.getvalue()
    assert f"{f}: hosts[2].speed:" in msg and "smallest CPU quota" in msg, msg
    assert "Traceback" not in msg
    assert _groups(f"tp-{name}-") == []
    assert not [n for n in nsutil.list_netns() if n.startswith(f"tp-{name}-")]
