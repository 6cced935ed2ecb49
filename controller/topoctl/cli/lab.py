"""`topoctl lab ...`: a cluster of namespaces on this machine (see docs/lab.md).

Every subcommand but `up` takes `--lab NAME`; without it, $TOPOCTL_LAB or the only lab there is.
Exit codes (topoagent.protocol): 0 ok, 1 error (bad input: cluster/plan file, port name; or the
lab operation failed; `status` and `measure`: a cable or host is not as configured). With
--detailed-exitcode, 2: `status --plan` found the cables the kernel has differ from the plan's
`fabric` (re-cabling pending), `rewire` re-cabled something. `exec` exits with its command's
code."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from topoagent.cliutil import add_detailed_exitcode, add_json
from topoagent.protocol import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, TopoError
from topoagent.state.host import load_yaml_file
from topoagent.state.values import format_rate
from topoctl.lab import lab as labmod
from topoctl.lab import names, owners
from topoctl.lab.layout import find_cable
from topoctl.lab.measure import measure
from topoctl.lab.netops import LabError
from topoctl.spec.cluster import ClusterError
from topoctl.spec.cluster_load import load_cluster

MAX_MEASURE_S = 3600.0  # per cable: longer is a typo, and iperf3's own limit is a day


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl lab` and its subcommands (up, down, status, measure, cut, heal, ...)."""
    text = "build and drive a cluster of namespaces on this machine"
    p = sub.add_parser("lab", help=text, description=text,
                       epilog="example: topoctl lab up cluster.yaml && topoctl lab status")
    # required: a bare `topoctl lab` is a usage error (with --json, a JSON error document)
    lsub = p.add_subparsers(dest="lab_command", metavar="SUBCOMMAND", required=True)

    def cmd(name: str, func, help: str, example: str, lab: bool = True, json: bool = True,
            detailed: bool = False) -> argparse.ArgumentParser:
        c = lsub.add_parser(name, help=help, description=help,
                            epilog=f"example: topoctl lab {example}")
        if json:
            add_json(c)
        if detailed:
            add_detailed_exitcode(c)
        if lab:
            c.add_argument("--lab", help="lab name (default: $TOPOCTL_LAB or the only lab)")
        c.add_argument("--state-dir", help=f"labs' state root (default: $TOPOCTL_LAB_DIR or "
                                           f"{labmod.DEFAULT_STATE_ROOT})")
        c.set_defaults(func=_guard(func))
        return c

    c = cmd("up", _up, "build a lab from a cluster file", "up cluster.yaml --plan plan.yaml",
            lab=False)
    c.add_argument("cluster", help="cluster.yaml")
    # --lab as every other lab verb spells it; --name kept for scripts that use it
    c.add_argument("--lab", "--name", dest="name",
                   help="lab name (default: the cluster's name; <= 9 of [a-z0-9])")
    c.add_argument("--plan", help="cable it as this plan's `fabric` says")
    c.add_argument("--mgmt-net", help="management subnet inside 10.232.0.0/16 (default: free)")
    c.add_argument("--no-ssh", action="store_true", help="no sshd per host")
    c = cmd("down", _down, "remove everything a lab created (also after a crash)",
            "down --lab demo")
    c.add_argument("--orphans", action="store_true",
                   help="instead: remove every lab whose owner, the test or benchmark run "
                        "that built it ($TOPOCTL_LAB_OWNER), has exited")
    c = cmd("status", _status, "hosts and cables, configured vs kernel vs measured rate",
            "status --plan plan.yaml --detailed-exitcode", detailed=True)
    c.add_argument("--plan", help="also compare the cables the kernel has with this plan's "
                                  "`fabric` (missing / extra / mismatched; with "
                                  "--detailed-exitcode exit 2 if they differ)")
    c = cmd("cut", _cut, "unplug the cable at HOST:PORT (both ends lose carrier)", "cut h0:p1")
    c.add_argument("port", help="HOST:PORT")
    c = cmd("heal", _heal, "plug the cable at HOST:PORT back in", "heal h0:p1")
    c.add_argument("port", help="HOST:PORT")
    c = cmd("measure", _measure, "iperf3 through every cable: achieved vs configured",
            "measure --time 5 h0:p1")
    c.add_argument("ports", nargs="*", help="only cables at these HOST:PORTs")
    c.add_argument("--time", type=float, default=2.0, help="seconds per cable (default 2)")
    c.add_argument("--jobs", type=int, default=1, help="cables measured at once (default 1)")
    c = cmd("rewire", _rewire, "re-cable a direct-connect lab from a plan's fabric wiring",
            "rewire plan.yaml", detailed=True)
    c.add_argument("plan", help="plan.yaml (or a cluster file): its `fabric` is used")
    c = cmd("exec", _exec, "run a command inside a host's namespace (no ssh)",
            "exec h0 -- ip route", json=False)
    c.add_argument("host")
    c.add_argument("command", nargs=argparse.REMAINDER, help="command and its arguments")
    cmd("list", _list, "labs on this machine", "list", lab=False)


