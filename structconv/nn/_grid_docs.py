r"""The docstrings of the 1-D, 2-D and 3-D grid layers, written once and filled in per dimension.

``GridConv{1,2,3}d`` and ``AvgPool{1,2,3}d`` differ only in their dimension; their docstrings
state the same contract and differ in the names of the axes, the kernel's symbols and the
examples' shapes.  One template per layer family keeps the three in step.
"""

from __future__ import annotations

from typing import NamedTuple


class _Dimension(NamedTuple):
    kernel: str  # the kernel's symbols, e.g. "k_1 k_2"
    kernel_tuple: str  # the kernel as a tuple, e.g. ":math:`(k_1, k_2)` (an int for both)"
    axes_in: str  # the grid axes of an input, e.g. "H_{in}, W_{in}"
    axes_out: str
    conv_example: str  # an input's shape in the examples
    pool_example: str


_DIMENSIONS = {
    1: _Dimension("k", ":math:`k`", "L_{in}", "L_{out}", "2, 3, 10", "2, 3, 9"),
    2: _Dimension(
        "k_1 k_2",
        ":math:`(k_1, k_2)` (an int for both)",
        "H_{in}, W_{in}",
        "H_{out}, W_{out}",
        "2, 3, 10, 10",
        "2, 3, 7, 6",
    ),
    3: _Dimension(
        "k_1 k_2 k_3",
        ":math:`(k_1, k_2, k_3)` (an int for all three)",
        "D_{in}, H_{in}, W_{in}",
        "D_{out}, H_{out}, W_{out}",
        "2, 3, 5, 6, 4",
        "1, 2, 5, 4, 6",
    ),
}

_CONV = r"""``torch.nn.Conv{d}d`` as a shift basis, one member per kernel offset, and torch's weight as :math:`\Theta`.

Basis: the shifts :math:`\mathcal A_{{-o}}` by each kernel offset :math:`o` (strided, dilated,
padded), by :func:`structconv.grid_basis` (K = :math:`{kernel}`)

Θ: torch's ``weight`` ``(Q, P/G, {kernel_comma})`` as a :class:`~structconv.ConvWeight`, as
:meth:`theta` returns it; its ``full()`` is the (K, P, Q) tensor

.. math:: y = \sum_k A_k^\top x\,\Theta_k + \beta,
          \qquad \Theta_{{k,\,i,\,o}} = W_{{o,\,i,\,k}} \ \text{{(for}}\ G = 1),

with :math:`W` the weight, kernel axes flattened into :math:`k` (block-diagonal for :math:`G > 1`):
a drop-in for ``torch.nn.Conv{d}d`` (its parameters too), derived and compared in ``docs/grid.rst``.

Parameters
----------
in_channels : int
    :math:`P`, the input's channels.
out_channels : int
    :math:`Q`, the output's channels.
kernel_size : int or tuple of int
    The kernel, {kernel_tuple}.
stride : int or tuple of int, default 1
    The step between output positions.
padding : int, tuple, "same" or "valid", default 0
    Padding on each side, as torch's, or per-dimension ``(before, after)`` pairs (not torch's).
dilation : int or tuple of int, default 1
    The spacing of the kernel's taps.
groups : int, default 1
    :math:`G` channel groups mapped apart (a block-diagonal :math:`\Theta_k`); divides :math:`P`, :math:`Q`.
bias : bool, default True
    Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
padding_mode : {{"zeros", "circular", "reflect", "replicate"}}, default "zeros"
    The border: the basis' zero or periodic boundary, or ``x`` framed by ``F.pad``.
device, dtype : optional
    Where the parameters live, and their dtype.
order : {{"auto", "native", "ax", "xtheta", "atheta"}}, default "auto"
    Passed to :func:`structconv.conv`: ``"auto"`` runs ``F.conv{d}d`` where it applies;
    ``"ax"`` / ``"xtheta"`` force the generic structured orders.  Keyword-only.

Shapes
------
- **input:** :math:`(B, C_{{in}}, {axes_in})` or unbatched :math:`(C_{{in}}, {axes_in})`
- **output:** :math:`(B, C_{{out}}, {axes_out})` or unbatched :math:`(C_{{out}}, {axes_out})`,
  the sizes as torch's

Examples
--------
>>> import torch
>>> from structconv.nn import GridConv{d}d
>>> ref, layer = torch.nn.Conv{d}d(3, 8, 3, padding=1), GridConv{d}d(3, 8, 3, padding=1)
>>> _ = layer.load_state_dict(ref.state_dict())
>>> x = torch.randn({conv_example})
>>> torch.allclose(layer(x), ref(x), atol=1e-5)
True
"""

_POOL = r"""``torch.nn.AvgPool{d}d`` as a one-member shift basis: the mean of each window, channel by channel.

Basis: the strided window mean :math:`A = \frac{{1}}{{|W|}}\sum_{{o \in W}} \mathcal A_{{-o}}`, by
:func:`structconv.avg_pool_basis` (K = 1)

Θ: :math:`I` per channel, never formed: pooling has no :meth:`theta` (K, P, Q) = ``(1, C, C)``

.. math:: y_{{:, c}} = A^\top x_{{:, c}} \quad \text{{for every channel }} c.

A drop-in for ``torch.nn.AvgPool{d}d``, derived and compared in ``docs/grid.rst``.

Parameters
----------
kernel_size : int or tuple of int
    The window, {kernel_tuple}.
stride : int or tuple of int, optional
    The windows' step; ``kernel_size`` by default, as in torch.
padding : int or tuple, default 0
    Zeros around the grid, at most half the window: an int, one per dimension, or
    ``(before, after)`` pairs.
ceil_mode : bool, default False
    Keep a last, partial window (torch's rule; see :func:`~structconv.avg_pool_basis`).
count_include_pad : bool, default True
    Count the padded zeros in each window's divisor.
divisor_override : int, optional
    Divide every window's sum by this instead{divisor_note}.
order : {{"auto", "native", "shift"}}, default "auto"
    How :math:`A^\top x` runs, :func:`structconv.apply_shifts`'s ``order``: ``"native"``
    (``F.avg_pool{d}d`` or a depthwise ``F.conv{d}d``), ``"shift"`` (slicing) or ``"auto"``;
    keyword-only.

Shapes
------
- **input:** :math:`(B, C, {axes_in})` or unbatched :math:`(C, {axes_in})`
- **output:** :math:`(B, C, {axes_out})` or unbatched :math:`(C, {axes_out})`, the sizes as
  torch's

Examples
--------
>>> import torch
>>> from structconv.nn import AvgPool{d}d
>>> x = torch.randn({pool_example})
>>> layer = AvgPool{d}d(3, stride=2, padding=1)
>>> torch.allclose(layer(x), torch.nn.AvgPool{d}d(3, stride=2, padding=1)(x), atol=1e-6)
True
"""

_DIVISOR_1D = (
    " (torch's ``AvgPool1d`` has no such argument, so here it is keyword-only; ours equals"
    " ``F.avg_pool2d`` with it on a height-1 image)"
)


def _fill(template: str, d: int) -> str:
    dim = _DIMENSIONS[d]
    note = _DIVISOR_1D if d == 1 else ""
    return template.format(d=d, kernel_comma=dim.kernel.replace(" ", ", "), divisor_note=note, **dim._asdict())


def conv_doc(d: int) -> str:
    """The docstring of ``GridConv{d}d``."""
    return _fill(_CONV, d)


def pool_doc(d: int) -> str:
    """The docstring of ``AvgPool{d}d``."""
    return _fill(_POOL, d)
