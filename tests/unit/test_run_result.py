"""`RunResult.allreduce_seconds`: the tree runtime's bucket timings as the ranks reported them,
reduced to one figure per bucket: the rank that started a bucket last did not wait for the
others, so its time is the AllReduce's; the others' excess is the skew."""

from __future__ import annotations

import pytest

from topoctl.rollout.run import WARMUP, RankStats, RunResult, allreduce_summary, predicted_buckets


def _result(per_rank: list[list[list[tuple[int, float, float]]]]) -> RunResult:
    ranks = {r: RankStats(f"h{r}", iterations=[1.0] * len(its), allreduce=its)
             for r, its in enumerate(per_rank)}
    return RunResult(0, ranks, 1.0)


def test_per_bucket_the_last_rank_s_time_and_the_skew():
    warm = [[(100, 0.0, 9.0)]] * WARMUP  # DDP's first bucketing: one bucket, left out
    rank0 = warm + [[(64, 0.001, 0.30), (32, 0.0, 0.20)]] * 3
    rank1 = warm + [[(64, 0.002, 0.25), (32, 0.0, 0.21)],
                    [(64, 0.002, 0.26), (32, 0.0, 0.20)],
                    [(64, 0.002, 0.27), (32, 0.0, 0.22)]]
    rows = _result([rank0, rank1]).allreduce_seconds
    assert [r["bytes"] for r in rows] == [64, 32]
    assert rows[0]["seconds"] == pytest.approx(0.26)  # min over ranks, median over iterations
    assert rows[0]["skew"] == pytest.approx(0.04)
    assert rows[1]["seconds"] == pytest.approx(0.20)
    assert rows[1]["skew"] == pytest.approx(0.01)


def test_no_timings_and_iterations_some_rank_lacks_give_none():
    assert _result([[], []]).allreduce_seconds is None
    only_one = [[(64, 0.0, 0.3)]] * (WARMUP + 2)
    assert _result([only_one, []]).allreduce_seconds is None
    assert _result([only_one]).to_dict()["allreduce"] == [
        {"bytes": 64, "seconds": 0.3, "skew": 0.0}]


def test_summary_line_sets_each_bucket_beside_its_prediction():
    plan = {"metadata": {"collective": {"runtime": {"bucket_seconds": [0.25, 0.2]}}}}
    rows = [{"bytes": 4_200_000, "seconds": 0.26, "skew": 0.04},
            {"bytes": 3_200_000, "seconds": 0.2, "skew": 0.01}]
    line = allreduce_summary(rows, predicted_buckets(plan))
    assert "4.2 MB 0.260 / 0.250 (0.040)" in line and "3.2 MB 0.200 / 0.200 (0.010)" in line
    assert predicted_buckets({"metadata": {}}) == []
    assert "/" not in allreduce_summary(rows[:1]).split(": ", 1)[1]


def test_iteration_time_is_the_ranks_mean_not_the_slowest_rank_s():
    # rank 0 leads by 0.02 s in odd iterations and waits for rank 1 in them (the leaves of a
    # tree leave the AllReduce after its root): the job's period is 1.0 s, which the mean over
    # ranks gives and the slowest rank's time (1.02 s) would not; warm-up iterations left out
    warm = [9.0] * WARMUP
    lead = warm + [1.02, 0.98] * 3
    lag = warm + [0.98, 1.02] * 3
    ranks = {0: RankStats("h0", iterations=lead), 1: RankStats("h1", iterations=lag)}
    assert RunResult(0, ranks, 1.0).iteration_time == pytest.approx(1.0)
    slow = {0: RankStats("h0", iterations=warm + [1.2] * 4),
            1: RankStats("h1", iterations=warm + [1.0] * 4)}
    assert RunResult(0, slow, 1.0).iteration_time == pytest.approx(1.1)
    assert RunResult(0, {}, 1.0).iteration_time is None


def test_benchmark_runs_time_at_least_the_minimum_predicted_seconds():
    """`iterations_for`: the asked count, or enough that the timed iterations (after
    `WARMUP`) cover `min_seconds` of predicted time (the benchmarks' `MIN_TIMED_SECONDS`; the
    demo's topoopt plan: 10 timed)."""
    from bench.common import MIN_TIMED_SECONDS
    from topoctl.rollout.run import WARMUP, iterations_for

    assert iterations_for(4.5, 8, MIN_TIMED_SECONDS) == 8  # baseline: 6 timed already cover 6 s
    assert iterations_for(0.655, 8, MIN_TIMED_SECONDS) == WARMUP + 10
    assert (iterations_for(0.655, 8, MIN_TIMED_SECONDS) - WARMUP) * 0.655 >= MIN_TIMED_SECONDS
    assert iterations_for(0.6, 6, min_seconds=3.0) == 7
    assert iterations_for(0.0, 1, MIN_TIMED_SECONDS) == WARMUP + round(MIN_TIMED_SECONDS / 1e-3)