def _guard(func):
    """Every lab verb but `list` needs root; errors are mapped by the CLI (topoctl.cli)."""
    def run(args: argparse.Namespace) -> int:
        if os.geteuid() != 0 and func is not _list:
            raise LabError("topoctl lab needs root (network namespaces)")
        return func(args) or EXIT_OK
    return run


def _lab_name(args: argparse.Namespace) -> str:
    name = getattr(args, "lab", None)
    if name is not None:
        return names.check_lab_name(name, "--lab")
    name = os.environ.get("TOPOCTL_LAB")
    if name:
        return names.check_lab_name(name, "$TOPOCTL_LAB")
    labs = labmod.list_labs(args.state_dir)
    if len(labs) != 1:
        raise LabError(f"say which lab with --lab ({', '.join(labs) or 'no labs are up'})")
    return labs[0]


def _load(args: argparse.Namespace) -> labmod.Lab:
    return labmod.Lab.load(_lab_name(args), args.state_dir)


def _plan_fabric(path: str):
    """The `fabric` mapping of a plan (or cluster) file: the wiring to cable."""
    data = load_yaml_file(path)
    if not isinstance(data, dict) or "fabric" not in data:
        raise ClusterError("no `fabric` mapping (the wiring to cable)", "fabric", source=path)
    return data["fabric"]


def _check_fabric(cluster, fabric, path: str) -> None:
    """ClusterError naming `path` and `fabric...` when `fabric` cannot cable `cluster`'s hosts
    (before anything is created or changed)."""
    try:
        cluster.with_fabric(fabric)
    except ClusterError as e:
        raise e.at(path) from None


def _up(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster)
    if args.name is not None:
        names.check_lab_name(args.name, "--lab")
    elif not names.LAB_NAME.match(cluster.name):
        raise ClusterError(f"{cluster.name!r} cannot name a lab (1-9 lowercase letters/digits, "
                           f"starting with a letter): give --lab", "name", source=args.cluster)
    fabric = None
    if args.plan:
        fabric = _plan_fabric(args.plan)
        _check_fabric(cluster, fabric, args.plan)
    t = time.monotonic()
    try:
        lab = labmod.up(cluster, args.name, args.state_dir, args.mgmt_net, fabric,
                        with_ssh=not args.no_ssh)
    except ClusterError as e:  # hosts[i].speed the machine cannot give: the cluster file's
        raise e.at(args.cluster) from None
    lay = lab.layout
    n = len(lay.cables) + len(lay.switch_ports)
    missing = labmod.unemulated(lab)
    if args.json:
        print(json.dumps({"ok": True, "lab": lab.name, "seconds": round(time.monotonic() - t, 3),
                          "hosts": [h.name for h in lay.hosts], "cables": n,
                          "mgmt_net": str(lay.mgmt_net), "gateway": str(lay.gateway),
                          "ssh_config": None if args.no_ssh else str(lab.ssh_config),
                          "inventory": None if args.no_ssh else str(lab.inventory),
                          "unemulated": list(missing), "tcp_congestion": lab.tcp_congestion,
                          "cpu": lab.cpu}))
        return EXIT_OK
    print(f"lab {lab.name} up in {time.monotonic() - t:.1f}s: {len(lay.hosts)} hosts, {n} "
          f"cables, management {lay.mgmt_net} (root {lay.gateway})")
    if not args.no_ssh:
        print(f"ssh -F {lab.ssh_config} {lay.hosts[0].name}    # Ansible: -i {lab.inventory}")
    if lab.cpu and lab.cpu.get("quotas"):
        shares = ", ".join(f"{h} {c:.3g}" for h, c in lab.cpu["quotas"].items())
        print(f"CPU quotas (cores of {lab.cpu['cores']}, cgroup {lab.cpu['backend']}): {shares}")
    elif lab.cpu is None:
        print("note: no CPU groups (no usable cgroup CPU controller on this machine): the "
              "hosts' processes share the cores unconfined (the cluster states no speed)",
              file=sys.stderr)
    if missing:
        print(f"warning: this kernel has no sch_netem: latency/loss of {len(missing)} cable(s) "
              f"not emulated (rates are)", file=sys.stderr)
    if lab.tcp_congestion != labmod.HOST_TCP_CONGESTION:
        print(f"warning: the hosts' TCP congestion control is {lab.tcp_congestion}, not "
              f"{labmod.HOST_TCP_CONGESTION} (not in this kernel): measured times may not "
              f"follow the plan's predictions", file=sys.stderr)
    return EXIT_OK


