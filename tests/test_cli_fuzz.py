"""Every bad input of the table in :mod:`tuner.commands.bad_inputs` (all commands, the three space kinds):
exit code 2, exactly one ``error:`` line on stderr, no traceback, nothing written outside ``--out``, no file
that existed changed or removed, no results.json or temporary file left half-written."""

from __future__ import annotations

import pytest

from tuner.commands.bad_inputs import bad_input_cases, run_bad_input

CASES = bad_input_cases()
COMMANDS = ("search", "predict", "replay", "calibrate", "catalog")

pytestmark = pytest.mark.slow  # 220+ cases in this process: about 40 s on a busy 2-core machine


def test_the_table_covers_every_command_and_space_kind():
    assert len(CASES) >= 173
    assert len({c.name for c in CASES}) == len(CASES)
    first = {c.args[0] for c in CASES if c.args}
    assert set(COMMANDS) <= first
    for kind in ("sharding", "parallel", "accelerators"):
        assert sum(c.name.startswith(f"search {kind}") for c in CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_error_line_and_exit_2(case, tmp_path):
    r = run_bad_input(case, tmp_path)
    assert r.exit_code == 2, (r.exit_code, r.first_line)
    assert r.error_lines == 1 and r.other_lines == 0, r.first_line
    assert not r.traceback
    assert not r.outside, f"written outside --out: {r.outside}"
    assert not r.lost, f"changed or removed: {r.lost}"
    assert not r.half_written, r.half_written
