"""`topoctl apply | diff | status | rollback PLAN`: drive every host's agent.

Exit codes (topoagent.protocol): 0 = success (changes made or not, drift or not), 1 = error
(bad plan, or prepare failed: no host changed; status: a host unreachable), 3 = partial (the
apply failed on some hosts, every changed host rolled back). With --detailed-exitcode: 0 =
nothing to do / in sync, 2 = changes made (apply, rollback) or pending (diff, apply --dry-run)
or drift (status). The verbs return the rollout report's detailed outcome
(topoctl.rollout.twophase); `topoagent.cliutil.run_verb` makes it the exit code."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from topoagent.cliutil import add_detailed_exitcode, add_json
from topoagent.state.host import StateError
from topoctl.cli.apply_ansible import run_via_ansible
from topoctl.lab.lab import Lab, list_labs
from topoctl.rollout import twophase as rollout
from topoctl.rollout.transports import Transport
from topoctl.rollout.transports.local import LocalTransport, lab_transport
from topoctl.rollout.transports.ssh import SshTransport, lab_ssh_transport
from topoctl.rollout.twophase import Event, Report
from topoctl.spec.cluster import OVSDB_REMOTE, Cluster
from topoctl.spec.cluster_load import load_cluster

RESULT_STYLE = {"in sync": "green", "changes": "yellow", "changed": "green", "drifted": "yellow",
                "rolled back": "magenta", "error": "red", "unreachable": "red",
                "killed": "red", "dropped": "red", "confirmed": "green", "recovered": "magenta",
                "applied": "yellow", "not applied": "green"}
CONFIRM_SSH_S = 60.0  # default --confirm-within over SSH


def pick_transport(args: argparse.Namespace, plan: dict) -> Transport:
    """The transport `pick_target` chooses, with its description as `target`."""
    transport, target = pick_target(args, plan)
    transport.target = target  # type: ignore[attr-defined]
    return transport


def pick_target(args: argparse.Namespace, plan: dict) -> tuple[Transport, str]:
    """How the plan's hosts are reached, and a line naming that target: the operator's flag
    first (--local, --lab NAME, or --cluster FILE: more than one is an error), else the lab
    the plan's `metadata.cluster` names when one of that name is up. With --lab, over the
    lab's namespaces or, with --ssh, its sshd; with --cluster, SSH to the file's addresses.

    How hosts are reached (addresses, user, key, known_hosts, the agent command) comes from
    the operator (the lab, the cluster file, the flags), never from the plan: a lab named by
    the plan never beats the operator's --cluster, a --cluster FILE that is missing or bad is
    an error naming it, and a plan's `metadata.inventory` is only checked against the cluster
    file's and refused when it differs (docs/agent.md, trust model)."""
    hosts = sorted(plan["hosts"])
    if args.local and args.lab is not None:
        raise StateError([("--lab", "give one of --local and --lab")])
    if args.cluster is not None and (args.local or args.lab is not None):
        # the hosts are reached as --local/--lab say (`run --heal` re-plans with the file),
        # and the file the operator named is read all the same: a bad one is an error
        _load_cluster_file(args.cluster)
    if args.local:
        chosen = args.hosts or hosts
        if len(chosen) != 1:
            raise StateError([("--local", "applies one host's state to this machine: name it "
                               "with --hosts")])
        return LocalTransport({chosen[0]: None}), f"this machine as host {chosen[0]} (--local)"
    if args.cluster is not None and args.lab is None:  # its inventory, flags as defaults
        return _cluster_target(args, plan, hosts)
    lab_name = args.lab or plan["metadata"].get("cluster")
    if lab_name and (args.lab or lab_name in list_labs()):
        lab = Lab.load(lab_name)
        missing = [h for h in hosts if h not in {x.name for x in lab.cluster.hosts}]
        if missing:
            raise StateError([("hosts", f"not in lab {lab_name}: {', '.join(missing)}")])
        how = "its sshd" if args.ssh else "its namespaces"
        why = "--lab" if args.lab else "the plan's metadata.cluster"
        return (lab_ssh_transport(lab) if args.ssh else lab_transport(lab),
                f"lab {lab_name} over {how} ({why})")
    raise StateError([("", f"no lab named {lab_name!r} is up: give --lab NAME, --cluster FILE "
                       "(an inventory and host addresses) or --local (a plan's "
                       "metadata.inventory is never used on its own)")])


