"""Random spanning trees over ranks for the tree tests: each tree attaches the ranks in a random
order to a random rank already placed, roots spread over the ranks (tree t rooted at t mod
world), a random rate per tree. Deterministic per seed."""

from __future__ import annotations

import random


def random_trees(world: int, ntrees: int, seed: int, rates: tuple[float, float] = (0.1, 5.0)
                 ) -> list[dict]:
    """`ntrees` trees over `world` ranks as schedule entries: {"root", "rate", "parents"}."""
    rng = random.Random(seed)
    trees = []
    for t in range(ntrees):
        order = list(range(world))
        rng.shuffle(order)
        root = t % world
        order.remove(root)
        placed = [root]
        parents: list[int | None] = [None] * world
        for r in order:
            parents[r] = rng.choice(placed)
            placed.append(r)
        trees.append({"root": root, "rate": rng.uniform(*rates), "parents": parents})
    return trees
