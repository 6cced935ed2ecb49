"""`python -m bench.planner.lab_check`'s `--repeats` summary: one line per strategy with the
medians of its runs, their ranges and the error of the two medians (not the median of the
errors)."""

from __future__ import annotations

import pytest

from bench.planner.lab_check import cli, median_table


def _row(strategy: str, predicted: float, measured: float) -> dict:
    return {"strategy": strategy, "predicted": predicted, "measured": measured,
            "error_pct": 100 * (predicted - measured) / measured}


def test_medians_per_strategy_in_first_seen_order():
    rows = [_row("trees", 0.630, 0.657), _row("baseline", 11.27, 11.19),
            _row("trees", 0.628, 0.600), _row("baseline", 11.30, 11.20),
            _row("trees", 0.632, 0.568)]
    head, rule, trees, baseline = median_table(rows)
    assert head.startswith("| strategy | runs |") and rule.startswith("|---|")
    cells = [c.strip() for c in trees.strip("|").split("|")]
    assert cells[:4] == ["trees", "3", "0.630 (0.628-0.632)", "0.600 (0.568-0.657)"]
    assert cells[4] == "+5.0%"  # (0.630 - 0.600) / 0.600 of the medians
    assert cells[5] == "-4.1%, +4.7%, +11.3%"
    cells = [c.strip() for c in baseline.strip("|").split("|")]
    assert cells[:2] == ["baseline", "2"]
    assert cells[3] == "11.195 (11.190-11.200)"


def test_repeats_below_one_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli(["c.yaml", "j.yaml", "--repeats", "0"])
    assert e.value.code == 1  # usage errors exit 1 (README "Exit codes")
    assert "--repeats must be at least 1" in capsys.readouterr().err
