"""`topoctl lab`: build, inspect, break, re-cable and remove a cluster of namespaces.

A lab's state directory (default /var/lib/topoctl/labs/<name>, root overridable with
$TOPOCTL_LAB_DIR or `state_root`) holds lab.json (the cluster and the Layout), the SSH material,
sshd pid files and the last `measure` results. `down` works from names alone when that directory
is gone (after a crash): every namespace and root link of the lab starts with `tp-<name>-`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topoagent.congestion import set_congestion_control
from topoagent.machinelock import machine_lock
from topoagent.process.launch import RANK_CGROUP_ENV
from topoagent.target import DEFAULT_STATE_ROOT as AGENT_STATE_ROOT
from topoagent.target import Target, drop_netns_etc, give_files_only_names
from topoctl.lab import cabling, commands, cpu, names, netops, ovs, owners, ssh
from topoctl.lab.layout import Layout, build_layout, cables_of, find_cable, mgmt_block_size
from topoctl.lab.netops import LabError
from topoctl.spec.cluster import LAB_MANAGEMENT, Cluster, ClusterError
from topoctl.spec.cluster_load import parse_cluster
from topotrain.timing import TCP_CONGESTION

DEFAULT_STATE_ROOT = "/var/lib/topoctl/labs"
# TCP congestion control of every lab host: Linux's default, the loss-based fair sharing the
# simulator's fluid model assumes. A namespace inherits the root's choice, and a machine set to
# BBR made the lock-step tree AllReduce stall on some message sizes: BBR's model of a veth path
# (minimum RTT of microseconds, bursts through the cable's token credit) caps the window below a
# message, so the message's tail waits for ACKs queued behind the reverse traffic. Measured on
# hetero8 (15.9 MB, the same trees): 64 KiB chunks 1.116 s with BBR against 0.92-0.94 s for 48,
# 56 and 80 KiB; with cubic 0.928 s. tworack8 at 16 KiB: 0.620 s (BBR), 0.464 s (cubic; the
# cost model predicts 0.464 s). The runtime's CPU calibration runs under the same.
HOST_TCP_CONGESTION = TCP_CONGESTION
# Per-namespace files `ip netns exec` binds over /etc (iproute2's convention; sshd and
# `Lab.exec` start that way, and so does everything they start: the agent, the ranks).


def state_root(root: str | Path | None = None) -> Path:
    """Where labs keep their state: `root`, else $TOPOCTL_LAB_DIR, else /var/lib/topoctl/labs."""
    return Path(root or os.environ.get("TOPOCTL_LAB_DIR") or DEFAULT_STATE_ROOT)


@dataclass
class Lab:
    """A running lab: what other code (apply transports, benches, tests) needs to reach it."""

    cluster: Cluster
    layout: Layout
    state_dir: Path
    netem: bool = False
    tcp_congestion: str = HOST_TCP_CONGESTION  # in effect on the hosts (read back at `up`)
    # the hosts' CPU groups (`topoctl.lab.cpu`): backend kind and root, period, the machine's
    # cores and each host's quota in cores (None: no limit); None: no groups (no controller)
    cpu: dict | None = None

    @property
    def name(self) -> str:
        """The lab's name."""
        return self.layout.lab

    def netns(self, host: str) -> str:
        """The namespace of `host`."""
        return self.layout.host(host).ns

    def mgmt_ip(self, host: str) -> str:
        """The management address of `host`."""
        return self.layout.host(host).mgmt_ip

    def cpu_backend(self) -> cpu.CpuBackend | None:
        """Where the hosts' CPU groups live (None: the lab has none)."""
        if not self.cpu:
            return None
        return cpu.CpuBackend(self.cpu["backend"], Path(self.cpu["root"]))

    def cpu_group(self, host: str) -> str:
        """The name of `host`'s CPU group (its namespace's name)."""
        return names.cpu_group(self.name, host)

    def join_prefix(self, host: str) -> list[str]:
        """Argv prefix that puts a command into `host`'s CPU group before it runs
        (`cpu.join_argv`; [] when the lab has no groups). Its children inherit the group."""
        b = self.cpu_backend()
        return cpu.join_argv(b.procs(self.cpu_group(host)), []) if b else []

    def rank_env(self, host: str) -> dict[str, str]:
        """What the agent of `host` is started with so that the ranks it launches, and only
        they, join `host`'s CPU group ($TOPO_RANK_CGROUP, `topoagent.process.launch`): the
        quota stands for the compute of the host's devices; the management plane (sshd, the
        agent: a real host's own cores) runs beside it. {} when the lab has no groups."""
        b = self.cpu_backend()
        return {RANK_CGROUP_ENV: str(b.procs(self.cpu_group(host)))} if b else {}

    def netns_argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` as a process of `host`: in its CPU group and, through `ip netns exec`, in its
        namespace (with its /etc/netns files). How the lab starts everything on a host."""
        return [*self.join_prefix(host), "ip", "netns", "exec", self.netns(host), *argv]

    def exec(self, host: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        """Run `argv` inside `host` (`netns_argv`: its namespace and CPU group), output
        captured as text; keyword arguments go to subprocess.run (e.g. check=True, timeout=...)."""
        return subprocess.run(self.netns_argv(host, argv), capture_output=True, text=True, **kw)

    @property
    def ssh_config(self) -> Path:
        """`ssh -F <this> h0` logs into host h0 (key, user and known_hosts set)."""
        return self.state_dir / "ssh" / "config"

    @property
    def ssh_key(self) -> Path:
        """The lab's SSH private key (accepted by every host's sshd)."""
        return self.state_dir / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """The lab's known_hosts file with every host's key."""
        return self.state_dir / "ssh" / "known_hosts"

    @property
    def inventory(self) -> Path:
        """The lab's Ansible inventory file."""
        return self.state_dir / "inventory.ini"

    def ovs(self, host: str) -> ovs.Ovs:
        """The host's own Open vSwitch (cluster `ovs: true`): `lab.ovs("h0").vsctl("show")`."""
        if not self.cluster.runs_ovs(host):
            raise LabError(f"host {host} runs no Open vSwitch (cluster: ovs: false)")
        return ovs.Ovs(self.netns(host), self.state_dir / "ovs" / host)

    def ovs_start(self, host: str) -> ovs.Ovs:
        """Start Open vSwitch inside `host` (checksum offload off on its wire ends); the running
        Ovs."""
        o = ovs.start(self.netns(host), self.state_dir / "ovs" / host,
                      prefix=self.join_prefix(host))
        # the userspace datapath reads frames through AF_PACKET: a TCP segment whose checksum
        # the sending veth left to offload arrives broken, so the wire ends facing this host's
        # NICs compute checksums in software (the agent does the same on the NICs themselves)
        h = next(x for x in self.layout.hosts if x.name == host)
        for p in h.ports:
            netops.run(["ip", "netns", "exec", self.layout.wire_ns, "ethtool", "-K", p.end,
                        "tx", "off"], check=False)
        return o

    def ovsdb(self, host: str) -> str | None:
        """The OVSDB remote of a host that runs OVS (what its agent gets as --ovsdb)."""
        if not self.cluster.runs_ovs(host):
            return None
        return self.ovs(host).db

    def save(self) -> None:
        """Write lab.json (cluster, layout, netem, TCP congestion control) atomically into the
        state directory."""
        data = {"lab": self.name, "netem": self.netem, "tcp_congestion": self.tcp_congestion,
                "cpu": self.cpu,
                "cluster": self.cluster.to_dict(),
                "layout": self.layout.to_dict()}
        tmp = self.state_dir / "lab.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.state_dir / "lab.json")

    @classmethod
    def load(cls, name: str, root: str | Path | None = None) -> Lab:
        """The lab `name` from its state directory; LabError when there is no such lab."""
        d = state_root(root) / names.check_lab_name(name)
        try:
            data = json.loads((d / "lab.json").read_text())
        except FileNotFoundError:
            raise LabError(f"no lab {name} (no {d / 'lab.json'})") from None
        except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
            raise LabError(f"cannot read the lab's state: {e}", source=str(d / "lab.json")
                           ) from None
        try:
            return cls(parse_cluster(data["cluster"]), Layout.from_dict(data["layout"]), d,
                       data.get("netem", False),
                       data.get("tcp_congestion", HOST_TCP_CONGESTION), data.get("cpu"))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # a hand-edited or truncated state file: say so rather than a traceback
            raise LabError(f"damaged lab state ({type(e).__name__}: {e}); `topoctl lab down "
                           f"--lab {name}` removes the lab by its names",
                           source=str(d / "lab.json")) from None


