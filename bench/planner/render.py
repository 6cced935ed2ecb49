"""Benchmark: render a plan for 1,024 hosts (target <= 10 s): shortest-path routing, addresses,
one HostState per host (1,023 routes each), the launch spec, and the YAML text; then, timed
separately, validating every host against the agent's schema. Degree-4 direct fabric (host
forwarding, the heavier case) and one switch.

    python -m bench.planner.render [HOSTS]
"""

from __future__ import annotations

import argparse
import time

from bench.common import direct, switched
from topoagent.state.host import parse_host_state
from topoctl.cli.plan import dump_plan
from topoctl.render.addressing import assign
from topoctl.render.hoststate import render_hosts
from topoctl.render.plan import fabric_wiring, plan_document
from topoctl.sim.routing import shortest_next_hops
from topoctl.spec.cluster_load import parse_cluster


def main(n: int = 1024, validate: bool = True) -> None:
    for name, data in (("direct-d4", direct(n, 4)), ("switch", switched(n))):
        cluster = parse_cluster(data)
        t0 = time.perf_counter()
        g = cluster.graph()
        hops = shortest_next_hops(g)
        t1 = time.perf_counter()
        addr = assign(g)
        hosts = render_hosts(g, hops, addr)
        doc = plan_document({"cluster": cluster.name}, fabric_wiring(cluster, g), hosts, {})
        t2 = time.perf_counter()
        text = dump_plan(doc)
        t3 = time.perf_counter()
        routes = sum(len(s["routes"]) for s in hosts.values())
        line = (f"{name:10} hosts={n} routes={routes} routing={t1 - t0:.2f}s "
                f"states={t2 - t1:.2f}s yaml={t3 - t2:.2f}s ({len(text) / 1e6:.0f} MB) "
                f"render_total={t3 - t0:.2f}s")
        if validate:
            for h, st in hosts.items():
                parse_host_state(st, prefix=f"hosts.{h}")
            line += f" validate={time.perf_counter() - t3:.2f}s"
        print(line, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hosts", nargs="?", type=int, default=1024, help="hosts (1024)")
    main(ap.parse_args().hosts)
