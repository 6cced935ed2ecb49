"""Roll a plan out to every host, transactionally: prepare everywhere, then apply, or nothing.

1. prepare: every host's agent validates its state against the host and diffs (`diff -`), all
   hosts in parallel. One error anywhere (bad state, missing link, unreachable host) and the
   rollout stops there: no host has been touched.
2. apply: hosts with changes apply in parallel; each agent is itself transactional (a failing
   host reverts itself). If any host fails, every host that did change is rolled back to its
   previous state (`rollback`), and the report names each host and its cause.
   A host whose SSH session dropped under its apply (no exit status) may have applied or not:
   over a new connection topoctl waits for its agent to finish (`recover --wait`, which also
   replays the journal of an agent that died), then diffs it against the plan: a host that did
   apply is rolled back with the others, one that did not is as before.

Report exit codes: the detailed outcome (topoagent.protocol; the CLI turns EXIT_CHANGES into
exit 0 unless --detailed-exitcode): apply 0 every host in sync, 2 changed (or pending with
--dry-run), 1 prepare failed (no host touched), a rollback failed or a host's state is unknown
(unreachable during its apply without --confirm-within, or a dropped session that could not be
checked), 3 partial: the apply failed on some hosts and every host that had changed was rolled
back (with `keep_going`: kept in the new state); status 0 in sync, 2 drifted, 1 a host could
not be checked; rollback 2 rolled back, 0 nothing to roll back on any host, 1 a host failed.
The agents are called with --detailed-exitcode (`transports.agent_argv`): their exit code 2 is
"changed" (or "changes pending"), 0 "nothing to do".

`status` (in sync / drifted / unreachable) and `rollback` use the same machinery. Progress goes
to a callback, one event per host and phase; the CLI prints it as lines and a summary table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from topoagent.protocol import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, EXIT_PARTIAL, exit_status
from topoagent.state.host import StateError, load_yaml_file
from topoctl.render.validate import validate_plan
from topoctl.rollout.transports import UNREACHABLE, AgentReply, Transport


@dataclass
class Event:
    """One host's result in one phase (prepare, apply, rollback, status), with the operations or
    errors."""

    host: str
    phase: str  # prepare | apply | rollback | status
    # in sync | changes | changed | drifted | error | unreachable | killed | dropped |
    # rolled back | confirmed | recovered | nothing to recover | applied | not applied
    result: str
    detail: list[str] = field(default_factory=list)  # operations, or error lines
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """The event as JSON-ready data."""
        return {"host": self.host, "phase": self.phase, "result": self.result,
                "detail": self.detail, "seconds": round(self.seconds, 3)}


@dataclass
class Report:
    """The outcome of a rollout command: exit code, every host's events and a summary message.
    `exit_code` is the detailed outcome (EXIT_CHANGES: changes made, pending or drift); the
    process exits with `exit_status(detailed)`."""

    command: str
    exit_code: int
    events: list[Event]
    message: str = ""

    def final(self) -> dict[str, Event]:
        """The last event of each host."""
        out: dict[str, Event] = {}
        for e in self.events:
            out[e.host] = e
        return out

    @property
    def changed(self) -> bool:
        """Changes were made (apply, rollback, stop), are pending (diff, --dry-run) or a host
        drifted (status)."""
        return self.exit_code == EXIT_CHANGES

    def exit_status(self, detailed: bool = True) -> int:
        """The process's exit code: EXIT_CHANGES only when `detailed` (--detailed-exitcode)."""
        return exit_status(self.exit_code, detailed)

    def to_dict(self, detailed: bool = True) -> dict:
        """The report as the `--json` document: exit code (the process's: 2 only when
        `detailed`), whether anything changed, message, each host's final event, all events."""
        return {"command": self.command, "exit_code": self.exit_status(detailed),
                "changed": self.changed, "message": self.message,
                "hosts": {h: e.to_dict() for h, e in sorted(self.final().items())},
                "events": [e.to_dict() for e in self.events]}


Progress = Callable[[Event], None]


def load_plan(path: str | Path) -> dict:
    """Read and validate a plan; StateError lists every problem by YAML path."""
    doc = load_yaml_file(path)
    problems = validate_plan(doc)
    if problems:
        raise StateError(problems, source=str(path))
    return doc


