"""What a case is, what a worker runs for it, and how cases are drawn.

A :class:`Case` is plain data (an entry point's name and the parameters Hypothesis drew), so the
parent can draw cases without importing torch and send them to a worker as JSON.  The worker
turns it into a :class:`Trial` with the ``trial`` function of the case's module: the call of the
public entry point, whether the input is valid, which argument a refusal must name, and how to
check an answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

OUTCOMES = ("right", "clear", "raw", "silent", "crash", "security")
"""Every case ends in one of these (``harness`` marks a bug of the suite itself)."""

VALID = "valid"
ERROR = "error"
EITHER = "either"
"""A case's expectation: a right answer, a clear error, or either of the two."""


@dataclass(frozen=True)
class Case:
    """One generated input: ``entry`` is the public entry point, ``module`` the cases module that runs it."""

    id: str
    entry: str
    module: str
    params: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "entry": self.entry, "module": self.module, "params": self.params})


@dataclass
class Trial:
    """What a worker runs for one case.

    Parameters
    ----------
    describe
        The input in words (or as code), for the report.
    call
        Calls the public entry point; it must call nothing of the suite's, so that the frame an
        error comes from is the package's or a dependency's.
    expect
        :data:`VALID`, :data:`ERROR` or :data:`EITHER`.
    names
        Argument names; a clear error names one of them.
    check
        For an answer: ``None`` when it is right, else what is wrong with it.
    readonly
        Directories the call must not write into (a reader's data directory).
    judges
        The check judges every answer itself, returning ``(outcome, cause)`` (a command line's
        answer is an exit status and a message, which may be a clear refusal).
    """

    describe: str
    call: Callable[[], Any]
    expect: str
    names: tuple[str, ...] = ()
    check: Callable[[Any], Any] | None = None
    readonly: tuple[str, ...] = field(default_factory=tuple)
    judges: bool = False


def draw(strategy: st.SearchStrategy[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` parameter sets from ``strategy``, the same on every run (derandomised, no database).

    Hypothesis seeds a derandomised run from the test function, which is this one for every
    entry point; the strategies differ, so the draws do.  Repeated draws are dropped, and each is
    returned as it travels to a worker (through JSON).
    """
    found: dict[str, dict[str, Any]] = {}

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(params: dict[str, Any]) -> None:
        text = json.dumps(params, sort_keys=True)
        found.setdefault(text, json.loads(text))  # as a worker will read it: tuples become lists

    collect()
    return list(found.values())


# --- strategies shared by the case modules -----------------------------------------------------------
HUGE = (10**10, 2**40, 2**63 - 1, 2**64)
"""Sizes no machine holds, and sizes that overflow C integers."""


def bad_sizes() -> st.SearchStrategy[Any]:
    """A size no entry point should take as it is: zero, negative, non-integer, huge, or not a number."""
    return st.sampled_from([0, -1, -(2**31), 2.5, 3.0, float("nan"), float("inf"), "3", None, True, *HUGE])


class Expectation:
    """What a case with several changes expects: the strictest of them, naming any of their arguments."""

    def __init__(self) -> None:
        self.expect = VALID
        self.names: list[str] = []
        self.words: list[str] = []

    def add(self, expect: str, names: tuple[str, ...], words: str) -> None:
        rank = {VALID: 0, EITHER: 1, ERROR: 2}
        if rank[expect] > rank[self.expect]:
            self.expect = expect
        self.names += [n for n in names if n not in self.names]
        self.words.append(words)

    @property
    def described(self) -> str:
        return "; ".join(self.words) or "valid"