def list_labs(root: str | Path | None = None) -> list[str]:
    """Labs with a state directory, plus labs whose namespaces exist without one."""
    found = set()
    r = state_root(root)
    if r.is_dir():
        found |= {p.parent.name for p in r.glob("*/lab.json")
                  if names.LAB_NAME.match(p.parent.name)}
    for ns in netops.list_netns("tp-"):
        lab = ns[3:].split("-", 1)[0]
        if names.LAB_NAME.match(lab) and ns.startswith(names.prefix(lab)):
            found.add(lab)
    return sorted(found)


def orphaned_labs(root: str | Path | None = None) -> list[str]:
    """Labs whose owning run (a test or benchmark, `topoctl.lab.owners`) has exited: of every
    lab `list_labs` finds and every lab with an owner record (one whose `up` was killed before
    it created anything). Only lab names: a record under a name no lab can have was not made
    by `up` (which records a checked name) and is left to `bad_owner_records`."""
    candidates = set(list_labs(root)) | {r for r in owners.recorded() if names.LAB_NAME.match(r)}
    return owners.orphans(sorted(candidates))


def bad_owner_records() -> list[str]:
    """Owner records (`topoctl.lab.owners`) whose name is not a lab name: never made by
    `topoctl lab up`, so never acted on; `lab list` and `lab down --orphans` report them."""
    return [r for r in owners.recorded() if not names.LAB_NAME.match(r)]


