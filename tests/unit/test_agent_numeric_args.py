"""Every numeric argument of `topo-agent` is checked while the command line is parsed: a
negative, zero, NaN, infinite, huge or non-numeric value is a usage error (exit 1, the flag and
value named), never a ValueError deep in a verb (exit 70) and never a verb run with it (issue
50 item 11: `watch --interval -1` was exit 70). The flags are found by walking the parser, so a
numeric flag added later is covered too."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzgen import fuzz_settings
from topoagent import cli as agent_cli
from topoagent.protocol import EXIT_ERROR

# the audit's case first, then the family around it
BAD_NUMBERS = ["-1", "0", "-0.5", "nan", "NaN", "inf", "-inf", "1e400", "1e12", str(2**64), "²",
               "", "abc", "0x10", "1_0", "3 s"]


def _numeric_options() -> list[tuple[list[str], str]]:
    """(verb argv prefix, option) for every option whose value is parsed as a number: at the
    top level (given before `show`) and in each verb, with a verb's required arguments."""
    parser = agent_cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []

    def numeric(action: argparse.Action) -> bool:
        return bool(action.option_strings) and action.type not in (None, str, agent_cli.Path)

    for a in parser._actions:
        if numeric(a):
            found.append(([], a.option_strings[-1]))
    for verb, p in sub.choices.items():
        for a in p._actions:
            if numeric(a):
                found.append(([verb], a.option_strings[-1]))
    return found


OPTIONS = _numeric_options()


def test_no_numeric_flag_takes_a_bare_int_or_float():
    """A bare `type=int`/`type=float` accepts -1, nan and inf: each flag has a checked type."""
    parser = agent_cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [(name, a.option_strings) for name, p in [("", parser), *sub.choices.items()]
            for a in p._actions if a.type in (int, float)]
    assert bare == []
    flags = {opt for _, opt in OPTIONS}
    assert {"--interval", "--keep-history", "--timeout", "--confirm-within", "--wait",
            "--bytes", "--within"} <= flags, flags


@pytest.mark.parametrize(("prefix", "option"), OPTIONS, ids=[" ".join([*p, o])
                                                              for p, o in OPTIONS])
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_a_bad_number_is_a_usage_error_at_parse_time(prefix, option, value, tmp_path, capsys):
    extra = {"launch": ["--host", "h0", "job.yaml"], "apply": ["-"], "diff": ["-"],
             "confirm-watchdog": ["tok"]}.get(prefix[0] if prefix else "", [])
    argv = ["--state-dir", str(tmp_path / "st"), *(prefix or ["show"])]
    if prefix:
        argv += [f"{option}={value}", *extra]
    else:
        argv = ["--state-dir", str(tmp_path / "st"), f"{option}={value}", "show"]
    with pytest.raises(SystemExit) as e:
        agent_cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == EXIT_ERROR, err
    assert option in err and "Traceback" not in err, err
    assert not (tmp_path / "st").exists()  # nothing ran: not even the state directory


def test_watch_interval_minus_one_is_exit_1_as_a_program(tmp_path):
    """The audit's own reproducer, as a separate program (exit 70 before)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "topoagent.cli", "--state-dir", str(tmp_path),
                        "watch", "--interval", "-1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == EXIT_ERROR, r.stderr
    assert "--interval" in r.stderr and "expected seconds" in r.stderr
    assert "Traceback" not in r.stderr


_PARSER = agent_cli.build_parser()  # one for every example: parsing is what is under test


@given(data=st.data())
@fuzz_settings(100)
def test_fuzz_numeric_flags_parse_to_a_value_in_range_or_exit_1(data):
    """Any text for any numeric flag: a usage error (exit 1) or a finite value in the flag's
    range, parsed before any verb runs; never an exception of another kind (exit 70)."""
    prefix, option = data.draw(st.sampled_from(OPTIONS))
    text = data.draw(st.text(max_size=12)
                     | st.from_regex(r"-?[0-9]{0,25}(\.[0-9]*)?(e-?[0-9]+)?", fullmatch=True))
    argv = [f"{option}={text}", "show"] if not prefix else [*prefix, f"{option}={text}"]
    try:
        args = _PARSER.parse_known_args(argv)[0]
    except SystemExit as e:
        assert e.code == EXIT_ERROR
        return
    value = getattr(args, option.lstrip("-").replace("-", "_"))
    assert math.isfinite(value) and value > 0, (option, text, value)
