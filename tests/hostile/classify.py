"""How an outcome is classified, and how an answer is compared with its dense reference.

The rules (``docs/robustness.rst`` states them for readers):

* an answer to a valid input is ``right`` when it has the reference's shape, backend and dtype
  and its values are within the rounding bound of the dtype; otherwise ``silent``, as is any
  answer to an input that should have been refused;
* an exception is ``clear`` when it is of an expected type (:data:`EXPECTED`), a ``raise``
  statement of the ``structconv`` package raised it (its last frame is the package's, on a
  ``raise`` line: not a compiled NumPy or torch function the package called), and its message
  names one of the case's arguments (as a whole word); otherwise ``raw`` -- as is a refusal of a
  valid input, whatever its message;
* ``MemoryError``, ``RecursionError`` and torch's allocation failures are ``crash``, as are a
  worker that died or ran past its time limit (decided by the parent).
"""

from __future__ import annotations

import linecache
import os
import pickle
import re
import traceback
from types import TracebackType
from typing import Any

import numpy as np

import structconv

from .spec import ERROR, VALID, Trial

PACKAGE_DIR = os.path.dirname(os.path.abspath(structconv.__file__)) + os.sep

EXPECTED: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    LookupError,
    NotImplementedError,
    OSError,
    pickle.UnpicklingError,
)
"""Exception types a refusal may have: what callers catch for bad arguments and bad files."""

_OOM = re.compile(r"can't allocate memory|not enough memory|DefaultCPUAllocator|out of memory", re.IGNORECASE)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_FILE_SIZE = re.compile(r"\b\d[\d,]*-byte file")
_TEMPNAME = re.compile(r"\b(case|cli|cli-out|cli-cifar|structconv-hostile)-[A-Za-z0-9_]{8}\b")


def frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` of every frame of a traceback, outermost first."""
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(tb)]


def short_path(path: str) -> str:
    """A file path as the report shows it: from ``structconv/`` or the site-packages folder on."""
    if path.startswith(PACKAGE_DIR):
        return "structconv/" + path[len(PACKAGE_DIR) :]
    for marker in ("site-packages" + os.sep, "lib" + os.sep + "python3"):
        at = path.find(marker)
        if at >= 0:
            return path[at + len(marker) :].lstrip(os.sep)
    return os.path.basename(path)


def names_argument(message: str, names: tuple[str, ...]) -> bool:
    """Whether ``message`` names one of ``names`` as a whole word (``x`` in ``x has shape``, not in ``expected``)."""
    return any(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w])", message, re.IGNORECASE) for name in names)


def normalise(message: str, sandbox: str) -> str:
    """A text without what differs between runs (sandbox path, temporary names, addresses), cut to 400 characters."""
    text = message.replace(sandbox, "<tmp>") if sandbox else message
    text = _ADDRESS.sub("0x…", text)
    text = _TEMPNAME.sub(r"\1-XXXXXXXX", text)
    text = _FILE_SIZE.sub("N-byte file", text)  # a torch.save'd file holds a random id: its size varies
    return text if len(text) <= 400 else text[:397] + "..."


def classify_exception(exc: BaseException, trial: Trial) -> tuple[str, str, str]:
    """``(outcome, cause, where)`` of an exception raised by a case's call."""
    stack = frames(exc.__traceback__)
    last = stack[-1] if stack else ("?", 0, "?")
    ours = [f for f in stack if f[0].startswith(PACKAGE_DIR)]
    where = f"{short_path(ours[-1][0])}:{ours[-1][1]}" if ours else f"{short_path(last[0])}:{last[1]}"
    kind = type(exc).__name__
    if isinstance(exc, MemoryError | RecursionError):
        return "crash", kind, where
    if isinstance(exc, RuntimeError) and _OOM.search(str(exc)):
        return "crash", "allocation failure", where
    if not isinstance(exc, EXPECTED):
        return "raw", f"unexpected type {kind}", where
    if not last[0].startswith(PACKAGE_DIR):
        return "raw", f"{kind} raised in {short_path(last[0])}", where
    if not linecache.getline(last[0], last[1]).lstrip().startswith("raise"):
        # the package's frame is last, but it did not raise: a compiled function it called did
        return "raw", f"{kind} raised by a compiled function called at {where}", where
    if trial.expect == VALID:
        return "raw", f"refused a valid input ({kind})", where
    if not names_argument(str(exc), trial.names):
        return "raw", f"{kind} does not name {' or '.join(trial.names) or 'the argument'}", where
    return "clear", kind, where


def classify_answer(answer: Any, trial: Trial) -> tuple[str, str]:
    """``(outcome, cause)`` of a case's call that returned."""
    if trial.check is None or (trial.expect == ERROR and not trial.judges):
        return "silent", "accepted an input it should refuse"
    problem = trial.check(answer)
    if isinstance(problem, tuple):  # a check that judges the answer itself (a command's exit status)
        return problem
    return ("right", "") if problem is None else ("silent", problem)


# --- comparing answers with a dense reference ---------------------------------------------------------
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
"""Unit roundoff of each floating dtype."""
TINY = {"float64": 2.3e-308, "float32": 1.2e-38, "float16": 6.2e-5, "bfloat16": 1.2e-38}
"""Smallest normal number of each dtype: subnormal products may be flushed to zero."""


def dtype_name(a: Any) -> str:
    return str(a.dtype).removeprefix("torch.")


def backend_name(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    return "torch" if type(a).__module__.startswith("torch") else type(a).__name__


def to_numpy(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a.astype(np.float64)
    return a.detach().to("cpu").double().numpy()


def compare(
    answer: Any,
    reference: np.ndarray,
    bound: np.ndarray,
    dtype: str,
    backend: str,
    terms: int,
    device: str = "cpu",
    nan_input: bool = False,
) -> str | None:
    r"""``None`` if ``answer`` equals ``reference`` to rounding, else what differs.

    ``bound`` is the same contraction on absolute values; a sum of ``terms`` products rounded in
    ``dtype`` is off by at most about ``terms * eps * bound`` (the classic :math:`\gamma_n` bound),
    with slack for the orders' different groupings.  Non-finite reference entries must be
    non-finite in the answer; finite answer entries must match finite reference entries.  With
    ``nan_input`` (NaN or infinity in an operand) the answer may be non-finite where the reference
    is not: a dense order multiplies the zeros a sparse one skips.
    """
    if backend_name(answer) != backend:
        return f"answer is a {backend_name(answer)} array, expected {backend}"
    if tuple(answer.shape) != tuple(reference.shape):
        return f"answer has shape {tuple(answer.shape)}, expected {tuple(reference.shape)}"
    if dtype_name(answer) != dtype:
        return f"answer has dtype {dtype_name(answer)}, expected {dtype}"
    if backend == "torch" and str(answer.device) != device:
        return f"answer is on {answer.device}, expected {device}"
    if device == "meta":
        return None
    got = to_numpy(answer)
    eps = EPS.get(dtype, 2.0**-52)
    tol = 4.0 * (terms + 2) * eps * bound + 10.0 * (terms + 2) * TINY.get(dtype, 0.0)
    finite_ref = np.isfinite(reference)
    if not nan_input and not np.all(np.isfinite(got) | ~finite_ref | ~np.isfinite(bound)):
        return "answer is NaN or infinite where the reference is finite"
    if np.any(np.isfinite(got[~finite_ref])):
        return "answer is finite where the reference is NaN or infinite"
    ok = finite_ref & np.isfinite(bound) & np.isfinite(got)
    err = np.abs(got[ok] - reference[ok])
    if err.size and bool(np.any(err > tol[ok])):
        worst = int(np.argmax(err - tol[ok]))
        return f"wrong values: max error {float(err[worst]):.3g} exceeds the {dtype} bound {float(tol[ok][worst]):.3g}"
    return None