# --- up ------------------------------------------------------------------------------------------
def pick_mgmt_net(hosts: int, wanted: str | None = None, source: str = "--mgmt-net") -> str:
    """`wanted`, or the first free block in 10.232.0.0/16 that no root address overlaps;
    LabError naming `source` (where `wanted` came from) when it cannot be used."""
    used = [ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}").network
            for link in netops.ip_json("addr", "show") for a in link.get("addr_info", [])
            if a.get("family") == "inet"]
    if wanted:
        try:
            net = ipaddress.IPv4Network(wanted)
        except ValueError as e:
            raise LabError(f"not an IPv4 network: {e}", source=source) from None
        # the README's address table: labs live in LAB_MANAGEMENT and nowhere else
        if not net.subnet_of(ipaddress.IPv4Network(LAB_MANAGEMENT)):
            raise LabError(f"{net} is outside {LAB_MANAGEMENT}", source=source)
        if net.num_addresses - 3 < hosts:
            raise LabError(f"{net} is too small for {hosts} hosts and the gateway",
                           source=source)
        clash = [u for u in used if u.overlaps(net)]
        if clash:
            raise LabError(f"management network {net} overlaps {clash[0]} on this machine")
        return str(net)
    for net in ipaddress.IPv4Network(LAB_MANAGEMENT).subnets(new_prefix=mgmt_block_size(hosts)):
        if not any(u.overlaps(net) for u in used):
            return str(net)
    raise LabError(f"no free management block left in {LAB_MANAGEMENT}")


def up(cluster: Cluster, name: str | None = None, root: str | Path | None = None,
       mgmt_net: str | None = None, fabric: Any = None, with_ssh: bool = True) -> Lab:
    """Build the lab; on any failure remove whatever was created and re-raise. One lab comes
    up at a time on a machine (a machine lock): the management block is the first that no
    address on the machine overlaps, and two labs picking at once could pick the same one."""
    with machine_lock("lab-up"):
        return _up(cluster, name, root, mgmt_net, fabric, with_ssh)


