"""The structconv console entry point."""

from __future__ import annotations

import subprocess
import sys

from structconv.cli import main
from structconv.selfcheck import CheckResult, format_results


def test_check_passes_and_prints_a_table(capsys):
    assert main(["check", "--cases", "3", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "conv = einsum   [torch, sparse, xtheta]" in out
    assert "Prop. 3: compose = sequence" in out
    assert " 0 failed" in out


def test_check_rejects_unknown_backend(capsys):
    assert main(["check", "--backends", "jax"]) == 2
    assert "expected numpy and/or torch" in capsys.readouterr().err


def test_failed_identity_is_reported_as_failure():
    table = format_results([CheckResult("x", 1, 1.0, 1e-10), CheckResult("y", 1, 0.0, 1e-10)])
    assert "FAIL" in table and "1 passed, 1 failed" in table


def test_console_script_numpy_only_runs_without_importing_torch():
    code = (
        "import sys; from structconv.cli import main; "
        "rc = main(['check', '--cases', '2', '--backends', 'numpy']); "
        "assert 'torch' not in sys.modules; sys.exit(rc)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