def _load_cluster_file(path: str) -> Cluster:
    """The operator's `--cluster FILE`; an error naming it when it is missing, unreadable or
    not a valid cluster file."""
    if not path:
        raise StateError([("--cluster", "expected a cluster file, got ''")])
    return load_cluster(path)


def _cluster_target(args: argparse.Namespace, plan: dict, hosts: list[str]
                    ) -> tuple[Transport, str]:
    """SSH to the hosts of the operator's cluster file (`--cluster FILE`): a missing, unreadable
    or invalid file is an error naming it (exit 1), whatever lab the plan names."""
    cluster = _load_cluster_file(args.cluster)
    inv = cluster.inventory_doc()
    if cluster.inventory is None:
        inv |= {"transport": "ssh", "user": args.ssh_user, "port": 22, "key": args.ssh_key,
                "known_hosts": args.known_hosts, "agent": [args.agent]}
    check_plan_inventory(plan, inv, args.cluster, getattr(args, "plan", ""))
    transport = inventory_transport(inv, hosts, args.cluster)
    return transport, f"cluster file {args.cluster} over SSH as {inv['user']}"


INVENTORY_KEYS = ("transport", "user", "port", "key", "known_hosts", "agent", "addresses",
                  "ovsdb")


def check_plan_inventory(plan: dict, inv: dict, cluster_file: str, plan_file: str) -> None:
    """StateError (exit 1, before any host is reached) naming each `metadata.inventory` key
    of the plan that differs from the inventory the operator's cluster file gives: a plan
    that would reach its hosts another way (another agent command, key, known_hosts file,
    user or address) was made for another cluster, or by someone else."""
    given = (plan.get("metadata") or {}).get("inventory")
    if given is None:
        return
    if not isinstance(given, dict):
        raise StateError([("metadata.inventory", "expected a mapping")], source=plan_file)
    problems = [(f"metadata.inventory.{k}",
                 f"{_shown(given.get(k))} differs from {cluster_file}'s {_shown(inv.get(k))}: "
                 "refusing a plan that chooses how its hosts are reached")
                for k in sorted(set(given) | set(inv), key=str)
                if k in INVENTORY_KEYS and given.get(k) != inv.get(k)]
    problems += [(f"metadata.inventory.{k}", "unknown key") for k in sorted(given, key=str)
                 if k not in INVENTORY_KEYS]
    if problems:
        raise StateError(problems, source=plan_file)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def inventory_transport(inv: dict, hosts: list[str], source: str) -> Transport:
    """SSH transport from an inventory: {transport, user, port, key, known_hosts, agent,
    addresses: {host: ip}, ovsdb: {host: OVSDB remote}} (ovsdb optional: hosts whose agent
    gets `--ovsdb`)."""
    addresses = inv.get("addresses") or {}
    missing = [h for h in hosts if h not in addresses]
    if missing:
        raise StateError([(f"{source}.addresses", f"no address for {', '.join(missing)}")])
    ovsdb = inv.get("ovsdb") or {}
    if not isinstance(ovsdb, dict):
        raise StateError([(f"{source}.ovsdb", "expected a mapping host -> OVSDB remote")])
    for h, db in sorted(ovsdb.items()):
        if not isinstance(db, str) or not OVSDB_REMOTE.match(db):
            raise StateError([(f"{source}.ovsdb.{h}", f"not an OVSDB remote (unix:/PATH, "
                                                      f"tcp:HOST:PORT or ssl:HOST:PORT): {db!r}")])
    return SshTransport(addresses, key=Path(inv["key"]).expanduser(),
                        known_hosts=Path(inv["known_hosts"]).expanduser(), user=inv["user"],
                        port=int(inv.get("port", 22)), agent=list(inv["agent"]),
                        ovsdb={h: ovsdb[h] for h in hosts if h in ovsdb})


