r"""Convolution as attention and back (Cordonnier, Loukas & Jaggi, Lemmas 1–2).

* :func:`conv_to_attention`: any convolution kernel as multi-head self-attention with one
  quadratic-encoding head per kernel position (hard one-hot, or soft with a finite
  :math:`\alpha`), the border given as torch gives it (``padding_mode``, zero padding by
  default), and the :math:`\min(D_h, D_{out})` channel bound of Lemma 1 when the heads are
  narrower than the output.
* :func:`nearest_convolution` / :func:`attention_to_conv`: the converse where it holds: heads
  that are one-hot on a set of translations are a grid basis, and for trained heads the
  distance of each head from its nearest one-hot shift says how convolutional it is.

These functions are re-exported by :mod:`structconv.theory`.
:meth:`structconv.nn.PositionalAttention.from_conv` builds the same heads as a layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Array, as_index, is_floating, namespace, of, shape_str, to_numpy
from ..backend.checks import check_array
from ..bases.base import Basis
from ..bases.convert import as_basis
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank
from ..bases.grid import GridBasis, _grid
from ..structures.grid import grid_basis
from ..structures.positional import _check_centres, _detached, inner_positions, quadratic_scores, relative_offsets

#: torch's padding modes (``torch.nn.Conv2d(padding_mode=...)``) that attention heads can read,
#: and the grid each runs on.  ``"zeros"``: the image, surrounded by zero tokens for soft heads;
#: ``"circular"``: a torus; ``"replicate"``: the image alone, where the softmax renormalises over
#: the pixels that exist, so a head whose offset leaves the image reads the nearest pixel.
PADDING_MODES: dict[str, str] = {"zeros": "zero", "circular": "periodic", "replicate": "zero"}

#: Modes that are translations at every pixel (one-hot heads are then shift matrices).
SHIFT_MODES = ("zeros", "circular")

#: The border names used before torch's spelling, and what they are now.
_RENAMED = {"zero": "zeros", "padded": "zeros", "periodic": "circular"}

#: An :math:`\alpha` at which a quadratic head is one-hot to the last bit: the nearest off-target
#: offset scores :math:`-\alpha` below the target (squared distances on the integer grid differ by
#: at least 1), and :math:`e^{-1024}` underflows to an exact zero in float64 (below
#: :math:`e^{-745}`), float32 and float16, so the target's weight is exactly 1.
ONE_HOT_ALPHA = 1024.0


def padding_boundary(padding_mode: Any, *, modes: tuple[str, ...] = tuple(PADDING_MODES), where: str = "") -> str:
    """The grid boundary (``"zero"`` or ``"periodic"``) that ``padding_mode`` runs on; a clear error otherwise.

    Parameters
    ----------
    padding_mode
        One of ``modes``, spelled as ``torch.nn.Conv2d`` spells it.
    modes
        The modes the caller accepts.
    where
        The caller's name, for the message.
    """
    if isinstance(padding_mode, str) and padding_mode in modes:
        return PADDING_MODES[padding_mode]
    prefix = f"{where}: " if where else ""
    hint = ""
    if isinstance(padding_mode, str) and padding_mode in _RENAMED:
        hint = f" ({padding_mode!r} is spelled padding_mode={_RENAMED[padding_mode]!r} now, as in torch)"
    raise ValueError(
        f"{prefix}padding_mode must be one of {modes} (torch.nn.Conv2d's spelling), got {padding_mode!r}{hint}"
    )


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


@dataclass(frozen=True)
class ConvHeads:
    r"""The heads of Cordonnier et al.'s construction for one kernel, before any attention matrix is built.

    Shared by :func:`conv_to_attention` (which builds the ``(K, M, M)`` heads) and
    :func:`conv_module_heads` (whose heads :meth:`structconv.nn.PositionalAttention.from_conv`
    gives to a layer's encoding).

    Attributes
    ----------
    grid
        The grid, :math:`(S_1, \dots, S_d)`.
    offsets
        ``(K, d)`` integers: head :math:`h` attends, from every output, to the input at offset
        :math:`\Delta_h` (the kernel positions in row-major order, as ``weight.flatten(2)``).
    boundary
        The grid the heads run on, ``"zero"`` or ``"periodic"``.
    margin
        Per axis, the zero tokens on each side that soft heads need for ``padding_mode="zeros"``
        (:math:`\max_h |\Delta_{h,i}|`; zeros for the other modes).
    theta
        :math:`\Theta_h = W_{:,:,h}^\top`, ``(K, P, Q)``, or the :class:`~structconv.LowRank`
        factors of Lemma 1.
    bias
        The bias, padded with zeros to ``out_dim``, or ``None``.
    """

    grid: tuple[int, ...]
    offsets: np.ndarray
    boundary: str
    margin: tuple[int, ...]
    theta: Array | LowRank
    bias: Array | None


def conv_heads(
    weight: Array,
    grid: Any,
    bias: Array | None = None,
    *,
    padding_mode: str = "zeros",
    padding: Any = "same",
    dilation: Any = 1,
    head_dim: int | None = None,
    out_dim: int | None = None,
    where: str = "conv_heads",
) -> ConvHeads:
    r"""One head per kernel position of ``weight``: its offset and :math:`\Theta_h` (Lemma 1), no attention yet.

    Parameters
    ----------
    weight
        The kernel, ``(Q, P, k_1, ..., k_d)`` with :math:`d \le 3` (torch's layout).
    grid
        The grid it runs on, :math:`(S_1, \dots, S_d)` (an int for :math:`d = 1`).
    bias
        Its bias, ``(Q,)``, or ``None``.
    padding_mode
        ``"zeros"``, ``"circular"`` or ``"replicate"``, as ``torch.nn.Conv2d`` spells them.
    padding
        As for :func:`~structconv.grid_basis` (torch's spellings); it must keep the grid's size,
        since every position of the grid is an output of attention.
    dilation
        The spacing of the kernel's entries (an int or one per axis).
    head_dim, out_dim
        As for :func:`conv_to_attention`.
    where
        The caller's name, for messages.

    Returns
    -------
    ConvHeads

    Raises
    ------
    ValueError
        For a kernel of the wrong rank for ``grid``, an unknown ``padding_mode``, padding that
        does not keep the size, a bias of the wrong shape, or heads too narrow for the output
        channels (Lemma 1's :math:`Q \le \min(D_h, D_{out})`).
    """
    check_array(weight, "weight", (3, 4, 5), ("(Q, P, k1)", "(Q, P, k1, k2)", "(Q, P, k1, k2, k3)"))
    d = weight.ndim - 2
    g = tuple(int(s) for s in ((grid,) if isinstance(grid, int) else grid))
    if len(g) != d:
        raise ValueError(
            f"{where}: grid has {len(g)} dimensions but weight is a {d}-D kernel of shape {tuple(weight.shape)}"
        )
    boundary = padding_boundary(padding_mode, where=where)
    kernel = tuple(int(s) for s in weight.shape[2:])
    Q, P = int(weight.shape[0]), int(weight.shape[1])
    if bias is not None and tuple(bias.shape) != (Q,):
        raise ValueError(f"{where}: bias must have shape (Q,) = ({Q},), got {shape_str(tuple(bias.shape))}")
    try:
        shifts = grid_basis(g, kernel, padding=padding, dilation=dilation, boundary=boundary)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}: {error}") from None
    if shifts.out_grid != g:
        raise ValueError(
            f"{where}: padding={padding!r} gives an output grid {shifts.out_grid} on the grid {g}, but attention "
            f"keeps every position as an output: the padding must keep the size (padding='same', i.e. "
            f"dilation * (kernel_size - 1) / 2 on each side)"
        )
    offsets = np.asarray(shifts.offsets, dtype=np.int64)
    # Soft heads read zero padding from zero tokens as far out as the farthest offset.
    reach = np.abs(offsets).max(axis=0) if padding_mode == "zeros" else np.zeros(d, dtype=np.int64)
    margin = tuple(int(r) for r in reach)
    theta = namespace(weight).permute_dims(weight.reshape(Q, P, -1), (2, 1, 0))
    if head_dim is None and out_dim is None:
        return ConvHeads(g, offsets, boundary, margin, theta, bias)
    Dh = head_dim if head_dim is not None else Q
    Dout = out_dim if out_dim is not None else Q
    if min(Dh, Dout) < Q:
        raise ValueError(
            f"{where}: heads of width D_h={Dh} and D_out={Dout} outputs express at most "
            f"min(D_h, D_out)={min(Dh, Dout)} output channels (Lemma 1), but the kernel has Q={Q}"
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
    return ConvHeads(g, offsets, boundary, margin, LowRank(value_t, out_t), big_bias)


def conv_module_heads(
    conv: Any, grid: Any, *, head_dim: int | None = None, where: str = "conv_module_heads"
) -> ConvHeads:
    r"""The heads of a convolution module: what a layer of one quadratic head per kernel position needs.

    Cordonnier et al.'s construction (Lemmas 1 and 2): head :math:`h` sits at the offset
    :math:`\Delta_h` of the :math:`h`-th kernel position (row-major, dilated) and carries that
    position's weight, :math:`\Theta_h = W_{:,:,h}^\top` (block-diagonal for ``groups > 1``):

    .. math::

        \sum_h \bigl(A_h^\top x\,\Theta_h\bigr)_n + b = \sum_h W_{:,:,h}\, x_{n + \Delta_h} + b
        = \operatorname{conv}(x)_n, \qquad
        (A_h)_{mn} = \operatorname{softmax}_m\bigl(-\alpha\lVert \delta_{mn} - \Delta_h\rVert^2\bigr)
        \xrightarrow[\alpha\to\infty]{} [\,\delta_{mn} = \Delta_h\,].

    The border is the module's ``padding_mode``: ``"zeros"`` gives as many zero tokens around the
    grid as the farthest offset (:attr:`ConvHeads.margin`), ``"circular"`` a periodic grid,
    ``"replicate"`` the image alone (a head whose offset leaves it reads the nearest pixel).
    :meth:`structconv.nn.PositionalAttention.from_conv` builds the layer from these heads.

    Parameters
    ----------
    conv
        A ``torch.nn.Conv1d/2d/3d`` or ``structconv.nn.GridConv1d/2d/3d``: stride 1, padding
        that keeps the size (``"same"``, or :math:`\mathrm{dilation}(k - 1)/2` per side), any
        dilation and groups, as many input as output channels.
    grid
        The grid the heads run on, :math:`(H, W)` for a 2-D convolution.
    head_dim
        Heads of this width (:math:`\Theta_h = W^v_h W^{o\top}_h`), at least the channels
        (Lemma 1); ``None``: the full :math:`\Theta_h`.
    where
        The caller's name, for messages.

    Returns
    -------
    ConvHeads
        One head per kernel position, with the module's kernel (dense for ``groups > 1``) and bias.

    Raises
    ------
    TypeError
        If ``conv`` is not a convolution module of that kind (a transposed one included), or
        ``grid`` is not a tuple of sizes.
    ValueError
        Naming the argument: a lazy module not yet run, a stride other than 1, padding that does
        not keep the size, ``padding_mode="reflect"`` (a mirror is no translation: no head at a
        fixed offset reads it), input and output channels that differ, a grid of another
        dimension than the kernel, or a ``head_dim`` below the channels.
    """
    needed = ("weight", "bias", "stride", "padding", "padding_mode", "dilation", "groups", "in_channels")
    if not all(hasattr(conv, name) for name in (*needed, "out_channels")) or getattr(conv, "transposed", False):
        raise TypeError(
            f"{where}: conv must be a torch.nn.Conv1d/2d/3d or a structconv.nn.GridConv1d/2d/3d, "
            f"got {type(conv).__name__}"
        )
    weight = conv.weight
    lazy = getattr(conv, "has_uninitialized_params", None)  # torch's lazy modules (LazyConv2d, ...)
    if callable(lazy) and lazy():
        raise ValueError(f"{where}: conv is a lazy convolution whose weight is not initialised yet; run it once")
    try:
        sizes = _grid(grid)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}: {error}") from None
    stride = tuple(int(s) for s in conv.stride)
    if any(s != 1 for s in stride):
        raise ValueError(
            f"{where}: conv has stride={stride}, but stride must be 1: attention has an output at every "
            "position of the grid, a strided convolution at fewer"
        )
    mode = str(conv.padding_mode)
    if mode not in PADDING_MODES:
        raise ValueError(
            f"{where}: conv has padding_mode={mode!r}, which no head can read: a head reads a translation "
            f"of the image (the nearest pixel beyond it), not its mirror; padding_mode must be one of "
            f"{tuple(PADDING_MODES)}"
        )
    P, Q, G = int(conv.in_channels), int(conv.out_channels), int(conv.groups)
    if P != Q:
        raise ValueError(
            f"{where}: conv has in_channels={P} and out_channels={Q}, but PositionalAttention maps "
            "embed_dim channels to as many; they must be equal"
        )
    kernel = weight.detach()
    if G > 1:  # a grouped kernel is the dense one that is zero between groups: Θ_h block-diagonal
        dense = _like(np.zeros((Q, P, *kernel.shape[2:])), kernel)
        q, p = Q // G, P // G
        for g in range(G):
            dense[g * q : (g + 1) * q, g * p : (g + 1) * p] = kernel[g * q : (g + 1) * q]
        kernel = dense
    bias = None if conv.bias is None else conv.bias.detach()
    return conv_heads(
        kernel, sizes, bias, padding_mode=mode, padding=conv.padding, dilation=conv.dilation,
        head_dim=head_dim, out_dim=None if head_dim is None else Q, where=where,
    )  # fmt: skip


def positional_basis(grid: Any, centres: Array, alpha: Array | None = None, boundary: str = "zero") -> DenseBasis:
    r"""Quadratic heads as a dense ``(K, M, N)`` basis; ``alpha=None`` is the hard limit.

    Hard heads (:math:`\alpha\to\infty`) are one-hot on the input at offset :math:`\Delta_h` from
    each output, i.e. the shift matrix of that offset (a ``"zero"`` grid leaves the columns whose
    target falls off the grid empty, which is zero padding; a ``"periodic"`` grid wraps), so
    ``centres`` must be integers.  With a finite ``alpha`` each column is the softmax of
    :func:`quadratic_scores` over the grid.
    """
    if alpha is not None:
        basis = quadratic_scores(grid, centres, alpha, boundary).basis(representation="dense")
        assert isinstance(basis, DenseBasis)
        return basis
    g = _grid(grid)
    _check_centres(centres, len(g))
    offsets = _detached(centres)
    if not np.allclose(offsets, np.round(offsets)):
        raise ValueError("hard attention (alpha=None) needs integer centres (the offsets it attends to)")
    like = centres if is_floating(centres) else None
    shifts = GridBasis(g, g, np.round(offsets).astype(np.int64), boundary=boundary, like=like)
    return DenseBasis(shifts.to_dense())


def conv_to_attention(
    weight: Array,
    grid: Any,
    bias: Array | None = None,
    *,
    alpha: float | None = None,
    padding_mode: str = "zeros",
    dilation: Any = 1,
    num_heads: int | None = None,
    head_dim: int | None = None,
    out_dim: int | None = None,
) -> tuple[Basis, Array | LowRank, Array | None]:
    r"""Cordonnier et al.'s construction: a convolution as multi-head self-attention (Lemmas 1 and 2).

    For a torch-layout kernel ``weight`` of shape ``(Q, P, k_1, ..., k_d)`` ("same" padding,
    stride 1, the given dilation) it returns one positional head per kernel position,
    :math:`\Delta_h` = that position's offset, with the quadratic encoding of inverse width
    ``alpha`` (``None`` gives the hard one-hot heads), and :math:`\Theta_h = W_{:,:,h}^\top`,
    so that ``conv(basis, x, theta) + bias`` is the convolution
    ``torch.nn.Conv{d}d(P, Q, k, padding="same", dilation=dilation, padding_mode=padding_mode)``.

    The border is torch's ``padding_mode`` (see :doc:`/attention`):

    * ``"zeros"`` (the default, as everywhere in torch and structconv): zero padding.  Hard
      heads leave the columns whose offset falls off the image empty; soft heads normalise over
      the image surrounded by zero tokens (that are not outputs), so the identity holds to the
      dtype's precision at the border too;
    * ``"circular"``: the grid is a torus, exact for hard and soft heads;
    * ``"replicate"``: no tokens beyond the image, the softmax renormalising over the pixels
      that exist: a head whose offset leaves the image reads the nearest pixel, which is
      replicate padding (hard heads are built at :data:`ONE_HOT_ALPHA`, one-hot to the last bit).

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
    padding_mode
        ``"zeros"``, ``"circular"`` or ``"replicate"``, as above (torch's spelling).
    dilation
        The spacing of the kernel's entries (an int or one per axis): the heads sit at the
        dilated offsets.
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

    Raises
    ------
    ValueError
        For an unknown ``padding_mode`` (the names before torch's, ``"periodic"``, ``"zero"`` and
        ``"padded"``, are refused naming their spelling now), a non-positive ``alpha``, a kernel
        that does not fit ``grid`` or ``num_heads``, or heads too narrow (Lemma 1).

    Examples
    --------
    >>> import torch
    >>> from torch.nn import functional as F
    >>> from structconv import conv
    >>> from structconv.theory import conv_to_attention
    >>> x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    >>> weight = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    >>> basis, theta, _ = conv_to_attention(weight, (6, 6))  # zero padding, hard heads
    >>> y = conv(basis, x.flatten(2).transpose(1, 2), theta).transpose(1, 2)
    >>> torch.allclose(y.reshape(2, 4, 6, 6), F.conv2d(x, weight, padding=1))
    True
    """
    if alpha is not None and not 0.0 < float(alpha) < math.inf:
        raise ValueError(
            f"conv_to_attention: alpha must be positive and finite (or None for hard heads), got {alpha!r}"
        )
    check_array(weight, "weight", (3, 4, 5), ("(Q, P, k1)", "(Q, P, k1, k2)", "(Q, P, k1, k2, k3)"))
    kernel = tuple(int(s) for s in weight.shape[2:])
    if num_heads is not None:
        if len(set(kernel)) != 1:
            raise ValueError(f"the construction needs a square kernel (sqrt(N_h) per side), got {kernel}")
        if int(np.prod(kernel)) != num_heads:
            raise ValueError(
                f"a {'x'.join(map(str, kernel))} kernel needs {int(np.prod(kernel))} heads (one per position), "
                f"but num_heads={num_heads}"
            )
    heads = conv_heads(
        weight, grid, bias, padding_mode=padding_mode, dilation=dilation, head_dim=head_dim, out_dim=out_dim,
        where="conv_to_attention",
    )  # fmt: skip
    g, K = heads.grid, len(heads.offsets)
    centres = _like(heads.offsets.astype(np.float64), weight)
    widths = None if alpha is None else _like(np.full(K, float(alpha)), weight)
    basis: Basis
    if padding_mode == "zeros" and alpha is not None:  # soft heads among zero tokens, which are no outputs
        big = tuple(s + 2 * p for s, p in zip(g, heads.margin, strict=True))
        basis = inner_positions(quadratic_scores(big, centres, widths).basis(representation="dense"), big, heads.margin)
    elif padding_mode == "replicate" and alpha is None:
        # The hard limit of heads renormalised over the image: one-hot on the nearest pixel.
        basis = positional_basis(g, centres, _like(np.full(K, ONE_HOT_ALPHA), weight), heads.boundary)
    else:  # hard zero padding (empty columns), or heads on a torus, or soft replicate
        basis = positional_basis(g, centres, widths, heads.boundary)
    return basis, heads.theta, heads.bias


@dataclass(frozen=True)
class ConvolutionFit:
    """How close each attention head is to a one-hot shift (see :func:`nearest_convolution`).

    Attributes
    ----------
    grid
        The grid the heads lie on.
    padding_mode
        ``"zeros"`` or ``"circular"``: the border of the shifts compared with.
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
    padding_mode: str
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


def nearest_convolution(basis: Basis | Array, grid: Any, *, padding_mode: str = "zeros") -> ConvolutionFit:
    r"""Each head's nearest one-hot shift on ``grid`` and its distance from it.

    The offset chosen for head :math:`k` is the one with the largest mean weight
    :math:`\frac1N\sum_n A_k[n + \delta, n]` (over instances too for a per-instance basis); the
    one-hot shift of that offset under ``padding_mode`` is then compared with the head column
    by column.  A "mixture of convolutions" diagnostic for trained attention heads.

    Parameters
    ----------
    basis
        Heads of shape ``(K, M, M)`` or ``(B, K, M, M)``, :math:`M = \prod_i S_i` (any basis, or
        a dense array).
    grid
        The grid the tokens lie on, :math:`(S_1, \dots, S_d)` (an int for :math:`d = 1`).
    padding_mode
        ``"zeros"`` (shifts within the grid, the columns whose offset leaves it empty) or
        ``"circular"`` (shifts on the torus), as torch spells them: the shifts compared with,
        and the offsets they may have.  A :class:`~structconv.nn.PositionalAttention` of
        ``boundary="periodic"`` is compared with ``"circular"``, one of ``"zero"`` with ``"zeros"``.

    Returns
    -------
    ConvolutionFit
        Per head, the offset, the distance and the mass.

    Raises
    ------
    ValueError
        If the basis does not have :math:`M = N = \prod_i S_i`, or for a bad grid or padding mode.
    """
    boundary = padding_boundary(padding_mode, modes=SHIFT_MODES, where="nearest_convolution")
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
    index = rel.gather(np.arange(len(rel.offsets))).reshape(-1)  # the offset id of every pair: O(MN), as dense
    for k in range(K):
        per_offset = np.bincount(index, weights=mean[k].reshape(-1), minlength=len(rel.offsets))
        best = int(per_offset.argmax())
        offsets[k], mass[k] = rel.offsets[best], per_offset[best] / M
    shifts = GridBasis(g, g, offsets, stride=1, boundary=boundary).to_dense()
    distance = 0.5 * np.abs(dense - to_numpy(shifts)[None]).sum(axis=2).mean(axis=(0, 2))
    return ConvolutionFit(g, padding_mode, offsets, distance, mass)


def attention_to_conv(
    basis: Basis | Array, theta: Array, grid: Any, *, padding_mode: str = "zeros", tol: float = 1e-6
) -> tuple[Basis, Array]:
    r"""Heads that are one-hot on translations, as a grid basis and :math:`\Theta` (the converse of Lemma 1).

    Parameters
    ----------
    basis
        The heads, ``(K, M, M)`` (as for :func:`nearest_convolution`).
    theta
        Their parameter :math:`\Theta`, ``(K, P, Q)``.
    grid, padding_mode
        As for :func:`nearest_convolution` (``"zeros"`` or ``"circular"``).
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
    check_array(theta, "theta", (3,), ("(K, P, Q)",))
    fit = nearest_convolution(basis, grid, padding_mode=padding_mode)
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
    boundary = PADDING_MODES[padding_mode]
    return GridBasis(fit.grid, fit.grid, unique, stride=1, boundary=boundary, like=like), merged
