"""Shared by the tree-runtime benchmarks (`bench.trees.allreduce_lab`, `bench.trees.cpu`,
`bench.lab.emulation_fit`): packed trees and the runtime's chunk choice for a cluster file's cables,
as the lab benches route them (one cable per host pair, the fastest), and the cost model's
prediction of any tree schedule on them. Helpers of every benchmark: `bench.common`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from topocontract.schedule import TreeSchedule
from topocontract.trees import chunk_count
from topoctl.collective.trees.bounds import partition_bound
from topoctl.collective.trees.pack import TreePlan, plan_trees
from topoctl.collective.trees.pipeline import (
    RuntimeCosts,
    TreePrediction,
    choose_chunks,
    link_rows,
    link_steps,
    predict,
    runtime_costs,
    tree_shape,
)
from topoctl.collective.trees.schedule import plan_to_schedule
from topoctl.fabric.capgraph import build_capgraph
from topoctl.lab.commands import cable_credit_s
from topoctl.labprofile import LabProfile, machine_profile
from topoctl.sim.fabric import tcp_efficiency
from topoctl.spec.cluster_load import load_cluster
from topotrain.timing import load_calibration

LEGACY_CHUNK = 16384  # what the threaded executor used


def cluster_cables(path: str | Path, scale: float = 1.0) -> tuple[list[str], list, int]:
    """(hosts, [(a, b, bytes/s)] one per host pair (the fastest cable), MTU) of a direct
    cluster file, rates x ``scale``."""
    cluster = load_cluster(path)
    fab = cluster.graph()
    best: dict[tuple[str, str], float] = {}
    for ln in fab.links:
        key = tuple(sorted((ln.a, ln.b)))
        best[key] = max(best.get(key, 0.0), ln.capacity * scale / 8.0)
    return list(fab.hosts), [(a, b, c) for (a, b), c in sorted(best.items())], fab.mtu


def trees_for(hosts: list[str], links: list, mtu: int, nbytes: int,
              chunk_bytes: int | None = None, colocated: int | None = None,
              loopback: bool = False, lab: LabProfile | None = None
              ) -> tuple[TreePlan, float, TreeSchedule, TreePrediction]:
    """Plan trees on ``links`` (bytes/s), the optimum rate tau (partition bound), the runtime
    schedule (chunk from the cost model unless ``chunk_bytes``) and the predicted AllReduce of
    ``nbytes`` with all ranks on this machine (``colocated``, default every rank). The chunk is
    chosen for the lab; ``loopback``: predict without the cable emulation's cost (ranks over
    loopback, as in ``bench.trees.cpu``); ``lab``: the machine's profile (default: this
    machine's, `machine_profile()`)."""
    lab = lab or machine_profile()
    g = build_capgraph(links, hosts)
    plan = plan_trees(g)
    tau = partition_bound(g)[0]
    costs = runtime_costs(load_calibration())
    shape = tree_shape([t.parents for t in plan.trees], [t.rate for t in plan.trees])
    rate = plan.rate * tcp_efficiency(mtu)
    ranks = colocated or len(hosts)
    uses = _one_hop_uses(hosts, links)
    steps = link_steps(shape, uses)
    if chunk_bytes is None:
        pred = choose_chunks(shape, float(nbytes), rate, costs, ranks, links=steps,
                             credit_s=lab_credit(shape, uses, mtu), lab=lab)
        chunk_bytes = max(1, pred.chunk_bytes)
    sched = plan_to_schedule(plan, chunk_bytes=chunk_bytes)
    pred = schedule_prediction(sched, hosts, links, mtu, nbytes, colocated, loopback, rate,
                               lab=lab)
    return plan, tau, sched, pred


def _one_hop_uses(hosts: list[str], links: list) -> dict:
    """One cable per host pair, each direction its own link (the fill and drain steps)."""
    at = {h: i for i, h in enumerate(hosts)}
    uses = {}
    for a, b, cap in links:
        uses[(at[a], at[b])] = [((a, b), 1.0 / cap)]
        uses[(at[b], at[a])] = [((b, a), 1.0 / cap)]
    return uses


def lab_credit(shape, uses: dict, mtu: int) -> np.ndarray:
    """Per row of ``link_steps(shape, uses)`` (one-hop uses: a link is a directed host pair
    with 1 / its rate in bytes/s): the token credit the lab gives a cable of that rate."""
    per_byte = {link: pb for hops in uses.values() for link, pb in hops}
    return np.array([cable_credit_s(8.0 / per_byte[link], mtu)
                     for link in link_rows(shape, uses)])


def schedule_prediction(sched: TreeSchedule, hosts: list[str], links: list, mtu: int,
                        nbytes: int, colocated: int | None = None, loopback: bool = False,
                        rate: float | None = None, credit_s: float | None = None,
                        costs: RuntimeCosts | None = None, lab: LabProfile | None = None
                        ) -> TreePrediction:
    """The cost model's AllReduce of ``nbytes`` with any tree schedule (packed trees, a plan's
    TopoOpt path trees) whose tree edges are cables of ``links`` (bytes/s, one per host pair):
    the trees' total rate is the largest at which every directed cable carries its trees'
    shares (goodput; ``rate`` given: that one); the runtime's chunk count from the
    schedule's ``chunk_bytes``; ``credit_s``: the cables' token credit (default: the lab's,
    per cable); ``costs``:
    the runtime's CPU costs (default: this machine's calibration); ``lab``: the machine's
    profile (default: `machine_profile()`)."""
    at = {h: i for i, h in enumerate(hosts)}
    cap = {}
    for a, b, c in links:
        cap[(at[a], at[b])] = cap[(at[b], at[a])] = c
    total = sum(t.rate for t in sched.trees)
    load: dict[tuple[int, int], float] = {}
    for t in sched.trees:
        for child, parent in enumerate(t.parents):
            if parent is None:
                continue
            for edge in ((child, parent), (parent, child)):
                if edge not in cap:
                    raise ValueError(f"tree edge {hosts[edge[0]]}-{hosts[edge[1]]} is not a "
                                     "cable")
                load[edge] = load.get(edge, 0.0) + t.rate / total
    if rate is None:
        rate = min(cap[e] / x for e, x in load.items()) * tcp_efficiency(mtu)
    if costs is None:
        costs = runtime_costs(load_calibration())
    lab = lab or machine_profile()
    if loopback:
        lab = replace(lab, emulation_bytes_per_s=1e30)
    shape = tree_shape([t.parents for t in sched.trees], [t.rate for t in sched.trees])
    uses = _one_hop_uses(hosts, links)
    steps = link_steps(shape, uses)
    c = chunk_count(sched, nbytes // 4, 4)
    credit = lab_credit(shape, uses, mtu) if credit_s is None else credit_s
    return predict(shape, float(nbytes), rate, c, costs, colocated or len(hosts), links=steps,
                   credit_s=credit, lab=lab)


def write_schedule(sched: TreeSchedule, path: Path) -> Path:
    path.write_text(yaml.safe_dump(sched.dump(), sort_keys=False))
    return path
