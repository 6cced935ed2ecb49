"""`topoctl run`'s model check before launch for the catalog's own models: in this process,
only when the plan names something in the model, and only for a catalog entry's exact factory
(any other factory, even one under topoctl.catalog, goes to the unprivileged capture child)."""

from __future__ import annotations

import pytest

from topoagent.state.host import StateError
from topoctl.catalog.registry import ENTRIES
from topoctl.rollout.run import check_model

MLP = {"factory": ENTRIES["mlp"].factory, "kwargs": {"layers": 2, "hidden": 16}}


def test_a_catalog_model_naming_nothing_is_not_built():
    check_model({"model": MLP})  # nothing named: a catalog model is an nn.Module


def test_what_a_catalog_model_lacks_is_named():
    check_model({"model": MLP, "sfb": ["net.0"]})  # a Linear of the MLP
    with pytest.raises(StateError) as e:
        check_model({"model": MLP, "sfb": ["net.9"], "fusion": {"regions": ["encoder"]}})
    paths = [p for p, _ in e.value.problems]
    assert paths == ["job.fusion.regions[0]", "job.sfb[0]"], e.value.problems


def test_only_a_catalog_entrys_exact_factory_is_built_in_this_process():
    """A plan naming another callable reachable from a catalog module is the plan's code: it
    goes to the capture child, as the capture user (which refuses it)."""
    odd = {"factory": "topoctl.catalog.build:importlib.import_module",
           "kwargs": {"name": "json"}}
    with pytest.raises(StateError) as e:
        check_model({"model": odd, "sfb": ["net.0"]})
    assert any(p == "job.model.factory" and "captured as user" in m
               for p, m in e.value.problems), e.value.problems
