"""The device memory model against the figures of the ZeRO paper and a user's 13 B model."""

from __future__ import annotations

import pytest

from topoctl.sim.memory import footprint, overflow


def test_zero_paper_accounting_16_bytes_per_parameter():
    """ZeRO (SC'20) section 3.1: mixed-precision Adam keeps 2+2+12 = 16 bytes per parameter;
    7.5 B parameters -> 120 GB, and ZeRO-3 over 64 ranks 1.9 GB."""
    base = footprint(7_500_000_000, 2, 0, mixed_precision=True)
    assert base.total == pytest.approx(120e9)
    assert (base.parameters, base.gradients, base.optimiser) == pytest.approx((15e9, 15e9, 90e9))
    z3 = footprint(7_500_000_000, 2, 0, mixed_precision=True, shard=64, zero=3)
    assert z3.total == pytest.approx(120e9 / 64)
    z1 = footprint(7_500_000_000, 2, 0, mixed_precision=True, shard=64, zero=1)
    assert z1.total == pytest.approx(30e9 + 90e9 / 64)  # the paper's 31.4 GB


def test_a_13b_lm_does_not_fit_an_h100_replicated_but_does_sharded():
    """The new user's model: 40 layers x hidden 5120 (12.6 B in the blocks) in bf16 with Adam:
    over 200 GB a replica; with tensor parallelism 8 inside the host and FSDP over 4 hosts,
    about 6.6 GB of state a device."""
    params = 40 * (12 * 5120**2 + 13 * 5120) + 2 * 32000 * 5120
    replica = footprint(params, 2, 4e9, mixed_precision=True)
    assert replica.total > 200e9
    problems = overflow({"h0/gpu0": replica}, {"h0/gpu0": 80e9}, {"h0/gpu0": "H100"})
    assert problems and problems[0].startswith("h0/gpu0 (H100, 80 GB): needs ")
    assert "has 80 GB" in problems[0] and "optimiser" in problems[0]
    sharded = footprint(params, 2, 4e9 / 8, mixed_precision=True, tensor=8, shard=4, zero=3,
                        largest_unit=12 * 5120**2)
    assert sharded.total < 80e9
    assert overflow({"h0/gpu0": sharded}, {"h0/gpu0": 80e9}, {}) == []
    assert overflow({"h0": replica}, {"h0": None}, {}) == []  # unknown capacity: not checked


def test_recomputation_and_microbatches():
    kept = footprint(1000, 4, 500.0, optimiser="sgd", microbatches=4)
    assert kept.activations == 2000 and kept.total == 4000 + 4000 + 2000
    again = footprint(1000, 4, 500.0, optimiser="sgd", microbatches=4, recompute_bytes=50.0)
    assert again.activations == 200
    with pytest.raises(ValueError, match="optimiser 'lamb'"):
        footprint(1, 4, 0, optimiser="lamb")