def host_texts(plan: dict, only: list[str] | None = None) -> dict[str, str]:
    """Each host's HostState as YAML text (only the hosts in `only`); StateError for an unknown
    host."""
    hosts = plan["hosts"]
    if only:
        missing = [h for h in only if h not in hosts]
        if missing:
            raise StateError([("--hosts", f"not in the plan: {', '.join(missing)}")])
    return {h: yaml.safe_dump(hosts[h], sort_keys=False) for h in (only or sorted(hosts))}


def _parallel(fn: Callable[[str], Event], hosts: list[str], progress: Progress,
              workers: int = 32) -> dict[str, Event]:
    out: dict[str, Event] = {}
    if not hosts:
        return out
    with ThreadPoolExecutor(max(1, min(workers, len(hosts)))) as ex:
        for ev in ex.map(fn, hosts):
            out[ev.host] = ev
            progress(ev)
    return out


FAILED = ("error", "unreachable", "killed", "dropped")


def _parallel_many(fn: Callable[[str], list[Event]], hosts: list[str], progress: Progress,
                   skip_first: bool = False, workers: int = 32) -> dict[str, list[Event]]:
    """`_parallel` for steps of several events per host; with `skip_first`, the first event of
    a multi-event run was already reported by `fn` itself."""
    out: dict[str, list[Event]] = {}
    if not hosts:
        return out
    with ThreadPoolExecutor(max(1, min(workers, len(hosts)))) as ex:
        for evs in ex.map(fn, hosts):
            out[evs[0].host] = evs
            for e in evs[1:] if skip_first and len(evs) > 1 else evs:
                progress(e)
    return out


def _event(reply: AgentReply, phase: str, seconds: float, ok_result: str,
           change_result: str) -> Event:
    if reply.killed:  # no answer of its own: say what happened, and what is left to do
        last = (reply.err or "").strip().splitlines()[-1:]
        return Event(reply.host, phase, "killed",
                     [f"agent killed ({reply.killed}) during {phase}; run `topo-agent recover` "
                      "or re-apply", *last], seconds)
    if reply.dropped:  # no exit status: the agent may have finished, or still be running
        return Event(reply.host, phase, "dropped", [f"{reply.dropped} during {phase}"], seconds)
    doc = reply.json()
    ops = [op["what"] for op in doc.get("operations", [])]
    if reply.rc == EXIT_OK:
        return Event(reply.host, phase, ok_result, ops, seconds)
    if reply.rc == EXIT_CHANGES and doc.get("ok"):  # --detailed-exitcode: changed / pending
        return Event(reply.host, phase, change_result, ops, seconds)
    if reply.rc == UNREACHABLE:
        return Event(reply.host, phase, "unreachable", [doc["error"]], seconds)
    problems = [f"{p['path']}: {p['message']}" if p.get("path") else p["message"]
                for p in doc.get("problems", [])] or [doc.get("error", f"exit {reply.rc}")]
    return Event(reply.host, phase, "error", problems, seconds)


def _call(transport: Transport, host: str, args: list[str], stdin: str | None, phase: str,
          ok: str, change: str, timeout: float) -> Event:
    t0 = time.perf_counter()
    reply = transport.agent(host, args, stdin, timeout=timeout)
    return _event(reply, phase, time.perf_counter() - t0, ok, change)


def apply_plan(plan: dict, transport: Transport, *, dry_run: bool = False,
               force_mgmt: bool = False, probe: bool = True, only: list[str] | None = None,
               progress: Progress = lambda e: None, timeout: float = 120.0,
               confirm_within: float | None = None, keep_going: bool = False) -> Report:
    """Prepare every host, then apply; with `confirm_within` (seconds) each agent applies with
    --confirm-within and reverts by itself unless confirmed, and every changed host whose
    management path still carries a probe of real size afterwards is confirmed
    (`_Apply.confirm_probed`; a host the apply cut off or starved goes back on its own).
    With `keep_going`, when the apply fails on some hosts the hosts that did apply keep the
    new state instead of being rolled back (each failed host reverts itself, as always)."""
    run = _Apply(transport, host_texts(plan, only), ["--force-mgmt"] if force_mgmt else [],
                 progress, timeout, confirm_within)
    prep = run.prepare()
    bad = sorted(h for h, e in prep.items() if e.result in FAILED)
    if bad:
        return Report("apply", EXIT_ERROR, run.events,
                      f"prepare failed on {', '.join(bad)} ({_causes(prep, bad)}): "
                      "no host was changed")
    todo = sorted(h for h, e in prep.items() if e.result == "changes")
    if dry_run or not todo:
        return Report("apply", EXIT_CHANGES if todo else EXIT_OK, run.events,
                      f"{len(todo)} of {len(run.texts)} hosts need changes" if todo
                      else "every host is in sync")
    outcome = run.apply(todo, probe)
    failed = sorted(h for h, e in outcome.items() if e.result in FAILED)
    if not failed:
        return Report("apply", EXIT_CHANGES, run.events, f"applied on {len(todo)} hosts")
    after = run.clean_up(outcome, failed, keep_going)
    return Report("apply", after.exit_code(), run.events, after.message())


