"""Generated heterogeneous clusters (cluster-file data) for TAG's self-play and benchmarks.

TAG (Zhang et al., IEEE TPDS 2023) trains its prior on random device topologies of a few
machines and tests on unseen ones. `generated` draws one: hosts of mixed device types (H100,
A100, V100 by the roofline) or CPU hosts of mixed `speed`, on a direct-connect ring with
chords or a switch, cables and NICs of mixed rates. Deterministic for a seed (one
`random.Random`); O(n) hosts and links. Plain data: parse it with
`topoctl.spec.cluster_load.parse_cluster`.
"""

from __future__ import annotations

import random

GPU_TYPES = ("H100", "A100", "V100")
CPU_SPEEDS = (0.25, 0.5, 0.75, 1.0)
RATES = ("10gbit", "25gbit", "40gbit", "100gbit")


def generated(n: int, seed: int, shape: str = "any", compute: str = "gpu") -> dict:
    """A cluster of `n` hosts (`shape`: ``direct``, ``switched`` or ``any``; `compute`:
    ``gpu`` (mixed types) or ``cpu`` (mixed speeds, Mbit/s cables as the lab's))."""
    rng = random.Random(seed)
    kind = rng.choice(("direct", "switched")) if shape == "any" else shape
    rates = RATES if compute == "gpu" else ("50mbit", "100mbit", "200mbit")
    hosts: list[dict] = []
    for i in range(n):
        h: dict = {"name": f"h{i}", "nics": []}
        if compute == "gpu":
            h["gpus"] = {"count": 1, "type": rng.choice(GPU_TYPES)}
        else:
            h["gpus"] = {"count": 1, "type": "cpu"}
            h["speed"] = rng.choice(CPU_SPEEDS)
        hosts.append(h)
    doc: dict = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"gen{n}-{seed}",
                 "defaults": {"nic_speed": rates[-1], "latency": "0ms"}, "hosts": hosts}
    if kind == "switched":
        for h in hosts:
            h["nics"].append({"name": "eth0", "speed": rng.choice(rates)})
        doc["fabric"] = {"kind": "switched", "switches": [{"name": "sw0"}]}
        return doc
    pairs = [(i, (i + 1) % n) for i in range(n)] if n > 2 else [(0, 1)] if n == 2 else []
    chords = [(i, j) for i in range(n) for j in range(i + 2, n) if (j - i) % n not in (1, n - 1)]
    rng.shuffle(chords)
    pairs += chords[: n // 2]
    links = []
    for a, b in pairs:
        ea, eb = len(hosts[a]["nics"]), len(hosts[b]["nics"])
        hosts[a]["nics"].append({"name": f"eth{ea}"})
        hosts[b]["nics"].append({"name": f"eth{eb}"})
        links.append({"a": f"h{a}:eth{ea}", "b": f"h{b}:eth{eb}", "bandwidth": rng.choice(rates)})
    doc["fabric"] = {"kind": "direct", "mtu": 9000, "links": links}
    return doc
