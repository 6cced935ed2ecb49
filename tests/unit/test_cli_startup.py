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
