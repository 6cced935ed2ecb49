"""Issue 34, evaluation 1's gap: would deep speed-ordered pipelines as anchors reach the plans
MCMC finds and MCTS does not (4-5 stages on unequal replica sets)?

    python -m bench.tag.deep_anchors [--top 60] [--all]

A candidate family, valued with tag's own evaluator (the simulator, roofline costs): the
fastest m hosts (by the whole model's seconds on each host), cut in speed order into k <= 5
consecutive replica sets of any sizes (every composition of m), each set a pipeline stage
over a contiguous run of op-groups, the cuts chosen by dynamic programming to minimise the
slowest stage's compute (a stage runs at its slowest member's pace, its replicas splitting
the rows; communication left out). The `top` candidates by that estimate are simulated with
ring and ring+shares syncs. Printed against tag's and MCMC's figures from evaluation 1
(docs/results.md). The family is NOT in tag's search (an experiment; see docs/results.md).
Cost: O(2^m * k * groups^2) estimates, 2 * top simulations."""

from __future__ import annotations

import itertools
import math
import sys
import time

from bench.common import PLANS
from bench.tag import sim as tag_sim
from topoagent.cliutil import ArgumentParser
from topoctl.planner import prepare
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.tag import kit
from topoctl.tag.clusters import generated
from topoctl.tag.evaluator import Evaluator
from topoctl.tag.problem import build_space, op_groups
from topoctl.tag.space import Plan, Stage
from topoctl.tag.train import job_doc

MAX_STAGES = 5
# (name, cluster, model, batch, tag ms, MCMC ms): evaluation 1's cases where MCMC beat tag
CASES = [("gen8-cpu-104", lambda: parse_cluster(generated(8, 104, compute="cpu")), "bert", 64),
         ("switch8", lambda: load_cluster(PLANS / "switch8-cluster.yaml"), "bert", 64),
         ("gen4-gpu-101", lambda: parse_cluster(generated(4, 101, compute="gpu")), "vgg", 256),
         ("gen4-gpu-101", lambda: parse_cluster(generated(4, 101, compute="gpu")), "resnet",
          256)]


def compositions(m: int, k: int):
    """Every way to write m as k positive parts, in order. O(C(m-1, k-1))."""
    for cuts in itertools.combinations(range(1, m), k - 1):
        b = (0, *cuts, m)
        yield [b[i + 1] - b[i] for i in range(k)]


def balanced_cuts(pace, n: int, sets: list[list[int]]) -> tuple[float, list[int]]:
    """(the slowest stage's pace, each stage's first group) minimising the slowest stage over
    contiguous cuts of `n` groups into len(sets) stages; `pace(set, a, b)` is the stage's
    seconds for groups [a, b). Dynamic programming, O(k * n^2)."""
    k = len(sets)
    f = [[math.inf] * (n + 1) for _ in range(k + 1)]
    arg = [[0] * (n + 1) for _ in range(k + 1)]
    f[0][0] = 0.0
    for s in range(1, k + 1):
        for b in range(s, n - (k - s) + 1):
            for a in range(s - 1, b):
                v = max(f[s - 1][a], pace(sets[s - 1], a, b))
                if v < f[s][b]:
                    f[s][b], arg[s][b] = v, a
    firsts, b = [], n
    for s in range(k, 0, -1):
        b = arg[s][b]
        firsts.append(b)
    return f[k][n], firsts[::-1]


def candidates(times: list[list[float]], sizes: tuple[int, ...]) -> list[tuple]:
    """(estimate, host index sets, first group per stage), best estimate first."""
    n, hosts = len(times), len(times[0])
    order = sorted(range(hosts), key=lambda j: (sum(r[j] for r in times), j))

    def pace(hs: list[int], a: int, b: int) -> float:
        return sum(max(times[g][h] for h in hs) for g in range(a, b)) / len(hs)

    out = []
    for m in range(1, hosts + 1):
        for k in range(1, min(MAX_STAGES, m, n) + 1):
            for comp in compositions(m, k):
                if any(c not in sizes for c in comp):
                    continue
                bounds = list(itertools.accumulate(comp, initial=0))
                sets = [order[bounds[i]:bounds[i + 1]] for i in range(k)]
                est, firsts = balanced_cuts(pace, n, sets)
                out.append((est, sets, firsts))
    return sorted(out, key=lambda c: (c[0], len(c[1])))


def plan_for(space, sets: list[list[int]], firsts: list[int], n: int, shares: bool) -> Plan:
    """The staged plan of one candidate (ring or ring+shares on replicated stages)."""
    stages = []
    for s, (hs, a) in enumerate(zip(sets, firsts, strict=True)):
        last = firsts[s + 1] - 1 if s + 1 < len(firsts) else n - 1
        hosts = tuple(space.hosts[h] for h in sorted(hs))
        sync = "none" if len(hs) == 1 else ("ring+shares" if shares else "ring")
        stages.append(Stage(a, last, hosts, sync))
    return Plan("pp", stages=tuple(stages))


def one_case(cluster, model: str, batch: int, top: int) -> tuple[float, str, int, float]:
    """(best ms, its shape, plans simulated, seconds)."""
    ctx = prepare(cluster, parse_job(job_doc(model, batch) | {"strategies": ["tag"]}),
                  use_cache=False)
    groups = op_groups(ctx, 24, kit())
    ev = Evaluator(ctx, groups, kit())
    space = build_space(ctx, groups, ("ring",), kit(), True, ev.times)
    t0 = time.perf_counter()
    best = (math.inf, "")
    for _, sets, firsts in candidates(ev.times, space.sizes)[:top]:
        for shares in (False, True):
            t = ev.time(plan_for(space, sets, firsts, len(groups), shares))
            shape = "+".join(str(len(s)) for s in sets) + (" shares" if shares else "")
            best = min(best, (t, shape))
    return best[0] * 1e3, best[1], len(ev.cache), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="bench.tag.deep_anchors", description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=60, help="candidates simulated (by estimate)")
    ap.add_argument("--all", action="store_true",
                    help="every case of evaluation 1 (bench.tag.sim), not only MCMC's four")
    a = ap.parse_args(argv)
    cases = [(n, lambda c=c: c, m, b) for n, c, _ in tag_sim.clusters(False)
             for m, b in tag_sim.MODELS] if a.all else CASES
    print("| cluster | model | best deep pipeline ms | hosts per stage | plans simulated | s |")
    print("|---|---|---|---|---|---|")
    for name, make, model, batch in cases:
        ms, shape, sims, s = one_case(make(), model, batch, a.top)
        print(f"| {name} | {model} | {ms:.2f} | {shape} | {sims} | {s:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
