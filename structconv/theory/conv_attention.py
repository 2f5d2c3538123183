r"""Convolution as attention and back (Cordonnier, Loukas & Jaggi, Lemmas 1–2).

* :func:`conv_to_attention`: any convolution kernel as multi-head self-attention with one
  quadratic-encoding head per kernel position (hard one-hot, or soft with a finite
  :math:`\alpha`), borders by an explicit choice, and the :math:`\min(D_h, D_{out})` channel
  bound of Lemma 1 when the heads are narrower than the output.
* :func:`nearest_convolution` / :func:`attention_to_conv`: the converse where it holds: heads
  that are one-hot on a set of translations are a grid basis, and for trained heads the
  distance of each head from its nearest one-hot shift says how convolutional it is.

These functions are re-exported by :mod:`structconv.theory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Array, as_index, is_floating, namespace, of, shape_str, to_numpy
from ..backend.checks import check_array
from ..bases.base import Basis
from ..bases.convert import as_basis
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank

BORDERS = ("periodic", "zero", "padded")


def attention_alpha_bound(dtype: Any, *, ndim: int = 2) -> float:
    r"""The smallest :math:`\alpha` at which a soft quadratic head is one-hot to the precision of ``dtype``.

    In a column of a soft head the chosen offset has score 0 and its :math:`2d` nearest
    neighbours :math:`-\alpha`; the weight they take away is about :math:`2d\,e^{-\alpha}`, and
    the chosen weight rounds to one once that is below the unit roundoff :math:`\varepsilon/2`
    (:math:`\varepsilon` the dtype's machine epsilon): :math:`\alpha \ge \ln(4d/\varepsilon)`,
    18.02 for float32 and 38.1 for float64 on a 2-D grid.  A second, larger threshold is where
    the off-target weights become exact zeros
    (the softmax flushes subnormal weights to zero: in float32 :math:`\alpha > 126\ln 2
    \approx 87.34`, measured in ``docs/attention.rst``).  Cordonnier et al.'s :math:`\alpha = 46` is neither.

    Parameters
    ----------
    dtype
        A floating NumPy or torch dtype (or its name).
    ndim
        :math:`d`, the dimensions of the grid.

    Returns
    -------
    float
        :math:`\ln(4d/\varepsilon)`.
    """
    eps = float(np.finfo(str(dtype).removeprefix("torch.")).eps) / 2
    return float(np.log(2 * ndim / eps))


def _like(values: np.ndarray, like: Array) -> Any:
    """``values`` as a new array with the backend, dtype and device of ``like``."""
    return of(like).asarray(values.astype(np.float64), like)


def _padded_heads(grid: tuple[int, ...], pad: tuple[int, ...], centres: Any, alpha: Any) -> DenseBasis:
    """Soft heads on the grid padded with zero tokens, restricted to the real tokens (rows and columns)."""
    from ..structures.positional import QuadraticPosition

    big = tuple(g + 2 * p for g, p in zip(grid, pad, strict=True))
    heads = QuadraticPosition(big, centres, alpha, boundary="zero").basis(representation="dense").to_dense()
    inner = np.ravel_multi_index(
        tuple(np.meshgrid(*[np.arange(p, p + g) for g, p in zip(grid, pad, strict=True)], indexing="ij")), big
    ).reshape(-1)
    index = as_index(inner, heads)
    return DenseBasis(heads[:, index][:, :, index])


def conv_to_attention(
    weight: Array,
    grid: Any,
    bias: Array | None = None,
    *,
    alpha: float | None = None,
    boundary: str = "periodic",
    num_heads: int | None = None,
    head_dim: int | None = None,
    out_dim: int | None = None,
) -> tuple[Basis, Array | LowRank, Array | None]:
    r"""Cordonnier et al.'s construction: a convolution as multi-head self-attention (Lemmas 1 and 2).

    For a torch-layout kernel ``weight`` of shape ``(Q, P, k_1, ..., k_d)`` ("same" padding,
    stride 1) it returns one positional head per kernel position, :math:`\Delta_h` = that
    position's offset, with the quadratic encoding of inverse width ``alpha`` (``None`` gives
    the hard one-hot heads), and :math:`\Theta_h = W_{:,:,h}^\top`, so that
    ``conv(basis, x, theta) + bias`` is the convolution.

    Borders (see :doc:`/attention`) are an explicit choice:

    * ``"periodic"``: the grid is a torus (circular padding), exact for hard and soft heads;
    * ``"padded"``: the image is surrounded by zero tokens that the heads may attend to but
      that are not outputs (zero padding); soft heads normalise over the padded grid, so the
      identity holds to the dtype's precision at the border too;
    * ``"zero"``: no tokens beyond the image: exact for hard heads (an empty column is zero
      padding), but a soft head renormalises over the pixels that exist, so border outputs
      differ from zero padding.

    With ``alpha >= attention_alpha_bound(dtype)`` the soft construction matches to the dtype's
    precision (see :func:`attention_alpha_bound`).

    Parameters
    ----------
    weight
        The kernel, ``(Q, P, k_1, ..., k_d)`` with :math:`d \le 3`.
    grid
        The grid it runs on, :math:`(S_1, \dots, S_d)` (an int for :math:`d = 1`).
    bias
        Its bias, ``(Q,)``, or ``None``.
    alpha
        The inverse width :math:`\alpha > 0` of soft heads, or ``None`` for hard one-hot heads.
    boundary
        ``"periodic"``, ``"padded"`` or ``"zero"``, as above.
    num_heads
        If given, the head count the construction must produce: Lemma 1 uses
        :math:`N_h = K^2` heads for a square :math:`K\times K` kernel, so a kernel that is not
        square, or whose size is not ``num_heads``, is an error.
    head_dim, out_dim
        Heads of width :math:`D_h` = ``head_dim`` and a layer of :math:`D_{out}` = ``out_dim``
        (default ``Q``) outputs: the parameter is then the :class:`~structconv.LowRank`
        :math:`\Theta_h = W^v_h W^{o\top}_h`, and Lemma 1's bound requires
        :math:`Q \le \min(D_h, D_{out})`; the outputs beyond ``Q`` are zero.

    Returns
    -------
    (basis, theta, bias)
        A ``(K, M, M)`` basis, ``theta`` of shape ``(K, P, Q)`` (or the ``LowRank`` factors) and
        the bias (padded with zeros to ``out_dim``, or ``None``).
    """
    from ..structures.grid import grid_basis
    from ..structures.positional import positional_basis

    check_array(weight, "weight", (3, 4, 5), ("(Q, P, k1)", "(Q, P, k1, k2)", "(Q, P, k1, k2, k3)"))
    d = weight.ndim - 2
    g = tuple(int(s) for s in ((grid,) if isinstance(grid, int) else grid))
    if len(g) != d:
        raise ValueError(f"grid has {len(g)} dimensions but weight is a {d}-D kernel of shape {tuple(weight.shape)}")
    if boundary not in BORDERS:
        raise ValueError(f"boundary must be one of {BORDERS}, got {boundary!r}")
    if alpha is not None and not alpha > 0:
        raise ValueError(f"alpha must be positive (or None for hard heads), got {alpha!r}")
    kernel = tuple(int(s) for s in weight.shape[2:])
    Q, P = int(weight.shape[0]), int(weight.shape[1])
    if num_heads is not None:
        if len(set(kernel)) != 1:
            raise ValueError(f"the construction needs a square kernel (sqrt(N_h) per side), got {kernel}")
        if int(np.prod(kernel)) != num_heads:
            raise ValueError(
                f"a {'x'.join(map(str, kernel))} kernel needs {int(np.prod(kernel))} heads (one per position), "
                f"but num_heads={num_heads}"
            )
    shifts = grid_basis(g, kernel, padding="same", boundary="zero" if boundary == "padded" else boundary)
    offsets = shifts.offsets
    centres = _like(offsets.astype(np.float64), weight)
    widths = None if alpha is None else _like(np.full(len(offsets), float(alpha)), weight)
    if alpha is not None and boundary == "padded":
        basis: Basis = _padded_heads(g, tuple(k // 2 for k in kernel), centres, widths)
    else:
        basis = positional_basis(g, centres, widths, boundary="zero" if boundary == "padded" else boundary)
    theta = namespace(weight).permute_dims(weight.reshape(Q, P, -1), (2, 1, 0))
    if head_dim is None and out_dim is None:
        return basis, theta, bias
    Dh = head_dim if head_dim is not None else Q
    Dout = out_dim if out_dim is not None else Q
    if min(Dh, Dout) < Q:
        raise ValueError(
            f"heads of width D_h={Dh} and D_out={Dout} outputs express at most min(D_h, D_out)={min(Dh, Dout)} "
            f"output channels (Lemma 1), but the kernel has Q={Q}"
        )
    K = len(offsets)
    value = np.zeros((K, P, Dh))
    out = np.zeros((K, Dout, Dh))
    out[:, np.arange(Q), np.arange(Q)] = 1.0
    value_t, out_t = _like(value, weight), _like(out, weight)
    value_t[:, :, :Q] = theta
    big_bias = None
    if bias is not None:
        big_bias = _like(np.zeros(Dout), weight)
        big_bias[:Q] = bias
    return basis, LowRank(value_t, out_t), big_bias


@dataclass(frozen=True)
class ConvolutionFit:
    """How close each attention head is to a one-hot shift (see :func:`nearest_convolution`).

    Attributes
    ----------
    offsets
        ``(K, d)``: per head, the offset of its nearest one-hot shift.
    distance
        ``(K,)``: per head, the mean over outputs (and instances) of the total-variation
        distance :math:`\\tfrac12\\lVert a_{:,n} - s_{:,n}\\rVert_1` to that shift; 0 means the
        head is exactly that shift, 1 that it shares nothing with it.
    mass
        ``(K,)``: per head, the mean weight a column puts on that offset.
    """

    grid: tuple[int, ...]
    boundary: str
    offsets: np.ndarray
    distance: np.ndarray
    mass: np.ndarray

    def is_convolution(self, *, tol: float = 1e-6) -> bool:
        """Whether every head is within ``tol`` of a one-hot shift.

        Parameters
        ----------
        tol
            The largest :attr:`distance` allowed (total variation, in :math:`[0, 1]`).
        """
        return bool((self.distance <= tol).all())


def nearest_convolution(basis: Basis | Array, grid: Any, boundary: str = "zero") -> ConvolutionFit:
    r"""Each head's nearest one-hot shift on ``grid`` and its distance from it.

    The offset chosen for head :math:`k` is the one with the largest mean weight
    :math:`\frac1N\sum_n A_k[n + \delta, n]` (over instances too for a per-instance basis); the
    one-hot shift of that offset under ``boundary`` is then compared with the head column by
    column.  A "mixture of convolutions" diagnostic for trained attention heads.

    Parameters
    ----------
    basis
        Heads of shape ``(K, M, M)`` or ``(B, K, M, M)``, :math:`M = \prod_i S_i` (any basis, or
        a dense array).
    grid
        The grid the tokens lie on, :math:`(S_1, \dots, S_d)` (an int for :math:`d = 1`).
    boundary
        ``"zero"`` or ``"periodic"``: the shifts compared with (and the offsets they may have).

    Returns
    -------
    ConvolutionFit
        Per head, the offset, the distance and the mass.

    Raises
    ------
    ValueError
        If the basis does not have :math:`M = N = \prod_i S_i`, or for a bad grid or boundary.
    """
    from ..bases.grid import GridBasis, _grid
    from ..structures.positional import relative_offsets

    g = _grid(grid)
    b = as_basis(basis)
    rel = relative_offsets(g, boundary)
    M = int(np.prod(g))
    if b.M != M or b.N != M:
        raise ValueError(f"basis has shape {shape_str(b.shape)} but a grid of {g} has {M} positions (M = N = {M})")
    dense = to_numpy(b.to_dense()).astype(np.float64)
    dense = dense.reshape((-1,) + dense.shape[-3:])  # (B, K, M, N)
    mean = dense.mean(0)
    K = mean.shape[0]
    offsets = np.zeros((K, len(g)), dtype=np.int64)
    mass = np.zeros(K)
    for k in range(K):
        per_offset = np.bincount(rel.index.reshape(-1), weights=mean[k].reshape(-1), minlength=len(rel.offsets))
        best = int(per_offset.argmax())
        offsets[k], mass[k] = rel.offsets[best], per_offset[best] / M
    shifts = GridBasis(g, g, offsets, stride=1, boundary=boundary).to_dense()
    distance = 0.5 * np.abs(dense - to_numpy(shifts)[None]).sum(axis=2).mean(axis=(0, 2))
    return ConvolutionFit(g, boundary, offsets, distance, mass)


def attention_to_conv(
    basis: Basis | Array, theta: Array, grid: Any, boundary: str = "zero", *, tol: float = 1e-6
) -> tuple[Basis, Array]:
    r"""Heads that are one-hot on translations, as a grid basis and :math:`\Theta` (the converse of Lemma 1).

    Parameters
    ----------
    basis
        The heads, ``(K, M, M)`` (as for :func:`nearest_convolution`).
    theta
        Their parameter :math:`\Theta`, ``(K, P, Q)``.
    grid, boundary
        As for :func:`nearest_convolution`.
    tol
        The largest distance of a head from its one-hot shift (total variation).

    Returns
    -------
    (GridBasis, Array)
        The :class:`~structconv.GridBasis` of the heads' offsets (heads sharing an offset are
        merged and their :math:`\Theta_h` summed) and the matching parameter, so that
        ``conv(grid_basis, x, theta')`` equals ``conv(basis, x, theta)``.

    Raises
    ------
    ValueError
        If a head is farther than ``tol`` (total variation, see :func:`nearest_convolution`)
        from every one-hot shift; the message names the head and its distance.
    """
    from ..bases.grid import GridBasis

    check_array(theta, "theta", (3,), ("(K, P, Q)",))
    fit = nearest_convolution(basis, grid, boundary)
    if int(theta.shape[0]) != len(fit.offsets):
        raise ValueError(f"theta has K={int(theta.shape[0])} members but the basis has {len(fit.offsets)} heads")
    far = np.flatnonzero(fit.distance > tol)
    if far.size:
        k = int(far[0])
        nearest = tuple(int(v) for v in fit.offsets[k])
        raise ValueError(
            f"head {k} is at distance {fit.distance[k]:.3g} from its nearest one-hot shift {nearest} "
            f"(tol={tol:g}); it is not a convolution (see nearest_convolution)"
        )
    unique, inverse = np.unique(fit.offsets, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    merged = of(theta).scatter_add(theta, as_index(inverse, theta), len(unique))
    like = theta if is_floating(theta) else None
    return GridBasis(fit.grid, fit.grid, unique, stride=1, boundary=boundary, like=like), merged
