"""What NCCL needs on each host to run the plan's collectives (`topoctl export nccl`).

Pure functions over the plan document (and, for device and NIC facts, the cluster): no I/O.

- **Rank order.** NCCL's inter-host ring follows rank order (rank i sends to rank i+1). The
  planner's ring sends ``order[i]`` to ``order[i-1]`` (gloo's direction, `sim.schedules`), so
  NCCL rank ``(-i) mod n`` goes to the i-th rank of the planned ring, and NCCL's own ring is
  the planned ring, link for link. The same numbering is used for the MSCCL programs.
- **MSCCL programs** of the planned AllReduce (`topoctl.msccl`): the ring, the packed trees
  with their rates rounded to whole chunks, or on hosts with several ranks the hierarchical
  AllReduce; each checked against the executor's limits.
- **Per host**: the environment of each rank (rank, world, master, NCCL_SOCKET_IFNAME with the
  interfaces the plan routes training through, NCCL_TOPO_FILE, MSCCL_ALGO_DIR and
  MSCCL_XML_FILES) and an NCCL topology file with the host's GPUs and NICs.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from topoagent.protocol import TopoError
from topocontract.msccl import Limits, Program, check, to_xml
from topoctl.msccl.hierarchical import hierarchical_allreduce
from topoctl.msccl.ring import ring_allreduce
from topoctl.msccl.trees import trees_allreduce
from topoctl.rollout.links import watched_interfaces

__all__ = ["ExportError", "HostExport", "NcclExport", "export_nccl", "nccl_ranks"]

# compute capability (NCCL's `sm`) of the device types NCCL users name in cluster files
SM = {"P100": 60, "V100": 70, "T4": 75, "A100": 80, "A10": 86, "L4": 89, "H100": 90,
      "H200": 90, "B200": 100}
EXECUTOR_LIMITS = Limits()  # msccl-executor-nccl as built by default
TREE_CHUNKS = 64  # the trees' buffer in chunks: a tree's share is off by at most 1/128


class ExportError(TopoError, ValueError):
    """The plan cannot be exported for NCCL (its collective, or a program over the limits)."""


@dataclass
class HostExport:
    """One host's files: each rank's environment and the NCCL topology file."""

    rank_env: dict[int, dict[str, str]]  # local rank -> environment
    topo_xml: str


@dataclass
class NcclExport:
    """The whole export: per-host files and the MSCCL programs every host gets."""

    hosts: dict[str, HostExport]
    programs: dict[str, Program]
    ranks: dict[int, int]  # plan rank -> NCCL rank
    notes: list[str] = field(default_factory=list)


def _processes(plan: dict) -> dict[str, list[dict]]:
    procs = plan["job"].get("processes") or {}
    return {h: sorted(ps, key=lambda p: p["local_rank"]) for h, ps in procs.items()}


def nccl_ranks(plan: dict) -> dict[int, int]:
    """Plan rank -> NCCL rank, so that NCCL's ring is the planned ring (module docstring)."""
    procs = _processes(plan)
    order = (plan["job"].get("collective") or {}).get("order") or sorted(
        procs, key=lambda h: procs[h][0]["rank"])
    ring = [p["rank"] for h in order for p in procs.get(h, [])]
    if sorted(ring) != sorted(p["rank"] for ps in procs.values() for p in ps):
        raise ExportError([("job.collective.order", "does not list every host with ranks once")])
    n = len(ring)
    return {r: (-i) % n for i, r in enumerate(ring)}


def _programs(plan: dict, ranks: dict[int, int], limits: Limits) -> tuple[dict[str, Program],
                                                                          list[str]]:
    coll = plan["job"].get("collective") or {}
    algo, n = coll.get("algorithm", "ring"), len(ranks)
    if n < 2:
        return {}, ["one rank: no collective to export"]
    if coll.get("hierarchical"):
        return _hierarchical(plan, ranks, algo)
    if algo == "ring":
        return {"allreduce-ring": ring_allreduce(list(range(n)), name="topoctl-ring")}, []
    if algo == "trees":
        trees = []
        for t in coll["schedule"]["trees"]:
            parents: list[int | None] = [None] * n
            for r, p in enumerate(t["parents"]):
                parents[ranks[r]] = None if p is None else ranks[p]
            trees.append((parents, float(t["rate"])))
        prog = trees_allreduce(trees, TREE_CHUNKS, name="topoctl-trees", limits=limits)
        return {"allreduce-trees": prog}, [
            f"trees: {prog.nchannels} trees on as many channels, rates rounded to "
            f"{TREE_CHUNKS} chunks"]
    return {}, [f"collective {algo!r}: NCCL runs its own; no MSCCL program for it"]


def _hierarchical(plan: dict, ranks: dict[int, int], algo: str
                  ) -> tuple[dict[str, Program], list[str]]:
    """Hosts of several ranks: reduce-scatter in the host, a ring per shard over the hosts in
    the planned order (sending to the host before, as the planner's ring), all-gather."""
    if algo != "ring":
        return {}, [f"hierarchical with {algo!r} between hosts: no MSCCL program for it yet "
                    "(NCCL runs its own)"]
    procs = _processes(plan)
    order = plan["job"]["collective"].get("order") or sorted(procs)
    hosts = [[ranks[p["rank"]] for p in procs[h]] for h in reversed(order)]
    prog = hierarchical_allreduce(hosts, name="topoctl-hierarchical")
    return {"allreduce-hierarchical": prog}, [
        f"hierarchical: {len(hosts)} hosts x {len(hosts[0])} ranks (reduce-scatter in the "
        "host, a ring per shard between hosts, all-gather)"]