def _printer(console: Console, quiet: bool):
    def show(e: Event) -> None:
        if quiet:
            return
        n = len(e.detail)
        extra = f" ({n} operation{'s' * (n != 1)})" if e.result in (
            "changes", "changed", "drifted") else ""
        if e.result in rollout.FAILED:
            extra = ": " + "; ".join(e.detail)
        style = RESULT_STYLE.get(e.result, "")
        console.print(f"{e.host:<10} {e.phase:<9} [{style}]{e.result}[/]{extra} "
                      f"[dim]{e.seconds:.2f}s[/]", highlight=False)
    return show


def _summary(console: Console, report: Report, show_ops: bool) -> None:
    table = Table(title=f"topoctl {report.command}")
    for col in ("host", "phase", "result", "operations", "seconds"):
        table.add_column(col)
    for host, e in sorted(report.final().items()):
        style = RESULT_STYLE.get(e.result, "")
        ops = str(len(e.detail)) if e.result not in rollout.FAILED else "-"
        table.add_row(host, e.phase, f"[{style}]{e.result}[/]", ops, f"{e.seconds:.2f}")
    console.print(table)
    if show_ops:
        for host, e in sorted(report.final().items()):
            for op in e.detail:
                console.print(f"  {host}: {op}", highlight=False, markup=False)
    console.print(report.message, highlight=False, markup=False)


def open_plan(args: argparse.Namespace) -> tuple[dict, Transport]:
    """The validated plan and its transport; StateError/LabError (mapped by the CLI) if not.
    The target reached is named on stderr (`args.target` keeps it for a --json document)."""
    plan = rollout.load_plan(args.plan)
    transport = pick_transport(args, plan)
    args.target = target = getattr(transport, "target", transport.name)
    print(f"topoctl: target: {target}", file=sys.stderr, flush=True)
    return plan, transport


def run(args: argparse.Namespace) -> int:
    """apply, diff, status or rollback every host of the plan; the report's exit code."""
    console = Console(stderr=False, highlight=False, soft_wrap=True)
    if getattr(args, "via", "agent") == "ansible":
        got = run_via_ansible(args, _printer(console, args.json))
        if args.json:
            print(json.dumps(got.to_dict(args.detailed_exitcode)))
        else:
            _summary(console, got, show_ops=args.command == "diff" or args.dry_run)
        return got.exit_code
    plan, transport = open_plan(args)
    progress = _printer(console, args.json)
    try:
        if args.command == "apply":
            report = rollout.apply_plan(plan, transport, dry_run=args.dry_run,
                                        force_mgmt=args.force_mgmt, probe=not args.no_probe,
                                        only=args.hosts, progress=progress,
                                        confirm_within=confirm_window(args, transport),
                                        keep_going=args.keep_going)
        elif args.command == "diff":
            report = rollout.apply_plan(plan, transport, dry_run=True,
                                        force_mgmt=args.force_mgmt, only=args.hosts,
                                        progress=progress)
            report.command = "diff"
        elif args.command == "status":
            report = rollout.status(plan, transport, only=args.hosts, progress=progress)
        else:
            report = rollout.rollback(plan, transport, only=args.hosts, progress=progress)
    finally:
        transport.close()
    if args.json:
        print(json.dumps(report.to_dict(args.detailed_exitcode)
                         | {"target": getattr(args, "target", None)}))
    else:
        _summary(console, report, show_ops=args.command in ("diff", "status") or args.dry_run)
    return report.exit_code  # the detailed outcome: EXIT_CHANGES exits 0 unless asked


