"""The bad-input sweep: every case of :mod:`tuner.commands.bad_inputs` run through ``tuner`` in this process.

Counts what each case did: exit code 2 with exactly one ``error:`` line (and nothing else on stderr),
tracebacks, files written outside ``--out``, files that existed before and were changed or removed
(data lost), and result files left half-written. Also times writing 560 trials (the main sharding
job's) to a SQLite study: batched in one transaction as a search does, and one transaction per trial
(Optuna's ``add_trials``). Writes experiments/results/bad_input_sweep.{json,md}.

    .venv/bin/python experiments/bad_input_sweep.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import REPO, write_results  # noqa: E402
from tuner.commands.bad_inputs import bad_input_cases, run_bad_input  # noqa: E402

COMMANDS = ("search", "predict", "replay", "calibrate", "catalog")


def study_writes(n: int = 560, per_unit: int = 7) -> dict:
    """Seconds to record ``n`` outcomes in units of ``per_unit``: batched (one transaction) and one by one."""
    from optuna.distributions import CategoricalDistribution

    from tuner.search.core import Outcome
    from tuner.search.study import SearchStudy, trial_for

    dist = {"x": CategoricalDistribution(list(range(n)))}
    outcomes = [Outcome(f"k{i}", {"x": i}, {"status": ["ok", "infeasible", "failed"][i % 3], "reason": "r"},
                        float(i) if i % 3 == 0 else None) for i in range(n)]
    folder = Path(tempfile.mkdtemp(prefix="tuner-study-writes-"))
    try:
        storage = f"sqlite:///{folder / 'study.db'}"
        batched = SearchStudy.open("batched", storage, False, dist)
        t0 = time.perf_counter()
        for i in range(0, n, per_unit):
            batched.record(outcomes[i:i + per_unit])
        batched.flush()
        t_batched = time.perf_counter() - t0
        single = SearchStudy.open("single", storage, False, dist)
        t0 = time.perf_counter()
        for i in range(0, n, per_unit):
            single.study.add_trials([trial_for(o, dist) for o in outcomes[i:i + per_unit]])
        t_single = time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"trials": n, "batched_s": t_batched, "one_transaction_per_trial_s": t_single}


def sweep() -> dict:
    """Run every case; the counts, per command, and each failing case."""
    cases = bad_input_cases()
    root = Path(tempfile.mkdtemp(prefix="tuner-bad-input-sweep-"))
    rows, seconds = [], []
    try:
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            r = run_bad_input(case, root / f"case{i:03d}")
            seconds.append(time.perf_counter() - t0)
            rows.append((case, r))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    by_command: dict[str, dict[str, int]] = {}
    for case, r in rows:
        cmd = case.args[0] if case.args and case.args[0] in COMMANDS else "tuner (no command)"
        if cmd == "search":
            cmd = "search " + next((k for k in ("sharding", "parallel", "accelerators") if k in case.name), "(file, flags)")
        entry = by_command.setdefault(cmd, {"cases": 0, "one_line_exit_2": 0})
        entry["cases"] += 1
        entry["one_line_exit_2"] += int(r.ok)
    return {
        "cases": len(rows),
        "one_line_exit_2": sum(r.ok for _, r in rows),
        "exit_code_not_2": sum(r.exit_code != 2 for _, r in rows),
        "not_one_error_line": sum(r.error_lines != 1 or r.other_lines != 0 for _, r in rows),
        "tracebacks": sum(r.traceback for _, r in rows),
        "files_outside_out": sum(len(r.outside) for _, r in rows),
        "data_lost": sum(len(r.lost) for _, r in rows),
        "half_written_results": sum(len(r.half_written) for _, r in rows),
        "seconds_per_case_median": statistics.median(seconds),
        "seconds_per_case_max": max(seconds),
        "by_command": by_command,
        "study_writes": study_writes(),
        "failing": [{"case": c.name, "exit_code": r.exit_code, "stderr_first_line": r.first_line,
                     "outside": r.outside, "lost": r.lost, "half_written": r.half_written}
                    for c, r in rows if not r.ok],
        "examples": [{"case": c.name, "stderr": r.first_line} for c, r in rows[:: max(len(rows) // 12, 1)]],
    }


def markdown(res: dict) -> str:
    """The results as a short table."""
    lines = ["# Bad-input sweep", "", "Every case of `tuner/commands/bad_inputs.py` run through `tuner` "
             "(`.venv/bin/python experiments/bad_input_sweep.py`).", "",
             "| measure | count |", "|---|---:|"]
    for key in ("cases", "one_line_exit_2", "exit_code_not_2", "not_one_error_line", "tracebacks",
                "files_outside_out", "data_lost", "half_written_results"):
        lines.append(f"| {key.replace('_', ' ')} | {res[key]} |")
    lines += ["", f"Seconds per case: median {res['seconds_per_case_median']:.3f}, max "
              f"{res['seconds_per_case_max']:.2f}.", "", "| command | cases | one line, exit 2 |", "|---|---:|---:|"]
    for cmd, e in sorted(res["by_command"].items()):
        lines.append(f"| {cmd} | {e['cases']} | {e['one_line_exit_2']} |")
    w = res["study_writes"]
    lines += ["", f"Writing {w['trials']} trials to a SQLite study: {w['batched_s']:.2f} s batched (one transaction "
              f"per batch), {w['one_transaction_per_trial_s']:.2f} s one transaction per trial."]
    if res["failing"]:
        lines += ["", "## Failing cases", ""] + [f"- {f['case']}: exit {f['exit_code']}, {f['stderr_first_line']}"
                                                 for f in res["failing"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "bad_input_sweep",
                        help="result pair to write (without suffix)")
    args = parser.parse_args()
    res = sweep()
    write_results(args.out, res, markdown(res))
    print(f"{res['one_line_exit_2']} of {res['cases']} bad inputs: one error line and exit 2; tracebacks "
          f"{res['tracebacks']}, files outside --out {res['files_outside_out']}, data lost {res['data_lost']}")


if __name__ == "__main__":
    main()