def _down(args: argparse.Namespace) -> int:
    if args.orphans:
        return _down_orphans(args)
    name = _lab_name(args)
    t = time.monotonic()
    r = labmod.down(name, args.state_dir)
    if args.json:
        print(json.dumps({"ok": True, "lab": name, "seconds": round(time.monotonic() - t, 3),
                          "removed": {k: r[k] for k in ("namespaces", "links", "processes")}}))
        return EXIT_OK
    print(f"lab {name} down in {time.monotonic() - t:.1f}s: removed {r['namespaces']} "
          f"namespaces, {r['links']} root links, {r['processes']} processes")
    return EXIT_OK


def _down_orphans(args: argparse.Namespace) -> int:
    """`down --orphans`: every lab whose owning run has exited (`topoctl.lab.owners`)."""
    if args.lab is not None:
        raise LabError("give either --lab or --orphans", source="--orphans")
    gone, failed = [], {}
    for name in labmod.orphaned_labs(args.state_dir):
        try:  # one lab that cannot be removed does not keep the others
            labmod.down(name, args.state_dir)
            gone.append(name)
        except TopoError as e:
            failed[name] = str(e)
    skipped = _report_bad_records(args.json)
    for name, why in failed.items():
        print(f"topoctl: lab {name}: not removed: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps({"ok": not failed, "removed": gone, "failed": failed,
                          "skipped_records": skipped}))
    elif gone:
        print(f"removed {len(gone)} orphan lab(s): {', '.join(gone)}")
    elif not failed:
        print("no orphan labs")
    return EXIT_ERROR if failed else EXIT_OK


def _report_bad_records(quiet: bool) -> list[str]:
    """Owner records under a name no lab can have (not made by `lab up`): named on stderr
    (unless `quiet`, the --json document lists them), never acted on."""
    bad = labmod.bad_owner_records()
    for r in [] if quiet else bad:
        print(f"topoctl: warning: {owners.OWNERS_DIR / r}: an owner record whose name is not a "
              f"lab name (1-9 lowercase letters/digits, a letter first): skipped; remove it "
              f"by hand", file=sys.stderr)
    return bad


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}M"


