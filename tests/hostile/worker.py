"""The worker: runs cases one after another and answers one JSON line per case.

Started by :mod:`.runner`, it first limits its own address space (``RLIMIT_AS``, the bytes in
``HOSTILE_MEMORY``) and works in its own sandbox directory: its working directory, where a
payload's canary would appear, with ``home`` (``HOME`` and the reader caches) and ``work``
(``TMPDIR``, where cases write their files; emptied after every case).  It reads a case per
line on stdin and writes a ready line, then per case an announcement and a result, on the pipe
that was its stdout; what the package or a dependency prints goes to stderr instead, which the
parent keeps in a log.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import resource
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from .classify import classify_answer, classify_exception, normalise
from .spec import Case, Trial

CANARY = "CANARY"
"""A malicious input's payload writes this file in the sandbox; finding it means code ran."""
CANARY_ENV = "HOSTILE_PWNED"
"""... or sets this environment variable."""


def _protocol_pipe() -> TextIO:
    """The original stdout, for results only; fd 1 then points at stderr (prints cannot corrupt the protocol)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def _snapshot(directories: tuple[str, ...]) -> dict[str, set[str]]:
    return {d: set(os.listdir(d)) if os.path.isdir(d) else set() for d in directories}


def _security(sandbox: str, before_root: set[str], trial: Trial, before: dict[str, set[str]]) -> str | None:
    """What a case left that it should not have: the canary, a new file in the sandbox or a read-only folder."""
    if os.path.exists(os.path.join(sandbox, CANARY)):
        return "a payload ran: the canary file was written"
    if os.environ.get(CANARY_ENV):
        return "a payload ran: the canary variable was set"
    new = set(os.listdir(sandbox)) - before_root
    if new:
        return f"files appeared outside the case's folder: {sorted(new)}"
    for folder, names in before.items():
        added = (set(os.listdir(folder)) if os.path.isdir(folder) else set()) - names
        if added:
            return f"files written into the read-only data folder: {sorted(added)}"
    return None


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def _clean(sandbox: str, keep: set[str]) -> None:
    """Remove what a case left: new entries of the sandbox and everything in its ``work`` folder (``TMPDIR``)."""
    os.environ.pop(CANARY_ENV, None)
    for name in set(os.listdir(sandbox)) - keep:
        _remove(os.path.join(sandbox, name))
    work = os.path.join(sandbox, "work")
    for name in os.listdir(work):
        _remove(os.path.join(work, name))


def run_case(case: Case, sandbox: str, announce: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run one case and classify its outcome (all but the parent's crash kinds).

    ``announce`` receives the input's description before the call, so that the parent can
    describe a case that kills its worker.
    """
    module = importlib.import_module(f"{__package__}.{case.module}")
    keep = set(os.listdir(sandbox))
    record: dict[str, Any] = {"id": case.id, "entry": case.entry}
    start = time.perf_counter()
    try:
        trial: Trial = module.trial(case.entry, case.params)
    except Exception as exc:  # the suite's own bug: reported as such, never as the package's
        record.update(outcome="harness", cause=f"building the case: {type(exc).__name__}", message=str(exc))
        record.update(input=repr(case.params)[:300], expect="?", where="tests/hostile")
        _clean(sandbox, keep)
        return record
    record.update(input=normalise(trial.describe, sandbox), expect=trial.expect)
    if announce is not None:
        announce(record["input"])
    before = _snapshot(trial.readonly)
    answer: Any = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            answer = trial.call()
    except BaseException as exc:  # everything, SystemExit included: the CLI cases catch their own
        if isinstance(exc, KeyboardInterrupt):
            raise
        outcome, cause, where = classify_exception(exc, trial)
        message = f"{type(exc).__name__}: {exc}"
    else:
        where, message = "", str(getattr(answer, "message", ""))  # a command line's answer carries its stderr
        try:
            outcome, cause = classify_answer(answer, trial)
        except Exception as exc:
            outcome, cause, message = "harness", f"checking the answer: {type(exc).__name__}", str(exc)
    breach = _security(sandbox, keep, trial, before)
    if breach is not None:
        outcome, cause = "security", breach
    _clean(sandbox, keep)
    record.update(outcome=outcome, cause=cause, where=where, message=normalise(message, sandbox))
    record["seconds"] = round(time.perf_counter() - start, 4)
    return record


def _limit_memory() -> None:
    """Apply the address-space limit the parent set (``HOSTILE_MEMORY``, bytes) to this process and its children."""
    memory = int(os.environ.get("HOSTILE_MEMORY", "0"))
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    _limit_memory()
    proto = _protocol_pipe()
    faulthandler.enable(sys.stderr)
    sandbox = os.getcwd()
    import torch  # imported before the first case, so that its import time is no case's

    torch.set_num_threads(1)
    for name in ("cases_conv", "cases_grid", "cases_graph", "cases_sparse", "cases_attention", "cases_nn"):
        importlib.import_module(f"{__package__}.{name}")
    proto.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in sys.stdin:
        raw = json.loads(line)
        case = Case(raw["id"], raw["entry"], raw["module"], raw["params"])
        print(f"== case {case.id}", file=sys.stderr, flush=True)

        def announce(text: str) -> None:
            proto.write(json.dumps({"started": text}) + "\n")

        proto.write(json.dumps(run_case(case, sandbox, announce)) + "\n")


if __name__ == "__main__":
    main()
