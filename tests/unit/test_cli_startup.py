"""A verb that only reads files does not pay for torch: importing the CLI (every verb's module)
or reading a job leaves torch unimported (1.2 s of CPU on the 2-core VM, paid by every
`topoctl` call before). Models are built from the catalog only when a plan is made."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["topoctl.cli", "topoctl.spec.job", "topoctl.catalog"])
def test_importing_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_the_catalog_still_builds_its_models():
    code = ("import sys; from topoctl.catalog import ENTRIES, build_model, example_inputs; "
            "m = build_model('mlp', {'layers': 2, 'hidden': 8, 'features': 4, 'classes': 2}); "
            "x = example_inputs('mlp', {'features': 4}, 3); "
            "print(type(m).__name__, tuple(x[0].shape), 'torch' in sys.modules, "
            "ENTRIES['mlp'].factory)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["MLP", "(3,", "4)", "True", "topoctl.catalog.dense:MLP"]


def test_every_verb_maps_to_the_module_that_registers_it():
    import argparse  # noqa: PLC0415 (test-local)

    from topoctl import cli  # noqa: PLC0415 (test-local)

    for module in cli.COMMANDS:
        parser = cli.build_parser([module])
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert {v for v, m in cli.VERBS.items() if m == module} == set(sub.choices), module


def test_a_verb_imports_only_its_own_module():
    code = ("import sys, topoctl.cli as c; "
            "c.build_parser(c.modules_for(['--json', 'run', 'p.yaml'])); "
            "print(sorted(m for m in sys.modules if m.startswith('topoctl.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert "'topoctl.cli.run'" in out
    assert not any(f"'topoctl.cli.{m}'" in out for m in ("plan", "trees", "lab", "topology"))
    from topoctl import cli  # noqa: PLC0415 (test-local)

    assert cli.modules_for(["--version"]) == []
    assert cli.modules_for(["--help"]) == cli.COMMANDS == cli.modules_for(["nosuchverb"])
    assert cli.modules_for(["--json", "explain", "plan.yaml"]) == ["topoctl.cli.plan"]
