"""`python -m bench.demo.median` merges demo runs, the OVS row included (present in some runs
only when others ran with --no-ovs)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.demo.median import median_table


def _run(path: Path, rows: dict[str, float], ovs: float | None = None) -> Path:
    doc = {"allreduce_optimum": 1.0,
           "rows": [{"strategy": s, "predicted": 4.0, "measured": m} for s, m in rows.items()]}
    if ovs is not None:  # the demo's OVS row, with its evidence fields
        doc["rows"].append({"strategy": "baseline+bandwidth (ovs)", "predicted": 4.0,
                            "measured": ovs, "ovs_classes": [], "ovs_nic_tx": {}})
    path.write_text(json.dumps(doc))
    return path


def test_median_table_keeps_the_ovs_row_and_counts_its_runs(tmp_path):
    runs = [_run(tmp_path / "r1.json", {"baseline": 4.0, "baseline+bandwidth": 4.2}, 4.4),
            _run(tmp_path / "r2.json", {"baseline": 4.2, "baseline+bandwidth": 4.0}, 4.6),
            _run(tmp_path / "r3.json", {"baseline": 4.1, "baseline+bandwidth": 4.1})]
    lines = median_table(runs).splitlines()
    (ovs,) = [ln for ln in lines if ln.startswith("baseline+bandwidth (ovs) |")]
    assert "4.500 (4.400-4.600; 2 of 3 runs)" in ovs
    (base,) = [ln for ln in lines if ln.startswith("baseline |")]
    assert "4.100 (4.000-4.200) |" in base  # in every run: no count
    assert lines[-1].startswith("3 runs")


def test_median_table_says_what_each_plan_is_once(tmp_path):
    runs = []
    for k, placement in enumerate(["1 host (h0): whole model", "1 host (h0): whole model",
                                   "2 hosts: 2 stages"]):
        path = tmp_path / f"r{k}.json"
        path.write_text(json.dumps({"allreduce_optimum": 1.0, "rows": [
            {"strategy": "baseline", "plan": "8 hosts, ring", "predicted": 4.0, "measured": 4.0},
            {"strategy": "placement", "plan": placement, "predicted": 0.1, "measured": 0.1}]}))
        runs.append(path)
    lines = median_table(runs).splitlines()
    assert lines[0].split(" | ")[:3] == ["strategy", "plan", "predicted s/it"]
    (base,) = [ln for ln in lines if ln.startswith("baseline |")]
    assert base.split(" | ")[1] == "8 hosts, ring"
    (pl,) = [ln for ln in lines if ln.startswith("placement |")]
    # runs that planned differently: each plan once
    assert pl.split(" | ")[1] == "1 host (h0): whole model / 2 hosts: 2 stages"


def test_median_table_without_an_allreduce_optimum(tmp_path):
    path = tmp_path / "r1.json"  # a run of strategies without packed trees: no optimum
    path.write_text(json.dumps({"allreduce_optimum": None, "rows": [
        {"strategy": "placement", "plan": "1 host (h0): whole model", "predicted": 0.12,
         "measured": 0.15}]}))
    lines = median_table([path]).splitlines()
    (pl,) = [ln for ln in lines if ln.startswith("placement |")]
    assert pl.split(" | ")[-2:] == ["-", "-"]
    assert lines[-1] == "1 runs; no AllReduce optimum (no trees)."
