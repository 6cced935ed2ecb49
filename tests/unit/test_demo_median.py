"""`python -m bench.demo_median` merges demo runs, the OVS row included (present in some runs
only when others ran with --no-ovs)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.demo_median import median_table


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
