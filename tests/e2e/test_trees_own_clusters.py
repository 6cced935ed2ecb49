"""`python -m bench.trees.own_clusters` end to end: its cluster generator is deterministic and every
file it makes is a valid cluster unlike the examples; the bench's small suite (a 4-host ring)
goes through `topoctl plan`, `lab up`, `apply`, `run` and `lab down` for real and reports sane
figures, leaving no namespace behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.trees import clusters as own_clusters
from topoctl.spec.cluster_load import parse_cluster

ROOT = Path(__file__).resolve().parents[2]


def test_generator_is_deterministic_and_unlike_the_examples():
    full = own_clusters.suite("full", seed=16)
    assert full == own_clusters.suite("full", seed=16)
    assert full["rrg10"] != own_clusters.suite("full", seed=17)["rrg10"]
    examples = [yaml.safe_load(p.read_text()) for p in (ROOT / "plans").glob("*-cluster.yaml")]
    assert len(examples) >= 7
    shapes = {(len(c["hosts"]), len(c["fabric"].get("links") or [])) for c in examples}
    for name, doc in full.items():
        cluster = parse_cluster(doc)
        assert len(cluster.hosts) <= 10, name
        assert cluster.fabric.mtu == 9000, name
        assert (len(cluster.hosts), len(cluster.fabric.links)) not in shapes, name
        # every NIC carries exactly one cable
        assert sum(len(h.nics) for h in cluster.hosts) == 2 * len(cluster.fabric.links), name
    degrees = {len(h.nics) for h in parse_cluster(full["rrg10"]).hosts}
    assert degrees == {3}
    with pytest.raises(ValueError, match="unknown suite"):
        own_clusters.suite("huge")


# not serial: it asserts bounds that hold on a busy machine too (nothing beats the optimum;
# the error is what the figures say), and its timings go to a cache of its own
@pytest.mark.netns
def test_small_suite_through_the_users_path(tmp_path):
    # `--retime` measures the ops and the runtime calibration again and caches them: into a
    # cache of this test's own, never the machine's (benchmarks after CI would use figures
    # measured under the test suite's load)
    cache, out = tmp_path / "cache", tmp_path / "out"
    # the demo's job with a quarter of its width: the same path, a fraction of the timing
    job = yaml.safe_load((ROOT / "plans" / "mlp-job.yaml").read_text())
    job["model"]["params"] |= {"layers": 2, "hidden": 256}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    r = subprocess.run([sys.executable, "-m", "bench.trees.own_clusters",
                        "--suite", "small", "--iterations", "3", "--out", str(out),
                        "--job", str(tmp_path / "job.yaml"), "--batch", "16",
                        "--json"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=os.environ | {"TOPOCTL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    (row,) = doc["rows"]
    assert row["cluster"] == "ring4" and row["strategy"] == "trees" and row["synchronous"]
    assert row["measured_s"] > 0 and row["predicted_s"] > 0 and row["optimum_s"] > 0
    # the optimum is a bound on the AllReduce alone: no iteration can beat it
    assert row["optimum_over_measured"] < 1.0
    assert row["error_pct"] == pytest.approx(
        100 * (row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    assert len(row["loadavg_start"]) == 3
    # a reader can redo it: the cluster, job and plan files are kept next to the results
    kept = out / "ring4"
    assert yaml.safe_load((kept / "job.yaml").read_text())["strategies"] == ["trees"]
    assert parse_cluster(yaml.safe_load((kept / "cluster.yaml").read_text()))
    assert (kept / "plan.yaml").exists() and (out / "results.md").exists()
    results = json.loads((out / "results.json").read_text())
    assert results["rows"][0]["lab"] == row["lab"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"tp-{row['lab']}-" not in left
    assert list((cache / "runtime").glob("*.json")), "the calibration went to the test's cache"
