"""TopoOpt in the lab (root): the 12-host degree-4 testbed cabled three ways, each planned,
built, applied and trained on for real; predicted vs measured iteration time side by side.

- topoopt:  the `topoopt` strategy's cabling, routes (host forwarding, multipath) and AllReduce;
- ring:     the same 24 cables as a plain double ring (h_i -- h_i+1 twice), `baseline` strategy;
- expander: the same 24 cables as a random 4-regular graph (seeded), `baseline` strategy.

    python -m bench.topoopt.lab [--job plans/mlp-job.yaml] [--iterations 5] [--json]

Each variant gets its own lab (named tpoNNN), removed at the end even on failure. Ratios are
iteration-time ratios against topoopt in the same run."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import networkx as nx
import yaml

from bench.common import ROOT


def ring_fabric(n: int, mtu: int) -> dict:
    links = [{"a": f"h{i}:eth{2 * k}", "b": f"h{(i + 1) % n}:eth{2 * k + 1}"}
             for k in range(2) for i in range(n)]
    return {"kind": "direct", "mtu": mtu, "links": links}


def expander_fabric(n: int, d: int, mtu: int, seed: int = 1) -> dict:
    while True:
        g = nx.random_regular_graph(d, n, seed=seed)
        if nx.is_connected(g):
            break
        seed += 1
    used = dict.fromkeys(range(n), 0)
    links = []
    for a, b in sorted(g.edges()):
        links.append({"a": f"h{a}:eth{used[a]}", "b": f"h{b}:eth{used[b]}"})
        used[a] += 1
        used[b] += 1
    return {"kind": "direct", "mtu": mtu, "links": links}


def measure(cluster, job, fabric, strategy: str, iterations: int, tmp: Path) -> dict:
    from topoctl import cli
    from topoctl.lab import lab as labmod
    from topoctl.planner import make_plan

    c = cluster.with_fabric(fabric) if fabric is not None else cluster
    j = job.model_copy(update={"strategies": [strategy]})
    # the lab ranks' ops timed again when planning: this VM's speed drifts (docs/planner.md)
    plan, _, _ = make_plan(c, j, retime=True)
    path = tmp / f"{strategy}-plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    name = f"tpo{os.getpid() % 1000}"
    lab = labmod.up(c, name=name, fabric=plan["fabric"], with_ssh=False)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if cli.main(["apply", str(path), "--lab", lab.name]) != 0:  # 0: applied
                raise SystemExit(f"{strategy}: apply failed")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = cli.main(["run", str(path), "--lab", lab.name, "--iterations",
                             str(iterations), "--json", "--timeout", "1800"])
        result = json.loads(buf.getvalue())
        if code:
            raise SystemExit(f"{strategy}: training failed: {result.get('failure')}")
    finally:
        labmod.down(name)
    meta = plan["metadata"]
    return {"predicted": meta["prediction"]["iteration_time"],
            "measured": result["iteration_time"], "synchronous": result["synchronous"],
            "collective": plan["job"]["collective"]["algorithm"],
            "topology": meta.get("collective", {}).get("topology")}


def main(argv: list[str] | None = None) -> int:
    from topoctl.spec.cluster_load import load_cluster
    from topoctl.spec.job import load_job

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", default=str(ROOT / "plans" / "topoopt12-cluster.yaml"))
    ap.add_argument("--job", default=str(ROOT / "plans" / "mlp-job.yaml"))
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cluster, job = load_cluster(args.cluster), load_job(args.job)
    n, mtu = len(cluster.hosts), cluster.fabric.mtu
    d = min(len(h.nics) for h in cluster.hosts)
    variants = {"topoopt": (None, "topoopt"), "ring": (ring_fabric(n, mtu), "baseline"),
                "expander": (expander_fabric(n, d, mtu), "baseline")}
    out = {}
    with tempfile.TemporaryDirectory(prefix="topoopt-lab-") as tmp:
        os.environ.setdefault("TOPOCTL_LAB_DIR", str(Path(tmp) / "labs"))
        for name, (fabric, strategy) in variants.items():
            print(f"{name}: planning, building the lab, training ...", file=sys.stderr)
            out[name] = measure(cluster, job, fabric, strategy, args.iterations, Path(tmp))
    base = out["topoopt"]
    for r in out.values():
        r["predicted_ratio"] = r["predicted"] / base["predicted"]
        r["measured_ratio"] = r["measured"] / base["measured"]
    out["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'fabric':<10} {'predicted s':>12} {'measured s':>11} {'error':>7} "
          f"{'pred/topoopt':>13} {'meas/topoopt':>13}")
    for name in variants:
        r = out[name]
        err = 100 * (r["predicted"] - r["measured"]) / r["measured"]
        print(f"{name:<10} {r['predicted']:>12.3f} {r['measured']:>11.3f} {err:>+6.0f}% "
              f"{r['predicted_ratio']:>13.2f} {r['measured_ratio']:>13.2f}")
    print(f"load average {' '.join(out['loadavg'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
