"""The cluster a lab really emulates, for predictions that are compared with the lab.

Cables are shaped with HTB on every kernel, but their latency and loss need sch_netem; where
the kernel lacks it (`topoctl lab up` says so) the lab's cables have neither. A prediction made
for the cluster file then charges every lock-step step of a collective the cables' latency the
measurement never sees (hetero8's trees, 64 steps over 1-2 ms cables: +6%).
`topoctl plan --as-lab`, the demo (its OVS row too) and `bench/planner/lab_check.py` (through
`--as-lab`) therefore plan the cluster as the lab emulates it (`lab_emulation`) and print
which latencies they left out.
"""

from __future__ import annotations

import copy
import os

from topoctl.lab import names, netops

__all__ = ["as_emulated", "lab_emulation", "probe_netem"]


def as_emulated(doc: dict) -> tuple[dict, list[str]]:
    """A copy of the cluster document `doc` with every latency and loss set to 0 (defaults,
    links, switches' uplinks, attachments), and the YAML paths that had a non-zero one."""
    out = copy.deepcopy(doc)
    changed: list[str] = []

    def clear(node: dict, path: str) -> None:
        for key in ("latency", "loss"):
            v = node.get(key)
            if v not in (None, 0, "0", "0ms", "0s", "0%"):
                changed.append(f"{path}.{key}")
            if key in node:
                node[key] = 0
    clear(out.get("defaults") or {}, "defaults")
    fabric = out.get("fabric") or {}
    for section in ("links", "switches", "attach"):
        for i, node in enumerate(fabric.get(section) or []):
            if isinstance(node, dict):
                clear(node, f"fabric.{section}[{i}]")
    return out, changed


def probe_netem() -> bool:
    """Whether this kernel has sch_netem (probed in a throwaway namespace, then removed)."""
    ns = f"{names.prefix(names.check_lab_name(f'np{os.getpid() % 10**5}'))}probe"
    netops.run(["ip", "netns", "add", ns])
    try:
        return netops.has_netem(ns)
    finally:
        netops.run(["ip", "netns", "del", ns], check=False)


def lab_emulation(doc: dict) -> tuple[dict, list[str]]:
    """The cluster document `doc` as this kernel's lab emulates it, and the YAML paths it
    left out: `doc` itself where the kernel has sch_netem, else `as_emulated(doc)` (root: the
    probe uses a network namespace)."""
    if probe_netem():
        return doc, []
    return as_emulated(doc)
