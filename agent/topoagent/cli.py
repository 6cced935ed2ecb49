"""`topo-agent`: show, diff, apply and roll back one host's network state.

Exit codes (diff, apply, rollback): 0 = nothing to do, 2 = changes needed (diff) or made
(apply, rollback), 1 = error, and the host is unchanged. Human output by default, --json for
programs (one JSON document on stdout)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from topoagent.apply import ApplyError, Result, apply_state, plan
from topoagent.mgmt import Mgmt
from topoagent.observe import observe, to_host_state
from topoagent.state import (
    HostState,
    StateError,
    load_host_state,
    load_yaml,
    load_yaml_file,
    parse_host_state,
)
from topoagent.store import Store, StoreBusy
from topoagent.target import Target, TargetError

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


def _read_state(path: str) -> HostState:
    if path == "-":
        return load_host_state(sys.stdin.read(), "<stdin>")
    return parse_host_state(load_yaml_file(path))


def _mgmt(args) -> Mgmt | None:
    """The management connection to protect: --mgmt, else the SSH session we run in."""
    if args.force_mgmt:
        return None
    return Mgmt.parse(args.mgmt) if args.mgmt else Mgmt.from_env()


def _emit_ops(args, verb: str, result: Result) -> int:
    code = EXIT_CHANGES if result.ops else EXIT_OK
    if args.json:
        print(json.dumps({
            "ok": True, "changes": len(result.ops), "dry_run": result.dry_run,
            "operations": [op.to_dict() for op in result.ops],
            "probes": result.probes, "seconds": round(result.seconds, 4),
        }))
        return code
    if not result.ops:
        print("nothing to do")
        return code
    for op in result.ops:
        print(f"  {op.describe()}")
    print(f"{len(result.ops)} {verb} in {result.seconds:.3f}s")
    return code


def cmd_show(args, target: Target) -> int:
    state = to_host_state(observe(target))
    print(json.dumps(state.to_dict()) if args.json else state.to_yaml(), end="\n" * args.json)
    return EXIT_OK


def cmd_diff(args, target: Target) -> int:
    desired = _read_state(args.file)
    t0 = time.perf_counter()
    _, ops = plan(target, desired, mgmt=_mgmt(args))
    return _emit_ops(args, "changes needed", Result(ops, time.perf_counter() - t0, dry_run=True))


def cmd_apply(args, target: Target) -> int:
    desired = _read_state(args.file)
    store = Store(target.store_dir)
    with contextlib.nullcontext() if args.dry_run else store.lock():
        result = apply_state(target, desired, dry_run=args.dry_run, probe=not args.no_probe,
                             store=store, mgmt=_mgmt(args))
    return _emit_ops(args, "changes needed" if args.dry_run else "changes made", result)


def cmd_rollback(args, target: Target) -> int:
    store = Store(target.store_dir)
    with contextlib.nullcontext() if args.dry_run else store.lock():
        previous = store.previous()
        if previous is None:
            raise TargetError(f"nothing to roll back: no applied state in {store.dir}")
        result = apply_state(target, previous, dry_run=args.dry_run, probe=not args.no_probe,
                             mgmt=_mgmt(args))
        if not args.dry_run:
            store.pop()
    return _emit_ops(args, "changes needed" if args.dry_run else "changes made", result)


def cmd_launch(args, target: Target) -> int:
    from topoagent.launch import LaunchError, launch

    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    job = load_yaml(text, args.file)  # JSON is YAML too
    if not isinstance(job, dict) or "command" not in job:
        raise StateError([("job", "expected a job spec with command and processes")])
    try:
        return launch(job, args.host, target, target.store_dir / "run", args.timeout)
    except LaunchError as e:
        raise TargetError(str(e)) from None


def cmd_stop(args, target: Target) -> int:
    from topoagent.launch import stop

    n = stop(target.store_dir / "run")
    print(json.dumps({"ok": True, "stopped": n}) if args.json else f"stopped {n} ranks")
    return EXIT_CHANGES if n else EXIT_OK


def cmd_watch(args, target: Target) -> int:
    from topoagent.watch import watch

    rnd = watch(target, interval=args.interval, repair=args.repair, once=args.once,
                status_file=args.status_file, mgmt=_mgmt(args))
    if args.json:
        print(json.dumps({"ok": rnd.status != "error", "status": rnd.status,
                          "drift": rnd.drift, "repaired": rnd.repaired, "error": rnd.error}))
    else:
        print(rnd.status + (f": {rnd.error}" if rnd.error else ""))
        for what in rnd.repaired or rnd.drift:
            print(f"  {what}")
    return rnd.exit_code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topo-agent", description=__doc__.split("\n")[0])
    p.add_argument("--netns", help="act inside this network namespace")
    p.add_argument("--state-dir", type=Path,
                   help="where applied states are kept (default /var/lib/topo-agent/<target>)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--mgmt", metavar="CLIENT_IP,SERVER_IP",
                   help="management connection to protect (default: from SSH_CONNECTION)")
    p.add_argument("--force-mgmt", action="store_true",
                   help="allow changes to the interface, address or route of the management "
                        "connection")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("show", help="print the observed state as HostState YAML").set_defaults(
        func=cmd_show)
    d = sub.add_parser("diff", help="print the operations that would reach FILE")
    d.add_argument("file", help="HostState YAML, or - for stdin")
    d.set_defaults(func=cmd_diff)
    a = sub.add_parser("apply", help="make the host match FILE (transactional)")
    a.add_argument("file", help="HostState YAML, or - for stdin")
    a.add_argument("--dry-run", action="store_true", help="print the operations, change nothing")
    a.add_argument("--no-probe", action="store_true", help="skip next-hop reachability probes")
    a.set_defaults(func=cmd_apply)
    r = sub.add_parser("rollback", help="return to the previously applied state")
    r.add_argument("--dry-run", action="store_true")
    r.add_argument("--no-probe", action="store_true")
    r.set_defaults(func=cmd_rollback)
    la = sub.add_parser("launch", help="run this host's ranks of a job spec, supervised")
    la.add_argument("file", help="job spec (JSON or YAML), or - for stdin")
    la.add_argument("--host", required=True, help="this host's name in job.processes")
    la.add_argument("--timeout", type=float, help="stop every rank after this many seconds")
    la.set_defaults(func=cmd_launch)
    w = sub.add_parser("watch", help="reconcile loop: report (and --repair) drift from the "
                       "last applied state")
    w.add_argument("--interval", type=float, default=30.0, help="seconds between rounds")
    w.add_argument("--repair", action="store_true", help="re-apply the last applied state "
                   "when the host drifted")
    w.add_argument("--once", action="store_true", help="one round; exit 0 in sync or idle, "
                   "2 drifted or repaired, 1 error")
    w.add_argument("--status-file", type=Path,
                   help="JSON status written every round (default <state dir>/watch.json)")
    w.set_defaults(func=cmd_watch)
    sub.add_parser("stop", help="stop the ranks of a running launch").set_defaults(
        func=cmd_stop)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target = Target(netns=args.netns, state_dir=args.state_dir)
    try:
        target.check()
        return args.func(args, target)
    except (StateError, ApplyError, TargetError, StoreBusy) as e:
        problems = getattr(e, "problems", None) or [("", str(e))]
        if args.json:
            print(json.dumps({"ok": False, "error": str(e),
                              "reverted": getattr(e, "reverted", None),
                              "problems": [{"path": p, "message": m} for p, m in problems]}))
        else:
            for path, msg in problems:
                print(f"error: {path}: {msg}" if path else f"error: {msg}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
