"""README.md's code runs as written.

Every ```python block is executed alone, exactly as written, in a fresh namespace, with the
repository root as working directory (so ``../shared/data`` resolves as the README says).  A
block fails if it raises or prints nothing; a block that reads a path under ``../shared/data``
which is absent is skipped.  When a block is followed by a ```text block, that block is the
output the README promises: it must match, up to floating-point numbers (each is replaced by
``<float>``, so that rounding noise and timings may vary) and runs of spaces.

Of the ```bash blocks, only the lines in :data:`RUN` are run (cheap, read-only, no network);
every other line must match a pattern of :data:`NOT_RUN`, which says why it is not: a new line
in the README fails :func:`test_every_bash_line_is_classified` until it is put in one of them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: Characters per line of a README code block (as the docs' code boxes: tests/test_docs_layout.py).
LIMIT = 88

#: The bash lines that are run: each is cheap (seconds), reads nothing it may change and needs
#: no network.  Each must exit 0 and print something.
RUN = {
    "structconv --help": "the command's usage",
    "structconv check --cases 2": "the framework's identities on 2 random cases each: seconds",
}

#: Patterns of the bash lines that are not run, and why.
NOT_RUN = {
    r"pip install .*": "installs packages: changes the environment and needs the network",
    r"bash scripts/setup\.sh.*": "creates .venv and installs into it (the network, minutes)",
    r"bash scripts/main\.sh": "the main job: minutes of training (scripts/main.sh)",
    r"bash scripts/test\.sh": "the whole test suite, this file included: over ten minutes",
    r"structconv cifar train .*--preset (fast|paper).*": "needs a GPU: minutes to hours",
    r"structconv cifar train .*--preset smoke.*": (
        "trains and writes a run directory under runs/ (tests/test_cifar_train.py runs the "
        "smoke preset in a temporary directory)"
    ),
    r"structconv cifar demo.*": "the CPU demo: minutes of training (scripts/main.sh runs it)",
    r"structconv cifar plot .*": "needs trained runs under its directory",
    r"structconv (planetoid|tour)\b.*": "minutes of training (tests/test_tour.py, test_examples.py)",
}


def blocks() -> list[tuple[str, int, str, str | None]]:
    """Every fenced block of README.md: ``(language, line of its first code line, code, output)``.

    ``output`` is the code of a ```text block that follows the block with nothing but blank lines
    between them (the output the README shows for it), else ``None``.
    """
    text = README.read_text(encoding="utf-8")
    matches = list(re.finditer(r"^```(\w*)\n(.*?)^```[ \t]*$", text, re.S | re.M))
    found = []
    for m, after in zip(matches, [*matches[1:], None], strict=True):
        shown = None
        if after is not None and after.group(1) == "text" and not text[m.end() : after.start()].strip():
            shown = after.group(2)
        found.append((m.group(1), text.count("\n", 0, m.start(2)) + 1, m.group(2), shown))
    return found


BLOCKS = blocks()
PYTHON = [(line, code, shown) for lang, line, code, shown in BLOCKS if lang == "python"]


FLOAT = r"[-+]?\d+\.\d+(?:e[-+]?\d+)?"


def masked(text: str) -> list[str]:
    """Lines with every floating-point number (``1.5``, ``2.0e-15``, ``80.7%``) as ``<float>``."""
    text = re.sub(FLOAT, "<float>", text)
    return [" ".join(line.split()) for line in text.strip().split("\n")]


def numbers_agree(printed: str, shown: str) -> list[str]:
    """The printed numbers that disagree with the README's: what a reader would see differ.

    A number of magnitude at least 1e-3 (an accuracy, a score ratio) must be within 5 % of the
    shown one (seeds fix them; other BLAS builds move the last digits); a smaller one (a
    rounding error such as ``2.0e-15``) must stay below ten times the shown one.
    """
    bad = []
    for got, want in zip(re.findall(FLOAT, printed), re.findall(FLOAT, shown), strict=True):
        g, w = float(got), float(want)
        ok = abs(g) <= 10 * abs(w) if abs(w) < 1e-3 else abs(g - w) <= 0.05 * abs(w)
        if not ok:
            bad.append(f"{got} where README shows {want}")
    return bad


def bash_lines() -> list[str]:
    """The commands of the ```bash blocks: one per line, comments and blank lines dropped."""
    lines = []
    for lang, _, code, _ in BLOCKS:
        if lang == "bash":
            for line in code.split("\n"):
                command = re.sub(r"(^|\s)#.*$", "", line).strip()
                if command:
                    lines.append(command)
    return lines


def test_the_readme_has_its_blocks() -> None:
    assert len(PYTHON) >= 6  # the 30-second example and the five first tasks
    assert set(RUN) <= set(bash_lines())


def test_code_lines_fit() -> None:
    long = [
        f"README.md:{start + n}: {len(text)} chars"
        for _, start, code, _ in BLOCKS
        for n, text in enumerate(code.split("\n"))
        if len(text) > LIMIT
    ]
    assert not long, "\n".join(long)


@pytest.mark.parametrize(("line", "code", "shown"), PYTHON, ids=[f"line{p[0]}" for p in PYTHON])
def test_python_block_runs_alone(line: int, code: str, shown: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    for path in re.findall(r"""["'](\.\./shared/data[^"']*)["']""", code):
        if not (ROOT / path).exists():
            pytest.skip(f"{path} is absent (the block at README.md:{line} reads it)")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
    printed = out.getvalue()
    assert printed.strip(), f"the block at README.md:{line} prints nothing"
    if shown is not None:
        assert masked(printed) == masked(shown), f"README.md:{line} prints:\n{printed}"
        assert not numbers_agree(printed, shown), f"README.md:{line}: {numbers_agree(printed, shown)}"


def test_every_bash_line_is_classified() -> None:
    lines = bash_lines()
    unknown = [ln for ln in lines if ln not in RUN and not any(re.fullmatch(p, ln) for p in NOT_RUN)]
    assert not unknown, "bash lines neither in RUN nor in NOT_RUN:\n" + "\n".join(unknown)


@pytest.mark.parametrize("command", sorted(RUN))
def test_bash_line_runs(command: str) -> None:
    if command not in bash_lines():
        pytest.skip(f"{command!r} is no longer in README.md")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{command} printed nothing"