def _status(args: argparse.Namespace) -> int:
    lab = _load(args)
    report = None
    if args.plan:
        try:
            report = labmod.check_cabling(lab, _plan_fabric(args.plan))
        except ClusterError as e:
            raise e.at(args.plan) from None
    st = labmod.status(lab)
    if args.json:
        print(json.dumps(st | ({"plan": report.as_dict()} if report else {}), indent=1))
        return _plan_exit(st, report) if report else EXIT_OK
    print(f"lab {st['lab']} ({st['kind']}), management {st['mgmt_net']}, state {st['state_dir']}"
          f", hosts' TCP {st['tcp_congestion']}")
    print(f"{'host':<10} {'netns':<6} {'mgmt ip':<15} {'sshd':<8} {'ovs':<4} {'speed':>5} "
          f"{'cpu':>6} ports")
    for h in st["hosts"]:
        print(f"{h['name']:<10} {'ok' if h['netns_exists'] else 'GONE':<6} {h['mgmt_ip']:<15} "
              f"{h['sshd_pid'] or '-'!s:<8} {'yes' if h['ovs_pids'] else '-':<4} "
              f"{_speed(h['speed']):>5} {_cpu(h):>6} {' '.join(h['ports'])}")
    if st.get("cpu"):
        print(f"cpu: cores the kernel gives each host per {st['cpu']['period_us']} us period "
              f"(cgroup {st['cpu']['backend']}, {st['cpu']['cores']} cores; -: no limit)")
    print(f"\n{'cable':<32} {'state':<7} {'config':>8} {'kernel':>8} {'measured':>9} ratio")
    bad = 0
    for c in st["cables"]:
        kr = c["kernel_rate"]
        krs = _rate(kr[0]) if kr[0] == kr[1] else f"{_rate(kr[0])}/{_rate(kr[1])}"
        m = c["measured"] or {}
        ratio = f"{m['ratio']:.3f}" if m.get("ratio") else (m.get("error") or "-")
        bad += c["state"] == "missing" or any(r != c["rate"] for r in kr)
        print(f"{c['name']:<32} {c['state']:<7} {format_rate(c['rate']):>8} {krs:>8} "
              f"{_rate(m.get('achieved')):>9} {ratio}")
    if st["unemulated"]:
        print(f"\nno sch_netem in this kernel: latency/loss not emulated on "
              f"{', '.join(st['unemulated'])}")
    if report:
        _print_cabling(args.plan, report)
        return _plan_exit(st, report)
    # a lab with CPU groups whose group is gone no longer confines that host's processes
    bad += sum(1 for h in st["hosts"] if st.get("cpu") and h["cpu_period_us"] is None)
    return EXIT_ERROR if bad or not all(h["netns_exists"] for h in st["hosts"]) else EXIT_OK


def _speed(v: float | None) -> str:
    return "1" if v is None else f"{v:g}"


def _cpu(h: dict) -> str:
    """The host's CPU share as the kernel has it (quota / period, in cores)."""
    if h["cpu_quota_us"] is None or not h["cpu_period_us"]:
        return "-" if h["cpu_group"] else "none"
    return f"{h['cpu_quota_us'] / h['cpu_period_us']:.3g}"


def _plan_exit(st: dict, report) -> int:
    """`status --plan`: EXIT_ERROR when a host is gone (the lab is broken), EXIT_CHANGES when
    the cabling differs from the plan (re-cabling pending: `topoctl lab rewire PLAN`; exit 2
    with --detailed-exitcode, else 0), else EXIT_OK."""
    if not all(h["netns_exists"] for h in st["hosts"]):
        return EXIT_ERROR
    return EXIT_CHANGES if not report.ok else EXIT_OK


def _print_cabling(plan: str, report) -> None:
    n = len(report.matching)
    if report.ok:
        print(f"\ncabling as in {plan}: all {n} cables")
        return
    print(f"\ncabling differs from {plan} ({n} cables as planned; "
          f"`topoctl lab rewire {plan}` re-cables):")
    for m in report.missing:
        where = f"; its ports are cabled as {', '.join(m['ports_cabled_to'])}" \
            if m["ports_cabled_to"] else ""
        print(f"  missing     {m['cable']} ({format_rate(m['rate'])}){where}")
    for x in report.extra:
        kr = "/".join(_rate(r) for r in x["kernel_rate"])
        print(f"  extra       {x['cable']} ({kr}{'' if x['up'] else ', cut'})")
    for m in report.mismatched:
        print(f"  mismatched  {m['cable']}: {'; '.join(m['problems'])}")


def _cut(args: argparse.Namespace) -> int:
    return _plug(args, False)


