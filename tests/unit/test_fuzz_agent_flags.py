"""Property-based fuzzing of `topo-agent`'s flags and its verbs other than `apply --dry-run`
(which tests/integration/test_fuzz_agent.py fuzzes with documents): bad management
addresses and probes, history sizes, OVSDB remotes, namespaces, watch intervals and status
files, launch specs with bad ranks, confirm/rollback/recover/stop with nothing to act on.

Invariant: exit 0 or 1 (2 only with --detailed-exitcode, given before or after the verb), never
70, no traceback. Verbs that could change a host run against
a namespace that does not exist (`--netns tpxnosuch`); `show`, `diff` and `apply --dry-run`
only read this machine's namespace."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzgen import fuzz_settings
from topoagent import cli as agent_cli
from topoagent.protocol import EXIT_BUG

EXAMPLES = int(os.environ.get("TOPO_FUZZ_AGENT_FLAG_EXAMPLES", "200"))
GLOBAL = st.sampled_from([
    ["--mgmt", "junk"], ["--mgmt", "10.231.0.1"], ["--mgmt", "10.231.0.1,10.231.0.2,9"],
    ["--mgmt", ","], ["--mgmt-probe", "not a host!"], ["--mgmt-probe", "999.1.1.1"],
    ["--mgmt-probe", ""], ["--keep-history", "0"], ["--keep-history", "-1"],
    ["--keep-history", "x"], ["--ovsdb", "junk"], ["--ovsdb", ""], ["--json"],
    ["--detailed-exitcode"],
    ["--netns", "tpxnosuch"], ["--netns", "BAD NAME/.."], ["--netns", ""], ["--force-mgmt"]])
VERBS = st.sampled_from([
    ["diff", "{d}/state.yaml"], ["apply", "--dry-run", "{d}/state.yaml"],
    ["apply", "--dry-run", "--confirm-within", "nan", "{d}/state.yaml"], ["show"],
    ["watch", "--once", "--interval", "nan"], ["watch", "--once", "--interval", "-1"],
    ["watch", "--once", "--status-file", "/nonexistent/x"],
    ["launch", "--host", "h0", "{d}/spec.json"], ["launch", "--host", "", "{d}/spec.json"],
    ["launch", "--timeout", "nan", "--host", "h0", "{d}/spec.json"],
    ["rollback"], ["recover"], ["stop"], ["confirm"], ["confirm-watchdog"], ["bogus"],
    ["diff", "--detailed-exitcode", "{d}/state.yaml"],
    ["apply", "--dry-run", "--detailed-exitcode", "--json", "{d}/state.yaml"],
    ["watch", "--once", "--detailed-exitcode"], ["rollback", "--detailed-exitcode", "--json"],
    ["recover", "--detailed-exitcode"], ["stop", "--detailed-exitcode", "--json"],
    ["show", "--detailed-exitcode"], ["confirm", "--json"]])
READ_ONLY = ("diff", "show")


@fuzz_settings(EXAMPLES)
@given(flags=st.lists(GLOBAL, max_size=3), verb=VERBS)
def test_agent_flags_and_verbs_never_crash(flags, verb):
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "state.yaml").write_text("interfaces: []\n")
        (d / "spec.json").write_text(json.dumps({"name": "j", "processes": {
            "h0": [{"rank": "x"}]}}))  # a bad rank: launch must refuse it, never start it
        glob = [a for f in flags for a in f]
        if verb[0] not in READ_ONLY and "--dry-run" not in verb:
            glob += ["--netns", "tpxnosuch"]  # the last --netns wins: never this host
        argv = ["--state-dir", str(d / "st"), *glob, *[a.format(d=d) for a in verb]]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = agent_cli.main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
    assert rc != EXIT_BUG and "Traceback" not in err.getvalue(), (argv, rc, err.getvalue())
    allowed = (0, 1, 2) if "--detailed-exitcode" in argv else (0, 1)  # 2 only when asked
    assert rc in allowed, (argv, rc, err.getvalue())