def _up(cluster: Cluster, name: str | None, root: str | Path | None, mgmt_net: str | None,
        fabric: Any, with_ssh: bool) -> Lab:
    """`up`'s steps, under its lock."""
    name = names.check_lab_name(name or cluster.name, "--lab" if name else "")
    if fabric is not None:
        cluster = cluster.with_fabric(fabric, prefix="plan.fabric")
    backend, cores = cpu.detect(), cpu.machine_cores()
    check_cpu(cluster, backend, cores)  # before anything is created
    leftovers = netops.list_netns(names.prefix(name)) + netops.root_links(names.prefix(name))
    if leftovers:
        raise LabError(f"lab {name} exists (or left {leftovers[0]} behind): "
                       f"run `topoctl lab down --lab {name}` first")
    names.mgmt_root_if(name, len(cluster.hosts) - 1)  # raises if link names would not fit
    net = pick_mgmt_net(len(cluster.hosts), mgmt_net or cluster.addressing.management,
                        "--mgmt-net" if mgmt_net else "addressing.management")
    layout = build_layout(cluster, name, net)
    owners.record(name)  # before anything is created: a run killed mid-`up` leaves an orphan
    d = state_root(root) / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True, mode=0o700)
    lab = Lab(cluster, layout, d)
    ipv6 = cluster.addressing.family != "ipv4"
    try:
        netops.batch("ip", commands.root_batch(layout))
        for h in layout.hosts:
            netops.batch("ip", commands.host_batch(layout, h.name, ipv6), ns=h.ns)
        # before any host process starts: OVS joins its host's group, sshd passes the group on
        # to the agent, whose ranks join it (`Lab.rank_env`)
        lab.cpu = make_cpu_groups(cluster, name, backend, cores)
        # before sshd starts: `ip netns exec` binds the files when it starts a program
        for h in layout.hosts:  # names resolve in files only (files_only_nsswitch says why)
            give_files_only_names(h.ns)
        in_effect = set_congestion_control([h.ns for h in layout.hosts], HOST_TCP_CONGESTION)
        lab.tcp_congestion = ",".join(sorted(set(in_effect.values())))
        if ipv6:  # before the wire brings the carriers (and the link-local addresses) up
            enable_ipv6(layout, cluster.addressing.family)
        netops.batch("ip", commands.wire_ip_batch(layout), ns=layout.wire_ns)
        lab.netem = netops.has_netem(layout.wire_ns)
        netops.batch("tc", commands.wire_tc_batch(layout, lab.netem), ns=layout.wire_ns)
        lab.save()
        if with_ssh:
            ssh.write_ssh_files(layout, d, {h.name: lab.rank_env(h.name) for h in layout.hosts})
            ssh.start_sshd(layout, d)
            show_cpu_groups_to_sshd(lab)
        with ThreadPoolExecutor(4) as ex:  # ovs-vswitchd takes ~1 s to detach
            list(ex.map(lab.ovs_start, [h.name for h in cluster.hosts
                                        if cluster.runs_ovs(h.name)]))
    except BaseException:
        down(name, root)
        raise
    return lab


