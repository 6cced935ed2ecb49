"""Faults of the management path during `topoctl apply` over SSH, on the 4-host lab with its real
sshd per host and a real agent process per call: an SSH session dropped while its agent applies,
an agent killed on one host (the signal reported through sshd), a host cut off by its own apply
(reported within seconds by SSH keepalives, reverted by its own watchdog). Every host is read
back with iproute2 (`tests.e2e.test_rollout.dumps`)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml

from tests.e2e.labs import HOSTS, PLAN, dumps, ring4_lab, topoctl
from tests.e2e.test_faults import CONFIRM_S
from tests.netns import ip_json
from topoctl.lab.ssh import sshd_pids
from topoctl.rollout import twophase
from topoctl.rollout.transports.ssh import lab_ssh_transport

pytestmark = pytest.mark.netns


@pytest.fixture
def lab(tmp_path):
    with ring4_lab(tmp_path / "labs", "e") as lab:
        yield lab


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def agent_pids(lab, host: str, verb: str) -> list[int]:
    """This lab host's agent processes running `verb` (the Python process, not the
    transport's /bin/sh wrapper around it)."""
    mark = str(lab.state_dir / "agent" / host)
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            argv = _cmdline(int(d))
            if argv[:1] == [sys.executable] and "topoagent.cli" in argv and mark in argv \
                    and verb in argv:
                out.append(int(d))
    return out


