"""The command line: ``structconv ...`` through ``structconv.cli.main``, and a few real processes.

A case draws a subcommand, an option and a bad value for it (zero, negative, non-integer, NaN,
``inf``, huge, empty, misspelt), or a bad data folder, archive, checkpoint or run folder crafted
as in :mod:`.cases_data`.  A bad command must exit with status 2 (usage) or 1 (a failure at run
time), with a one-line message naming the option or file, never a traceback; a valid one must
exit 0.  The ``console`` cases run ``structconv`` and ``python -m structconv`` as processes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from .classify import names_argument
from .spec import EITHER, ERROR, VALID, Trial

BAD_INTS = ("0", "-1", "2.5", "abc", "", "nan", "inf", "1e3", "--", "-0", str(2**64))
BAD_FLOATS = ("0", "-1", "nan", "inf", "-inf", "abc", "", "1e999")
OPTIONS: dict[str, tuple[str, ...]] = {
    "check": ("--seed", "--cases", "--backends"),
    "planetoid": ("--data", "--name", "--model", "--seeds", "--epochs"),
    "cifar train": ("--model", "--preset", "--epochs", "--batch-size", "--lr", "--seed", "--time-limit", "--option")
    + ("--set", "--data", "--device", "--train-subset", "--test-subset", "--cache"),
    "cifar eval": ("runs", "--device", "--data"),
    "cifar plot": ("runs",),
    "cifar bench": ("--batch", "--steps", "--rounds", "--only", "--peak-tflops", "--device"),
    "cifar demo": ("--epochs", "--lr", "--time-limit", "--device"),
}
INT_OPTIONS = ("--seed", "--cases", "--seeds", "--epochs", "--batch-size", "--train-subset", "--test-subset")
INT_OPTIONS += ("--batch", "--steps", "--rounds")
FLOAT_OPTIONS = ("--lr", "--time-limit", "--peak-tflops")
COMMAND_DEFECTS = ("no_command", "unknown_command", "unknown_option", "misspelt_option", "missing_value")


@st.composite
def cli_params(draw: Any) -> dict[str, Any]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    option = draw(st.sampled_from(OPTIONS[command]))
    kind = draw(st.sampled_from(("value", "value", "value", "file", "structure", "valid")))
    if option in INT_OPTIONS:
        value = draw(st.sampled_from(BAD_INTS))
    elif option in FLOAT_OPTIONS:
        value = draw(st.sampled_from(BAD_FLOATS))
    else:
        value = draw(
            st.sampled_from(("bogus", "", "ALL", "gcn,,gat", "key", "=1", "heads=abc", "lr=-1", "cuda", "meta"))
        )
    return {
        "command": command,
        "option": option,
        "value": value,
        "kind": kind,
        "structure": draw(st.sampled_from(COMMAND_DEFECTS)),
        "file": draw(st.sampled_from(("missing", "empty_folder", "garbage", "malicious", "file_not_folder"))),
    }


@st.composite
def console_params(draw: Any) -> dict[str, Any]:
    return {"way": draw(st.sampled_from(("script", "module", "cli_module"))), "args": draw(st.sampled_from(ARGVS))}


ARGVS = (("--version",), ("check", "--cases", "0"), ("cifar", "train", "--epochs", "-1"), ("bogus",))
ENTRIES = {"cli": (cli_params(), 420), "console": (console_params(), 12)}


@dataclass
class Ran:
    """A command's answer: its exit status and what it printed (``message``: the end of stderr)."""

    status: int
    out: str
    err: str

    @property
    def message(self) -> str:
        return f"exit {self.status}: " + "\n".join(self.err.strip().splitlines()[-3:])


def _main(argv: list[str]) -> Ran:
    """``structconv.cli.main(argv)`` with its output captured; an uncaught exception propagates."""
    from structconv.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit_:
            code = exit_.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
    return Ran(int(status), out.getvalue(), err.getvalue())


def _judge(ran: Ran, expect: str, names: tuple[str, ...], status: int | None, want: str) -> Any:
    """``(outcome, cause)`` of a command's answer."""
    if expect == VALID:
        if ran.status == 0 and want in ran.out:
            return "right", ""
        return "raw", f"a valid command exited {ran.status}"
    if ran.status == 0:
        return ("right", "") if expect == EITHER else ("silent", "a bad command exited 0")
    if "Traceback (most recent call last)" in ran.err:
        return "raw", "a traceback instead of a message"
    if status is not None and ran.status != status:
        return "raw", f"exit status {ran.status}, expected {status} ({'usage' if status == 2 else 'runtime'} error)"
    if not names_argument(ran.err, names):
        return "raw", f"the message does not name {' or '.join(names)}"
    return "clear", f"exit {ran.status}"