def _checked(programs: dict[str, Program], limits: Limits) -> None:
    problems = [(f"job.collective ({name})", p) for name, prog in programs.items()
                for p in check(prog, limits)]
    if problems:
        raise ExportError(problems)


def _rank_env(plan: dict, proc: dict, nccl_rank: int, ifnames: list[str],
              remote_dir: str, host: str, programs: dict[str, Program]) -> dict[str, str]:
    job = plan["job"]
    files = ",".join(f"{remote_dir}/{host}/msccl/{name}.xml" for name in sorted(programs))
    env = {"RANK": str(nccl_rank), "LOCAL_RANK": str(proc["local_rank"]),
           "WORLD_SIZE": str(job["world_size"]),
           "LOCAL_WORLD_SIZE": str(len(job["processes"][host])),
           "MASTER_ADDR": str(job["master"]["address"]), "MASTER_PORT": str(job["master"]["port"]),
           "NCCL_TOPO_FILE": f"{remote_dir}/{host}/topo.xml"}
    if ifnames:  # "=" : exact names, not prefixes
        env["NCCL_SOCKET_IFNAME"] = "=" + ",".join(ifnames)
    if programs:
        env |= {"MSCCL_ALGO_DIR": f"{remote_dir}/{host}/msccl", "MSCCL_XML_FILES": files}
    return env


def _topo_xml(gpus: int, gpu_type: str, nics: list[tuple[str, int]]) -> str:
    """NCCL's topology file: one CPU, the host's GPUs on PCI switches of their own, its NICs.
    Bus ids are placeholders (0000:<index>:00.0): NCCL matches them against the ones it
    detects, so on real hardware dump the detected topology (NCCL_TOPO_DUMP_FILE) and keep
    this file's NICs and speeds."""
    system = ET.Element("system", {"version": "1"})
    cpu = ET.SubElement(system, "cpu", {"numaid": "0", "arch": "x86_64"})
    sm = SM.get(gpu_type)
    for g in range(gpus):
        pci = ET.SubElement(cpu, "pci", {"busid": f"0000:{g + 1:02x}:00.0", "class": "0x030200",
                                         "link_speed": "16.0 GT/s PCIe", "link_width": "16"})
        ET.SubElement(pci, "gpu", {"dev": str(g), "gdr": "1"} | ({"sm": str(sm)} if sm else {}))
    nic = ET.SubElement(cpu, "nic")
    for dev, (name, mbps) in enumerate(nics):
        ET.SubElement(nic, "net", {"name": name, "dev": str(dev), "speed": str(mbps),
                                   "port": "1", "maxconn": "65536", "gdr": "0"})
    ET.indent(system, space="  ")
    return ET.tostring(system, encoding="unicode") + "\n"


def _host_facts(cluster: Any, host: str, ifnames: list[str], nprocs: int
                ) -> tuple[int, str, list[tuple[str, int]]]:
    """(GPUs, device type, [(NIC, Mbit/s)]) of `host`: from the cluster when given, else the
    plan's ranks and 0 Mbit/s (NCCL then detects the speed)."""
    if cluster is None:
        return nprocs, "", [(n, 0) for n in ifnames]
    try:
        spec = cluster.host(host)
    except KeyError:
        raise ExportError([("--cluster", f"the plan's host {host} is not in cluster "
                                         f"{cluster.name}: the plan is for another cluster")]
                          ) from None
    gpus = cluster.gpus(host)
    speeds = {n.name: (n.speed or cluster.defaults.nic_speed or 0) for n in spec.nics}
    return gpus.count, gpus.type, [(n, int(speeds.get(n, 0)) // 1_000_000) for n in ifnames]


def export_nccl(plan: dict, cluster: Any = None, remote_dir: str = "/etc/topoctl/nccl",
                limits: Limits = EXECUTOR_LIMITS) -> NcclExport:
    """Everything NCCL needs on each host of `plan` (validated plan document; `cluster` the
    parsed cluster file for device types and NIC speeds, optional); ExportError when the
    plan's collective has no program within `limits`."""
    ranks = nccl_ranks(plan)
    programs, notes = _programs(plan, ranks, limits)
    _checked(programs, limits)
    ifaces = watched_interfaces(plan)
    hosts = {}
    for host, procs in _processes(plan).items():
        names = ifaces.get(host, [])
        gpus, gtype, nics = _host_facts(cluster, host, names, len(procs))
        hosts[host] = HostExport(
            rank_env={p["local_rank"]: _rank_env(plan, p, ranks[p["rank"]], names, remote_dir,
                                                 host, programs) for p in procs},
            topo_xml=_topo_xml(gpus, gtype, nics))
    return NcclExport(hosts=hosts, programs=programs, ranks=ranks, notes=notes)


def program_files(export: NcclExport) -> dict[str, str]:
    """File name -> XML text of every program."""
    return {f"{name}.xml": to_xml(p) for name, p in sorted(export.programs.items())}
