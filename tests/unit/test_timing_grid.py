"""The lab's stage timings on a grid of micro-batches, interpolated between (graph.cost)."""

import pytest

from topoctl.graph.cost import TrainCost, interpolate_train_costs, timing_grid


@pytest.mark.parametrize("batch, around", [
    (1, (1, 1)), (3, (3, 3)), (5, (4, 6)), (13, (12, 16)), (16, (16, 16)), (19, (16, 24)),
    (24, (24, 24)), (37, (32, 48)), (96, (96, 96)), (100, (96, 128)), (384, (384, 384)),
    (385, (384, 512))])
def test_grid_points_are_powers_of_two_and_three_times_them(batch, around):
    assert timing_grid(batch) == around


def test_a_search_over_many_micro_batches_times_few_grid_points():
    points = {p for b in range(1, 97) for p in timing_grid(b)}
    assert points == {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96}


def test_bad_batch_is_refused():
    with pytest.raises(ValueError):
        timing_grid(0)


def test_costs_are_affine_between_the_grid_points():
    lo = {"a": TrainCost(1.0, 2.0, 3.0, 0.5), "b": TrainCost(0.0, 0.0, 0.0)}
    hi = {"a": TrainCost(3.0, 4.0, 7.0, 0.5), "b": TrainCost(1.0, 0.0, 0.0)}
    mid = interpolate_train_costs(lo, hi, 16, 24, 18)
    assert mid["a"] == TrainCost(1.5, 2.5, 4.0, 0.5)
    assert mid["b"] == TrainCost(0.25, 0.0, 0.0)
    assert interpolate_train_costs(lo, hi, 16, 24, 16) == lo
    assert interpolate_train_costs(lo, hi, 16, 24, 24) == hi