def _folder(kind: str) -> Path:
    """A data folder (or file) of the given kind in a fresh temporary folder."""
    import tempfile

    from . import craft

    root = Path(tempfile.mkdtemp(prefix="cli-"))
    if kind == "missing":
        return root / "missing"
    if kind == "file_not_folder":
        path = root / "a-file"
        path.write_text("x")
        return path
    data = root / "data"
    data.mkdir()
    if kind == "garbage":
        (data / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b" + os.urandom(64))
        (data / "ind.cora.x").write_bytes(os.urandom(64))
    elif kind == "malicious":
        blob = craft.malicious("os.system", "reduce_p4")
        (data / "cifar-10-python.tar.gz").write_bytes(
            craft.tar_bytes([craft.file_member("cifar-10-batches-py/test_batch", blob)])
        )
        for suffix in ("x", "y", "tx", "ty", "allx", "ally", "graph"):
            (data / f"ind.cora.{suffix}").write_bytes(blob)
        (data / "ind.cora.test.index").write_text("1\n")
        (data / "checkpoint.pt").write_bytes(blob)
    if kind in ("garbage", "malicious"):
        (data / "run1").mkdir()
        (data / "run1" / "metrics.json").write_text("{" if kind == "garbage" else '{"history": 3}')
    return data


def _valid_cifar() -> Path:
    """A folder holding a valid tiny official CIFAR-10 archive (4 images a batch)."""
    import pickle
    import tempfile

    import numpy as np

    from . import craft

    data = Path(tempfile.mkdtemp(prefix="cli-cifar-"))
    rng = np.random.default_rng(0)
    members = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 3]}
        members.append(craft.file_member(f"cifar-10-batches-py/{name}", pickle.dumps(batch, protocol=4)))
    (data / "cifar-10-python.tar.gz").write_bytes(craft.tar_bytes(members))
    return data


def trial(entry: str, p: dict[str, Any]) -> Trial:
    if entry == "console":
        return _console_trial(p)
    command, option, value, kind = p["command"].split(), p["option"], p["value"], p["kind"]
    argv: list[str] = list(command)
    names: tuple[str, ...] = (option, option.lstrip("-"))
    status: int | None = 2
    expect, want = ERROR, ""
    words = ""
    if kind == "valid":
        argv, expect, want, words = _valid(command)
    elif kind == "structure":
        argv, names, words = _structure(command, p["structure"])
    elif kind == "file" or option in ("--data", "runs", "--cache"):
        folder = _folder(p["file"])
        where = {"runs": [str(folder / "checkpoint.pt" if folder.name == "data" else folder)]}.get(option)
        argv += where if where is not None else ([option, str(folder)] if option != "runs" else [str(folder)])
        if command[0] == "cifar" and option == "--cache":
            argv += ["--data", str(_folder("garbage"))]
        if command == ["cifar", "eval"] and option == "runs":
            argv += ["--data", str(_valid_cifar())]  # eval reads the test split before the checkpoints
        argv += _cheap(command, option)
        names = (option, folder.name, "cifar-10-python.tar.gz", "ind.cora.x", "checkpoint.pt", "metrics.json")
        names += ("test_batch", "data", "cache")
        status = None  # a missing folder is a usage error (2), a corrupt file a failure at run time (1)
        words = f"{option} {p['file']}"
        if command == ["cifar", "plot"] and p["file"] in ("empty_folder", "missing"):
            expect = EITHER  # no runs to plot: nothing to do
    else:
        if option == "--only" and value in ("", "ALL"):
            value = "bogus"  # an empty --only is every variant: valid, and slow
        if _accepts(option, value):
            value = "abc"  # a valid value would run the command: only refusals are drawn here
        if value == str(2**64) and option in ("--batch", "--seed"):
            expect = EITHER  # a valid count that torch cannot hold: refused clearly, or run
        argv += [option, value] if option != "runs" else [value]
        argv += _cheap(command, option)
        words = f"{option} {value!r}"
        if option in ("--option", "--set", "--only", "--backends", "--model", "--device", "--name", "--preset"):
            status = None
    describe = f"structconv {' '.join(_quote(a) for a in argv)}; {words or 'valid'}"

    def check(ran: Ran) -> Any:
        return _judge(ran, expect, names, status, want)

    return Trial(describe, lambda: _main(argv), expect, (), check, judges=True)


