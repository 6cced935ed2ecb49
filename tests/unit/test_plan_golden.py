"""Golden plans: every example cluster x job in plans/ (the job as written), and every strategy
on each direct-connect example cluster (mlp), plan to the same bytes as the recorded ones
(tests/unit/golden/plans.sha256). A refactor must leave them alone; a change that means to move
a plan rewrites the record and says why in its commit:

    .venv/bin/python -m tests.unit.test_plan_golden --write
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import yaml

from topoctl.cli import main

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "plans"
RECORD = Path(__file__).parent / "golden" / "plans.sha256"
# every strategy but the alias "bandwidth" (= baseline+bandwidth), named here so that a new
# strategy does not move the recorded plans
EVERY_STRATEGY = ["baseline", "baseline+bandwidth", "pipeline", "placement", "topoopt", "trees",
                  "trees+bandwidth"]
# the direct-connect examples: topoopt plans only there
EVERY_STRATEGY_ON = ["fast4", "hetero8", "mesh4", "topoopt12", "tworack8"]


def cases() -> list[tuple[str, str, bool]]:
    """(cluster, job, every strategy?) for each recorded plan."""
    clusters = sorted(p.name.removesuffix("-cluster.yaml") for p in PLANS.glob("*-cluster.yaml"))
    jobs = sorted(p.name.removesuffix("-job.yaml") for p in PLANS.glob("*-job.yaml"))
    return ([(c, j, False) for c in clusters for j in jobs]
            + [(c, "mlp", True) for c in EVERY_STRATEGY_ON])


def case_name(cluster: str, job: str, every: bool) -> str:
    return f"{cluster}__{job}" + ("__every-strategy" if every else "")


def plan_bytes(cluster: str, job: str, every: bool, tmp: Path) -> bytes:
    """The plan `topoctl plan --no-cache` writes for the case (roofline costs: no machine's
    timings enter it)."""
    job_file = PLANS / f"{job}-job.yaml"
    if every:
        spec = yaml.safe_load(job_file.read_text())
        spec["strategies"] = EVERY_STRATEGY
        job_file = tmp / f"{job}-every-job.yaml"
        job_file.write_text(yaml.safe_dump(spec))
    out = tmp / f"{case_name(cluster, job, every)}.yaml"
    code = main(["plan", str(PLANS / f"{cluster}-cluster.yaml"), str(job_file), "-o", str(out),
                 "--no-cache"])
    assert code == 0, f"planning {cluster} x {job} exited {code}"
    return out.read_bytes()


def recorded() -> dict[str, str]:
    lines = RECORD.read_text().splitlines() if RECORD.exists() else []
    return {name: digest for digest, name in (line.split() for line in lines if line.strip())}


@pytest.mark.parametrize("cluster, job, every", cases(),
                         ids=[case_name(*c) for c in cases()])
def test_plan_bytes_as_recorded(cluster, job, every, tmp_path, capsys):
    digest = hashlib.sha256(plan_bytes(cluster, job, every, tmp_path)).hexdigest()
    capsys.readouterr()
    want = recorded().get(case_name(cluster, job, every))
    assert want is not None, f"no recorded plan for {case_name(cluster, job, every)}: --write"
    assert digest == want, (f"{case_name(cluster, job, every)} plans to other bytes than "
                            f"recorded (plan kept at {tmp_path})")


def write_record(tmp: Path) -> None:
    """Plan every case and record the digests."""
    rows = []
    for case in cases():
        digest = hashlib.sha256(plan_bytes(*case, tmp)).hexdigest()
        rows.append(f"{digest}  {case_name(*case)}\n")
        print(rows[-1], end="", file=sys.stderr)
    RECORD.write_text("".join(rows))


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory(prefix="tp-golden-") as tmp:
        write_record(Path(tmp))