def show_cpu_groups_to_sshd(lab: Lab) -> None:
    """Mount the CPU groups' hierarchy in each host sshd's mount namespace (which `ip netns
    exec` gave a fresh /sys without it), so that the agent a session starts can put its ranks
    into the host's group (`cpu.mount_in_argv`, `Lab.rank_env`)."""
    b = lab.cpu_backend()
    if b is None:
        return
    for h in lab.layout.hosts:
        pid = int((lab.state_dir / "run" / f"sshd-{h.name}.pid").read_text().split()[0])
        r = subprocess.run(cpu.mount_in_argv(pid, b), capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            raise LabError(f"{h.name}: cannot show its CPU group to its sshd: "
                           f"{r.stderr.strip() or r.returncode}")


def enable_ipv6(layout: Layout, family: str) -> None:
    """IPv6 on in every host namespace of a lab whose cluster asks for it (a new namespace
    takes the kernel's defaults, not the machine's, so a machine booted with IPv6 disabled by
    sysctl still gets it here); LabError naming `addressing.family` when this kernel has no
    IPv6. The fabric ports' link-local addresses (`commands.host_batch`) skip duplicate
    address detection: they come from the ports' MACs, unique in the lab, and a tentative
    one sends no neighbour solicitation for a second or two after a cable comes up. The
    plan's own addresses carry `dad: false`."""
    for h in layout.hosts:
        t = Target(netns=h.ns)
        try:
            for conf in ("all", "default", "lo", *(p.nic for p in h.ports)):
                t.write_sysctl(f"net/ipv6/conf/{conf}/disable_ipv6", "0")
            for p in h.ports:
                t.write_sysctl(f"net/ipv6/conf/{p.nic}/accept_dad", "0")
        except OSError as e:
            raise LabError(f"addressing.family: {family}: IPv6 cannot be enabled in {h.ns} "
                           f"({e.strerror}; a kernel booted with ipv6.disable=1?)") from None


def check_cpu(cluster: Cluster, backend: cpu.CpuBackend | None, cores: int) -> None:
    """ClusterError at `hosts[i].speed` when the lab cannot give the cluster's hosts their
    speeds on this machine: no CPU controller (cgroup v1 `cpu` or v2 `cpu.max`), or a host's
    share below the smallest quota the kernel enforces (`cpu.check_quotas`)."""
    speeds = {h.name: h.speed for h in cluster.hosts}
    stated = [(i, h.name) for i, h in enumerate(cluster.hosts) if h.speed is not None]
    if stated and backend is None:
        i, h = stated[0]
        raise ClusterError([(f"hosts[{i}].speed",
                             f"{h} asks for a compute speed, but this machine has no cgroup CPU "
                             f"controller (v1 `cpu` with cpu.cfs_quota_us, or v2 with cpu.max; "
                             f"see `mount | grep cgroup`): the lab cannot enforce it")])
    problems = cpu.check_quotas(speeds, cores, {h.name: i for i, h in enumerate(cluster.hosts)},
                                lab_devices(cluster))
    if problems and backend is not None:
        raise ClusterError(problems)


def lab_devices(cluster: Cluster) -> dict[str, int]:
    """Ranks each host of `cluster` runs in the lab (`gpus.count`: each device a rank,
    whatever its type; the quota formula counts a host without devices as one)."""
    return {h.name: cluster.gpus(h.name).count for h in cluster.hosts}


def make_cpu_groups(cluster: Cluster, lab: str, backend: cpu.CpuBackend | None,
                    cores: int) -> dict | None:
    """One CPU group per host of lab `lab`, limited to its fixed quota (`cpu.quotas` over the
    hosts' speeds, None meaning 1, and devices); what `Lab.cpu` keeps. None (no groups) when
    the machine has no CPU controller, which `check_cpu` allowed only for a cluster without
    speeds, or when a cluster without speeds cannot have groups (LabError when one with
    speeds cannot)."""
    if backend is None:
        return None
    q = cpu.quotas({h.name: h.speed for h in cluster.hosts}, cores, lab_devices(cluster))
    try:
        cpu.enable_v2_cpu(backend)
        for h in cluster.hosts:
            backend.create(names.cpu_group(lab, h.name), q[h.name])
    except LabError:
        if any(h.speed is not None for h in cluster.hosts):  # speeds not enforced: `up` fails
            raise
        # a machine that refuses groups (a read-only cgroup mount in a container) still gets
        # its lab when the cluster states no speed, unlimited, as before the fixed shares
        cpu.remove_groups(names.prefix(lab))
        return None
    return {"backend": backend.kind, "root": str(backend.root), "period_us": cpu.PERIOD_US,
            "cores": cores, "quotas": dict(q)}


def unemulated(lab: Lab) -> list[str]:
    """Cables whose latency/loss the kernel cannot emulate (no sch_netem)."""
    if lab.netem:
        return []
    items = [(c.name, c.latency, c.loss) for c in lab.layout.cables]
    items += [(f"{s.ref}--{s.switch}", s.latency, s.loss) for s in lab.layout.switch_ports]
    return [n for n, lat, loss in items if lat > 0 or loss > 0]


# --- down ----------------------------------------------------------------------------------------
def down(name: str, root: str | Path | None = None) -> dict[str, int]:
    """Remove every process, namespace, root link and file of lab `name`, found by prefix."""
    pre = names.prefix(names.check_lab_name(name))
    namespaces = netops.list_netns(pre)
    # the hosts' processes: those in their namespaces and those in their CPU groups (one that
    # joined its group but had not entered its namespace yet is only there)
    pids = set(netops.netns_pids(namespaces)) | set(cpu.group_pids(pre))
    pids.discard(os.getpid())  # `lab down` run from a session on a lab host
    netops.kill_pids(sorted(pids))
    links = netops.root_links(pre)
    # bridge first: its ports then go with their namespaces or the link del below
    order = sorted(links, key=lambda x: x != names.mgmt_bridge(name))
    netops.batch("ip", [f"link del {x}" for x in order] + [f"netns del {n}" for n in namespaces],
                 force=True)
    d = state_root(root) / name
    if d.is_dir():
        shutil.rmtree(d)
    # what agents reached without --state-dir (over SSH, or `topo-agent --netns`) kept for the
    # lab's hosts: their default state directories are named after the namespace
    for stale in AGENT_STATE_ROOT.glob(f"netns-{pre}*"):
        shutil.rmtree(stale, ignore_errors=True)
    drop_netns_etc(f"{pre}*")  # the hosts' nsswitch.conf (`give_files_only_names`)
    groups = cpu.list_groups(pre)
    left = netops.list_netns(pre) + netops.root_links(pre) + cpu.remove_groups(pre)
    if left:
        raise LabError(f"could not remove {', '.join(left)}")
    owners.forget(name)
    return {"processes": len(pids), "namespaces": len(namespaces), "links": len(links),
            "cpu_groups": len(groups)}


# --- cut / heal / rewire -------------------------------------------------------------------------
def set_port(lab: Lab, port: str, up_: bool) -> list[str]:
    """Cut (up_=False) or heal the cable at HOST:PORT; returns the cable names."""
    try:
        found = find_cable(lab.layout, port)
    except ValueError as e:
        raise LabError(str(e)) from None
    ends = [e for _, es in found for e in es]
    netops.batch("ip", commands.ends_state(lab.layout, up_, ends), ns=lab.layout.wire_ns)
    return [n for n, _ in found]


def rewire(lab: Lab, fabric: Any) -> dict[str, list[str]]:
    """Re-cable a direct-connect lab to `fabric` (a plan's `fabric` wiring: the cluster file's
    fabric mapping). Only tc state in the wire namespace changes; host ports stay put."""
    if lab.layout.kind != "direct":
        raise LabError("only direct-connect labs can be re-cabled")
    new_cluster = lab.cluster.with_fabric(fabric, prefix="plan.fabric")
    ports = lab.layout.ports()
    old = {(c.a_end, c.b_end, c.rate, c.latency, c.loss): c for c in lab.layout.cables}
    new_cables = cables_of(new_cluster, ports)
    new = {(c.a_end, c.b_end, c.rate, c.latency, c.loss): c for c in new_cables}
    removed = [c for k, c in old.items() if k not in new]
    added = [c for k, c in new.items() if k not in old]
    w, mtu = lab.layout.wire_ns, lab.layout.mtu
    lines: list[str] = []
    for c in removed:
        lines += commands.unwire(c.a_end) + commands.unwire(c.b_end)
    for c in added:
        lines += commands.cable_tc(c, mtu, lab.netem)
    new_ends = {e for c in new_cables for e in (c.a_end, c.b_end)}
    gone = {e for c in removed for e in (c.a_end, c.b_end)} - new_ends
    ip_lines = commands.ends_state(lab.layout, False, sorted(gone))
    ip_lines += commands.ends_state(lab.layout, True, sorted(new_ends))
    netops.batch("tc", lines, ns=w)
    netops.batch("ip", ip_lines, ns=w)
    lab.cluster, lab.layout.cables = new_cluster, new_cables
    lab.save()
    return {"removed": [c.name for c in removed], "added": [c.name for c in added]}


# --- status --------------------------------------------------------------------------------------
def status(lab: Lab) -> dict:
    """Hosts and cables as the kernel reports them (independent of what lab.json claims)."""
    lay = lab.layout
    namespaces = set(netops.list_netns(names.prefix(lab.name)))
    sshd = ssh.sshd_pids(lab.state_dir)
    wire_links = {ln["ifname"]: ln for ln in netops.ip_json("link", "show", ns=lay.wire_ns)} \
        if lay.wire_ns in namespaces else {}
    rates = cabling.kernel_rates(lay.wire_ns, list(wire_links)) if wire_links else {}
    measured = load_measurements(lab)

    def state(ends: list[str]) -> str:
        if not all(e in wire_links for e in ends):
            return "missing"
        return "up" if all("UP" in wire_links[e].get("flags", []) for e in ends) else "cut"

    hosts = [{"name": h.name, "netns": h.ns, "netns_exists": h.ns in namespaces,
              "mgmt_ip": h.mgmt_ip, "sshd_pid": sshd.get(h.name),
              "ovs_pids": [p for p in ovs.pids(lab.state_dir / "ovs" / h.name) if _alive(p)],
              "ports": [p.nic for p in h.ports]} | cpu_status(lab, h.name) for h in lay.hosts]
    cables = [{"name": c.name, "a": c.a, "b": c.b, "rate": c.rate,
               "kernel_rate": [rates.get(c.a_end), rates.get(c.b_end)],
               "latency": c.latency, "loss": c.loss, "state": state([c.a_end, c.b_end]),
               "measured": measured.get(c.name)} for c in lay.cables]
    cables += [{"name": f"{s.ref}--{s.switch}", "a": s.ref, "b": s.switch, "rate": s.rate,
                "kernel_rate": [rates.get(s.end), rates.get(s.shaped)], "latency": s.latency,
                "loss": s.loss, "state": state([s.end]),
                "measured": measured.get(f"{s.ref}--{s.switch}")} for s in lay.switch_ports]
    cables += [{"name": f"{u.leaf}--{u.spine}", "a": u.leaf, "b": u.spine, "rate": u.rate,
                "kernel_rate": [rates.get(u.leaf_end), rates.get(u.spine_end)],
                "latency": u.latency, "loss": 0.0, "state": state([u.leaf_end, u.spine_end]),
                "measured": None} for u in lay.uplinks]
    return {"lab": lab.name, "kind": lay.kind, "mgmt_net": lay.mgmt_net,
            "state_dir": str(lab.state_dir), "netem": lab.netem,
            "tcp_congestion": lab.tcp_congestion, "unemulated": unemulated(lab),
            "cpu": None if not lab.cpu else {k: lab.cpu[k] for k in
                                             ("backend", "root", "period_us", "cores")},
            "hosts": hosts, "cables": cables}


def cpu_status(lab: Lab, host: str) -> dict:
    """`host`'s compute as configured (`speed`: the cluster's, None meaning 1; `cpu_share`:
    its quota in cores, None when unlimited) and as the kernel has it (`cpu_quota_us`,
    `cpu_period_us`, None when the group is gone or unlimited; `cpu_group`, `cpu_procs`:
    processes in the group; `cpu_throttled`: periods it was throttled in)."""
    speed = next((h.speed for h in lab.cluster.hosts if h.name == host), None)
    out: dict[str, Any] = {"speed": speed, "cpu_share": None, "cpu_group": None,
                           "cpu_quota_us": None, "cpu_period_us": None, "cpu_procs": 0,
                           "cpu_throttled": None}
    b = lab.cpu_backend()
    if b is None or lab.cpu is None:
        return out
    g = lab.cpu_group(host)
    q = (lab.cpu.get("quotas") or {}).get(host)
    limit = b.limit(g)
    stat = b.stat(g)
    return out | {"cpu_share": q, "cpu_group": str(b.group(g)),
                  "cpu_quota_us": limit[0] if limit else None,
                  "cpu_period_us": limit[1] if limit else None,
                  "cpu_procs": len(b.members(g)), "cpu_throttled": stat.get("nr_throttled")}


def check_cabling(lab: Lab, fabric: Any) -> cabling.CablingReport:
    """The lab's cables as the kernel has them (`cabling.observe`: veth peers, tc redirects
    and rates, link state) against `fabric` (a plan's `fabric` wiring, validated against the
    lab's hosts: ClusterError under `fabric...`). LabError for a switched lab."""
    if lab.layout.kind != "direct":
        raise LabError("only direct-connect labs have a cabling to check against a plan")
    planned = cabling.planned_cables(lab.cluster.with_fabric(fabric).graph())
    return cabling.compare(planned, cabling.observe(lab.name, [h.name for h in lab.layout.hosts]))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def load_measurements(lab: Lab) -> dict[str, dict]:
    """The lab's last `lab measure` results by cable ({} when never measured)."""
    try:
        return json.loads((lab.state_dir / "measure.json").read_text())
    except (OSError, ValueError):
        return {}
