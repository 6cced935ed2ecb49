"""Monte-Carlo tree search with PUCT over TAG's per-op-group decisions.

TAG (Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment", IEEE TPDS 2023) searches one op-group per tree level. Each playout descends from
the root by PUCT (Silver et al., "Mastering the game of Go without human knowledge", Nature
2017): child a of node s maximises

    Q(s, a) + c * P(s, a) * sqrt(N(s)) / (1 + N(s, a)),

with P the prior (the GNN's, or uniform), Q the child subtree's mean value blended with its best
(`max_mix`; the reward is deterministic and the search wants the best leaf; an unvisited child
takes its parent's mean: first-play urgency), until it reaches a node not yet expanded;
that node is expanded (its legal actions and their prior) and valued by simulating the default
completion of its partial state (`value`), and the value is backed up the path. A subtree
whose complete states have all been valued is done (MCTS-Solver's idea, Winands et al., CG
2008, for a deterministic single-player reward: its best is known) and never selected again;
the search ends early when the root is done. The search returns the best complete state it
simulated (the reward is deterministic: the best seen is a lower bound of the optimum, and the
result is never worse than any state it valued, e.g. the root's default, the baseline), the
root's visit distribution and every expanded node's (self-play targets for the prior).

Deterministic for a seed: ties in PUCT go to the earlier action of a permutation drawn once per
node from `random.Random(seed)`; no other randomness. With a `time_limit` the number of
playouts depends on the machine (the plan then too): the default budget is a playout count
(and the caller's counted `stop`).
Complexity: O(playouts * depth * branching) besides the value calls (one per playout).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

State = tuple
Legal = Callable[[State], list]
Value = Callable[[State], tuple[float, State]]  # partial state -> (value, its completion)
Prior = Callable[[State, list], Sequence[float]]
Progress = Callable[[int, int, float], None]  # (playouts done, budget, best value)


@dataclass
class Node:
    """A node: its actions with prior, visits and summed values per child."""

    actions: list
    prior: list[float]
    order: list[int]  # tie-break permutation of the action indices
    visits: list[int]
    total: list[float]
    best: list[float]
    done: list[bool]  # the child's subtree fully simulated (every complete state below valued)
    children: dict[int, Node] = field(default_factory=dict)
    n: int = 0
    w: float = 0.0


@dataclass
class SearchResult:
    """The best complete state and its value; the root's actions and visits; playouts and
    value calls made; (state, actions, visits) of every node visited at least twice."""

    best_state: State
    best_value: float
    root_actions: list
    root_visits: list[int]
    playouts: int
    evaluations: int
    targets: list[tuple[State, list, list[int]]]
    stopped_by_time: bool = False
    # (playouts done when it was found, value): each improvement of the best value
    improvements: list[tuple[int, float]] = field(default_factory=list)


def uniform(state: State, actions: list) -> list[float]:
    """The uniform prior (MCTS without the GNN)."""
    return [1.0 / len(actions)] * len(actions)


def _expand(state: State, legal: Legal, prior: Prior, rng: random.Random) -> Node:
    acts = legal(state)
    p = list(prior(state, acts)) if acts else []
    total = sum(p)
    p = [x / total for x in p] if total > 0 else [1.0 / max(1, len(acts))] * len(acts)
    order = list(range(len(acts)))
    rng.shuffle(order)
    return Node(acts, p, order, [0] * len(acts), [0.0] * len(acts), [-math.inf] * len(acts),
                [False] * len(acts))


def _pick(node: Node, c: float, mix: float, lo: float, hi: float) -> int:
    """The PUCT child (ties: the node's permutation order); Q normalised to [0, 1] by the
    lowest and highest value seen (`lo`, `hi`), as MuZero does."""
    sq = math.sqrt(max(1, node.n))
    span = hi - lo if hi > lo else 1.0
    fpu = (node.w / node.n - lo) / span if node.n else 0.0
    best, best_u = node.order[0], -math.inf
    for i in node.order:
        if node.done[i]:  # nothing left to learn below it: its best is known
            continue
        q = (((1 - mix) * node.total[i] / node.visits[i] + mix * node.best[i] - lo) / span
             if node.visits[i] else fpu)
        u = q + c * node.prior[i] * sq / (1 + node.visits[i])
        if u > best_u:
            best, best_u = i, u
    return best


def search(legal: Legal, value: Value, playouts: int, prior: Prior = uniform,
           c_puct: float = 1.0, seed: int = 0, time_limit: float | None = None,
           progress: Progress | None = None, clock: Callable[[], float] = time.perf_counter,
           start: Sequence[State] = (), max_mix: float = 0.5,
           stop: Callable[[], bool] | None = None) -> SearchResult:
    """PUCT search (module docstring) for at most `playouts` playouts (and `time_limit`
    seconds of `clock`). `start`: complete states valued first (anchors: the result is never
    worse than them). `progress` is called every 10% of the budget. `max_mix`: Q blends the
    child's mean with the best value below it, (1 - mix) mean + mix max (single-player search
    of a deterministic reward looks for the best leaf, not the best average). `stop`: asked
    before each playout, True ends the search (a counted cap of the caller's, e.g. on the
    distinct plans simulated: deterministic, unlike `time_limit`)."""
    rng = random.Random(seed)
    t0 = clock()
    best_v, best_s = -math.inf, ()
    evals, lo, hi = 0, math.inf, -math.inf
    done = 0
    improvements: list[tuple[int, float]] = []

    def val(state: State) -> float:
        nonlocal best_v, best_s, evals, lo, hi
        v, full = value(state)
        evals += 1
        lo, hi = min(lo, v), max(hi, v)
        if v > best_v:
            best_v, best_s = v, full
            improvements.append((done, v))
        return v

    for s in start:
        val(s)
    root = _expand((), legal, prior, rng)
    root.n, root.w = 1, val(())
    timed_out, step = False, max(1, playouts // 10)
    while done < playouts and not all(root.done) and not (stop is not None and stop()):
        if time_limit is not None and clock() - t0 > time_limit:
            timed_out = True
            break
        node, state, path = root, (), []
        while True:
            if not node.actions:  # terminal: valued from the caller's cache
                v = val(state)
                break
            i = _pick(node, c_puct, max_mix, lo, hi)
            path.append((node, i))
            state = state + (node.actions[i],)
            child = node.children.get(i)
            if child is None:
                child = node.children[i] = _expand(state, legal, prior, rng)
                v = val(state)
                child.n, child.w = 1, v
                break
            node = child
        _backup(path, v, not child.actions if path else False)
        done += 1
        if progress is not None and done % step == 0:
            progress(done, playouts, best_v)
    return SearchResult(best_s, best_v, root.actions, root.visits, done, evals,
                        _targets(root, ()), timed_out, improvements)


def _backup(path: list[tuple[Node, int]], v: float, finished: bool) -> None:
    """Back the playout's value `v` up its `path` of (node, child index); `finished`: it
    reached a complete state (a subtree is done when all its children are)."""
    for nd, i in reversed(path):
        nd.done[i] = nd.done[i] or finished
        finished = all(nd.done)
    for nd, i in path:
        nd.visits[i] += 1
        nd.total[i] += v
        nd.best[i] = max(nd.best[i], v)
        nd.n += 1
        nd.w += v


def _targets(node: Node, state: State) -> list[tuple[State, list, list[int]]]:
    """(state, actions, visits) of every node with at least two visits, depth first."""
    out = []
    if node.actions and sum(node.visits) >= 2:
        out.append((state, list(node.actions), list(node.visits)))
    for i, ch in sorted(node.children.items()):
        out += _targets(ch, state + (node.actions[i],))
    return out
