"""The demo's Open vSwitch row: the bandwidth-allocated plan applied through OVS.

`bench/demo/run.py` measures `baseline+bandwidth` with the tc driver on the hetero8 lab; this runs
the same strategy on an OVS-marked copy of the cluster (every host `ovs: true`): `lab up` starts
an ovsdb-server and an ovs-vswitchd (userspace datapath) per host, the plan puts each host's
fabric NICs on bridge tpbr0 with its addresses on internal port tpovs0 and the per-destination
classes as OVS queues (`qos.driver: ovs`), and the agent applies them through OVSDB plus tc u32
destination filters on the HTB qdisc OVS made (the userspace datapath ignores set_queue).

Besides the prediction and the measurement, the row records what the stock tools read on each
host after training (`ovs_classes`): per planned class, its OVS queue (ovs-vsctl), the agent's
tc filter pointing at its HTB class, and the bytes that class sent (tc -s): the evidence that the
training traffic went through OVS's per-destination queues.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.demo.summary import plan_summary

OVS_STRATEGY = "baseline+bandwidth"
OVS_ROW = f"{OVS_STRATEGY} (ovs)"


def ovs_cluster(path: Path):
    """The cluster file at `path` with every host marked `ovs: true` (and `-ovs` appended to its
    name): the same fabric, each host behind its own Open vSwitch, as this kernel's lab
    emulates it (`topoctl.lab.emulated.lab_emulation`: no latency or loss without sch_netem)."""
    from topoctl.lab.emulated import lab_emulation
    from topoctl.spec.cluster_load import parse_cluster

    doc, _ = lab_emulation(yaml.safe_load(path.read_text()))
    doc["name"] = f"{doc['name']}-ovs"
    doc.setdefault("defaults", {})["ovs"] = True
    for h in doc.get("hosts", []):
        h["ovs"] = True
    return parse_cluster(doc, f"{path} (every host ovs: true)")


def _sent(lab, host: str, what: str, dev: str) -> dict[str, int]:
    """Handle -> bytes sent, from `tc -s WHAT show dev DEV` (text: iproute2's JSON of HTB
    statistics is not valid JSON here)."""
    out = lab.exec(host, ["tc", "-s", what, "show", "dev", dev], check=True, timeout=30).stdout
    sent, handle = {}, None
    for line in out.splitlines():
        m = re.match(r"(?:class|qdisc) \S+ (\S+) (root|parent)", line)
        if m:
            handle = m.group(1) if what == "class" or m.group(2) == "root" else None
        m = re.match(r"\s*Sent (\d+) bytes", line)
        if m and handle is not None:
            sent[handle] = int(m.group(1))
            handle = None
    return sent


def ovs_classes(lab, plan: dict) -> list[dict]:
    """Per OVS QoS class of the plan, what the host's own tools report after the run: `host`,
    `dev`, `dst`, `rate`, `queue` (its OVS queue's min-rate in bit/s, ovs-vsctl; None: no such
    queue), `filter` (the agent's u32 filter sends `dst` to the class), `bytes` (sent by HTB
    class 1:(id+1), tc -s) and `dev_bytes` (sent by the whole qdisc of `dev`)."""
    addr_host = {a.split("/")[0]: h for h, st in plan["hosts"].items()
                 for i in st.get("interfaces", []) for a in i.get("addresses", [])}
    rows = []
    for host, st in sorted(plan["hosts"].items()):
        for q in st.get("qos", []):
            if q.get("driver") != "ovs":
                continue
            dev = q["dev"]
            o = lab.ovs(host)
            qos = o.vsctl("get", "port", dev, "qos").strip()
            queues = {}
            if qos not in ("", "[]"):
                for qid, uuid in _ovs_map(o.vsctl("get", "qos", qos, "queues")).items():
                    cfg = _ovs_map(o.vsctl("get", "queue", uuid, "other_config"))
                    queues[int(qid)] = int(cfg.get("min-rate", "0"))
            sent = _sent(lab, host, "class", dev)
            root = list(_sent(lab, host, "qdisc", dev).values())
            filters = lab.exec(host, ["tc", "filter", "show", "dev", dev, "parent", "1:"],
                               check=True, timeout=30).stdout
            for c in q["classes"]:
                handle = f"1:{c['id'] + 1:x}"
                rows.append({
                    "host": host, "dev": dev, "dst": c["dst"],
                    "dst_host": addr_host.get(c["dst"].split("/")[0]),
                    "rate": c["rate"], "ceil": c.get("ceil", c["rate"]), "class": handle,
                    "queue": queues.get(c["id"]),
                    "filter": f"flowid {handle}" in filters,
                    "bytes": sent.get(handle, 0),
                    "dev_bytes": root[0] if root else 0})
    return rows


def _ovs_map(text: str) -> dict[str, str]:
    """ovs-vsctl's `{k=v, k="v"}` map output as a dict."""
    body = text.strip().strip("{}").strip()
    out = {}
    for item in body.split(",") if body else []:
        k, _, v = item.strip().partition("=")
        out[k.strip().strip('"')] = v.strip().strip('"')
    return out


