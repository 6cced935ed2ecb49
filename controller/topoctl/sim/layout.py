"""What each device of a plan holds and does: its parallelism degrees, its memory footprint
against its capacity, and the collectives of one iteration with their bytes.

One accounting for every strategy (the planner checks every plan with it and the plan carries
its figures for `topoctl explain`): a data-parallel plan (ring, trees, TopoOpt's rings, SFB,
DisCo, batch shares) keeps the whole model on every device, with the activations of the
device's own samples; a GPipe pipeline (`placement`, `pipeline`, `tag`'s staged plans) keeps
its stage's ops on each of the stage's devices, with the activations of every micro-batch in
flight (GPipe keeps all until the backward pass). The bytes per kind are ZeRO's accounting
(`sim.memory.footprint`, Rajbhandari et al., SC'20): weights and gradients in the training
dtype, Adam's two fp32 moments, and an fp32 master copy when training in fp16/bf16: 16 bytes
per parameter either way. Tensor parallelism and FSDP are 1 here: no strategy plans them yet.

Pure functions over plain data; O(ops + devices + collective steps)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topoctl.sim.memory import Footprint, footprint, format_gb

__all__ = ["DEGREES", "OPTIMISER", "DeviceGroup", "OpBytes", "collectives", "group_doc",
           "group_label", "layout", "layout_doc", "overflows"]

OPTIMISER = "adam"  # what the check assumes the job trains with (the LMs' optimiser)
DEGREES = ("data", "tensor", "pipeline", "fsdp")


@dataclass(frozen=True)
class OpBytes:
    """One op's parameters and the activations it keeps for the backward, at the graph's
    batch."""

    name: str
    param_bytes: float
    act_bytes: float


@dataclass(frozen=True)
class DeviceGroup:
    """Devices that hold and do the same: their names, device type, capacity in bytes (None:
    unknown, not checked), parallelism degrees, pipeline stage (None: no pipeline) and the
    footprint of each."""

    devices: tuple[str, ...]
    kind: str
    capacity: float | None
    degrees: tuple[tuple[str, int], ...]
    stage: int | None
    footprint: Footprint

    @property
    def fits(self) -> bool:
        """Whether each device holds its footprint (True when the capacity is unknown)."""
        return self.capacity is None or self.footprint.total <= self.capacity

    def refusal(self) -> str:
        """'h0..h3 (32 x H100, 80 GB each): needs 212 GB per device (parameters ...), has
        80 GB': the devices, what each needs by kind, what each has."""
        n = len(self.devices)
        cap = format_gb(self.capacity) if self.capacity is not None else "unknown"
        where = f"stage {self.stage}: " if self.stage is not None else ""
        return (f"{where}{group_label(self.devices)} ({n} x {self.kind}, {cap} each): needs "
                f"{self.footprint.describe()} per device, has {cap}")


def _stage_footprint(ops: Sequence[OpBytes], rows: float, batch: int, dtype_bytes: int,
                     microbatches: int) -> Footprint:
    """The footprint of a device holding `ops` and computing `rows` samples per micro-batch
    (the graph's bytes are at `batch` samples), `microbatches` of them in flight."""
    params = sum(o.param_bytes for o in ops) / dtype_bytes
    acts = sum(o.act_bytes for o in ops) * rows / batch
    return footprint(params, dtype_bytes, acts, optimiser=OPTIMISER,
                     mixed_precision=dtype_bytes < 4, microbatches=microbatches)


def _data_parallel(ops: Sequence[OpBytes], batch: int, dtype_bytes: int,
                   collective: Mapping, devices: Mapping[str, Sequence[str]],
                   ranks: Mapping[str, Sequence[int]]) -> list[tuple[str, str, int | None,
                                                                     dict, Footprint]]:
    """(host, device, stage, degrees, footprint) of every device of a data-parallel plan:
    the whole model each, activations of its own samples (`collective["shares"]`: samples
    per global rank; else the graph's batch)."""
    shares = collective.get("shares")
    world = sum(len(r) for r in ranks.values())
    degrees = {"data": world, "tensor": 1, "pipeline": 1, "fsdp": 1}
    out = []
    for h, devs in devices.items():
        for dev, r in zip(devs, ranks[h], strict=True):
            rows = shares[r] if shares else batch
            out.append((h, dev, None, degrees,
                        _stage_footprint(ops, rows, batch, dtype_bytes, 1)))
    return out


def _pipeline(ops: Sequence[OpBytes], batch: int, dtype_bytes: int, collective: Mapping,
              devices: Mapping[str, Sequence[str]]) -> list[tuple[str, str, int | None,
                                                                  dict, Footprint]]:
    """(host, device, stage, degrees, footprint) of every device of a GPipe plan: its
    stage's ops, the activations of its rows of every micro-batch in flight (`shares`: rows
    per micro-batch of each replica; else `micro_batch` each)."""
    by_name = {o.name: o for o in ops}
    stages = collective["stages"]
    micro = int(collective.get("microbatches", 1))
    out = []
    for k, st in enumerate(stages):
        held = [by_name[n] for n in st["ops"] if n in by_name]
        hosts = st["hosts"]
        degrees = {"data": len(hosts), "tensor": 1, "pipeline": len(stages), "fsdp": 1}
        for j, h in enumerate(hosts):
            rows = st["shares"][j] if st.get("shares") else collective["micro_batch"]
            out.append((h, devices[h][0], k, degrees,
                        _stage_footprint(held, rows, batch, dtype_bytes, micro)))
    return out


