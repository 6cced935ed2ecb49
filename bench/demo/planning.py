"""The demo's cluster, job and planning, shared by its rows (`bench.demo.run`) and the child
that plans the pipeline strategies ahead (`bench.demo.ahead`)."""

from __future__ import annotations

import yaml

from bench.common import ROOT

CLUSTER = ROOT / "plans" / "hetero8-cluster.yaml"
# every lab host computes at a fixed share (an eighth of the machine here, `topoctl.lab.cpu`),
# so a plan on fewer hosts is not sped up by the idle hosts' cores: with this job the whole
# model on one host is slower than the data-parallel plans on good network plans (trees),
# faster than the ring over the 50 Mbit/s cables (plans/mlp-job.yaml's 16 MB of gradients
# would keep it on one host)
JOB = ROOT / "bench" / "jobs" / "mlp-demo-job.yaml"


def demo_cluster() -> tuple[object, list[str]]:
    """The demo's cluster as this kernel's lab emulates it (`topoctl.lab.emulated`: without
    sch_netem no latency or loss), and what the lab could not emulate (empty: nothing)."""
    from topoctl.lab.emulated import lab_emulation  # the planner's imports: torch
    from topoctl.spec.cluster_load import load_cluster, parse_cluster

    doc, cleared = lab_emulation(yaml.safe_load(CLUSTER.read_text()))
    if not cleared:
        return load_cluster(CLUSTER), []
    return parse_cluster(doc, f"{CLUSTER} (as emulated)"), cleared


def job_document() -> dict:
    """The demo's job file as a document (each plan sets its own `strategies`)."""
    return yaml.safe_load(JOB.read_text())


def plan_for(cluster, job_doc: dict, strategy: str) -> dict:
    """The plan of `job_doc` with `strategy` only, the ranks' step timed as `--retime` does:
    once per process (again after `topoctl.graph.profile.forget_retimed`; a child planning
    ahead counts its parent's timings, `adopt_retimed`), then from the cache that timing
    filled."""
    from topoctl.planner import make_plan  # imports torch
    from topoctl.spec.job import parse_job

    job = parse_job({**job_doc, "strategies": [strategy]}, f"{JOB}[{strategy}]")
    plan, _, _ = make_plan(cluster, job, retime=True)
    return plan
