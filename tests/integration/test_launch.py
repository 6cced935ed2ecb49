"""`topo-agent launch` and `stop` with real processes in a throwaway namespace: ranks run as an
unprivileged user, events travel on their own channel, no process outlives its launcher, and
`stop` signals only processes that are still the ranks it recorded."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.test_confirm import wait_for
from topoagent.process.ranks import rank_dir

pytestmark = pytest.mark.netns


def spec(command: list[str], ranks: int = 1, **extra) -> dict:
    """A launch spec for host h0 with `ranks` ranks running `command`."""
    return {"name": "t", "command": command, "world_size": ranks,
            "master": {"address": "127.0.0.1", "port": 29999},
            "batch": {"global": ranks, "per_rank": 1}, "model": {},
            "processes": {"h0": [{"rank": r, "local_rank": r, "env": {"RANK": str(r)}}
                                 for r in range(ranks)]}, **extra}


@pytest.fixture
def agent(make_netns, tmp_path):
    """(argv prefix of the agent for a fresh namespace, its state directory); afterwards every
    process of the test (its launchers, by their state directory, and its ranks, by their
    markers) is killed, even when the test failed, and the ranks' directory removed."""
    ns, state = make_netns(), tmp_path / "state"
    yield [sys.executable, "-m", "topoagent.cli", "--netns", ns, "--state-dir", str(state)], state
    for pid in processes_with(str(state)) + [p for m in MARKERS for p in processes_with(m)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    MARKERS.clear()
    subprocess.run(["rm", "-rf", str(rank_dir(state / "run"))], check=False)


def launch(agent, job: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    argv, _ = agent
    return subprocess.run([*argv, "launch", "--host", "h0", "-"], input=json.dumps(job),
                          capture_output=True, text=True, timeout=timeout)


def start(agent, job: dict) -> subprocess.Popen:
    argv, _ = agent
    p = subprocess.Popen([*argv, "launch", "--host", "h0", "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    p.stdin.write(json.dumps(job))
    p.stdin.close()
    return p


MARKERS: list[str] = []  # of the running test's ranks


def with_marker(marker: str) -> list[str]:
    """A rank that sleeps, findable by `marker` on its command line."""
    MARKERS.append(marker)
    return ["python3", "-c", "import time; time.sleep(600)", marker]


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (an independent look at /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_ranks_run_unprivileged_with_a_private_job_spec(agent):
    """A plan's command is not root on the host: it runs as `nobody` with no groups, and its
    job spec is 0600, readable by that user only."""
    r = launch(agent, spec(["sh", "-c", 'id -u; id -G; stat -c %a:%U "$TOPOCTL_JOB"']))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[:3] == ["[rank 0] 65534", "[rank 0] 65534", "[rank 0] 600:nobody"]
    # root only when the job names it, with a warning
    r = launch(agent, spec(["id", "-u"], user="root"))
    assert r.returncode == 0 and "[rank 0] 0" in r.stdout.splitlines()
    assert json.loads(r.stdout.splitlines()[0])["event"] == "warning"


@pytest.fixture
def cpu_group():
    """A throwaway cgroup v1 `cpu` group (tp- prefix), removed afterwards."""
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cgroup.procs").is_file():
        pytest.skip("no cgroup v1 cpu hierarchy on this machine")
    g = root / f"tp-launch-{uuid.uuid4().hex[:8]}"
    g.mkdir()
    yield g
    for _ in range(100):  # the ranks are gone once the launch returned; their exit may lag
        with contextlib.suppress(OSError):
            g.rmdir()
            return
        time.sleep(0.05)


def test_ranks_join_the_group_named_by_the_environment_and_the_agent_stays_out(agent,
                                                                                 cpu_group):
    """$TOPO_RANK_CGROUP (the lab's per-host CPU quota): the ranks join the group before they
    run, the launching agent does not; a value that is not a cgroup.procs file under
    /sys/fs/cgroup is refused before any rank starts."""
    argv, _ = agent
    job = spec(["sh", "-c", "cat /proc/self/cgroup; cat /proc/$PPID/cgroup | sed s/^/agent:/"])
    env = {**os.environ, "TOPO_RANK_CGROUP": str(cpu_group / "cgroup.procs")}
    r = subprocess.run([*argv, "launch", "--host", "h0", "-"], input=json.dumps(job), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    mine = [ln for ln in r.stdout.splitlines() if ":cpu" in ln]
    assert any(ln.startswith("[rank 0] ") and ln.endswith(f":/{cpu_group.name}") for ln in mine)
    assert not any("agent:" in ln and cpu_group.name in ln for ln in mine), r.stdout
    for bad in ("/tmp/cgroup.procs", str(cpu_group / "cpu.shares"), "relative/cgroup.procs"):
        r = subprocess.run([*argv, "launch", "--host", "h0", "-"], input=json.dumps(job),
                           env={**env, "TOPO_RANK_CGROUP": bad}, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1 and "TOPO_RANK_CGROUP" in r.stdout + r.stderr, r
        assert "[rank 0]" not in r.stdout


def test_events_travel_apart_from_what_a_rank_prints(agent):
    """Only the event channel carries events; a forged event on stdout, a carriage return or a
    line-separator character stays behind `[rank N]`."""
    forged = json.dumps({"event": "link-down", "interface": "eth0", "reason": "forged"})
    script = (f"printf '%s\\n' '{forged}'; printf 'x\\r{forged}\\n'; "
              f"printf 'y\\342\\200\\250{forged}\\n'; "
              'echo \'{"event": "iter", "seconds": 0.5}\' >&"$TOPOCTL_EVENT_FD"')
    r = launch(agent, spec(["sh", "-c", script]))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()  # as a reader splitting on every line break would
    assert '[event 0] {"event": "iter", "seconds": 0.5}' in lines
    assert f"[rank 0] {forged}" in lines
    assert not [ln for ln in r.stdout.splitlines() + r.stdout.replace("\r", "\n").split("\n")
                if "link-down" in ln and not ln.startswith("[rank 0] ")]


def test_what_a_rank_wrote_before_it_ended_is_all_forwarded(agent):
    """A rank writes more events than the pipes hold while nobody reads the launcher yet, then
    exits: the launcher forwards every event, the last one included, before it ends (it used
    to end as soon as its ranks had, with the rest still in the pipes)."""
    count = 1500  # ~100 KB of events: more than the launcher's stdout pipe holds
    line = '{"event": "iter", "iter": %d, "seconds": 0.5, "pad": "xxxxxxxxxxxxxxxx"}\n'
    script = ("import os\n"
              "fd = int(os.environ['TOPOCTL_EVENT_FD'])\n"
              f"for i in range({count}):\n"
              f"    os.write(fd, ({line!r} % i).encode())\n"
              "open('finished', 'w').close()\n")  # in its directory (its cwd)
    p = start(agent, spec(["python3", "-c", script]))
    try:
        # the rank fills the launcher's stdout pipe and part of its event pipe, and ends;
        # only later is anything read
        finished = rank_dir(agent[1] / "run") / "finished"
        assert wait_for(finished.exists, 60), "the rank did not finish writing"
        time.sleep(1)  # the launcher sees the rank gone within 0.1 s
        out = p.stdout.read()  # to its end: the launcher ends once it forwarded everything
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out[-2000:]
    iters = [json.loads(ln.split("] ", 1)[1])["iter"] for ln in out.splitlines()
             if ln.startswith("[event 0] ")]
    assert iters == list(range(count))


def test_a_launcher_killed_with_9_leaves_no_rank_and_no_block(agent):
    """Its ranks die with it (PR_SET_PDEATHSIG); the stale pid file neither blocks the next
    launch nor lets `stop` signal whoever has that pid now."""
    marker = uuid.uuid4().hex
    argv, state = agent
    pidfile = state / "run" / "job.pids"
    p = start(agent, spec(with_marker(marker), ranks=2))
    # both ranks up and recorded (the launcher writes the file once every rank started: a
    # kill before that, on a busy machine, leaves no file, which is no test of a stale one)
    assert wait_for(lambda: len(processes_with(marker)) == 2 and pidfile.exists(), 30)
    p.kill()
    p.wait()
    assert wait_for(lambda: not processes_with(marker), 5), "ranks outlived their launcher"
    assert pidfile.exists()  # stale: its processes are gone
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        pid, start_time = pidfile.read_text().split("\n")[0].split()
        # the pid now names a bystander (as a reused pid would)
        pidfile.write_text(f"{bystander.pid} {start_time}\n")
        r = subprocess.run([*argv, "stop"], capture_output=True, text=True)
        assert r.returncode == 0 and "stale" in r.stderr
        assert bystander.poll() is None, "stop killed a bystander"
        # an earlier format (a bare pid) is not acted on either
        pidfile.write_text(f"{bystander.pid}")
        r = subprocess.run([*argv, "stop"], capture_output=True, text=True)
        assert r.returncode == 0 and "ignoring" in r.stderr and bystander.poll() is None
        pidfile.write_text(f"{bystander.pid} {start_time}\n")
        r = launch(agent, spec(["true"]))
        assert r.returncode == 0 and "stale pid file" in r.stderr
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("garbage", [b"abc\n", b"\x00\xff\xfe", b"12 x 3\n", b"-5 7\n"])
def test_a_garbage_pid_file_is_reported_not_a_crash(agent, garbage):
    argv, state = agent
    (state / "run").mkdir(parents=True, exist_ok=True)
    (state / "run" / "job.pids").write_bytes(garbage)
    r = subprocess.run([*argv, "--detailed-exitcode", "stop"], capture_output=True, text=True)
    assert r.returncode == 0 and "ignoring" in r.stderr and "Traceback" not in r.stderr
    (state / "run" / "job.pids").write_bytes(garbage)
    r = launch(agent, spec(["true"]))
    assert r.returncode == 0 and "ignoring" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_launcher_told_to_stop_stops_its_ranks(agent, sig):
    marker = uuid.uuid4().hex
    p = start(agent, spec(with_marker(marker), ranks=2))
    assert wait_for(lambda: len(processes_with(marker)) == 2, 30)
    p.send_signal(sig)
    assert p.wait(timeout=10) == 130
    assert not processes_with(marker)
    assert not (agent[1] / "run" / "job.pids").exists()


def test_a_launcher_whose_reader_left_stops_its_ranks(agent):
    """The controller gone (its end of the launcher's output closed, as when an SSH channel
    closes under a launcher that outlives its parent): the ranks are stopped within seconds."""
    marker = uuid.uuid4().hex
    p = start(agent, spec(with_marker(marker)))
    assert wait_for(lambda: len(processes_with(marker)) == 1, 30)
    p.stdout.close()
    assert p.wait(timeout=10) == 130
    assert not processes_with(marker)
