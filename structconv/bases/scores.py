r"""Scores to attention weights: masks, a LeakyReLU and the column-wise softmax, on any backend.

What :class:`~structconv.bases.attention.AttentionBasis` applies to raw scores each time it forms
its weights, :math:`A = \mathrm{softmax}_m(\mathrm{mask}(\mathrm{LeakyReLU}(s)))`, and the
checks its builder (:func:`structconv.attention_basis`) runs on the arguments.
"""

from __future__ import annotations

import math
from numbers import Real

from ..backend import Array, autocast_dtype, device_of, dtype_name, namespace, of


def finite_real(value: object, arg: str, meaning: str) -> float:
    """``value`` as a ``float`` if it is a finite real number (not a bool); else an error naming ``arg``.

    A NumPy scalar becomes a Python ``float``, which never promotes an array's dtype.

    Parameters
    ----------
    value
        The argument as given.
    arg
        Its name, as the message shows it.
    meaning
        What it is for, shown in the message (``"e.g. 1/sqrt(D)"``).

    Raises
    ------
    TypeError
        If ``value`` is not a real number, or is a ``bool``.
    ValueError
        If it is NaN or infinite.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{arg} must be a real number ({meaning}), got {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{arg} must be finite ({meaning}), got {value!r}")
    return float(value)


def check_placement(named: dict[str, Array]) -> None:
    """Raise naming the array on another backend, device or dtype than ``named["x"]`` (nothing converts silently).

    Under autocast on ``x``'s device the products convert their operands' dtypes (as ``torch.matmul``
    does), so only the backend and device must agree there.

    Parameters
    ----------
    named
        The arrays by argument name, ``"x"`` among them.
    """
    x, loose = named["x"], autocast_dtype(named["x"]) is not None
    for name, a in named.items():
        if of(a).name != of(x).name:
            raise TypeError(f"{name} is a {of(a).name} array but x is a {of(x).name} array; do not mix backends")
        if device_of(a) != device_of(x):
            raise ValueError(f"{name} is on device {device_of(a)} but x is on {device_of(x)}")
        if not loose and dtype_name(a) != dtype_name(x):
            raise TypeError(f"{name} has dtype {dtype_name(a)} but x has dtype {dtype_name(x)}; convert explicitly")


def allowed_mask(mask: Array) -> Array:
    r"""A boolean mask (``True`` = allowed) from a boolean or additive ``{-inf, 0}`` mask.

    Parameters
    ----------
    mask
        Boolean (returned as it is) or floating, holding only :math:`-\infty` and 0.

    Raises
    ------
    ValueError
        If a floating mask holds anything else (NaN included).
    """
    if str(mask.dtype).endswith("bool"):
        return mask
    lib = namespace(mask)
    finite = lib.isfinite(mask)
    if bool(lib.isnan(mask).any()) or bool((mask[finite] != 0).any()) or bool((mask[~finite] > 0).any()):
        raise ValueError("mask must be boolean (True = allowed) or hold only -inf and 0")
    return finite


def masked_softmax(scores: Array, mask: Array | None = None) -> Array:
    """:func:`structconv.masked_softmax` without its argument checks, for arrays known good.

    Parameters
    ----------
    scores, mask
        As for :func:`structconv.masked_softmax`.
    """
    backend = of(scores)
    # NumPy and torch spell every call below alike (a hot path: no array API wrappers).
    lib = backend.native()
    if mask is not None:
        scores = lib.where(allowed_mask(mask), scores, -float("inf"))
    peak = backend.detach(lib.amax(scores, axis=-2, keepdims=True))
    peak = lib.where(lib.isfinite(peak), peak, 0.0)  # an empty column: exp(-inf) = 0 below
    exp = lib.exp(scores - peak)
    total = exp.sum(-2, keepdims=True)
    # A non-empty column sums to at least 1 (its peak gives exp(0)); an empty one sums to 0 and is
    # divided by 1 instead (a clamp to a tiny value underflows to 0 in float32 and below, and
    # 1/tiny overflows in the backward).
    weights = exp / lib.where(total > 0, total, 1.0)
    # Subnormal weights are flushed to zero: as operands they make CPU GEMMs about ten times
    # slower (a 16x16-token Gaussian head held 7 % of them), and each is below the dtype's
    # smallest normal number.  NaN is kept.
    return backend.flush_subnormals(weights, nonnegative=True)


def normalise(
    scores: Array, mask: Array | None = None, *, leaky_relu: float | None = None, normalize: bool = True
) -> Array:
    """LeakyReLU, log-domain mask and column-wise softmax of raw scores (as :func:`structconv.attention_basis` asks).

    Parameters
    ----------
    scores
        Raw scores, softmax over axis ``-2``.
    mask
        Boolean (``True`` = allowed) or additive ``{-inf, 0}``, broadcasting to ``scores``; or ``None``.
    leaky_relu
        The negative slope of a LeakyReLU applied first, or ``None``.
    normalize
        Softmax-normalise (masked entries 0); ``False`` keeps the masked scores, masked entries 0.
    """
    lib = of(scores).native()
    if leaky_relu is not None:
        scores = lib.where(scores >= 0, scores, scores * leaky_relu)
    if normalize:
        return masked_softmax(scores, mask)
    return scores if mask is None else lib.where(allowed_mask(mask), scores, 0.0)
