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


def check_input_dtype(x: torch.Tensor, parameter: torch.Tensor, layer: str, arg: str = "x") -> None:
    """Raise a ``TypeError`` naming ``arg`` when ``x`` and a layer's ``parameter`` differ in dtype.

    Under autocast on ``x``'s device the mismatch is autocast's to resolve, so nothing is raised.

    Examples
    --------
    >>> check_input_dtype(torch.zeros(2, dtype=torch.float64), torch.zeros(2), "GATConv")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: GATConv: x has dtype torch.float64 but the layer's parameters are torch.float32; convert one ...
    """
    if x.dtype == parameter.dtype or autocast_dtype(x.device.type) is not None:
        return
    raise TypeError(
        f"{layer}: {arg} has dtype {x.dtype} but the layer's parameters are {parameter.dtype}; convert one of them "
        f"({arg}.to({parameter.dtype}) or layer.to({x.dtype})), or run under torch.autocast"
    )
