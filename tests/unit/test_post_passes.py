"""Post-passes declared once (`strategies.post_pass`): every named strategy of before still
resolves (one function per composition, aliases included), a composition no module wired by
hand (``trees+shares+bandwidth``) plans through `topoctl plan`, and one the declarations do not
allow is refused at the job's `strategies[i]` with exit code 1, no traceback, and the allowed
bases, passes and orders in the message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoagent.protocol import EXIT_ERROR, EXIT_OK
from topoctl.apportion import apportion
from topoctl.cli import main
from topoctl.strategies import (
    POST_PASSES,
    PlanContext,
    Strategy,
    StrategyError,
    available,
    composition,
    post_pass,
    resolve,
)

PLANS = Path(__file__).resolve().parents[2] / "plans"
HETERO4 = PLANS / "hetero4-compute-cluster.yaml"  # speeds 1 / 0.5 / 0.75 / 0.25
# every name a job could list before post-passes were declared: none may go or change meaning
NAMED = ["bandwidth", "baseline", "baseline+bandwidth", "baseline+disco", "baseline+sfb",
         "baseline+shares", "disco", "pipeline", "placement", "sfb", "shares", "tag",
         "topoopt", "trees", "trees+bandwidth", "trees+shares"]


def test_the_named_strategies_are_those_of_before_and_aliases_share_their_function():
    named = available()
    assert sorted(named) == NAMED
    for p in ("bandwidth", "shares", "sfb", "disco"):
        assert named[p] is named[f"baseline+{p}"] is resolve(p)
    assert composition("trees+shares+bandwidth") == ("trees", ("shares", "bandwidth"))
    assert composition("sfb") == ("baseline", ("sfb",))


@pytest.mark.parametrize("name, words", [
    ("trees+sfb", "+sfb does not apply to trees (only to baseline)"),
    ("baseline+bandwidth+shares", "+shares cannot follow +bandwidth"),
    ("baseline+sfb+disco", "+disco cannot follow +sfb"),
    ("baseline+shares+shares", "+shares twice"),
    ("trees+nope", "no post-pass 'nope'"),
    ("shares+bandwidth", "no base strategy 'shares'"),
])
def test_a_composition_the_declarations_do_not_allow_is_refused_naming_what_is(name, words):
    with pytest.raises(StrategyError) as e:
        resolve(name)
    msg = e.value.problems[0][1]
    assert words in msg and name in msg
    assert "bases: baseline, pipeline, placement, tag, topoopt, trees" in msg
    assert "+bandwidth on baseline/trees, after +shares/+sfb/+disco" in msg


def test_a_new_post_pass_composes_without_wiring(monkeypatch):
    def mark(ctx: PlanContext, base: Strategy) -> Strategy:
        base.notes = dict(base.notes) | {"marked": base.name}
        return base

    monkeypatch.setitem(POST_PASSES, "mark", None)  # teardown removes the declaration
    post_pass("mark", applies_to=("baseline",), after=("shares",))(mark)
    assert composition("baseline+shares+mark") == ("baseline", ("shares", "mark"))
    with pytest.raises(StrategyError, match=r"\+mark does not apply to trees"):
        composition("trees+mark")


def _job(tmp_path: Path, strategies: list[str]) -> Path:
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = strategies
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_trees_shares_bandwidth_plans_with_both_passes(tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    code = main(["plan", str(HETERO4), str(_job(tmp_path, ["trees+shares+bandwidth"])), "-o",
                 str(out), "--no-cache"])
    capsys.readouterr()
    assert code == EXIT_OK
    plan = yaml.safe_load(out.read_text())
    assert plan["metadata"]["strategy"] == "trees+shares+bandwidth"
    assert plan["job"]["collective"]["algorithm"] == "trees"
    # +shares: the global batch split by the hosts' speeds
    assert plan["job"]["batch"]["shares"] == apportion(384, [1.0, 0.5, 0.75, 0.25])
    # +bandwidth: QoS classes per destination on every training host's NICs
    assert all(st["qos"] and all(q["classes"] for q in st["qos"])
               for st in plan["hosts"].values())


@pytest.mark.parametrize("name, words", [
    ("trees+sfb", "+sfb does not apply to trees"),
    ("nope", "unknown strategy 'nope'"),
])
def test_topoctl_plan_refuses_at_the_strategies_path_listing_the_allowed(tmp_path, capsys,
                                                                         name, words):
    out = tmp_path / "plan.yaml"
    job = _job(tmp_path, ["baseline", name])
    code = main(["plan", str(HETERO4), str(job), "-o", str(out), "--no-cache"])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and not out.exists()
    assert f"{job}: strategies[1]: " in err and words in err
    assert "bases: baseline, pipeline" in err and "+shares on baseline/trees" in err
    assert "Traceback" not in err
