"""An apply the kernel refuses leaves every attribute it set as it was, the HTB token credit
included, and `diff` sees the credit (issue 50 item 5). An MTU of 65536 on a veth (its maximum
is 65535) is refused; the classes built in the same send had been sized for that MTU (two
frames of 65536 bytes: burst 131100b), the revert kept that size, and the verify (which only
looked for too little credit) and `diff` saw nothing. Real namespace and veth, real agent
processes; the credit read back with `tc class show`. A family: rates where two 64 KiB frames
exceed the 4 ms credit, with the MTU alone, a class changed, a class added beside it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.forkagent import ForkAgent
from tests.netns import sh
from topoagent.state.host import htb_credit

pytestmark = pytest.mark.netns

_FORK: list[ForkAgent] = []


@pytest.fixture(scope="module", autouse=True)
def _fork(tmp_path_factory) -> Iterator[None]:
    _FORK.append(ForkAgent(tmp_path_factory.mktemp("fork")))
    yield
    _FORK.pop().close()


def agent(ns: str, state: Path, *args: str, doc: dict | None = None
          ) -> subprocess.CompletedProcess:
    return _FORK[0].run(["--netns", ns, "--state-dir", str(state), *args],
                        stdin=None if doc is None else yaml.safe_dump(doc))


_UNIT = {"b": 1, "Kb": 1024, "Mb": 1024 ** 2, "Gb": 1024 ** 3}


def credit(ns: str, dev: str) -> dict[int, tuple[int, int]]:
    """minor -> (burst, cburst) bytes of the agent's classes, as `tc class show` prints them."""
    out = sh(["tc", "-n", ns, "class", "show", "dev", dev]).stdout
    found = {}
    for m in re.finditer(r"class htb 7470:(\w+) .*? burst (\d+(?:\.\d+)?)(\w+) "
                         r"cburst (\d+(?:\.\d+)?)(\w+)", out):
        minor, b, bu, c, cu = m.groups()
        found[int(minor, 16)] = (round(float(b) * _UNIT[bu]), round(float(c) * _UNIT[cu]))
    return found


def near(got: tuple[int, int], want: tuple[int, int]) -> bool:
    # tc prints sizes rounded to 3 digits in Kb/Mb
    return all(abs(g - w) <= 0.01 * w + 64 for g, w in zip(got, want, strict=True))


def state(rate: str, classes: list[dict], mtu: int | None = None) -> dict:
    iface = {"name": "tcr0", "up": True, **({"mtu": mtu} if mtu else {})}
    return {"interfaces": [iface],
            "qos": [{"dev": "tcr0", "driver": "tc", "rate": rate, "classes": classes}]}


RATE_BITS = {"10mbit": 10_000_000, "100mbit": 100_000_000}  # the link; classes at half
CHANGES = ["mtu-only", "class-changed", "class-added"]


@pytest.fixture
def veth(make_netns) -> str:
    ns = make_netns()
    sh(["ip", "-n", ns, "link", "add", "tcr0", "type", "veth", "peer", "name", "tcr1"])
    sh(["ip", "-n", ns, "link", "set", "tcr1", "up"])
    return ns


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("rate", list(RATE_BITS))
def test_a_refused_mtu_leaves_the_credit_and_diff_sees_it(veth, tmp_path, rate, change):
    ns, st = veth, tmp_path / "state"
    r_bits = RATE_BITS[rate]
    half = f"{r_bits // 2}bit"
    a = state(rate, [{"id": 2, "dst": "10.231.97.2/32", "rate": half}])
    r = agent(ns, st, "apply", "-", doc=a)
    assert r.returncode == 0, r.stderr
    link = htb_credit(r_bits, 1500)
    want = {1: (link, link), 2: (htb_credit(r_bits // 2, 1500), link)}  # ceil: the link's
    applied = credit(ns, "tcr0")
    assert set(applied) == {1, 2} and all(near(applied[k], want[k]) for k in want), applied

    classes = [{"id": 2, "dst": "10.231.97.2/32",
                "rate": f"{r_bits // 4}bit" if change == "class-changed" else half}]
    if change == "class-added":
        classes.append({"id": 3, "dst": "10.231.97.3/32", "rate": half})
    b = state(rate, classes, mtu=65536)
    r = agent(ns, st, "apply", "-", doc=b)
    assert r.returncode == 1 and "host is as before" in r.stderr, (r.stdout, r.stderr)
    after = credit(ns, "tcr0")
    assert set(after) == {1, 2} and all(near(after[k], want[k]) for k in want), \
        (after, want)  # was burst 131100b
    assert sh(["ip", "-n", ns, "-j", "link", "show", "tcr0"]).stdout.count('"mtu":1500')
    d = agent(ns, st, "diff", "--detailed-exitcode", "-", doc=a)
    assert d.returncode == 0, d.stdout  # nothing to do: the host is A, credit included

    # the credit changed by hand (more, as the refused MTU left it; or less): diff sees it,
    # apply repairs it
    for burst in ("131100", "1600"):
        sh(["tc", "-n", ns, "class", "change", "dev", "tcr0", "parent", "7470:1", "classid",
            "7470:2", "htb", "rate", half, "ceil", rate, "burst", burst,
            "cburst", str(want[2][1])])
        d = agent(ns, st, "diff", "--detailed-exitcode", "-", doc=a)
        assert d.returncode == 2 and "class" in d.stdout, (burst, d.stdout, d.stderr)
        assert agent(ns, st, "apply", "-", doc=a).returncode == 0
        assert near(credit(ns, "tcr0")[2], want[2])
