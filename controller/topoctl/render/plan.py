"""The Plan document (DESIGN.md "The plan"): `metadata`, `fabric`, `hosts`, `job`.

`fabric` is the cabling in the cluster file's own format (so `Cluster.with_fabric` and the lab
read it back); addresses live in the hosts' states and, summarised, in `metadata.addressing`.
`job` is the launch spec: per host its processes (rank, local rank, environment), and the model
as an import path + kwargs + input shapes, so the training process needs no controller code.
Gloo binds to the host's training address: `GLOO_SOCKET_IFNAME=lo` would bind 127.0.0.1 (lo's
first address), unreachable from other hosts, so every process gets `bind_address` (and
`TOPOCTL_BIND_ADDRESS`) and the launcher makes gloo's device use it; `MASTER_ADDR` is rank 0's
training address."""

from __future__ import annotations

import topoctl
from topoagent.protocol import API_VERSION
from topoagent.state.values import format_rate
from topoagent.state.wire import LaunchSpec
from topoctl.catalog.registry import ENTRIES, resolve_params
from topoctl.fabric.graph import FabricGraph
from topoctl.render.addressing import Addressing
from topoctl.render.pipeline import pipeline_addresses
from topoctl.render.validate import validate_plan  # noqa: F401  (re-exported)
from topoctl.spec.cluster import Cluster, format_duration


def fabric_wiring(cluster: Cluster, graph: FabricGraph) -> dict:
    """The cabling as a cluster-file `fabric` mapping."""
    if graph.kind == "switched":
        return cluster.fabric.model_dump(mode="json", exclude_none=True)
    links = []
    for ln in graph.links:
        e = {"a": f"{ln.a}:{ln.a_nic}", "b": f"{ln.b}:{ln.b_nic}",
             "bandwidth": format_rate(ln.capacity)}
        if ln.latency:
            e["latency"] = format_duration(ln.latency)
        if ln.loss:
            e["loss"] = ln.loss
        links.append(e)
    return {"kind": "direct", "mtu": graph.mtu, "links": links}


def launch_spec(job, hosts: list[str], ranks: dict[str, list[int]], addr: Addressing,
                local_batch: int, collective: dict, buckets: list[int],
                bucket_cap: int | None = None) -> dict:
    """The plan's `job` section, built through the agent's `LaunchSpec` (the wire contract):
    per host its processes (rank, local rank, bind address, environment), the command, the
    model as an import path. `job` is the validated Job; `ranks` host -> global ranks;
    `bucket_cap` the DDP bucket cap in bytes the strategy chose (None: the job's)."""
    if collective.get("algorithm") == "pipeline":  # which training addresses talk to which
        hosts, ranks, collective = stage_ranks_only(collective, hosts, ranks)
        collective = pipeline_addresses(collective, addr.training)
    world = sum(len(r) for r in ranks.values())
    master = addr.training[hosts[0]]
    # batch shares (`+shares`), the layers synchronised by SFB (`+sfb`) and the regions compiled
    # as one (`disco`'s fusion) travel in the strategy's collective and have their own fields
    # in the launch spec
    collective = dict(collective)
    shares, sfb = collective.pop("shares", None), collective.pop("sfb", None)
    fusion = collective.pop("fusion", None)
    batch = {"global": job.batch.global_, "per_rank": local_batch}
    procs: dict[str, list[dict]] = {}
    for h in hosts:
        rs = ranks[h]
        procs[h] = [{"rank": r, "local_rank": i, "bind_address": addr.training[h],
                     "env": {"MASTER_ADDR": master, "MASTER_PORT": str(job.launch.port),
                             "WORLD_SIZE": str(world), "RANK": str(r), "LOCAL_RANK": str(i),
                             "LOCAL_WORLD_SIZE": str(len(rs)),
                             "TOPOCTL_BIND_ADDRESS": addr.training[h]}}
                    for i, r in enumerate(rs)]
    return LaunchSpec.model_validate({
        "name": job.name, "backend": job.launch.backend, "command": list(job.launch.command),
        "world_size": world, "master": {"address": master, "port": job.launch.port},
        "threads": job.launch.threads, "iterations": job.launch.iterations,
        "batch": batch | ({"shares": list(shares)} if shares is not None else {}),
        "model": model_launch_spec(job.model), "dtype": job.dtype,
        "bucket_cap_mb": round((bucket_cap or job.sync.bucket) / 2**20, 6),
        "collective": collective | {"buckets": buckets}, "processes": procs,
        **({"sfb": list(sfb)} if sfb is not None else {}),
        **({"fusion": dict(fusion)} if fusion is not None else {}),
    }).to_dict(exclude_unset=True)


def stage_ranks_only(collective: dict, hosts: list[str], ranks: dict[str, list[int]]
                     ) -> tuple[list[str], dict[str, list[int]], dict]:
    """A pipeline's launch without the ranks no stage uses (a host the placement left out
    would only join the process group and leave, after importing torch on the shared cores):
    the hosts that run a stage in their order, their stage ranks renumbered 0.. in that order,
    and `collective` with each stage's `ranks` renumbered the same way."""
    used = {r for st in collective["stages"] for r in st["ranks"]}
    kept = [(h, [r for r in ranks[h] if r in used]) for h in hosts]
    kept = [(h, rs) for h, rs in kept if rs]
    new_rank = {r: i for i, r in enumerate(r for _, rs in kept for r in rs)}
    stages = [st | {"ranks": [new_rank[r] for r in st["ranks"]]} for st in collective["stages"]]
    return ([h for h, _ in kept], {h: [new_rank[r] for r in rs] for h, rs in kept},
            collective | {"stages": stages})


def model_launch_spec(model) -> dict:
    """What a training process needs to build the model without the controller: an import path,
    its keyword arguments and the per-sample input shapes (catalog models get their class)."""
    if model.factory:
        return {"factory": model.factory, "kwargs": dict(model.kwargs),
                "inputs": [i.model_dump(mode="json", exclude_none=True) for i in model.inputs]}
    entry = ENTRIES[model.catalog]
    params = resolve_params(model.catalog, model.params)
    return {"catalog": model.catalog,
            "factory": entry.factory, "kwargs": params,
            "inputs": [{"shape": list(i.shape), "dtype": i.dtype} | ({"high": i.high} if i.high
                                                                     else {})
                       for i in entry.inputs(params)]}


def plan_document(metadata: dict, fabric: dict, hosts: dict[str, dict], job: dict) -> dict:
    """The Plan document: API version and kind, `metadata` (with the planner's version),
    `fabric` wiring, `hosts` (name -> HostState data) and the `job` launch spec."""
    return {"apiVersion": API_VERSION, "kind": "Plan",
            "metadata": {"planner": f"topoctl {topoctl.__version__}"} | metadata,
            "fabric": fabric, "hosts": hosts, "job": job}