def confirm_window(args: argparse.Namespace, transport: Transport) -> float | None:
    """--confirm-within: given, else CONFIRM_SSH_S over SSH (a host the apply cuts off reverts
    by itself) and off for the lab's namespaces and this machine; 0 turns it off."""
    seconds = getattr(args, "confirm_within", None)
    if seconds is None:
        seconds = CONFIRM_SSH_S if transport.name == "ssh" else 0
    return seconds or None


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 <= v <= 86400:
        raise argparse.ArgumentTypeError(f"expected seconds in [0, 86400], got {text!r}")
    return v


def add_transport_args(p: argparse.ArgumentParser) -> None:
    """The plan and how to reach its hosts: shared by apply, diff, status, rollback, run."""
    p.add_argument("plan", help="plan YAML (topoctl plan -o)")
    p.add_argument("--lab", help="the lab to act on (default: the plan's cluster name)")
    p.add_argument("--ssh", action="store_true",
                   help="reach lab hosts over their sshd instead of namespaces")
    p.add_argument("--cluster", help="cluster file with host addresses, for SSH")
    p.add_argument("--local", action="store_true", help="this machine is the host")
    p.add_argument("--hosts", type=lambda s: [h for h in s.split(",") if h],
                   help="comma-separated subset of hosts")
    p.add_argument("--ssh-user", default="root")
    p.add_argument("--ssh-key", default="~/.ssh/id_ed25519")
    p.add_argument("--known-hosts", default="~/.ssh/known_hosts")
    p.add_argument("--agent", default="topo-agent", help="agent command on remote hosts")
    add_json(p, "one JSON report on stdout")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `apply`, `diff`, `status` and `rollback` verbs to the topoctl parser."""
    helps = {"apply": "make every host match the plan (all or nothing)",
             "diff": "show what apply would change on each host",
             "status": "per host: in sync, drifted (with the drift) or unreachable",
             "rollback": "return every host to its previously applied state"}
    examples = {"apply": "topoctl apply plan.yaml --lab demo && topoctl run plan.yaml --lab demo",
                "diff": "topoctl diff plan.yaml --cluster cluster.yaml --detailed-exitcode",
                "status": "topoctl status plan.yaml --lab demo --detailed-exitcode",
                "rollback": "topoctl rollback plan.yaml --lab demo"}
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text,
                           epilog=f"example: {examples[name]}")
        add_transport_args(p)
        add_detailed_exitcode(p)
        # each verb lists only the flags it uses (`status --help` showed apply's --dry-run);
        # the others' defaults keep `run` one code path
        p.set_defaults(force_mgmt=False, no_probe=False, dry_run=False)
        if name in ("apply", "diff"):
            p.add_argument("--force-mgmt", action="store_true",
                           help="allow changes to the management interface, address or route")
        if name == "apply":
            p.add_argument("--no-probe", action="store_true", help="skip next-hop probes")
            p.add_argument("--dry-run", action="store_true", help="show, change nothing")
            p.add_argument("--confirm-within", type=_seconds, metavar="SECONDS",
                           help="each agent reverts by itself unless confirmed within SECONDS "
                                "of its apply; topoctl confirms every host it still reaches "
                                f"(default {CONFIRM_SSH_S:g} over SSH, off for lab namespaces "
                                "and --local; 0: off)")
        if name == "apply":
            p.add_argument("--keep-going", action="store_true",
                           help="when the apply fails on some hosts, the hosts that applied "
                                "keep the new state (default: they are rolled back); exit 3")
        if name in ("apply", "diff"):
            p.add_argument("--via", choices=["agent", "ansible"], default="agent",
                           help="ansible: run playbooks/apply.yml through ansible-runner "
                                "(diff: in check mode)")
            p.add_argument("--inventory", help="(--via ansible) Ansible inventory to use")
        p.set_defaults(func=run, command=name)
