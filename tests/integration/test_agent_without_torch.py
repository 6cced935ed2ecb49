"""The network agent runs on a host without torch (or the controller, or the training runtime):
`topo-agent show`, `diff` and `apply` in a throwaway namespace with those packages made
unimportable by an import hook, state read back with `ip -j`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.netns import ip_json, sh

pytestmark = pytest.mark.netns

# What a host that only runs the network agent does not have. The hook refuses them as a
# missing package would (ModuleNotFoundError), and the agent prints what it loaded at exit.
BLOCKED = ("torch", "numpy", "scipy", "networkx", "matplotlib", "topoctl", "topotrain")
RUNNER = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on this host)")
        return None

sys.meta_path.insert(0, Refuse())
from topoagent.cli import main
try:
    code = main(sys.argv[1:])
finally:
    loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED))
    print("LOADED " + ",".join(loaded), file=sys.stderr)
sys.exit(code)
"""


def agent(ns: str, state_dir: Path, *args: str, stdin: str | None = None
          ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, "--netns", ns, "--state-dir",
                           str(state_dir), *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def test_the_hook_refuses_torch():
    """The hook works: the training runtime cannot even be imported under it."""
    p = subprocess.run([sys.executable, "-c", RUNNER.replace("from topoagent.cli import main",
                                                             "import topotrain.train")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ModuleNotFoundError" in p.stderr


def test_show_diff_apply_without_torch(make_netns, tmp_path):
    ns = make_netns()
    sh(["ip", "-n", ns, "link", "add", "tpa0", "type", "veth", "peer", "name", "tpb0"])
    state = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True}],
             "routes": [{"dst": "10.236.9.0/24", "via": "10.231.1.2"}]}
    text = yaml.safe_dump(state)
    state_dir = tmp_path / "state"

    shown = agent(ns, state_dir, "--json", "show")
    assert shown.returncode == 0, shown.stderr
    assert "tpa0" in shown.stdout
    pending = agent(ns, state_dir, "diff", "-", stdin=text)
    assert pending.returncode == 0, pending.stderr  # changes pending: success
    applied = agent(ns, state_dir, "apply", "-", stdin=text)
    assert applied.returncode == 0, applied.stderr
    again = agent(ns, state_dir, "diff", "-", stdin=text)
    assert again.returncode == 0, again.stdout + again.stderr  # in sync

    for p in (shown, pending, applied, again):
        assert "LOADED \n" in p.stderr or p.stderr.rstrip().endswith("LOADED"), p.stderr
    addrs = ip_json(ns, "addr", "show", "dev", "tpa0")
    assert "10.231.1.1" in json.dumps(addrs)
    routes = ip_json(ns, "route", "show", "10.236.9.0/24")
    assert routes and routes[0]["gateway"] == "10.231.1.2"
