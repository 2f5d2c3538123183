"""The generated bad-input suite (``python -m tests.hostile``, ``docs/robustness.rst``), run whole.

First the harness meets cases of known outcome (a segfault, a hang, a payload that runs, ...).
Then every drawn case runs in worker processes under a memory and a time limit (about a minute
and a half on two cores) and the suite's verdict is asserted: no ``silent``, ``crash`` or
``security`` outcome, no case the suite itself failed to run, and no ``raw`` outcome outside the
allow-list of ``tests/hostile/allow.py``.  Each failure lists the groups of cases by cause, with
an example.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile.cases_selftest import KNOWN
from hostile.runner import run_cases
from hostile.spec import Case

ROOT = Path(__file__).resolve().parents[1]


def test_harness_classifies_each_outcome() -> None:
    """Cases of known outcome, a segfault, a hang and a payload that runs among them, on one worker."""
    cases = [Case(name, name, "cases_selftest", {}) for name in KNOWN]
    records = run_cases(cases, workers=1, timeout=8.0)
    got = {r["id"]: r["outcome"] for r in records}
    assert got == KNOWN, {
        k: (got[k], r["cause"], r["message"]) for r in records if (k := r["id"]) and got[k] != KNOWN[k]
    }


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("hostile")
    done = subprocess.run(
        [sys.executable, "-m", "tests.hostile", "--out", str(out), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, f"the suite did not run:\n{done.stdout}\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return result


def _groups(summary: dict[str, Any], outcome: str, ids: set[str] | None = None) -> str:
    """The findings of ``outcome`` (restricted to ``ids``) as lines: count, entry, cause, where, example."""
    lines = []
    for g in summary["findings"]:
        members = [i for i in g["ids"] if ids is None or i in ids]
        if g["outcome"] == outcome and members:
            example = g["example"]
            lines.append(f"{len(members):5d}  {g['entry']}: {g['cause']} [{g['where']}]")
            lines.append(f"       e.g. {example['id']}: {example['input'][:200]}")
            if example["message"]:
                lines.append(f"       -> {example['message'][:200]}")
    return "\n".join(lines)


@pytest.mark.parametrize("outcome", ["silent", "crash", "security", "harness"])
def test_no_case_ends(summary: dict[str, Any], outcome: str) -> None:
    found = summary["verdict"][outcome]
    assert not found, f"{len(found)} {outcome} cases:\n{_groups(summary, outcome)}"


def test_raw_outcomes_are_allowed(summary: dict[str, Any]) -> None:
    unallowed = set(summary["verdict"]["raw_not_allowed"])
    assert not unallowed, f"{len(unallowed)} raw cases not in tests/hostile/allow.py:\n" + _groups(
        summary, "raw", unallowed
    )


def test_every_entry_point_has_right_and_clear_cases(summary: dict[str, Any]) -> None:
    """A sanity check of the generators: each entry point sees valid inputs and refused ones."""
    thin = {
        entry: row
        for entry, row in summary["counts"].items()
        if entry != "console" and (row["right"] == 0 or row["clear"] == 0)
    }
    assert not thin, f"entry points without right or without clear cases: {thin}"
