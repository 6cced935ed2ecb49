"""`bench.placement.hybrid_phases`: the simulator's iteration cut into the phases the lab's pipeline
runtime reports (forward, backward, allreduce, step, other), per rank and per stage."""

from __future__ import annotations

import pytest

from bench.placement.hybrid_phases import format_phases, rank_phases, stage_phases
from topoctl.sim.engine import SimResult
from topoctl.sim.tasks import Compute, Transfer


def _pipeline() -> tuple[list, SimResult]:
    """Two stages of one rank each (h0, h1), one micro-batch, a sync on stage 0 only: the
    task ids `strategies.placement.pipeline_tasks` gives, in each rank's program order, with
    hand-set finish times (ms; the collective ``ar0`` is read from the finish times only)."""
    c = Compute
    tasks = [c("in0.0", "h0", 1), c("in1.0", "h1", 1), c("F0.0.0", "h0", 1),
             Transfer("act0.0.0.0", "h0", "h1", 1.0), c("act0.0.0.0/tx", "h0", 1, (), True),
             c("act0.0.0.0/rx", "h1", 1, (), True), c("F1.0.0", "h1", 1), c("B1.0.0", "h1", 1),
             Transfer("grad0.0.0.0", "h1", "h0", 1.0), c("grad0.0.0.0/tx", "h1", 1, (), True),
             c("grad0.0.0.0/rx", "h0", 1, (), True), c("B0.0.0", "h0", 1),
             c("ar0/cpu.0", "h0", 1, (), True), c("step0.0", "h0", 1),
             c("step1.0", "h1", 1), c("loss.0", "h1", 1, (), True)]
    ms = {"in0.0": 1, "in1.0": 1, "F0.0.0": 3, "act0.0.0.0": 4, "act0.0.0.0/tx": 4,
          "act0.0.0.0/rx": 4, "F1.0.0": 6, "B1.0.0": 9, "grad0.0.0.0": 10,
          "grad0.0.0.0/tx": 10, "grad0.0.0.0/rx": 10, "B0.0.0": 14, "ar0/cpu.0": 20,
          "ar0": 22, "step0.0": 23, "step1.0": 11, "loss.0": 12}
    return tasks, SimResult(0.023, 0.0, 0.0, 0.0, finish={k: v / 1e3 for k, v in ms.items()})


def test_a_rank_phases_tile_its_iteration_from_its_input_batch():
    tasks, res = _pipeline()
    p = rank_phases(tasks, res, 0, "h0")
    # forward: input batch (1) to its last send (4); backward: to B (14); the sync: the later
    # of its CPU (20) and the collective (22); the step (23); other: the rest of 23 ms
    assert p == pytest.approx({"forward": 0.003, "backward": 0.010, "allreduce": 0.008,
                               "step": 0.001, "other": 0.001})
    q = rank_phases(tasks, res, 1, "h1")
    # stage 1: its forward waits for the activation (6), backward to its send (10), no sync,
    # step at 11: the loss all-reduce and the wait for stage 0 are `other`
    assert q == pytest.approx({"forward": 0.005, "backward": 0.004, "allreduce": 0.0,
                               "step": 0.001, "other": 0.013})
    assert sum(q.values()) == pytest.approx(res.iteration_time)  # they tile the iteration


def test_stage_lines_read_like_the_measured_ones():
    tasks, res = _pipeline()
    lines = format_phases(stage_phases(tasks, res, [["h0"], ["h1"]]))
    assert lines[0] == ("  predicted stage 0: forward 3.0 ms, backward 10.0 ms, "
                        "allreduce 8.0 ms, step 1.0 ms, other 1.0 ms")
    assert lines[1].startswith("  predicted stage 1: forward 5.0 ms")
