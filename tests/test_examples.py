"""The examples run and print what they promise."""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_runs(capsys):
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "y: (8, 150, 64)" in out
    assert "<- chosen" in out
    assert "sparse basis K=6" in out and "composed basis K=6" in out
