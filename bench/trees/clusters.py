"""Cluster files unlike the examples in plans/, generated deterministically from a seed, for
`python -m bench.trees.own_clusters` (issue 16: the tree AllReduce's targets hold for any cluster a
user writes).

- ``ring6``: 6 hosts in a ring, 100 Mbit/s cables;
- ``mesh5``: 5 hosts fully meshed, each cable 50, 100, 150 or 200 Mbit/s (seeded);
- ``rrg10``: 10 hosts, a random 3-regular graph (seeded, connected), 80 Mbit/s;
- ``dumbbell6``: two triangles at 150 Mbit/s joined by two 50 Mbit/s cables with 2 ms delay;
- ``ring4`` (suite ``small``, for the test): 4 hosts in a ring, 200 Mbit/s.

Every file is a plain `kind: Cluster` (direct cables, MTU 9000 like the examples, one CPU
"GPU" per host, NIC names eth0.. in cable order) that `topoctl lab up` and `topoctl plan` take.
"""

from __future__ import annotations

import random

import networkx as nx

MTU = 9000


def cluster_doc(name: str, description: str, n: int,
                cables: list[tuple[int, int, int, float]]) -> dict:
    """A cluster file of `n` hosts h0..h{n-1} joined by `cables` (a, b, Mbit/s, one-way delay
    in ms): each host gets one NIC per cable end, numbered in cable order."""
    used = [0] * n
    links = []
    for a, b, mbit, delay in cables:
        link = {"a": f"h{a}:eth{used[a]}", "b": f"h{b}:eth{used[b]}", "bandwidth": f"{mbit}mbit"}
        if delay:
            link["latency"] = f"{delay:g}ms"
        links.append(link)
        used[a] += 1
        used[b] += 1
    fastest = max(c[2] for c in cables)
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": name,
            "description": description,
            "defaults": {"nic_speed": f"{fastest}mbit", "gpus": {"count": 1, "type": "cpu"}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": f"eth{k}"} for k in range(used[i])]}
                      for i in range(n)],
            "fabric": {"kind": "direct", "mtu": MTU, "links": links}}


def ring(name: str, n: int, mbit: int) -> dict:
    """`n` hosts in a ring of `mbit` Mbit/s cables."""
    return cluster_doc(name, f"{n} hosts in a ring, {mbit} Mbit/s", n,
                       [(i, (i + 1) % n, mbit, 0) for i in range(n)])


def mixed_mesh(name: str, n: int, rates: list[int], rng: random.Random) -> dict:
    """`n` hosts fully meshed, each cable's rate drawn from `rates` (Mbit/s)."""
    cables = [(a, b, rng.choice(rates), 0) for a in range(n) for b in range(a + 1, n)]
    return cluster_doc(name, f"{n} hosts, full mesh, {min(rates)}-{max(rates)} Mbit/s mixed",
                       n, cables)


def random_regular(name: str, n: int, degree: int, mbit: int, seed: int) -> dict:
    """A connected random `degree`-regular graph on `n` hosts (networkx, first connected one
    from `seed` on), `mbit` Mbit/s cables."""
    while True:
        g = nx.random_regular_graph(degree, n, seed=seed)
        if nx.is_connected(g):
            break
        seed += 1
    cables = [(a, b, mbit, 0) for a, b in sorted(tuple(sorted(e)) for e in g.edges())]
    return cluster_doc(name, f"{n} hosts, random {degree}-regular graph (seed {seed}), "
                       f"{mbit} Mbit/s", n, cables)


def dumbbell(name: str, inner: int, bridge: int, delay_ms: float) -> dict:
    """Two triangles (h0-h2, h3-h5) at `inner` Mbit/s joined by two `bridge` Mbit/s cables
    (h2-h3, h0-h5) with `delay_ms` one-way delay: no switch, the bridges are the cut."""
    cables = [(0, 1, inner, 0), (1, 2, inner, 0), (2, 0, inner, 0),
              (3, 4, inner, 0), (4, 5, inner, 0), (5, 3, inner, 0),
              (2, 3, bridge, delay_ms), (0, 5, bridge, delay_ms)]
    return cluster_doc(name, f"two triangles at {inner} Mbit/s joined by two {bridge} Mbit/s "
                       f"cables ({delay_ms:g} ms)", 6, cables)


def suite(name: str = "full", seed: int = 16) -> dict[str, dict]:
    """The cluster files of a suite (`full`: ring6, mesh5, rrg10, dumbbell6; `small`: ring4),
    by name; the same `seed` gives the same files."""
    if name == "small":
        return {"ring4": ring("ring4", 4, 200)}
    if name != "full":
        raise ValueError(f"unknown suite {name!r} (full, small)")
    rng = random.Random(seed)
    return {"ring6": ring("ring6", 6, 100),
            "mesh5": mixed_mesh("mesh5", 5, [50, 100, 150, 200], rng),
            "rrg10": random_regular("rrg10", 10, 3, 80, seed),
            "dumbbell6": dumbbell("dumbbell6", 150, 50, 2)}