def _accepts(option: str, value: str) -> bool:
    """Whether the option's documented type takes ``value`` (``--seed 0``, ``--time-limit 0``).

    A huge count (``2**64`` cases, seeds or steps) is valid too, and would run for ever; only the
    batch size and the seed, which reach torch at once, keep it.
    """
    try:
        number = int(value) if option in INT_OPTIONS else float(value)
    except ValueError:
        return False
    if option not in INT_OPTIONS + FLOAT_OPTIONS or number != number or number in (float("inf"), float("-inf")):
        return False
    if number >= 2**63:
        return option not in ("--batch", "--seed")
    return number >= 0 if option in ("--seed", "--time-limit") else number > 0


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_=.,:/" for c in arg) else json.dumps(arg)


def _scratch(name: str) -> str:
    """An absolute output folder in the case's work area (emptied after the case)."""
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="cli-out-"), name)


def _cheap(command: list[str], tested: str) -> list[str]:
    """Options that make a command fail fast or do little if the bad value is accepted (never the tested one)."""
    pairs: list[tuple[str, ...]] = []
    if command == ["cifar", "train"]:
        pairs = [("--preset", "smoke"), ("--train-subset", "8"), ("--test-subset", "8"), ("--out", _scratch("runs"))]
    elif command == ["cifar", "demo"]:
        pairs = [("--train-subset", "8"), ("--test-subset", "8"), ("--out", _scratch("runs"))]
    elif command == ["cifar", "bench"]:
        pairs = [
            ("--steps", "1"),
            ("--rounds", "1"),
            ("--batch", "2"),
            ("--only", "resnet18"),
            ("--out", _scratch("bench")),
        ]
    elif command == ["planetoid"]:
        pairs = [("--seeds", "1"), ("--epochs", "1"), ("--model", "gcn")]
    elif command == ["check"]:
        pairs = [("--cases", "1")]
    if command in (["cifar", "train"], ["cifar", "demo"]):
        pairs.append(("--no-progress",))
    return [arg for pair in pairs if pair[0] != tested for arg in pair]


def _valid(command: list[str]) -> tuple[list[str], str, str, str]:
    """A cheap valid command line near ``command``, and what its output must contain."""
    if command == ["check"]:
        return ["check", "--cases", "1", "--backends", "numpy"], VALID, "0 failed", "valid"
    if command[0] == "cifar":
        return [*command, "--help"], VALID, "exit status", "valid (--help)"
    return ["--version"], VALID, "structconv", "valid (--version)"


def _structure(command: list[str], defect: str) -> tuple[list[str], tuple[str, ...], str]:
    if defect == "no_command":
        return command[:1] if len(command) > 1 else [], ("command", "commands", "required", "verb"), "no subcommand"
    if defect == "unknown_command":
        return [*command[:1], "trian"], ("trian", "train", "invalid choice"), "a misspelt subcommand"
    if defect == "unknown_option":
        return [*command, "--frobnicate", "1"], ("--frobnicate",), "an unknown option"
    if defect == "misspelt_option":
        # not a prefix of the option: argparse takes an unambiguous prefix as the option itself
        wrong = {"check": "--csaes", "planetoid": "--sedes", "cifar": "--epohcs"}[command[0]]
        return [*command, wrong, "1"], (wrong, wrong.lstrip("-")), "a misspelt option"
    option = OPTIONS[" ".join(command)][0]
    if option == "runs":
        return list(command), ("runs", "required"), "a required argument missing"
    return [*command, option], (option,), "an option without its value"


def _console_trial(p: dict[str, Any]) -> Trial:
    args = list(p["args"])
    way = p["way"]
    if way == "script":
        argv = [str(Path(sys.executable).parent / "structconv"), *args]
    elif way == "module":
        argv = [sys.executable, "-m", "structconv", *args]
    else:
        argv = [sys.executable, "-m", "structconv.cli", *args]
    valid = args == ["--version"]
    names = {
        ("check", "--cases", "0"): ("--cases",),
        ("cifar", "train", "--epochs", "-1"): ("--epochs",),
        ("bogus",): ("bogus", "command"),
    }.get(tuple(args), ())

    def call() -> Ran:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        return Ran(done.returncode, done.stdout, done.stderr)

    def check(ran: Ran) -> Any:
        return _judge(ran, VALID if valid else ERROR, names, None if valid else 2, "structconv")

    describe = f"{' '.join(_quote(a) for a in argv[:3] if '/' not in a)} {' '.join(args)} (a process)"
    return Trial(describe, call, VALID if valid else ERROR, (), check, judges=True)