def layout(ops: Sequence[OpBytes], batch: int, dtype_bytes: int, collective: Mapping,
           devices: Mapping[str, Sequence[str]], ranks: Mapping[str, Sequence[int]],
           kind: Mapping[str, str], capacity: Mapping[str, float | None]
           ) -> list[DeviceGroup]:
    """The plan's devices in groups that hold and do the same, in the hosts' order.

    `ops`: the model's ops with their bytes at `batch` samples of `dtype_bytes` wide
    parameters; `collective`: the plan's (``algorithm: pipeline`` with ``stages``, else data
    parallel); `devices[host]`: its device names, rank order (`ranks[host]`: their global
    ranks); `kind[host]`, `capacity[host]`: its device type and bytes per device (None:
    unknown)."""
    rows = (_pipeline(ops, batch, dtype_bytes, collective, devices)
            if collective.get("algorithm") == "pipeline"
            else _data_parallel(ops, batch, dtype_bytes, collective, devices, ranks))
    groups: dict[tuple, list[str]] = {}
    for h, dev, stage, degrees, fp in rows:
        key = (stage, kind[h], capacity.get(h), tuple((d, degrees[d]) for d in DEGREES), fp)
        groups.setdefault(key, []).append(dev)
    return [DeviceGroup(tuple(devs), k, cap, deg, stage, fp)
            for (stage, k, cap, deg, fp), devs in groups.items()]


def overflows(groups: Sequence[DeviceGroup]) -> list[str]:
    """One sentence per group whose devices cannot hold their footprint (`refusal`)."""
    return [g.refusal() for g in groups if not g.fits]


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def group_label(devices: Sequence[str]) -> str:
    """Device names in short, order kept: runs of consecutive numbers as ``h0..h3``, hosts
    holding the same devices once (``h0..h3/g0..g7``)."""
    hosts: dict[str, list[str]] = {}
    for d in devices:
        host, sep, dev = d.partition("/")
        hosts.setdefault(host, []).append(dev if sep else "")
    per_host = {h: (f"/{', '.join(_runs(ds))}" if any(ds) else "") for h, ds in hosts.items()}
    # hosts holding the same devices: one run of hosts, their devices named once per run
    alike: dict[str, list[str]] = {}
    for h, suffix in per_host.items():
        alike.setdefault(suffix, []).append(h)
    return ", ".join(f"{run}{suffix}" for suffix, hs in alike.items() for run in _runs(hs))


def _runs(names: Sequence[str]) -> list[str]:
    """``[a, h0..h3]`` for names whose numbered tails run consecutively under one prefix."""
    parts: list[str] = []
    i = 0
    while i < len(names):
        m = _NUMBERED.match(names[i])
        j = i
        if m:
            prefix, n = m.group(1), int(m.group(2))
            while j + 1 < len(names):
                nxt = _NUMBERED.match(names[j + 1])
                if not nxt or nxt.group(1) != prefix or int(nxt.group(2)) != n + (j + 1 - i):
                    break
                j += 1
        parts.append(f"{names[i]}..{names[j]}" if j > i else names[i])
        i = j + 1
    return parts


def collectives(steps: Sequence[tuple[str, int, float]]) -> list[dict]:
    """Per kind of collective (a schedule's name, ``transfer`` for point-to-point sends of
    activations), in first-seen order: how many run per iteration, the most members one
    has, and the bytes they send over the iteration (every step, every member). `steps`:
    (kind, members, bytes sent) of each collective or transfer of the iteration."""
    out: dict[str, dict] = {}
    for name, members, sent in steps:
        row = out.setdefault(name, {"kind": name, "count": 0, "members": 0, "bytes": 0.0})
        row["count"] += 1
        row["members"] = max(row["members"], members)
        row["bytes"] += sent
    return list(out.values())


def _bytes(x: float) -> int:
    return int(round(x))


def group_doc(g: DeviceGroup) -> dict:
    """One group as the plan records it: devices (short and counted), device type, stage,
    degrees, and the footprint by kind against the capacity, in whole bytes."""
    fp = g.footprint
    memory = {k: _bytes(getattr(fp, k)) for k in ("parameters", "gradients", "optimiser",
                                                  "activations")}
    if fp.gathered:
        memory["gathered"] = _bytes(fp.gathered)
    memory |= {"total": _bytes(fp.total),
               "capacity": None if g.capacity is None else _bytes(g.capacity)}
    return {"devices": group_label(g.devices), "count": len(g.devices), "device": g.kind,
            **({"stage": g.stage} if g.stage is not None else {}),
            "degrees": dict(g.degrees), "memory": memory}


def layout_doc(groups: Sequence[DeviceGroup], colls: Sequence[dict]) -> dict:
    """The plan's `metadata.layout`: the accounting's assumption, the device groups
    (`group_doc`) and the iteration's collectives (`collectives`), bytes whole."""
    return {"memory_model": f"{OPTIMISER}: 16 bytes per parameter (weights, gradients, fp32 "
                            "moments, fp16/bf16 with an fp32 master copy) plus the activations "
                            "kept for the backward",
            "groups": [group_doc(g) for g in groups],
            "collectives": [c | {"bytes": _bytes(c["bytes"])} for c in colls]}