@dataclass
class _Apply:
    """One `apply_plan`: each host's state text, the agent flags every call carries and how
    to reach the agents. Its steps append their events to `events` in the order they happen
    (the report lists them so)."""

    transport: Transport
    texts: dict[str, str]  # host -> its HostState as YAML
    flags: list[str]
    progress: Progress
    timeout: float
    confirm_within: float | None
    events: list[Event] = field(default_factory=list)

    def call(self, host: str, args: list[str], stdin: str | None, phase: str, ok: str,
             change: str, timeout: float | None = None) -> Event:
        """One agent call on `host` as an event (`_call`; the run's timeout unless given)."""
        return _call(self.transport, host, args, stdin, phase, ok, change,
                     self.timeout if timeout is None else timeout)

    def prepare(self) -> dict[str, Event]:
        """Phase 1: every host diffs its state (changes nothing); host -> its event."""
        prep = _parallel(lambda h: self.call(h, [*self.flags, "diff", "-"], self.texts[h],
                                              "prepare", "in sync", "changes"),
                         list(self.texts), self.progress)
        self.events += prep.values()
        return prep

    def apply(self, todo: list[str], probe: bool) -> dict[str, Event]:
        """Phase 2: the hosts in `todo` apply (and confirm, with `confirm_within`); host ->
        its last event."""
        confirm = (["--confirm-within", f"{self.confirm_within:g}"] if self.confirm_within
                   else [])
        args = [*self.flags, "apply", *([] if probe else ["--no-probe"]), *confirm, "-"]

        def apply_one(h: str) -> list[Event]:
            ev = self.call(h, args, self.texts[h], "apply", "in sync", "changed")
            if not self.confirm_within or ev.result != "changed":
                return [ev]
            self.progress(ev)  # before the confirmation: the operator sees the apply at once
            # a probe of real size crosses the host's path after its change: keep the change
            # there; a host the change cut off or starved is not confirmed and reverts itself
            return [ev, self.confirm_probed(h)]

        runs = _parallel_many(apply_one, todo, self.progress,
                              skip_first=bool(self.confirm_within))
        self.events += [e for evs in runs.values() for e in evs]
        return {h: evs[-1] for h, evs in runs.items()}

    def confirm_probed(self, host: str) -> Event:
        """Confirm `host`'s apply through a probe of its management path: `confirm-probe`
        sends half a megabyte here, `confirm --probe -` takes it back, and the agent keeps the
        apply only when it came back whole within the probe's deadline (a path shaped to
        1 kbit/s still carries a bare `confirm`)."""
        timeout = min(self.timeout, self.confirm_within or self.timeout)
        t0 = time.perf_counter()
        reply = self.transport.agent(host, ["confirm-probe"], None, timeout=timeout)
        payload = reply.json().get("payload") if reply.rc == EXIT_OK else None
        if isinstance(payload, str):
            reply = self.transport.agent(host, ["confirm", "--probe", "-"], payload,
                                         timeout=timeout)
        return _event(reply, "confirm", time.perf_counter() - t0, "confirmed", "confirmed")

    def clean_up(self, outcome: dict[str, Event], failed: list[str],
                 keep_going: bool) -> _Failure:
        """After the apply failed on `failed`: settle the hosts whose session dropped, roll
        back every host that changed (not with `keep_going`) and recover the hosts whose
        agent was killed; what is left is the returned `_Failure`."""
        changed = sorted(h for h, e in outcome.items() if e.result in ("changed", "confirmed"))
        # sessions that dropped under the apply (or its confirmation): find out, over a new
        # connection, whether the host applied; one that did is rolled back with the others
        dropped = sorted(h for h in failed if outcome[h].result == "dropped")
        settled = _parallel_many(
            lambda h: _settle(self.transport, h, self.texts[h], self.flags, self.timeout),
            dropped, self.progress)
        self.events += [e for evs in settled.values() for e in evs]
        changed = sorted(changed + [h for h, evs in settled.items()
                                    if evs[-1].result == "applied"])
        back = {} if keep_going else _parallel(
            lambda h: self.call(h, [*self.flags, "rollback", "--no-probe"], None, "rollback",
                                 "rolled back", "rolled back"), changed, self.progress)
        self.events += back.values()
        # an agent killed mid-apply left its journal: recover that host now (any agent start
        # would), so it is as before and the report says so
        killed = sorted(h for h in failed if outcome[h].result == "killed")
        rec = _parallel(lambda h: self.call(h, ["recover"], None, "recover", "recovered",
                                             "recovered"), killed, self.progress)
        self.events += rec.values()
        return _Failure(outcome, failed, settled, changed, back, rec, keep_going,
                        self.confirm_within)


