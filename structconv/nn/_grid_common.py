"""What the grid layers share: input checks, the grid of an input, a named ``__init__``."""

from __future__ import annotations

import types
from typing import Any

import torch


def check_tensor(x: object, layer: str) -> None:
    """Refuse an input that is not a tensor (a nested list), naming the layer."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{layer}: input must be a torch.Tensor, got {type(x).__name__}")


def split_input(x: torch.Tensor, ndim: int, channels: int | None, layer: str) -> tuple[torch.Tensor, bool]:
    """Check a ``(B, C, *grid)`` or ``(C, *grid)`` input; return it batched and whether it was unbatched."""
    check_tensor(x, layer)
    if x.ndim not in (ndim + 1, ndim + 2):
        raise ValueError(
            f"{layer}: input must have shape (B, C, {', '.join('S' + str(i + 1) for i in range(ndim))}) or "
            f"unbatched (C, ...), got {tuple(x.shape)}"
        )
    unbatched = x.ndim == ndim + 1
    xb = x[None] if unbatched else x
    if channels is not None and int(xb.shape[1]) != channels:
        raise ValueError(f"{layer}: expected {channels} input channels (dim 1), got input of shape {tuple(x.shape)}")
    return xb, unbatched


def grid_and_like(
    x: torch.Tensor | tuple[int, ...], like: torch.Tensor | None, ndim: int, layer: str
) -> tuple[tuple[int, ...], torch.Tensor]:
    """A grid layer's ``basis`` arguments: an input ``x`` (``(B, C, *grid)`` or ``(C, *grid)``), or ``grid, like``."""
    if isinstance(x, torch.Tensor):
        if like is not None:
            raise ValueError(f"{layer}: basis(x) takes the input alone; like goes with a grid, basis(grid, like)")
        xb, _ = split_input(x, ndim, None, layer)
        return tuple(int(s) for s in xb.shape[2:]), xb
    if like is None:
        raise ValueError(f"{layer}: basis(grid, like) needs like, a tensor with the basis' dtype and device")
    return tuple(int(s) for s in x), like


def own_init(cls: type, init: Any) -> None:
    """Give ``cls`` its own copy of ``init``, its base's ``__init__``, named after ``cls``.

    Python names the function in the ``TypeError`` of a wrong call, so a call with too many
    positional arguments reads ``GridConv2d.__init__() takes ... positional arguments but ... were
    given`` rather than naming the private base.  The copy has the same code,
    defaults and signature.
    """
    copy = types.FunctionType(init.__code__, init.__globals__, init.__name__, init.__defaults__, init.__closure__)
    copy.__kwdefaults__ = init.__kwdefaults__
    copy.__annotations__ = init.__annotations__
    copy.__doc__ = init.__doc__
    copy.__module__ = cls.__module__
    copy.__qualname__ = f"{cls.__qualname__}.__init__"
    type.__setattr__(cls, "__init__", copy)
