"""Autocast queries that also hold on devices torch's autocast does not know (``meta``).

``torch.is_autocast_enabled("meta")`` and ``torch.autocast("meta")`` raise, while a training
step run on the ``meta`` device (tests/test_cifar_device.py checks the CIFAR step for host
reads that way) has no autocast to honour: these helpers answer "off" there.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

#: Device types with an autocast of their own.
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu")


def autocast_dtype(kind: str) -> Any:
    """The dtype autocast runs matrix products in on device type ``kind``, or ``None`` when it is off."""
    if kind not in AUTOCAST_DEVICES or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def autocast_off(kind: str) -> contextlib.AbstractContextManager[Any]:
    """A context with autocast disabled on device type ``kind`` (nothing to disable elsewhere)."""
    return torch.autocast(kind, enabled=False) if kind in AUTOCAST_DEVICES else contextlib.nullcontext()