@dataclass
class _Failure:
    """An apply that failed on some hosts, after `_Apply.clean_up`: each host's last apply
    event (`outcome`), the failed hosts, the dropped sessions' settling, the hosts that had
    changed, and the rollback and recovery events."""

    outcome: dict[str, Event]
    failed: list[str]
    settled: dict[str, list[Event]]
    changed: list[str]
    back: dict[str, Event]
    rec: dict[str, Event]
    keep_going: bool
    confirm_within: float | None

    def _failed_as(self, result: str) -> list[str]:
        return [h for h in self.failed if self.outcome[h].result == result]

    def _not(self, events: dict[str, Event], result: str) -> list[str]:
        return sorted(h for h, e in events.items() if e.result != result)

    def _unsettled(self) -> list[str]:
        return sorted(h for h, evs in self.settled.items()
                      if evs[-1].result not in ("applied", "not applied"))

    def exit_code(self) -> int:
        """EXIT_ERROR when a host may be left changed or unknown (a rollback or recovery
        failed, a dropped session could not be settled, an unreachable host has no deadline
        to revert by itself), else EXIT_PARTIAL: the failed hosts reverted themselves and
        every other changed host was rolled back (or, with `keep_going`, kept the new
        state)."""
        lost = self._failed_as("unreachable")
        if (self._not(self.back, "rolled back") or self._not(self.rec, "recovered")
                or self._unsettled() or (lost and not self.confirm_within)):
            return EXIT_ERROR
        return EXIT_PARTIAL

    def message(self) -> str:
        """The report's message: what failed, what was done about it, then what is left for
        the operator (upper case), as clauses joined by "; "."""
        failed = self.failed
        parts = [f"apply failed on {', '.join(failed)} ({_causes(self.outcome, failed)})"]
        parts += [f"{h} over a new connection: {_settled_text(evs)}"
                  for h, evs in self.settled.items()]
        unrecovered = self._not(self.rec, "recovered")
        ok = [h for h in sorted(self._failed_as("killed")) if h not in unrecovered]
        if ok:
            parts.append(f"recovered {', '.join(ok)} from its journal (host as before)")
        changed = ", ".join(self.changed)
        if not changed:
            parts.append("no other host had changed")
        elif self.keep_going:
            parts.append(f"kept the new state on {changed} (--keep-going)")
        else:
            parts.append(f"rolled back {changed}")
        parts += self._left_behind(unrecovered)
        return "; ".join(parts)

    def _left_behind(self, unrecovered: list[str]) -> list[str]:
        """The clauses of hosts the operator must look at (or that revert by themselves)."""
        parts = []
        lost = self._failed_as("unreachable")
        if self.confirm_within and lost:
            whose = ("its agent reverts by itself" if len(lost) == 1
                     else "their agents revert by themselves")
            parts.append(f"{', '.join(lost)} unreachable: {whose} "
                         f"{self.confirm_within:g} s after its apply unless confirmed")
        elif lost:  # nothing will revert it: it may be left changed
            parts.append(f"STATE UNKNOWN on {', '.join(lost)}: unreachable during its apply, "
                         "which may have happened (no --confirm-within to revert it by itself)")
        if unrecovered:
            parts.append(f"RECOVERY FAILED on {', '.join(unrecovered)}: run `topo-agent "
                         "recover` there or re-apply")
        unrolled = self._not(self.back, "rolled back")
        if unrolled:  # hosts left changed: an error the operator must look at
            parts.append(f"ROLLBACK FAILED on {', '.join(unrolled)}")
        unsettled = self._unsettled()
        if unsettled:
            parts.append(f"STATE UNKNOWN on {', '.join(unsettled)}: check it with `topoctl "
                         "status` (an unconfirmed apply reverts by itself at its deadline)")
        return parts


