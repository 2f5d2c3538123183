"""Cases whose outcome is known, one per outcome: the harness checked against them (``tests/test_hostile_suite.py``).

They are not part of the suite (``python -m tests.hostile`` does not draw them): each makes its
worker do what a package failure would, a payload that runs, a segfault, a hang, an allocation
beyond the memory limit, so that the classification and the worker restarts are tested too.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import time
from typing import Any

import numpy as np

from . import craft
from .spec import ERROR, VALID, Trial

ENTRIES: dict[str, Any] = {}
KNOWN = {
    "right": "right",
    "segfault": "crash",
    "clear": "clear",
    "hang": "crash",
    "raw": "raw",
    "memory": "crash",
    "payload": "security",
    "silent": "silent",
    "write_outside": "security",
}
"""Each self-test case and the outcome the harness must give it, in the order they run."""


def trial(entry: str, p: dict[str, Any]) -> Trial:
    import torch

    import structconv as sc

    A, x, theta = np.ones((2, 3, 4)), np.ones((5, 3, 6)), np.ones((2, 6, 7))
    if entry == "right":
        want = np.einsum("kmn,bmp,kpq->bnq", A, x, theta)
        return Trial(
            "conv, valid", lambda: sc.conv(A, x, theta), VALID, (), lambda y: None if np.allclose(y, want) else "no"
        )
    if entry == "clear":
        return Trial("conv, theta of K=3", lambda: sc.conv(A, x, np.ones((3, 6, 7))), ERROR, ("theta",))
    if entry == "silent":
        return Trial("conv, valid but expected to fail", lambda: sc.conv(A, x, theta), ERROR, ("theta",))
    if entry == "raw":
        return Trial("a torch error", lambda: torch.zeros(2) @ torch.zeros(3), ERROR, ("x",))
    if entry == "segfault":
        return Trial("reads address 0", lambda: ctypes.string_at(0), ERROR)
    if entry == "hang":
        return Trial("sleeps past the limit", lambda: time.sleep(3600), ERROR)
    if entry == "memory":
        return Trial("allocates 16 GiB", lambda: bytearray(16 << 30), ERROR)
    if entry == "payload":
        blob = craft.malicious("os.system", "reduce_p2")
        return Trial("pickle.loads of an os.system payload", lambda: pickle.loads(blob), ERROR)
    path = os.path.join(os.getcwd(), "stray-file")
    return Trial("writes beside the case's folder", lambda: open(path, "w").close(), ERROR)