def holds(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (the agent's store lock: its apply is running)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def session_sshds(pid: int, listener: int) -> list[int]:
    """The sshd processes of the connection `pid` runs under: its sshd ancestors below the
    host's listening sshd."""
    out = []
    while pid > 1 and pid != listener:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm == "sshd":
            out.append(pid)
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return out if pid == listener else []


def journal_lines(state: Path) -> int:
    """Lines in the agent's journal (0 when there is none)."""
    try:
        return len((state / "journal").read_bytes().splitlines())
    except OSError:
        return 0


def _stopped(pid: int) -> bool:
    """Whether `pid` is stopped (state T) after a SIGSTOP; False once it is gone or a zombie."""
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in "tT":
            return True
        if state in "ZX":
            return False
        time.sleep(0.0005)


def step_until(pid: int, ready, step_s: float = 0.002) -> bool:
    """Run process `pid` in steps of `step_s` (SIGCONT, sleep, SIGSTOP) until `ready()` holds
    while it is stopped: True, and `pid` is left stopped; False if it ended first. The signals
    go through a pidfd: once the agent has ended, its pid may name another process, which a
    plain kill would stop."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        signal.pidfd_send_signal(fd, signal.SIGSTOP)
        while _stopped(pid):
            if ready():
                return True
            signal.pidfd_send_signal(fd, signal.SIGCONT)
            time.sleep(step_s)
            signal.pidfd_send_signal(fd, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)
    return False


@pytest.mark.parametrize("agent", ["goes on", "dies"])
def test_an_ssh_session_dropped_during_apply(lab, capsys, agent):
    """h3's SSH connection is killed (both sshd processes of its session) while its agent
    holds the store lock mid-apply: topoctl sees no exit status, reconnects and waits for that
    agent to end. If it goes on, the apply went through: h3 is rolled back with every other
    host. If it dies too (SIGKILL, caught with its journal: changes made), the journal is
    replayed and h3 is as before. Either way every host ends as before, and a second apply
    converges."""
    before = dumps(lab)
    listener = sshd_pids(lab.state_dir)["h3"]
    state = lab.state_dir / "agent" / "h3"
    seen: dict = {}
    stop = threading.Event()

    def caught(pid: int) -> bool:  # the moment to cut: the apply begun (and changes made)
        return holds(pid, state / "lock") and (agent == "goes on" or journal_lines(state) >= 3)

    def drop() -> None:
        while not stop.is_set():
            for pid in agent_pids(lab, "h3", "apply"):
                # the agent runs in steps of a few ms from here on, so the moment is caught
                # however loaded the machine is (a poll alone missed it under load)
                if not step_until(pid, lambda pid=pid: caught(pid)):
                    continue  # it ended first (another phase's agent): look again
                # frozen: its reply cannot get out first; cut the session, then let the agent
                # go on (it ends its apply with nobody listening) or kill it (with its
                # journal's header and the inverses of two operations begun); what it left
                # on disk says what topoctl must find
                seen["sessions"] = session_sshds(pid, listener)
                for s in seen["sessions"]:
                    os.kill(s, signal.SIGKILL)
                seen["journal"] = journal_lines(state)
                time.sleep(0.3)
                os.kill(pid, signal.SIGCONT if agent == "goes on" else signal.SIGKILL)
                return
            time.sleep(0.005)

    def applied_states() -> int:  # history entries beyond the baseline (0000.json)
        return len([f for f in (state / "history").glob("*.json") if f.name != "0000.json"])

    history = applied_states()
    dropper = threading.Thread(target=drop)
    dropper.start()
    try:
        code = topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh", "--json")
    finally:
        stop.set()
        dropper.join()
    report = json.loads(capsys.readouterr().out)
    print(report["message"])
    assert seen.get("sessions"), f"h3's apply was not caught holding its lock: {seen}"
    assert code == 3, report["message"]
    h3 = [(e["phase"], e["result"]) for e in report["events"] if e["host"] == "h3"]
    assert report["message"].startswith("apply failed on h3 (h3: SSH session dropped before "
                                        "the agent's exit status"), report["message"]
    if agent == "goes on":
        assert h3 == [("prepare", "changes"), ("apply", "dropped"),
                      ("recover", "nothing to recover"), ("check", "applied"),
                      ("rollback", "rolled back")], h3
        assert "h3 over a new connection: the apply had completed (host in sync with the " \
               "plan), rolled back" in report["message"]
        assert {h for h, e in report["hosts"].items() if e["result"] == "rolled back"} == HOSTS
        confirm = json.loads((state / "confirm.json").read_text())
        assert confirm["state"] == "rolled back"  # its pending confirmation ended by it
    else:
        assert seen["journal"] >= 3, f"h3's agent was not caught mid-apply: {seen}"
        assert h3 == [("prepare", "changes"), ("apply", "dropped"), ("recover", "recovered"),
                      ("check", "not applied")], h3
        assert "h3 over a new connection: its agent had died half-way and its journal was " \
               "replayed, the apply had not happened (host as before)" in report["message"]
        assert {h for h, e in report["hosts"].items() if e["result"] == "rolled back"} == \
            HOSTS - {"h3"}
        assert applied_states() == history  # the interrupted apply left no entry
    assert dumps(lab) == before  # every host as before, read back with iproute2

    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh") == 0
    applied = dumps(lab)
    assert applied != before
    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh") == 0  # converged
    assert dumps(lab) == applied


def _session_env(lab, host: str, name: str) -> str | None:
    """$name in a new SSH session on `host` (None while sshd does not answer)."""
    c = paramiko.SSHClient()
    c.load_host_keys(str(lab.known_hosts))
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        c.connect(lab.mgmt_ip(host), key_filename=str(lab.ssh_key), username="root",
                  timeout=5, allow_agent=False, look_for_keys=False)
        _, out, _ = c.exec_command(f"printenv {name}", timeout=10)
        return out.read().decode().strip()
    except (paramiko.SSHException, OSError):
        return None
    finally:
        c.close()


def _reload_sshd(lab, host: str, env: str = "") -> None:
    """Add `env` (NAME=VALUE, or nothing) to `host`'s sshd_config SetEnv line and make sshd
    re-read it (SIGHUP: it re-executes itself); returns once a new session has it."""
    conf = lab.state_dir / "ssh" / f"sshd_config.{host}"
    lines = conf.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("SetEnv "))
    lines[i] = f"SetEnv TOPOCTL_LAB={lab.name} TOPOCTL_HOST={host}" + (f" {env}" if env else "")
    conf.write_text("\n".join(lines) + "\n")
    os.kill(sshd_pids(lab.state_dir)[host], signal.SIGHUP)
    name, _, value = (env or "TOPO_AGENT_CRASH_AFTER=").partition("=")
    end = time.monotonic() + 30
    while _session_env(lab, host, name) != value:
        assert time.monotonic() < end, f"{host}'s sshd did not take {env or 'the old env'}"
        time.sleep(0.2)


def test_an_agent_killed_over_ssh_is_named_with_its_signal(lab, capsys):
    """h1's agent SIGKILLs itself after its 3rd operation (the agent's test-only crash switch,
    set through h1's sshd): the transport's wrapper reports the signal, which paramiko would
    drop, topoctl recovers h1 from its journal and rolls the 3 others back."""
    before = dumps(lab)
    _reload_sshd(lab, "h1", "TOPO_AGENT_CRASH_AFTER=3")
    try:
        assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh", "--json") == 3
    finally:
        _reload_sshd(lab, "h1")
    report = json.loads(capsys.readouterr().out)
    print(report["message"])
    h1 = [e for e in report["events"] if e["host"] == "h1"]
    assert [(e["phase"], e["result"]) for e in h1] == [
        ("prepare", "changes"), ("apply", "killed"), ("recover", "recovered")]
    assert h1[1]["detail"] == ["agent killed (signal 9, SIGKILL) during apply; run "
                               "`topo-agent recover` or re-apply"]  # nothing after it
    assert "recovered h1 from its journal" in report["message"]
    assert {h for h, e in report["hosts"].items() if e["result"] == "rolled back"} == \
        HOSTS - {"h1"}
    assert dumps(lab) == before
    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh") == 0
    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh") == 0


@pytest.mark.serial
def test_a_host_cut_off_by_its_own_apply_is_reported_within_seconds(lab):
    """h2's state sends the controller's address into table 100, whose route leads out of a
    fabric port where nobody answers: applied with --force-mgmt (the path check off), the apply
    cuts h2 off and its reply never comes. SSH keepalives report h2 unreachable seconds after
    the cut (not at the 60 s command timeout), every other host is rolled back, and h2's
    watchdog reverts it at its deadline."""
    before = dumps(lab)
    plan = yaml.safe_load(PLAN.read_text())
    controller = lab.layout.gateway
    state = plan["hosts"]["h2"]
    state["rules"] = [*state.get("rules", []),
                      {"priority": 1500, "to": f"{controller}/32", "table": 100}]
    state["routes"].append({"dst": f"{controller}/32", "table": 100, "dev": "eth0"})
    ns = lab.netns("h2")
    marks: dict[str, float] = {}
    stop = threading.Event()

    def watch_cut() -> None:  # when the rule appears in the kernel, h2 is cut off
        while not stop.is_set() and "cut" not in marks:
            if any(r.get("priority") == 1500 for r in ip_json(ns, "-4", "rule", "show")):
                marks["cut"] = time.monotonic()
            time.sleep(0.02)

    def progress(e: twophase.Event) -> None:
        if e.host == "h2" and e.phase == "apply":
            marks["reported"] = time.monotonic()

    watcher = threading.Thread(target=watch_cut)
    watcher.start()
    transport = lab_ssh_transport(lab)
    t0 = time.monotonic()
    try:
        report = twophase.apply_plan(plan, transport, progress=progress,
                                     confirm_within=CONFIRM_S, force_mgmt=True, timeout=60)
    finally:
        stop.set()
        watcher.join()
        transport.close()
    took = time.monotonic() - t0
    final = report.final()
    assert report.exit_code == 3, report.message
    assert final["h2"].phase == "apply" and final["h2"].result == "unreachable", final["h2"]
    assert "no answer from its sshd for 6 s (3 keepalives 2 s apart)" in final["h2"].detail[0]
    assert (f"h2 unreachable: its agent reverts by itself {CONFIRM_S} s after its apply"
            in report.message)
    assert {h for h, e in final.items() if e.result == "rolled back"} == HOSTS - {"h2"}
    delay = marks["reported"] - marks["cut"]
    print(f"h2 cut off -> reported unreachable: {delay:.1f} s (whole apply {took:.1f} s)")
    assert delay < 12, delay  # interval 2 s x 3, plus the probe in flight
    record = lab.state_dir / "agent" / "h2" / "confirm.json"
    end = time.monotonic() + 40
    while json.loads(record.read_text())["state"] != "reverted" and time.monotonic() < end:
        time.sleep(0.2)
    assert json.loads(record.read_text())["state"] == "reverted"
    assert dumps(lab) == before
