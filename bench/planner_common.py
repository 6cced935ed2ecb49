"""Synthetic clusters for the planner benchmarks (plain cluster-file data)."""

from __future__ import annotations

from math import gcd


def switched(n: int, speed: str = "100gbit", gpu: str = "A100") -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"switch{n}",
            "defaults": {"nic_speed": speed, "gpus": {"count": 1, "type": gpu}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}]} for i in range(n)],
            "fabric": {"kind": "switched", "switches": [{"name": "sw0"}]}}


def direct(n: int, degree: int = 4, speed: str = "100gbit", gpu: str = "A100") -> dict:
    """A TotientPerms-style direct fabric: degree/2 rings with strides coprime to n."""
    strides = [p for p in range(1, n) if gcd(p, n) == 1][: degree // 2 * 3: 3][: degree // 2]
    hosts = [{"name": f"h{i}", "nics": [{"name": f"eth{k}"} for k in range(degree)]}
             for i in range(n)]
    links = []
    for r, p in enumerate(strides):
        for i in range(n):
            links.append({"a": f"h{i}:eth{2 * r}", "b": f"h{(i + p) % n}:eth{2 * r + 1}"})
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"direct{n}",
            "defaults": {"nic_speed": speed, "gpus": {"count": 1, "type": gpu}},
            "hosts": hosts, "fabric": {"kind": "direct", "links": links}}


def job(model: str, params: dict, batch: int, bucket: str = "25MB", dtype: str = "float16",
        method: str = "roofline") -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Job", "name": "bench",
            "model": {"catalog": model, "params": params}, "batch": {"global": batch},
            "dtype": dtype, "sync": {"bucket": bucket}, "cost": {"method": method}}
