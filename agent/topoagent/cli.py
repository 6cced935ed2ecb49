"""`topo-agent`: show, diff, apply and roll back one host's network state.

Exit codes (topoagent.protocol, README "Exit codes"): 0 = success (changes made or not), 1 =
error (bad input or usage, refused, failed; the host is unchanged), 70 = a bug (traceback), 130
= interrupted. With --detailed-exitcode (diff, apply, rollback, stop, watch, recover): 0 =
nothing to do / in sync, 2 = changes needed (diff, --dry-run, watch: drift) or made (apply,
rollback, stop, recover, watch --repair). The verbs below return the detailed outcome
(EXIT_CHANGES for changes); `cliutil.run_verb` turns it into the exit code. Human output by
default, --json for programs (one JSON document on stdout, errors included)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import re
import sys
import time
from pathlib import Path

import yaml

from topoagent import __version__
from topoagent.apply import confirm as confirming
from topoagent.apply import journal
from topoagent.apply.journal import Recovery
from topoagent.apply.mgmt import MGMT_FLOOR, Mgmt, resolve
from topoagent.apply.probe import (
    MAX_PROBE_BYTES,
    MAX_PROBE_WITHIN_S,
    MIN_PROBE_BYTES,
    PROBE_BYTES,
    PROBE_WITHIN_S,
    read_probe,
)
from topoagent.apply.store import DEFAULT_KEEP, Store, StoreBusy
from topoagent.apply.transaction import Result, apply_state, plan, rollback
from topoagent.apply.watch import watch
from topoagent.cliutil import (
    ArgumentParser,
    add_detailed_exitcode,
    add_global_options,
    add_json,
    parse_command_line,
    run_verb,
)
from topoagent.observe.host import observe, to_host_state
from topoagent.observe.ovs import show_ovs
from topoagent.process.launch import launch, stop
from topoagent.protocol import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    STOP_BY_OPERATOR,
    TopoError,
)
from topoagent.state.host import HostState, StateError, load_yaml, parse_host_state, read_text
from topoagent.state.values import format_rate, parse_rate
from topoagent.state.wire import load_launch_spec
from topoagent.target import Target


def _read_state(path: str, allow_empty: bool = False) -> HostState:
    """The desired state from a file or stdin. An empty document (0 bytes, `null`, `{}`) would
    remove everything the agent made: an error unless --allow-empty says that is the intent (a
    document that lists a section, even `routes: []`, says what it wants)."""
    source = "<stdin>" if path == "-" else path
    data = load_yaml(read_text(path), source)
    if data in (None, {}) and not allow_empty:
        raise StateError([("", f"{source}: empty state: it would remove every route, rule, "
                           f"address and QoS tree the agent made; pass --allow-empty if that "
                           f"is the intent")])
    try:
        return parse_host_state(data)
    except StateError as e:
        raise e.at(source) from None


@contextlib.contextmanager
def _naming(path: str):
    """Checks of the state against the host (a missing link, a foreign object in the way)
    name the state file too, as schema errors do."""
    try:
        yield
    except StateError as e:
        raise e.at("<stdin>" if path == "-" else path) from None


def _mgmt(args) -> Mgmt | None:
    """The management connection to protect: --mgmt, else the SSH session we run in."""
    if args.force_mgmt:
        return None
    mgmt = Mgmt.parse(args.mgmt) if args.mgmt else Mgmt.from_env()
    return dataclasses.replace(mgmt, floor=args.mgmt_floor) if mgmt else None


def _watch(args, mgmt: Mgmt | None) -> list[tuple[str, str | None]]:
    """Addresses whose path must not change: the management client (from the server address
    it connected to) and every --mgmt-probe; nothing with --force-mgmt."""
    if args.force_mgmt:
        return []
    out: list[tuple[str, str | None]] = [(mgmt.client, mgmt.server)] if mgmt else []
    return out + [(ip, None) for ip in resolve(args.mgmt_probe or [])]


def _emit_ops(args, verb: str, result: Result) -> int:
    code = EXIT_CHANGES if result.ops else EXIT_OK
    if args.json:
        print(json.dumps({
            "ok": True, "changes": len(result.ops), "dry_run": result.dry_run,
            "operations": [op.to_dict() for op in result.ops],
            "probes": result.probes, "seconds": round(result.seconds, 4),
            **({"confirm": result.confirm} if result.confirm else {}),
        }))
        return code
    if not result.ops:
        print("nothing to do")
        return code
    for op in result.ops:
        print(f"  {op.describe()}")
    print(f"{len(result.ops)} {verb} in {result.seconds:.3f}s")
    if result.confirm:
        print(f"run `topo-agent confirm` within {result.confirm['seconds']:g} s to keep it, "
              "or it is reverted")
    return code


def cmd_show(args, target: Target) -> int:
    """Print the observed state as HostState YAML (--ovs: only the agent's OVS state); exit 0."""
    obs = observe(target)
    if getattr(args, "ovs", False):  # the agent's Open vSwitch state alone
        rep = show_ovs(obs.ovs) or {"db": target.ovs_db, "error": "no ovsdb-server answers"}
        print(json.dumps(rep) if args.json else yaml.safe_dump(rep, sort_keys=False), end="")
        return EXIT_OK
    state = to_host_state(obs)
    print(json.dumps(state.to_dict()) if args.json else state.to_yaml(), end="\n" * args.json)
    if obs.ovs is not None and not args.json:  # as comments: the output stays a HostState
        text = yaml.safe_dump({"ovs_observed": show_ovs(obs.ovs)}, sort_keys=False)
        print("".join(f"# {line}\n" for line in text.splitlines()), end="")
    return EXIT_OK


def cmd_diff(args, target: Target) -> int:
    """Print the operations that would take the host to FILE; EXIT_CHANGES when there are some
    (exit 2 with --detailed-exitcode, else 0)."""
    desired = _read_state(args.file, args.allow_empty)
    t0 = time.perf_counter()
    with _naming(args.file):
        _, ops = plan(target, desired, mgmt=_mgmt(args))
    return _emit_ops(args, "changes needed", Result(ops, time.perf_counter() - t0, dry_run=True))


def _store(args, target: Target) -> Store:
    return Store(target.store_dir, keep=args.keep_history, target=target)


def recover_at_start(args, target: Target) -> Recovery | None:
    """An apply killed mid-way left a journal: put the host back before doing anything else.
    Skipped while another agent holds the lock (its journal is live, not abandoned)."""
    rec = None
    if journal.pending(target.store_dir):
        try:
            store = _store(args, target)
            with store.lock():
                rec = journal.recover(target, store)
        except StoreBusy:
            return None
        if rec is not None:
            print(f"topo-agent: {rec.describe()}", file=sys.stderr)
    gone = confirming.expired_orphan(target, _store(args, target))
    if gone is not None:
        print(f"topo-agent: reverted an unconfirmed apply: {gone['reason']}", file=sys.stderr)
        rec = rec or Recovery(gone["armed"], 0, [])
    return rec


def cmd_recover(args, target: Target) -> int:
    """Undo an apply that was killed half-way; EXIT_CHANGES undone (exit 2 with
    --detailed-exitcode), EXIT_OK nothing to recover, EXIT_ERROR problems left. With --wait,
    first wait for a running apply to end (its journal is live until then): what a controller
    whose session dropped mid-apply asks over a new connection."""
    if args.wait:
        _store(args, target).wait_idle(args.wait)
    rec = recover_at_start(args, target)
    if args.json:
        print(json.dumps({"ok": rec is None or not rec.problems, "recovered": rec is not None,
                          "undone": rec.undone if rec else 0,
                          "problems": rec.problems if rec else []}))
    elif rec is None:
        print("nothing to recover")
    if rec is not None and rec.problems:
        return EXIT_ERROR
    return EXIT_CHANGES if rec is not None and rec.undone else EXIT_OK


def _agent_args(args, target: Target) -> list[str]:
    """The global options that reach this same target (for the confirmation watchdog)."""
    out = ["--state-dir", str(Path(target.store_dir).resolve()),
           "--keep-history", str(args.keep_history)]
    if args.netns:
        out += ["--netns", args.netns]
    if args.ovsdb:
        out += ["--ovsdb", args.ovsdb]
    return out


def cmd_apply(args, target: Target) -> int:
    """Apply FILE transactionally (--dry-run: only print); EXIT_CHANGES when changes were made
    or are pending (exit 2 with --detailed-exitcode, else 0), EXIT_OK nothing to do."""
    desired = _read_state(args.file, args.allow_empty)
    store = _store(args, target)
    mgmt = _mgmt(args)
    armed = None
    with contextlib.nullcontext() if args.dry_run else store.lock():
        if not args.dry_run:
            confirming.refuse_if_pending(store.root)
        with _naming(args.file):
            result = apply_state(target, desired, dry_run=args.dry_run,
                                 probe=not args.no_probe, store=store, mgmt=mgmt,
                                 watch=_watch(args, mgmt))
        if not args.dry_run and result.ops and args.confirm_within:
            armed = confirming.arm(store, args.confirm_within)
            try:  # under the lock: a `confirm` cannot come between the record and its pid
                armed = confirming.spawn_watchdog(store.root, armed, _agent_args(args, target))
            except OSError as e:  # no watchdog, no apply: revert now
                confirming.revert(target, store, armed, f"cannot start the watchdog: {e}")
                raise confirming.ConfirmError(f"cannot start the confirmation watchdog: {e}; "
                                              "the apply was reverted") from None
        elif not args.dry_run:
            confirming.clear(store.root)
    if armed is not None:
        result.confirm = {"deadline": armed["deadline"], "seconds": armed["seconds"],
                          "token": armed["token"]}
    return _emit_ops(args, "changes needed" if args.dry_run else "changes made", result)


def cmd_confirm(args, target: Target) -> int:
    """`topo-agent confirm --probe FILE`: keep the pending apply (its watchdog stands down)
    when the probe came back whole and in time; exit 0."""
    proof = read_probe(args.probe) if args.probe else None
    doc = confirming.confirm(target, _store(args, target), proof, unprobed=args.no_probe)
    probe = doc.get("probe") if "seconds" in doc.get("probe", {}) else None
    if args.json:
        print(json.dumps({"ok": True, "confirmed": True, "armed": doc["armed"],
                          **({"probe": {k: probe[k] for k in ("bytes", "seconds")}}
                             if probe else {})}))
    else:
        seen = (f" (probe: {probe['bytes']} bytes each way in {probe['seconds']:.2f} s)"
                if probe else "")
        print(f"confirmed: the apply stays{seen}")
    return EXIT_OK


def cmd_confirm_probe(args, target: Target) -> int:
    """`topo-agent confirm-probe`: print a fresh probe payload for `confirm --probe`; exit 0."""
    payload = confirming.issue_probe(target, _store(args, target), args.bytes, args.within)
    if args.json:
        print(json.dumps({"ok": True, "bytes": len(payload), "within": args.within,
                          "payload": payload}))
    else:
        print(payload)
    return EXIT_OK


def cmd_confirm_watchdog(args, target: Target) -> int:
    """The detached watchdog of `apply --confirm-within`: reverts unless confirmed in time."""
    return confirming.watchdog(target, _store(args, target), args.token)


def cmd_rollback(args, target: Target) -> int:
    """Re-apply the state before the newest and drop the newest; EXIT_CHANGES rolled back (exit
    2 with --detailed-exitcode, else 0), EXIT_OK nothing to roll back."""
    store = _store(args, target)
    with contextlib.nullcontext() if args.dry_run else store.lock():
        result = rollback(target, store, dry_run=args.dry_run, probe=not args.no_probe,
                          mgmt=_mgmt(args))
        if result is None:  # nothing to do is success (protocol: EXIT_OK), said plainly
            msg = f"nothing to roll back: no earlier applied state in {store.dir}"
            print(json.dumps({"ok": True, "changes": 0, "dry_run": args.dry_run,
                              "operations": [], "message": msg}) if args.json else msg)
            return EXIT_OK
        if not args.dry_run:
            confirming.end_by_rollback(store.root)
    return _emit_ops(args, "changes needed" if args.dry_run else "changes made", result)


def cmd_launch(args, target: Target) -> int:
    """Run this host's ranks of the job spec, supervised; the launcher's exit code."""
    job = load_launch_spec(args.file)  # JSON is YAML too
    return launch(job, args.host, target, target.store_dir / "run", args.timeout)


def cmd_stop(args, target: Target) -> int:
    """Stop the ranks of a running launch; EXIT_CHANGES when some were stopped (exit 2 with
    --detailed-exitcode, else 0), EXIT_OK when none ran."""
    n = stop(target.store_dir / "run", args.reason)
    print(json.dumps({"ok": True, "stopped": n}) if args.json else f"stopped {n} ranks")
    return EXIT_CHANGES if n else EXIT_OK


def cmd_watch(args, target: Target) -> int:
    """Run the reconcile loop (--once: one round); EXIT_OK in sync, EXIT_CHANGES drifted or
    repaired (exit 2 with --detailed-exitcode, else 0), EXIT_ERROR error."""
    rnd = watch(target, interval=args.interval, repair=args.repair, once=args.once,
                status_file=args.status_file, mgmt=_mgmt(args), keep=args.keep_history)
    if args.json:
        print(json.dumps({"ok": rnd.status != "error", "status": rnd.status,
                          "drift": rnd.drift, "repaired": rnd.repaired, "error": rnd.error}))
    else:
        print(rnd.status + (f": {rnd.error}" if rnd.error else ""))
        for what in rnd.repaired or rnd.drift:
            print(f"  {what}")
    return rnd.exit_code


def _rate(text: str) -> int:
    try:
        return parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?")


def _number(text: str) -> float:
    """A plain decimal number of a flag (-1 when it is not one: never NaN, inf, `1_000`,
    hexadecimal or padded text, which Python's int() and float() would take)."""
    return float(text) if _DECIMAL.fullmatch(text) else -1.0


def _probe_bytes(text: str) -> int:
    v = int(text) if text.isascii() and text.isdigit() and len(text) < 12 else -1
    if not MIN_PROBE_BYTES <= v <= MAX_PROBE_BYTES:
        raise argparse.ArgumentTypeError(f"expected bytes in [{MIN_PROBE_BYTES}, "
                                         f"{MAX_PROBE_BYTES}], got {text!r}")
    return v


def _probe_within(text: str) -> float:
    v = _seconds(text)
    if v > MAX_PROBE_WITHIN_S:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, {MAX_PROBE_WITHIN_S:g}], "
                                         f"got {text!r}")
    return v


