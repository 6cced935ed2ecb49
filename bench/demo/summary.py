"""What a demo row's plan does, in a few words (`plan_summary`): shared by the demo's rows
(`bench.demo.run`) and its Open vSwitch row (`bench.demo.ovs`)."""

from __future__ import annotations


def _hosts_word(hosts: list[str]) -> str:
    return f"1 host ({hosts[0]})" if len(hosts) == 1 else f"{len(hosts)} hosts"


def plan_summary(plan: dict) -> str:
    """What a plan does, in a few words, from its `job` and `hosts` sections: the hosts that
    hold a part of the model, then the collective (ring, N trees) or the pipeline (whole
    model, N stages, N replicas), the cables of a plan that re-cables (TopoOpt's topology in
    `metadata.collective`), then the per-destination bandwidth classes it sets, if any.
    E.g. "8 hosts, ring", "8 hosts, 3 trees, bandwidth classes: 16",
    "8 hosts, ring, 4 buckets (forward overlap)", "8 hosts, ring, SFB on 4 layers",
    "8 hosts, 8 trees, re-cabled: 8 cables", "1 host (h0): whole model"."""
    job = plan.get("job") or {}
    coll = job.get("collective") or {}
    algo = coll.get("algorithm")
    if algo == "pipeline":
        stages = coll.get("stages") or []
        used = list(dict.fromkeys(h for s in stages for h in s.get("hosts", [])))
        replicas = int(coll.get("replicas") or 1)
        what = "whole model" if len(stages) == 1 else f"{len(stages)} stages"
        if replicas > 1:
            what += f", {replicas} replicas"
        text = f"{_hosts_word(used)}: {what}"
    else:
        used = list(coll.get("order") or sorted(job.get("processes") or {}))
        if algo == "trees":
            trees = len((coll.get("schedule") or {}).get("trees") or [])
            what = f"{trees} tree" + ("s" if trees != 1 else "")
        else:
            what = str(algo or "no collective")
        if coll.get("bucket_plan"):  # DisCo's buckets, named by the plan
            what += f", {len(coll['bucket_plan'])} buckets"
            if coll.get("bucket_overlap") == "forward":
                what += " (forward overlap)"
        if job.get("sfb"):
            what += f", SFB on {len(job['sfb'])} layers"
        text = f"{_hosts_word(used)}, {what}"
    # a topology strategy (topoopt) cables the hosts its own way: the plan's `fabric`
    if ((plan.get("metadata") or {}).get("collective") or {}).get("topology"):
        text += f", re-cabled: {len((plan.get('fabric') or {}).get('links') or [])} cables"
    classes = sum(len(q.get("classes") or []) for st in (plan.get("hosts") or {}).values()
                  for q in st.get("qos") or [])
    if classes:
        text += f", bandwidth classes: {classes}"
    return text