def _heal(args: argparse.Namespace) -> int:
    return _plug(args, True)


def _plug(args: argparse.Namespace, up: bool) -> int:
    """`cut` (up False) or `heal` the cable at args.port; EXIT_OK."""
    cables = list(labmod.set_port(_load(args), args.port, up))
    if args.json:
        print(json.dumps({"ok": True, "port": args.port, "up": up, "cables": cables}))
    for name in [] if args.json else cables:
        print(f"{'healed' if up else 'cut'} {name}")
    return EXIT_OK


def _measure(args: argparse.Namespace) -> int:
    if not math.isfinite(args.time) or not 0 < args.time <= MAX_MEASURE_S:
        raise LabError(f"expected seconds per cable, 0 < s <= {MAX_MEASURE_S:g}, got "
                       f"{args.time:g}", source="--time")
    if args.jobs < 1:
        raise LabError(f"expected at least 1 cable at once, got {args.jobs}", source="--jobs")
    lab = _load(args)
    for port in args.ports:  # a typo must not measure nothing and say all is well
        try:
            find_cable(lab.layout, port)
        except ValueError as e:
            raise LabError(str(e), source=port) from None
    results = measure(lab, args.ports or None, args.time, args.jobs)
    if args.json:
        print(json.dumps([r.__dict__ for r in results], indent=1))
        return EXIT_OK if all(r.error is None for r in results) else EXIT_ERROR
    print(f"{'cable':<32} {'config':>8} {'achieved':>9} {'ratio':>6} {'cpu%':>5}")
    for r in results:
        cpu = f"{r.cpu_percent:.0f}" if r.cpu_percent is not None else "-"
        print(f"{r.name:<32} {format_rate(r.configured):>8} {_rate(r.achieved):>9} "
              f"{(f'{r.ratio:.3f}' if r.ratio else r.error or '-'):>6} {cpu:>5}")
    return EXIT_OK if all(r.error is None for r in results) else EXIT_ERROR


def _rewire(args: argparse.Namespace) -> int:
    lab = _load(args)
    fabric = _plan_fabric(args.plan)
    _check_fabric(lab.cluster, fabric, args.plan)
    r = labmod.rewire(lab, fabric)
    changed = EXIT_CHANGES if r["removed"] or r["added"] else EXIT_OK
    if args.json:
        print(json.dumps({"ok": True, "lab": lab.name, "removed": list(r["removed"]),
                          "added": list(r["added"])}))
        return changed
    print(f"removed {len(r['removed'])} cables, added {len(r['added'])}")
    for n in r["removed"]:
        print(f"  - {n}")
    for n in r["added"]:
        print(f"  + {n}")
    return changed  # exit 2 with --detailed-exitcode when it re-cabled something


def _exec(args: argparse.Namespace) -> int:
    lab = _load(args)
    try:
        lab.netns(args.host)  # an unknown host is an error before anything runs
    except KeyError as e:
        raise LabError(str(e).strip("'\"")) from None
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        raise LabError("exec: no command given")
    return subprocess.call(lab.netns_argv(args.host, argv))  # in the host's CPU group too


def _list(args: argparse.Namespace) -> int:
    found = labmod.list_labs(args.state_dir)
    orphaned = set(labmod.orphaned_labs(args.state_dir))
    # a lab known only by its owner record: its `up` was killed before it built anything
    labs = sorted(set(found) | orphaned)
    skipped = _report_bad_records(args.json)
    if args.json:
        print(json.dumps({"ok": True, "labs": labs, "orphans": sorted(orphaned),
                          "record_only": sorted(orphaned - set(found)),
                          "skipped_records": skipped}))
    for name in [] if args.json else labs:
        # an orphan's owner (a test or benchmark run) was killed before it took the lab down
        if name not in orphaned:
            print(name)
        elif name in found:
            print(f"{name}  (orphan: `topoctl lab down --orphans` removes it)")
        else:
            print(f"{name}  (orphan, owner record only: its `lab up` was killed before it "
                  f"built anything; `topoctl lab down --orphans` removes the record)")
    return EXIT_OK