def _seconds(text: str) -> float:
    """Seconds in (0, 86400]: every duration flag of the agent (checked while parsing, so a
    negative, zero, NaN or infinite value is a usage error, exit 1, before anything runs)."""
    v = _number(text)
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 86400], got {text!r}")
    return v


def _run_seconds(text: str) -> float:
    """launch --timeout: seconds in (0, 10^7] (a training run may take days)."""
    v = _number(text)
    if not 0 < v <= 1e7:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 10000000], got {text!r}")
    return v


def _keep(text: str) -> int:
    """--keep-history: a whole number of applied states, at least 2 (rollback needs the one
    before the newest), at most 9999 (history entries are numbered with four digits)."""
    v = int(text) if text.isascii() and text.isdigit() and len(text) < 6 else -1
    if not 2 <= v <= 9999:
        raise argparse.ArgumentTypeError(f"expected a whole number in [2, 9999], got {text!r}")
    return v


DESCRIPTION = ("make this host's network match its part of a topoctl plan (routes, rules, "
               "addresses, QoS, Open vSwitch), transactionally, and run its training ranks")
EXIT_CODES = ("exit codes: 0 success, 1 error (bad input or usage), 70 a bug, 130 interrupted; "
              "with --detailed-exitcode: 0 nothing to do / in sync, 2 changes made or pending")