def _settle(transport: Transport, host: str, text: str, flags: list[str],
            timeout: float) -> list[Event]:
    """What became of an apply whose SSH session dropped: wait for the host's agent to end
    (replaying its journal if it died half-way), then diff against the plan. The last event is
    `applied` (in sync: the apply went through), `not applied` (the host is as before: the
    agent is transactional) or a failure (unreachable, error)."""
    # half the call timeout: the answer must come back before the call itself times out
    rec = _call(transport, host, ["recover", "--wait", f"{timeout / 2:g}"], None, "recover",
                "nothing to recover", "recovered", timeout)
    if rec.result in FAILED:
        return [rec]
    return [rec, _call(transport, host, [*flags, "diff", "-"], text, "check", "applied",
                       "not applied", timeout)]


def _settled_text(evs: list[Event]) -> str:
    rec, last = evs[0], evs[-1]
    died = ("its agent had died half-way and its journal was replayed, "
            if rec.result == "recovered" else "")
    if last.result == "applied":
        return died + "the apply had completed (host in sync with the plan), rolled back"
    if last.result == "not applied":
        return died + "the apply had not happened (host as before)"
    return f"{last.phase} {last.result}: {' / '.join(last.detail)}"


def _causes(events: dict[str, Event], hosts: list[str]) -> str:
    return "; ".join(f"{h}: {' / '.join(events[h].detail) or events[h].result}" for h in hosts)


def status(plan: dict, transport: Transport, *, only: list[str] | None = None,
           progress: Progress = lambda e: None, timeout: float = 60.0) -> Report:
    """Diff every host against the plan; Report exit 0 in sync, 2 drifted, 1 a host could not be
    checked."""
    texts = host_texts(plan, only)
    st = _parallel(lambda h: _call(transport, h, ["diff", "-"], texts[h], "status", "in sync",
                                   "drifted", timeout), list(texts), progress)
    events = list(st.values())
    results = {e.result for e in events}
    if results & set(FAILED):
        return Report("status", EXIT_ERROR, events, "some hosts could not be checked")
    if "drifted" in results:
        return Report("status", EXIT_CHANGES, events,
                      f"{sum(e.result == 'drifted' for e in events)} hosts drifted")
    return Report("status", EXIT_OK, events, "every host is in sync")


def rollback(plan: dict, transport: Transport, *, only: list[str] | None = None,
             progress: Progress = lambda e: None, timeout: float = 120.0) -> Report:
    """Roll every host back to its previously applied state; Report exit 2 rolled back, 0 nothing to
    roll back, 1 a host failed."""
    hosts = list(host_texts(plan, only))
    back = _parallel(lambda h: _call(transport, h, ["rollback", "--no-probe"], None, "rollback",
                                     "in sync", "rolled back", timeout), hosts, progress)
    events = list(back.values())
    bad = sorted(e.host for e in events if e.result in FAILED)
    if bad:
        return Report("rollback", EXIT_ERROR, events, f"rollback failed on {', '.join(bad)}")
    back_n = sum(e.result == "rolled back" for e in events)
    if not back_n:  # every agent said there was nothing to roll back (or nothing changed)
        return Report("rollback", EXIT_OK, events,
                      "nothing to roll back: no host had an earlier applied state to return to")
    return Report("rollback", EXIT_CHANGES, events, f"rolled back {back_n} of {len(hosts)} hosts")