def nic_tx(lab, plan: dict) -> dict[str, dict[str, int]]:
    """Host -> bytes each of its OVS bridge's NICs sent (ip -s link): where the traffic went,
    whichever class carried it."""
    out = {}
    for host, st in sorted(plan["hosts"].items()):
        ports = {p for b in (st.get("ovs") or {}).get("bridges", []) for p in b["ports"]}
        links = json.loads(lab.exec(host, ["ip", "-s", "-j", "link"], check=True,
                                    timeout=30).stdout)
        out[host] = {x["ifname"]: x["stats64"]["tx"]["bytes"] for x in links
                     if x["ifname"] in ports}
    return out


def describe(rows: list[dict]) -> list[str]:
    """One line per class: where it is, its planned rate and what went through it."""
    return [f"{r['host']} {r['dev']} -> {r['dst_host'] or r['dst']} ({r['class']}, rate "
            f"{r['rate']}, ceil {r['ceil']}, OVS queue "
            f"{'min-rate ' + str(r['queue']) if r['queue'] is not None else 'MISSING'}, "
            f"{'u32 filter' if r['filter'] else 'NO FILTER'}): {r['bytes'] / 1e6:.1f} MB, "
            f"{r['bytes'] / max(r['dev_bytes'], 1):.1%} of {r['dev']}'s bytes" for r in rows]


def ovs_row(cluster_file: Path, job_doc: dict, iterations: int, out: Path, lab_name: str,
            measure: Callable, log: Callable[[str], None],
            check: Callable | None = None) -> dict:
    """Plan `baseline+bandwidth` on the OVS-marked copy of `cluster_file`, build its lab (OVS
    per host), apply and train `iterations` iterations with `measure(name, plan, transport,
    iterations)` (bench/demo/run.py's), read the OVS classes, call `check(lab, plan, row)` if given
    (tests), and remove the lab and its OVS daemons, also on failure or interrupt. The row:
    strategy, plan (`bench.demo.summary.plan_summary`), predicted, the measurement and
    `ovs_classes`."""
    from topoctl.lab import lab as labmod
    from topoctl.planner import make_plan
    from topoctl.rollout.transports.ssh import lab_ssh_transport
    from topoctl.spec.job import parse_job

    cluster = ovs_cluster(cluster_file)
    job = parse_job({**job_doc, "strategies": [OVS_STRATEGY]}, f"job[{OVS_STRATEGY}]")
    plan, _, _ = make_plan(cluster, job)
    (out / "plan-baseline+bandwidth-ovs.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    log(f"lab {lab_name}: building {len(cluster.hosts)} hosts from {cluster_file.name}, every "
        "host behind its own Open vSwitch")
    lab = labmod.up(cluster, name=lab_name)  # removes what it made if it fails
    try:
        transport = lab_ssh_transport(lab)
        try:
            m = measure(OVS_ROW, plan, transport, iterations)
        finally:
            transport.close()
        classes = ovs_classes(lab, plan)
        tx = nic_tx(lab, plan)
        for line in describe(classes):
            log(f"{OVS_ROW}: class {line}")
        for host, nics in tx.items():
            log(f"{OVS_ROW}: {host} sent " + ", ".join(f"{n} {b / 1e6:.1f} MB"
                                                    for n, b in sorted(nics.items())))
        row = {"strategy": OVS_ROW, "plan": plan_summary(plan),
               "predicted": plan["metadata"]["prediction"]["iteration_time"],
               **m, "ovs_classes": classes, "ovs_nic_tx": tx}
        if check is not None:
            check(lab, plan, row)
    finally:
        labmod.down(lab_name)
        log(f"lab {lab_name} removed (OVS daemons with it)")
    return row