def _verb(sub, name: str, help: str | None, example: str, *, json: bool = True,
          detailed: bool = False) -> argparse.ArgumentParser:
    """A verb's parser: its help (None: hidden from the verb list), one example, --json and,
    for a verb that changes or compares state, --detailed-exitcode."""
    kw = {"help": help} if help is not None else {}
    p = sub.add_parser(name, description=help, epilog=f"example: {example}", **kw)
    if json:
        add_json(p)
    if detailed:
        add_detailed_exitcode(p)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The topo-agent argument parser with every verb."""
    p = ArgumentParser(prog="topo-agent", description=DESCRIPTION, epilog=EXIT_CODES)
    add_global_options(p, __version__)
    p.add_argument("--netns", help="act inside this network namespace")
    p.add_argument("--state-dir", type=Path,
                   help="where applied states are kept (default /var/lib/topo-agent/<target>)")
    p.add_argument("--ovsdb", metavar="REMOTE", help="ovsdb-server of this host (default "
                   "$TOPO_OVSDB, else unix:/run/openvswitch/db.sock)")
    p.add_argument("--mgmt", metavar="CLIENT_IP,SERVER_IP",
                   help="management connection to protect (default: from SSH_CONNECTION)")
    p.add_argument("--mgmt-probe", action="append", metavar="ADDR",
                   help="an address (or DNS name) whose route must be the same after an apply "
                        "as before (repeatable: gateway, controller, ...)")
    p.add_argument("--force-mgmt", action="store_true",
                   help="allow changes to the interface, address or route of the management "
                        "connection")
    p.add_argument("--mgmt-floor", type=_rate, default=MGMT_FLOOR, metavar="RATE",
                   help="refuse a QoS class that holds the management peer below RATE "
                        f"(default {format_rate(MGMT_FLOOR)})")
    p.add_argument("--keep-history", type=_keep, default=DEFAULT_KEEP, metavar="N",
                   help=f"applied states kept for rollback (default {DEFAULT_KEEP}, min 2)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sh = _verb(sub, "show", "print the observed state as HostState YAML (the agent's Open "
               "vSwitch state follows as comments)", "topo-agent show > observed.yaml")
    sh.add_argument("--ovs", action="store_true", help="print only the agent's OVS state: "
                    "bridges, queues, flows, groups, and the queueing mechanism per port")
    sh.set_defaults(func=cmd_show)
    d = _verb(sub, "diff", "print the operations that would reach FILE",
              "topo-agent diff --detailed-exitcode host.yaml", detailed=True)
    d.add_argument("file", help="HostState YAML, or - for stdin")
    d.add_argument("--allow-empty", action="store_true",
                   help="accept an empty state (removes everything the agent made)")
    d.set_defaults(func=cmd_diff)
    a = _verb(sub, "apply", "make the host match FILE (transactional)",
              "topo-agent apply --confirm-within 60 host.yaml", detailed=True)
    a.add_argument("file", help="HostState YAML, or - for stdin")
    a.add_argument("--allow-empty", action="store_true",
                   help="accept an empty state (removes everything the agent made)")
    a.add_argument("--dry-run", action="store_true", help="print the operations, change nothing")
    a.add_argument("--no-probe", action="store_true", help="skip next-hop reachability probes")
    a.add_argument("--confirm-within", type=_seconds, metavar="SECONDS",
                   help="revert by itself (a detached watchdog) unless `topo-agent confirm` "
                        "comes within SECONDS (like netplan try)")
    a.set_defaults(func=cmd_apply)
    c = _verb(sub, "confirm", "keep an apply made with --confirm-within, given the probe of "
              "the management path back", "ssh HOST topo-agent confirm-probe | ssh HOST "
              "topo-agent confirm --probe -")
    c.add_argument("--probe", metavar="FILE", help="what `confirm-probe` printed (- for "
                   "stdin), sent back over the same path")
    c.add_argument("--no-probe", action="store_true",
                   help="keep the apply without a probe (an operator at the host's console)")
    c.set_defaults(func=cmd_confirm)
    cp = _verb(sub, "confirm-probe", "print a probe payload to send back with `confirm "
               "--probe`", "topo-agent confirm-probe")
    cp.add_argument("--bytes", type=_probe_bytes, default=PROBE_BYTES,
                    help=f"payload size (default {PROBE_BYTES}, at least {MIN_PROBE_BYTES})")
    cp.add_argument("--within", type=_probe_within, default=PROBE_WITHIN_S, metavar="SECONDS",
                    help="seconds to have it back in (default %(default)g)")
    cp.set_defaults(func=cmd_confirm_probe)
    # internal: started by `apply --confirm-within`, not for users (hidden from the verb list)
    cw = _verb(sub, "confirm-watchdog", None, "(started by apply --confirm-within)", json=False)
    cw.add_argument("token")
    cw.set_defaults(func=cmd_confirm_watchdog)
    r = _verb(sub, "rollback", "return to the previously applied state",
              "topo-agent rollback --dry-run", detailed=True)
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--no-probe", action="store_true")
    r.set_defaults(func=cmd_rollback)
    la = _verb(sub, "launch", "run this host's ranks of a job spec, supervised",
               "topo-agent launch --host h0 job.json", json=False)
    la.add_argument("file", help="job spec (JSON or YAML), or - for stdin")
    la.add_argument("--host", required=True, help="this host's name in job.processes")
    la.add_argument("--timeout", type=_run_seconds, help="stop every rank after this many seconds")
    la.set_defaults(func=cmd_launch)
    w = _verb(sub, "watch", "reconcile loop: report (and --repair) drift from the last applied "
              "state", "topo-agent watch --once --detailed-exitcode", detailed=True)
    w.add_argument("--interval", type=_seconds, default=30.0, help="seconds between rounds")
    w.add_argument("--repair", action="store_true", help="re-apply the last applied state "
                   "when the host drifted")
    w.add_argument("--once", action="store_true", help="one round; exit 0 unless an error "
                   "(1); with --detailed-exitcode 0 in sync or idle, 2 drifted or repaired")
    w.add_argument("--status-file", type=Path,
                   help="JSON status written every round (default <state dir>/watch.json)")
    w.set_defaults(func=cmd_watch)
    st = _verb(sub, "stop", "stop the ranks of a running launch", "topo-agent stop",
               detailed=True)
    st.add_argument("--reason", default=STOP_BY_OPERATOR,
                    help="why, as the launch reports it in its `stopped` event (default "
                         f"{STOP_BY_OPERATOR}: topoctl run then reports the job stopped, exit 130)")
    st.set_defaults(func=cmd_stop)
    rc = _verb(sub, "recover", "undo an apply that was killed half-way (every start does this "
               "first)", "topo-agent recover --wait 30", detailed=True)
    rc.add_argument("--wait", type=_seconds, metavar="SECONDS",
                    help="first wait up to SECONDS for a running apply or rollback to end")
    rc.set_defaults(func=cmd_recover)
    return p


READ_ONLY = ("show", "diff")


def main(argv: list[str] | None = None) -> int:
    """Run one verb; every exception is mapped to an exit code here (topoagent.cliutil)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_command_line(build_parser(), argv)

    only = os.environ.get("TOPO_AGENT_CRASH_TARGET")  # test-only (topoagent.apply.journal)
    if only is not None and only != (args.netns or ""):
        os.environ.pop("TOPO_AGENT_CRASH_AFTER", None)

    def verb() -> int:
        target = Target(netns=args.netns, state_dir=args.state_dir, ovsdb=args.ovsdb)
        target.check()
        if args.command in READ_ONLY:  # they read the kernel alone: a damaged state
            try:                          # directory is worth a warning, not a refusal
                recover_at_start(args, target)
            except TopoError as e:
                print(f"topo-agent: warning: {e}", file=sys.stderr)
        elif args.command not in ("recover", "confirm-watchdog"):
            recover_at_start(args, target)
        return args.func(args, target)
    return run_verb("topo-agent", args, verb)


if __name__ == "__main__":
    # every module is loaded: what they hold (pydantic's schemas above all) lives as long as
    # the process, so the collector need not walk it again, in the verb or at exit; a
    # `diff` or `apply` costs 0.03 s of CPU less (of 0.21 s, every agent call pays it)
    gc.freeze()
    sys.exit(main())
