"""Run the playbooks in playbooks/ through ansible-runner, as one more way to roll a plan out.

`run_playbook` runs one playbook with a private data directory under the controller's state
directory (artifacts of the last `ROTATE` runs kept), feeds every host's task results to the
same progress callback as the SSH transport (twophase.Event), and turns the run's stats into a
twophase.Report (per host: ok / changed / failed / unreachable). apply.yml's confirmation
(the probe of each host's management path) carries its payload in two `no_log` tasks; the
`confirm` event comes from the facts the task after them sets (`_confirmation`).

ansible-runner fails quietly in three known ways; each is turned into an AnsibleRunError here:
- an event_handler that does not return True makes runner drop the event, so the run ends with
  no events and no stats (it looks like "nothing happened");
- a --limit that matches no host: ansible-playbook runs nothing, no host events;
- no ansible-playbook binary: runner starts nothing and writes no `rc` artifact.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from topoagent.protocol import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, TopoError
from topoctl.rollout.twophase import Event, Progress, Report

PLAYBOOKS = Path(__file__).resolve().parents[3] / "playbooks"  # the repository's playbooks/
ROTATE = 10  # artifact directories kept per private data dir

# task name in apply.yml -> (phase, result when the agent exits 0, result when it exits 2)
AGENT_TASKS = {
    "Prepare (diff against the host)": ("prepare", "in sync", "changes"),
    "Apply": ("apply", "in sync", "changed"),
    "Roll back the changed hosts when any host failed": ("rollback", "in sync", "rolled back"),
}


# apply.yml's tasks that only restate (as a failure) what an agent task already reported
REPORT_TASKS = {"Stop unless every host prepared", "Report the failed apply",
                "Report the failed confirmation", "Report the rollback"}

# apply.yml's confirmation: the probe's two steps carry its payload (no_log: their results are
# censored); the task after them says, as facts, what became of the confirmation
PROBE_TASKS = {"Probe the management path", "Confirm with the probe sent back"}
CONFIRMATION_TASK = "Note the confirmation"


class AnsibleRunError(TopoError):
    """ansible-runner could not run the playbook, or ran it without a trace of any host."""


def find_ansible_playbook() -> str:
    """ansible-playbook on PATH, else next to this Python (a venv that is not activated)."""
    found = shutil.which("ansible-playbook")
    if found:
        return found
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.exists():
        return str(beside)
    raise AnsibleRunError("ansible-playbook not found on PATH nor next to "
                          f"{sys.executable}: pip install 'topoctl[ansible]'")


def _agent_doc(res: dict) -> dict:
    try:
        doc = json.loads(res.get("stdout") or "")
        return doc if isinstance(doc, dict) else {}
    except ValueError:
        return {}


def event_of(ev: dict) -> Event | None:
    """The twophase.Event for one ansible-runner host event, or None (not a host result)."""
    kind = ev.get("event", "")
    data = ev.get("event_data") or {}
    host, task, res = data.get("host"), data.get("task", ""), data.get("res") or {}
    if not host or kind not in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
        return None
    seconds = float(data.get("duration") or 0.0)
    if task == CONFIRMATION_TASK:
        return _confirmation(host, res, seconds)
    if kind == "runner_on_unreachable":
        phase = "confirm" if task in PROBE_TASKS else AGENT_TASKS.get(task, ("prepare",))[0]
        return Event(host, phase, "unreachable", [str(res.get("msg", "unreachable")).strip()],
                     seconds)
    if task in PROBE_TASKS:
        return None  # censored; CONFIRMATION_TASK reports the outcome
    doc = _agent_doc(res)
    if task in AGENT_TASKS:
        phase, ok, change = AGENT_TASKS[task]
        rc = res.get("rc")
        if kind == "runner_on_ok" and rc in (0, 2):
            ops = [op["what"] for op in doc.get("operations", [])]
            return Event(host, phase, change if rc == 2 else ok, ops, seconds)
        if kind == "runner_on_ok" and rc is None:
            return None  # skipped through `when` (reported as ok without a result)
        problems = [f"{p['path']}: {p['message']}" if p.get("path") else p["message"]
                    for p in doc.get("problems", [])]
        return Event(host, phase, "error", problems or [
            doc.get("error") or (res.get("stderr") or res.get("msg") or f"exit {rc}").strip()],
            seconds)
    if task in REPORT_TASKS:
        return None  # the hosts' own agent events already say it
    if kind == "runner_on_failed" and not data.get("ignore_errors"):
        return Event(host, "prepare", "error", [str(res.get("msg", "failed")).strip()], seconds)
    return None


def _confirmation(host: str, res: dict, seconds: float) -> Event | None:
    """The confirm event from apply.yml's facts `topo_confirmation` (none / confirmed / error /
    unreachable) and `topo_confirmation_detail`; None when the host had nothing to confirm."""
    facts = res.get("ansible_facts") or {}
    result = str(facts.get("topo_confirmation", "none")).strip()
    if result == "none":
        return None
    detail = str(facts.get("topo_confirmation_detail") or "").strip()
    return Event(host, "confirm", result, [detail] if detail else [], seconds)


def run_playbook(playbook: str, inventory: str | Path, *, private_data_dir: Path,
                 extravars: dict | None = None, limit: list[str] | None = None,
                 check: bool = False, tags: list[str] | None = None,
                 progress: Progress = lambda e: None, bin_dir: str | Path | None = None,
                 keep_event: Callable[[dict], bool] = lambda ev: True,
                 command: str = "ansible") -> Report:
    """Run playbooks/<playbook> on the inventory's hosts; a Report with one final event per
    host. `keep_event` decides which events runner keeps (it must say True for the stats to
    exist: one returning False is exactly the first pitfall above, reported as an error)."""
    import ansible_runner  # optional dependency: topoctl[ansible]

    # runner runs `ansible-playbook` from PATH (an explicit binary would switch it to raw
    # mode, without the playbook): put the one found first on PATH
    bin_dir = Path(bin_dir) if bin_dir else Path(find_ansible_playbook()).parent
    private_data_dir.mkdir(parents=True, exist_ok=True)
    # runner writes extravars/cmdline into env/ and reads them back on the next run when the
    # new ones are empty: a stale variable would leak into this run
    shutil.rmtree(private_data_dir / "env", ignore_errors=True)
    events: list[Event] = []
    seen = {"host_events": 0}

    def handler(ev: dict) -> bool:
        if ev.get("event_data", {}).get("host"):  # any per-host event, agent task or not
            seen["host_events"] += 1
        e = event_of(ev)
        if e is not None:
            events.append(e)
            progress(e)
        return bool(keep_event(ev))

    cmdline = " ".join(["--check --diff" if check else "",
                        f"--tags {','.join(tags)}" if tags else ""]).strip()
    t0 = time.perf_counter()
    r = ansible_runner.run(
        private_data_dir=str(private_data_dir), project_dir=str(PLAYBOOKS),
        playbook=str(PLAYBOOKS / playbook), inventory=str(inventory),
        extravars=extravars or {}, limit=",".join(limit) if limit else None,
        cmdline=cmdline or None, event_handler=handler, quiet=True,
        rotate_artifacts=ROTATE, envvars={
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            # runner turns host-key checking off unless told: keep ssh's strict checking
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_PIPELINING": "True", "ANSIBLE_FORKS": "16",
            "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
            "ANSIBLE_ROLES_PATH": str(PLAYBOOKS / "roles")})
    seconds = time.perf_counter() - t0
    artifacts = Path(r.config.artifact_dir)
    if not (artifacts / "rc").exists():
        raise AnsibleRunError(f"ansible-runner wrote no rc artifact in {artifacts} (status "
                              f"{r.status}): ansible-playbook (looked in {bin_dir} and PATH) "
                              f"did not run; see {artifacts / 'stdout'}")
    stats = r.stats or {}
    processed = set(stats.get("processed", {}))
    if not processed:
        if seen["host_events"]:  # hosts ran, yet runner kept nothing
            raise AnsibleRunError(
                f"ansible-runner kept no stats ({r.status}, rc {r.rc}) although hosts ran: "
                f"events were dropped (an event_handler must return True); {artifacts}")
        if r.rc == 127:  # the shell's "command not found": runner wrote rc, nothing ran
            raise AnsibleRunError(f"ansible-playbook (looked in {bin_dir} and PATH) did not "
                                  f"run: not found or not executable (rc 127); see "
                                  f"{artifacts / 'stdout'}")
        if limit:
            raise AnsibleRunError(f"--limit {','.join(limit)} matched no host of the "
                                  f"inventory {inventory}: nothing ran ({_tail(artifacts)})")
        raise AnsibleRunError(f"ansible-playbook failed before any host ran (rc {r.rc}): "
                              f"{_tail(artifacts)}")
    return _report(command, r.rc, stats, events, processed, seconds, artifacts)


def _tail(artifacts: Path, lines: int = 3) -> str:
    try:
        text = (artifacts / "stdout").read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"see {artifacts}"
    return " / ".join(line.strip() for line in text[-lines:] if line.strip())


def _report(command: str, rc: int, stats: dict, events: list[Event], processed: set[str],
            seconds: float, artifacts: Path) -> Report:
    failed = sorted(set(stats.get("failures", {})) | set(stats.get("dark", {})))
    changed = sorted(h for h, n in stats.get("changed", {}).items() if n)
    have = {e.host for e in events}
    for h in sorted(processed - have):  # hosts without an agent task (site.yml, facts.yml)
        result = ("unreachable" if h in stats.get("dark", {}) else "error" if h in failed
                  else "changed" if h in changed else "in sync")
        events.append(Event(h, "ansible", result, [], seconds))
    if failed or rc != 0:
        causes = "; ".join(f"{e.host}: {' / '.join(e.detail) or e.result}"
                           for e in Report(command, 1, events).final().values()
                           if e.result in ("error", "unreachable"))
        return Report(command, EXIT_ERROR, events,
                      f"failed on {', '.join(failed) or '(no host: see ' + str(artifacts) + ')'}"
                      f" ({causes or _tail(artifacts)}); artifacts {artifacts}")
    if changed:
        return Report(command, EXIT_CHANGES, events,
                      f"{len(changed)} of {len(processed)} hosts changed")
    return Report(command, EXIT_OK, events, f"every host is in sync ({len(processed)} hosts)")


def default_data_dir(state_root: Path | None, name: str) -> Path:
    """<state root>/ansible/<name>: $TOPOCTL_STATE_DIR or /var/lib/topoctl by default."""
    root = state_root or Path(os.environ.get("TOPOCTL_STATE_DIR", "/var/lib/topoctl"))
    return root / "ansible" / name
