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

Exit codes (topoagent.protocol): apply 0 every host in sync, 2 changed (or pending with
--dry-run), 1 prepare failed (no host touched), a rollback failed or a host's state is unknown
(unreachable during its apply without --confirm-within, or a dropped session that could not be
checked), 3 partial: the apply failed on some hosts and every host that had changed was rolled
back (with `keep_going`: kept in the new state); status 0 in sync, 2 drifted, 1 a host could
not be checked; rollback 2 rolled back, 0 nothing to roll back on any host, 1 a host failed.

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

from topoagent.protocol import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, EXIT_PARTIAL
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
    """The outcome of a rollout command: exit code, every host's events and a summary message."""

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

    def to_dict(self) -> dict:
        """The report as the `--json` document: exit code, message, each host's final event, all
        events."""
        return {"command": self.command, "exit_code": self.exit_code, "message": self.message,
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
    if reply.rc == 0:
        return Event(reply.host, phase, ok_result, ops, seconds)
    if reply.rc == 2:
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
    --confirm-within and reverts by itself unless confirmed, and every changed host that is
    still reachable afterwards is confirmed (a host the apply cut off goes back on its own).
    With `keep_going`, when the apply fails on some hosts the hosts that did apply keep the
    new state instead of being rolled back (each failed host reverts itself, as always)."""
    texts = host_texts(plan, only)
    flags = ["--force-mgmt"] if force_mgmt else []
    events: list[Event] = []

    prep = _parallel(lambda h: _call(transport, h, [*flags, "diff", "-"], texts[h], "prepare",
                                     "in sync", "changes", timeout),
                     list(texts), progress)
    events += prep.values()
    bad = sorted(h for h, e in prep.items() if e.result in FAILED)
    if bad:
        return Report("apply", EXIT_ERROR, events,
                      f"prepare failed on {', '.join(bad)} ({_causes(prep, bad)}): "
                      "no host was changed")
    todo = sorted(h for h, e in prep.items() if e.result == "changes")
    if dry_run or not todo:
        return Report("apply", EXIT_CHANGES if todo else EXIT_OK, events,
                      f"{len(todo)} of {len(texts)} hosts need changes" if todo
                      else "every host is in sync")

    confirm = ["--confirm-within", f"{confirm_within:g}"] if confirm_within else []
    apply_args = [*flags, "apply", *([] if probe else ["--no-probe"]), *confirm, "-"]

    def apply_one(h: str) -> list[Event]:
        ev = _call(transport, h, apply_args, texts[h], "apply", "in sync", "changed", timeout)
        if not confirm_within or ev.result != "changed":
            return [ev]
        progress(ev)  # before the confirmation: the operator sees the apply at once
        # a fresh command reaches the host after its change: keep the change there; a host
        # the change cut off is not confirmed and its agent reverts by itself
        return [ev, _call(transport, h, ["confirm"], None, "confirm", "confirmed", "confirmed",
                          min(timeout, confirm_within))]

    runs = _parallel_many(apply_one, todo, progress, skip_first=bool(confirm_within))
    events += [e for evs in runs.values() for e in evs]
    outcome = {h: evs[-1] for h, evs in runs.items()}
    failed = sorted(h for h, e in outcome.items() if e.result in FAILED)
    changed = sorted(h for h, e in outcome.items() if e.result in ("changed", "confirmed"))
    if not failed:
        return Report("apply", EXIT_CHANGES, events, f"applied on {len(todo)} hosts")

    # sessions that dropped under the apply (or its confirmation): find out, over a new
    # connection, whether the host applied; one that did is rolled back with the others
    dropped = sorted(h for h in failed if outcome[h].result == "dropped")
    settled = _parallel_many(lambda h: _settle(transport, h, texts[h], flags, timeout),
                             dropped, progress)
    events += [e for evs in settled.values() for e in evs]
    changed = sorted(changed + [h for h, evs in settled.items() if evs[-1].result == "applied"])

    back = {} if keep_going else _parallel(
        lambda h: _call(transport, h, [*flags, "rollback", "--no-probe"], None, "rollback",
                        "rolled back", "rolled back", timeout), changed, progress)
    events += back.values()
    # an agent killed mid-apply left its journal: recover that host now (any agent start
    # would), so it is as before and the report says so
    killed = sorted(h for h in failed if outcome[h].result == "killed")
    rec = _parallel(lambda h: _call(transport, h, ["recover"], None, "recover", "recovered",
                                    "recovered", timeout), killed, progress)
    events += rec.values()
    unrolled = sorted(h for h, e in back.items() if e.result != "rolled back")
    unrecovered = sorted(h for h, e in rec.items() if e.result != "recovered")
    msg = f"apply failed on {', '.join(failed)} ({_causes(outcome, failed)}); "
    for h, evs in settled.items():
        msg += f"{h} over a new connection: {_settled_text(evs)}; "
    if killed:
        ok = [h for h in killed if h not in unrecovered]
        if ok:
            msg += f"recovered {', '.join(ok)} from its journal (host as before); "
    if keep_going:
        msg += (f"kept the new state on {', '.join(changed)} (--keep-going)" if changed
                else "no other host had changed")
    else:
        msg += (f"rolled back {', '.join(changed)}" if changed else "no other host had changed")
    lost = sorted(h for h in failed if outcome[h].result == "unreachable")
    if confirm_within and lost:
        whose = ("its agent reverts by itself" if len(lost) == 1
                 else "their agents revert by themselves")
        msg += (f"; {', '.join(lost)} unreachable: {whose} "
                f"{confirm_within:g} s after its apply unless confirmed")
    elif lost:  # nothing will revert it: it may be left changed
        msg += (f"; STATE UNKNOWN on {', '.join(lost)}: unreachable during its apply, which "
                "may have happened (no --confirm-within to revert it by itself)")
    if unrecovered:
        msg += (f"; RECOVERY FAILED on {', '.join(unrecovered)}: run `topo-agent recover` "
                "there or re-apply")
    if unrolled:  # hosts left changed: an error the operator must look at
        msg += f"; ROLLBACK FAILED on {', '.join(unrolled)}"
    unsettled = sorted(h for h, evs in settled.items()
                       if evs[-1].result not in ("applied", "not applied"))
    if unsettled:
        msg += (f"; STATE UNKNOWN on {', '.join(unsettled)}: check it with `topoctl status` "
                "(an unconfirmed apply reverts by itself at its deadline)")
    if unrolled or unrecovered or unsettled or (lost and not confirm_within):
        return Report("apply", EXIT_ERROR, events, msg)
    # partial: some hosts failed (each reverted itself), every other changed host rolled back
    # (or, with keep_going, left in the new state)
    return Report("apply", EXIT_PARTIAL, events, msg)


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
