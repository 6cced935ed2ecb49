"""`topoctl run PLAN` (train under the plan, supervised) and `topoctl stop PLAN`.

SIGTERM and SIGHUP end `run` as Ctrl-C does (exit 130): every launcher ends with the
transport, and no launcher or rank is left behind (`rollout.run`). A `topoctl stop` from
elsewhere ends it the same way: "stopped", exit 130 (interrupted), not a training failure."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator

from topoagent.cliutil import add_detailed_exitcode, positive_int, positive_seconds
from topoagent.protocol import EXIT_CHANGES, EXIT_ERROR, EXIT_OK
from topoctl.cli.apply import add_transport_args, open_plan
from topoctl.cli.run_heal import cmd_run_heal
from topoctl.rollout.heal import CHECKPOINT_EVERY, MAX_HEALS
from topoctl.rollout.run import (
    allreduce_summary,
    predicted_buckets,
    rank_user,
    run_job,
    stop_job,
)


@contextlib.contextmanager
def interrupted_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread while inside (the run
    then ends every launcher and exits 130, as with Ctrl-C); elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def warn_root(plan: dict, args: argparse.Namespace) -> None:
    """Say so when the ranks will run as root (only ever by the operator's --user root)."""
    if rank_user(plan, args.user) == "root":
        print("topoctl: warning: the ranks run as root on every host (--user root)",
              file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    """`topoctl run`: launch the plan's job on every host and supervise it (with --heal: heal
    around failed cables)."""
    plan, transport = open_plan(args)
    warn_root(plan, args)
    if args.heal:
        with interrupted_by_signals():
            return cmd_run_heal(args, plan, transport)
    quiet = args.json
    try:
        with interrupted_by_signals():
            result = run_job(plan, transport, iterations=args.iterations,
                             out=(lambda s: None) if quiet else print, verbose=args.verbose,
                             timeout=args.timeout, user=args.user, live=not quiet)
    finally:
        transport.close()
    if args.json:
        print(json.dumps(result.to_dict()))
        return result.exit_code
    if result.stopped:
        print(f"training {result.failure}")
        return result.exit_code
    if result.exit_code:
        print("training failed:\n  " + result.failure.replace("\n", "\n  "))
        return result.exit_code
    if result.iteration_time is None:  # a script that reports nothing: its exit status
        print(f"{len(result.ranks)} ranks ended with exit status 0 in {result.seconds:.1f} s "
              "(they reported no iterations: docs/own-script.md)")
        return EXIT_OK
    predicted = (plan.get("metadata", {}).get("prediction") or {}).get("iteration_time")
    same = ("yes" if result.synchronous else "NO") if result.checksums_reported else \
        "not reported"
    print(f"{len(result.ranks)} ranks, {args.iterations} iterations in {result.seconds:.1f} s; "
          f"median iteration {result.iteration_time:.3f} s"
          + (f" (predicted {predicted:.3f} s)" if isinstance(predicted, (int, float)) else "")
          + f"; parameters identical on every rank: {same}")
    if result.allreduce_seconds:
        print(allreduce_summary(result.allreduce_seconds, predicted_buckets(plan)))
    return EXIT_OK if result.synchronous or not result.checksums_reported else EXIT_ERROR


def cmd_stop(args: argparse.Namespace) -> int:
    """`topoctl stop`: stop the plan's training processes; EXIT_CHANGES stopped some (exit 2
    with --detailed-exitcode, else 0), EXIT_OK none ran, EXIT_ERROR a host failed. The agents
    answer with --detailed-exitcode (`transports.agent_argv`): 2 stopped, 0 none ran."""
    plan, transport = open_plan(args)
    try:
        codes = stop_job(plan, transport)
    finally:
        transport.close()
    said = {EXIT_CHANGES: "stopped", EXIT_OK: "nothing running"}
    print(json.dumps(codes) if args.json else
          "\n".join(f"{h}: {said.get(rc, 'error')}" for h, rc in codes.items()))
    if any(rc not in (EXIT_OK, EXIT_CHANGES) for rc in codes.values()):
        return EXIT_ERROR
    return EXIT_CHANGES if EXIT_CHANGES in codes.values() else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl run` and `topoctl stop` to the topoctl parser."""
    p = sub.add_parser("run", help="train under the plan on every host, supervised",
                       description="train under the plan on every host, supervised",
                       epilog="example: topoctl run plan.yaml --lab demo --iterations 20")
    add_transport_args(p)
    p.add_argument("--iterations", type=positive_int, default=10)
    p.add_argument("--timeout", type=positive_seconds,
                   help="stop every rank after this many seconds")
    p.add_argument("--verbose", action="store_true", help="print every rank's events")
    p.add_argument("--user", metavar="NAME",
                   help="run the ranks as this user on every host (default: the plan's "
                        "job.user, else the agents' unprivileged default, nobody); root only "
                        "when named here")
    p.add_argument("--heal", action="store_true",
                   help="when a cable fails: re-plan without it, apply, resume from the last "
                        "checkpoint (needs --job; the cluster from --cluster or the lab)")
    p.add_argument("--job", help="(--heal) the job file the plan was made from")
    p.add_argument("--checkpoint-every", type=positive_int, default=CHECKPOINT_EVERY, metavar="N",
                   help=f"(--heal) checkpoint every N iterations (default {CHECKPOINT_EVERY})")
    p.add_argument("--max-heals", type=positive_int, default=MAX_HEALS, metavar="K",
                   help=f"(--heal) give up after K failed cables (default {MAX_HEALS})")
    p.set_defaults(func=cmd_run)
    s = sub.add_parser("stop", help="stop the plan's training processes on every host",
                       description="stop the plan's training processes on every host",
                       epilog="example: topoctl stop plan.yaml --lab demo")
    add_transport_args(s)
    add_detailed_exitcode(s)
    s.set_defaults(func=cmd_stop)
