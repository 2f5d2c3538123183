r"""Attention masks: the check of a mask against the scores, and the masked column-wise softmax.

A mask is boolean (``True`` = may attend) or additive (:math:`-\infty` = masked, 0 = allowed), on
the scores' backend and device, and broadcasts to the scores without enlarging them.
:func:`structconv.attention_basis` and :func:`masked_softmax` check it here.
"""

from __future__ import annotations

from typing import Any

from ..backend import Array, device_of, dtype_name, find, is_floating, of, shape_str
from ..bases.scores import allowed_mask
from ..bases.scores import masked_softmax as _masked_softmax

__all__ = ["MASK_SHAPES", "check_mask", "masked_softmax"]


def masked_softmax(scores: Array, mask: Array | None = None) -> Array:
    r"""Column-wise softmax over :math:`m` (axis ``-2``) with log-domain masking.

    .. math:: w_{mn} = \frac{\mathbb 1_{\Omega}(m, n)\, e^{s_{mn} - c_n}}
              {\sum_{m'} \mathbb 1_{\Omega}(m', n)\, e^{s_{m'n} - c_n}},
              \qquad c_n = \max_{m:\,(m, n)\in\Omega} s_{mn},

    over the allowed set :math:`\Omega`; a column :math:`n` with no allowed entry is 0.

    Parameters
    ----------
    scores
        Floating-point scores, at least 2-D; the softmax runs over axis ``-2``.
    mask
        On the backend and device of ``scores``, broadcasting to them without enlarging them (each
        dimension that of the scores or 1, at most as many dimensions): booleans (``True`` =
        allowed) or additive values in :math:`\{-\infty, 0\}`.

    Returns
    -------
    Array
        Weights of the dtype of ``scores``.  A column with no allowed entry gives zeros (never
        ``NaN``) in every floating dtype, and its gradient is zero.  Weights below the dtype's
        smallest normal number are flushed to zero.
    """
    if find(scores) is None:
        raise TypeError(f"scores must be a numpy.ndarray or a torch.Tensor, got {type(scores).__name__}")
    if not is_floating(scores):
        raise TypeError(f"scores must hold floating-point numbers, got dtype {dtype_name(scores)}")
    shape = tuple(int(s) for s in scores.shape)
    if len(shape) < 2:
        raise ValueError(
            f"scores must have at least 2 dimensions (the softmax runs over axis -2), got shape {shape_str(shape)}"
        )
    if mask is not None:
        expected = f"a shape that broadcasts to {shape_str(shape)}, each dimension that of the scores or 1"
        check_mask(mask, scores, shape, arg="scores", layout="", expected=expected, ranks=(0, len(shape)))
    return _masked_softmax(scores, mask)


MASK_SHAPES = "(M, N), (K, M, N) or (B, K, M, N), each dimension that of the scores or 1"
"""The masks :func:`structconv.attention_basis` accepts, as its messages spell them."""


def check_mask(
    mask: object, like: Array, shape: tuple[int, ...], *, arg: str, layout: str, expected: str, ranks: tuple[int, int]
) -> None:
    """Raise a ``TypeError`` or ``ValueError`` naming ``mask`` unless it is a mask of the scores ``shape``.

    Parameters
    ----------
    mask
        The mask as given.
    like
        The array whose backend and device the mask must share.
    shape
        The scores' shape, which the mask must broadcast to without enlarging it.
    arg
        The name of ``like``, as the messages show it.
    layout
        The scores' axes spelt out (``"(B, K, M, N)"``), or ``""``.
    expected
        The shapes accepted, spelt out.
    ranks
        The least and the most dimensions of a mask.
    """
    if find(mask) is None:
        raise TypeError(f"mask must be a numpy.ndarray or a torch.Tensor (like {arg}), got {type(mask).__name__}")
    arr: Any = mask
    if of(arr).name != of(like).name:
        raise TypeError(
            f"mask is a {of(arr).name} array but {arg} is a {of(like).name} array; give the mask on {arg}'s backend"
        )
    if device_of(arr) != device_of(like):
        raise ValueError(f"mask is on device {device_of(arr)} but {arg} is on {device_of(like)}; move the mask")
    got = tuple(int(s) for s in arr.shape)
    if not ranks[0] <= len(got) <= ranks[1]:
        raise ValueError(
            f"mask must have {ranks[0]} to {ranks[1]} dimensions, got shape {shape_str(got)}; expected {expected}"
        )
    if any(g not in (1, want) for g, want in zip(got, shape[len(shape) - len(got) :], strict=True)):
        raise ValueError(
            f"mask of shape {shape_str(got)} does not broadcast to the scores {shape_str(shape)} {layout}".rstrip()
            + f" without enlarging them; expected {expected}"
        )
    if not (dtype_name(arr) == "bool" or is_floating(arr)):
        raise TypeError(
            f"mask must be boolean (True = may attend) or floating (additive: -inf = masked, 0 = allowed), "
            f"got dtype {dtype_name(arr)}"
        )
    allowed_mask(arr)
