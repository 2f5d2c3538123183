"""The engine's operands: checked, placed alike, and the parameter read as the arrays of its kind.

The kinds of parameter (:class:`Kind`) and :class:`Param` are defined beside the orders they
pick, in :mod:`structconv.engine.orders` (:data:`FULL`) and :mod:`structconv.engine.kinds` (the
others); they are named here too, where the operands are read.  Importing the kinds makes them,
which registers each as the reader of its class of parameter objects (:func:`kind_of`).
"""

from __future__ import annotations

from typing import Any

from ..backend import Array, autocast_dtype, autocast_to, device_of, dtype_name, of, shape_str
from ..backend.checks import check_array, check_same_placement
from ..bases.base import Basis
from ..bases.convert import as_basis
from ..bases.factor import Theta
from .kinds import AGGREGATION, CONV_WEIGHT, LOWRANK, SEPARABLE
from .orders import FULL, Kind, Param, Shaped, kind_of


def as_param(theta: Theta) -> Param:
    """Read ``theta`` (an array, or a parameter object of a :class:`Kind`) as a :class:`Param`."""
    return kind_of(theta).read(theta)


def autocast(a: Basis | Array, x: Array, theta: Theta) -> tuple[Basis | Array, Array, Theta]:
    """Inside ``torch.autocast``, every floating operand in the autocast dtype, as ``torch.matmul`` would.

    Autocast leaves layers' outputs in the low dtype and their parameters in float32; the
    engine's dtype check would refuse that mix, so the operands are converted here, once, and
    the contraction runs in the autocast dtype (float64 is left alone, as autocast does).
    """
    dtype = autocast_dtype(x)
    if dtype is None:
        return a, x, theta
    theta = kind_of(theta).cast(theta, lambda op: autocast_to(op, dtype))
    a = autocast_to(a, dtype) if not isinstance(a, Basis) else autocast_basis(a, dtype)
    return a, autocast_to(x, dtype), theta


def autocast_basis(basis: Basis, dtype: Any) -> Basis:
    """``basis`` in the autocast ``dtype`` where its entries are 4-byte floats (autocast leaves float64 alone)."""
    if basis.dtype.is_floating_point and basis.dtype.itemsize == 4 and basis.dtype != dtype:
        return basis.to(dtype=dtype)
    return basis


def placed(a: Basis | Array, x: Array) -> Basis | Array:
    """The basis as applied to ``x`` (:meth:`~structconv.Basis.placed_like`); arrays are returned as they are."""
    return a.placed_like(x) if isinstance(a, Basis) else a


def prepare(a: Basis | Array, x: Array, theta: Theta) -> tuple[Basis, Array, Param, bool]:
    """Check the operands against each other.

    Returns the basis, ``x`` as ``(B, M, P)``, the parameter, and whether ``x`` was 2-D.
    """
    basis = as_basis(placed(a, x))
    check_array(x, "x", (2, 3), ("(B, M, P)", "(M, P)"))
    param = as_param(theta)
    placement = {"x": x}
    placement.update(zip(param.kind.operand_names, param.operands, strict=True))
    check_same_placement(placement)
    x_backend = of(x, "x").name
    if basis.backend != x_backend:
        raise TypeError(f"the basis is a {basis.backend} basis but x is a {x_backend} array; do not mix backends")
    if dtype_name(x) != str(basis.dtype).removeprefix("torch."):
        raise TypeError(f"the basis has dtype {basis.dtype} but x has dtype {dtype_name(x)}; convert explicitly")
    if basis.device != device_of(x):
        raise ValueError(f"the basis is on device {basis.device} but x is on {device_of(x)}")
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    B, M, P = (int(s) for s in x.shape)
    if M != basis.M:
        raise ValueError(
            f"x has shape {shape_str(tuple(x.shape[1:] if squeeze else x.shape))} but the basis has "
            f"M={basis.M} input entries; expected x of shape (B, {basis.M}, P) or ({basis.M}, P)"
        )
    if basis.batch is not None and basis.batch != B:
        raise ValueError(f"the basis is per-instance with batch {basis.batch} but x has batch {B}; they must agree")
    if param.K != basis.K:
        raise ValueError(
            f"theta has K={param.K} members (shape {shape_str((param.K, param.P, param.Q))}) "
            f"but the basis has K={basis.K}"
        )
    if param.P != P:
        raise ValueError(
            f"theta has P={param.P} input channels but x has {P}; expected theta of shape ({basis.K}, {P}, Q)"
        )
    return basis, x, param, squeeze


__all__ = [
    "AGGREGATION",
    "CONV_WEIGHT",
    "FULL",
    "LOWRANK",
    "SEPARABLE",
    "Kind",
    "Param",
    "Shaped",
    "as_param",
    "autocast",
    "placed",
    "prepare",
]
