r"""Drop-in grid convolutions: ``GridConv{1,2,3}d`` over shift bases.

Each layer is :func:`structconv.grid_basis` for the input's grid plus a parameter, contracted
by :func:`structconv.conv`.  They take torch's layouts (``(B, C, *grid)`` or unbatched
``(C, *grid)``) and torch's constructor arguments, and keep torch's parameter names and
shapes, so ``load_state_dict`` accepts the state of a ``torch.nn.Conv{1,2,3}d``.  The pooling
layers over the same bases are in ``structconv.nn.pool``.

Every option of torch's layers is expressed in the formula:

* ``groups = G``: a shift basis with a block-diagonal :math:`\Theta_k` (block :math:`g` maps the
  input channels of group :math:`g` to its output channels); the parameter is stored as torch
  stores it, ``(Q, P/G, *kernel)``.  The native order passes ``groups`` to ``F.conv{d}d``; the
  generic orders contract the expanded block-diagonal :math:`\Theta` (zeros included).
* ``padding_mode="reflect"`` / ``"replicate"`` are not shift bases on the border (a reflected
  read depends on the grid edge, not on an offset): as torch does, ``x`` is framed explicitly
  (``F.pad`` with that mode) and the shift basis is built with no padding *on the padded grid*.
* ``"zeros"`` and ``"circular"`` are the ``"zero"`` and ``"periodic"`` boundaries of the basis.
* An empty batch (``B = 0``) returns torch's empty output (the engine refuses empty arrays, so
  it runs the native kernel whatever ``order`` says).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 (torch's own convention)

from ..backend.shift_torch import conv_image
from ..backend.torch_autocast import autocast_dtype
from ..bases.grid import GridBasis, Size, _ints
from ..engine.contract import conv, explain
from ..structures.grid import Padding, _padding, grid_basis
from ._grid_common import BasisCache, grid_and_like, split_input
from ._module import NotScriptable

_PADDING_MODES = {"zeros": "zero", "circular": "periodic", "reflect": "zero", "replicate": "zero"}
_FRAMED = ("reflect", "replicate")  # framed explicitly by F.pad, then a basis with no padding
_ORDERS = ("auto", "native", "ax", "xtheta", "atheta")


class _Entry:
    """A layer's basis for one input grid, and the engine's choice of order per batch size."""

    def __init__(self, basis: GridBasis, pads: list[int] | None = None) -> None:
        self.basis = basis
        self.pads = pads  # F.pad's argument for a framed padding mode (the basis is on the padded grid)
        geo = basis.geometry
        # The native kernel takes the layer's weight as it is stored only for a plain box kernel.
        self._eligible = basis.native_available() and basis.weights is None and not basis.normalize and geo.is_full_box
        self._chosen: dict[tuple[int, str], bool] = {}

    def native(self, layer: _GridConvNd, x: torch.Tensor) -> bool:
        """Whether the engine's plan for ``x`` (``(B, C, *grid)``) is the native order.

        An empty batch runs the native kernel whatever the order (the engine refuses empty arrays).
        """
        if not self._eligible:
            return False
        if x.dtype != layer.weight.dtype and autocast_dtype(x.device.type) is None:
            return False  # the engine's check names the mismatch
        key = (int(x.shape[0]), layer.order)
        chosen = self._chosen.get(key)
        if chosen is None:
            if key[0] == 0 or layer.order not in ("auto", "native"):
                chosen = key[0] == 0
            else:
                flat = x.flatten(2).transpose(1, 2)
                # Plans depend on shapes only: Θ's (K, P, Q) shape, the block-diagonal one for groups.
                theta = flat.new_empty((self.basis.K, layer.in_channels, layer.out_channels))
                chosen = explain(self.basis, flat, theta, layer.order).chosen == "native"
            self._chosen[key] = chosen
        return chosen


class _GridConvNd(NotScriptable, nn.Module):
    _ndim = 0

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Size,
        stride: Size = 1,
        padding: Padding = 0,
        dilation: Size = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
        order: str = "auto",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {arg} must be a positive integer, got {value!r}")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
            raise ValueError(f"{name}: groups must be a positive integer, got {groups!r}")
        for arg, value in (("in_channels", in_channels), ("out_channels", out_channels)):
            if value % groups:
                raise ValueError(f"{name}: {arg} must be divisible by groups (as in torch), got {value} and {groups=}")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"{name}: padding_mode must be one of {tuple(_PADDING_MODES)}, got {padding_mode!r}")
        d = self._ndim
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _ints(kernel_size, d, "kernel_size", 1)
        self.stride = _ints(stride, d, "stride", 1)
        self.dilation = _ints(dilation, d, "dilation", 1)
        self.padding = padding
        self.padding_mode = padding_mode
        if order not in _ORDERS:
            raise ValueError(f"{name}: order must be one of {_ORDERS}, got {order!r}")
        self.order = order
        self.groups = groups
        # Validates padding ("same" with a stride, malformed values) on a grid large enough for it.
        grid_basis(tuple(k * dl + 8 for k, dl in zip(self.kernel_size, self.dilation, strict=True)), **self._geometry())
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self._bases: BasisCache[_Entry] = BasisCache()
        self.reset_parameters()

    def _geometry(self, framed: bool = False) -> dict[str, Any]:
        """``grid_basis`` arguments; ``framed``: those of the basis on an explicitly padded grid."""
        return {
            "kernel": self.kernel_size,
            "stride": self.stride,
            "dilation": self.dilation,
            "padding": 0 if framed else self.padding,
            "boundary": _PADDING_MODES[self.padding_mode],
        }

    def reset_parameters(self) -> None:
        """torch's default initialisation, :math:`\\mathcal U(\\pm 1/\\sqrt{(P/G) K})` for weight and bias."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_channels // self.groups * math.prod(self.kernel_size))
            nn.init.uniform_(self.bias, -bound, bound)

    def theta(self) -> torch.Tensor:
        r"""The parameter :math:`\Theta` of shape ``(K, P, Q)``: block-diagonal when ``groups > 1``.

        :math:`\Theta_{k,\,gP' + i,\,hQ' + o} = \delta_{gh}\,W_{gQ' + o,\,i,\,k}` for the weight
        :math:`W` of shape ``(Q, P', *kernel)``, :math:`P' = P/G`, :math:`Q' = Q/G`.
        """
        w = self.weight.flatten(2)  # (Q, P', K)
        if self.groups == 1:
            return w.permute(2, 1, 0)
        G, (Q, Pg, K) = self.groups, w.shape
        blocks = w.reshape(G, Q // G, Pg, K)  # (g, o, i, k)
        eye = torch.eye(G, dtype=w.dtype, device=w.device)
        return torch.einsum("goik,gh->kgiho", blocks, eye).reshape(K, G * Pg, Q)

    def parameter(self) -> torch.Tensor:
        r""":math:`\Theta` ``(K, P, Q)`` for the layer contract: :meth:`theta`."""
        return self.theta()

    def basis(self, x: torch.Tensor | tuple[int, ...], like: torch.Tensor | None = None) -> GridBasis:
        """The shift basis this layer uses on the input ``x`` (or on a grid of sizes ``x``, placed like ``like``).

        The layer's output is ``conv(basis, x.flatten(2).transpose(1, 2), parameter())`` in ``(B, M, Q)`` layout,
        plus the bias; for ``padding_mode`` ``"reflect"``/``"replicate"`` the basis is on the grid of ``x``
        framed by ``F.pad`` (see the module notes), and ``x`` is framed first.
        """
        grid, like = grid_and_like(x, like, self._ndim, type(self).__name__)
        return self._entry(grid, like).basis

    def _entry(self, grid: tuple[int, ...], like: torch.Tensor) -> _Entry:
        # The settings are part of the key: a layer whose attributes were changed builds anew.
        key = (grid, like.dtype, like.device, self.kernel_size, self.stride, self.dilation, repr(self.padding),
               self.padding_mode)  # fmt: skip
        return self._bases.get(key, lambda: self._build(grid, like))

    def _build(self, grid: tuple[int, ...], like: torch.Tensor) -> _Entry:
        if self.padding_mode not in _FRAMED:
            return _Entry(grid_basis(grid, like=like, **self._geometry()))
        # The framing torch applies (F.pad with the mode), then a basis with no padding on the padded grid.
        extent = tuple(dl * (k - 1) + 1 for k, dl in zip(self.kernel_size, self.dilation, strict=True))
        before, after = _padding(self.padding, extent, self.stride)
        if self.padding_mode == "reflect" and any(max(b, a) >= g for b, a, g in zip(before, after, grid, strict=True)):
            raise ValueError(
                f"{type(self).__name__}: padding_mode='reflect' needs padding smaller than the input along every "
                f"dimension (as torch's F.pad), got padding {self.padding!r} on an input grid {grid}"
            )
        pads: list[int] = []
        for b, a in zip(reversed(before), reversed(after), strict=True):
            pads += [b, a]
        padded = tuple(g + b + a for g, b, a in zip(grid, before, after, strict=True))
        return _Entry(grid_basis(padded, like=like, **self._geometry(framed=True)), pads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve ``x`` of shape ``(B, C_in, *grid)`` (or unbatched) like ``torch.nn.Conv{d}d``.

        The engine's plan for the input's shape is made once and kept with the basis; when it
        chooses the ``"native"`` order (as it does for box kernels on torch), the layer runs that
        order's kernel (:func:`structconv.backend.shift_torch.conv_image`) on torch's layout directly,
        with the bias fused, instead of re-checking and re-planning the same operands on every
        call: the per-call Python cost is then close to ``torch.nn.Conv{d}d``'s.  Other plans go
        through :func:`structconv.conv`.  Tests hold both routes to ``conv`` and to torch.
        """
        xb, unbatched = split_input(x, self._ndim, self.in_channels, type(self).__name__)
        B = int(xb.shape[0])
        entry = self._entry(tuple(int(s) for s in xb.shape[2:]), xb)
        if entry.pads is not None:  # reflect / replicate: torch's explicit framing
            xb = F.pad(xb, entry.pads, mode=self.padding_mode)
        basis = entry.basis
        if entry.native(self, xb):
            direct = conv_image(xb, self.weight, basis.geometry, self.bias, self.groups)
            return direct[0] if unbatched else direct
        y: torch.Tensor = conv(basis, xb.flatten(2).transpose(1, 2), self.theta(), order=self.order)
        y = y.transpose(1, 2).reshape(B, self.out_channels, *basis.out_grid)
        if self.bias is not None:
            y = y + self.bias.reshape(-1, *([1] * self._ndim))
        return y[0] if unbatched else y

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding!r}, dilation={self.dilation}"
        )
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode!r}"
        return s + f", bias={self.bias is not None}, order={self.order!r}"


class GridConv1d(_GridConvNd):
    r"""``torch.nn.Conv1d`` as :math:`y = \sum_k A_k^\top x\,\Theta_k + \beta` with a 1-D shift basis.

    Arguments are those of ``torch.nn.Conv1d`` (every ``groups`` and ``padding_mode``; see the
    module notes) plus ``order``, passed to :func:`structconv.conv` (``"auto"`` runs the native
    convolution; ``"ax"`` / ``"xtheta"`` force the generic structured orders).
    """

    _ndim = 1


class GridConv2d(_GridConvNd):
    r"""``torch.nn.Conv2d`` as :math:`y = \sum_k A_k^\top x\,\Theta_k + \beta` with a 2-D shift basis.

    The parameter is stored as torch stores it, ``weight`` of shape ``(Q, P, k_1, k_2)``;
    :math:`\Theta` is the view ``weight.flatten(2).permute(2, 1, 0)``.

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GridConv2d
    >>> ref = torch.nn.Conv2d(3, 8, 3, padding=1)
    >>> layer = GridConv2d(3, 8, 3, padding=1)
    >>> _ = layer.load_state_dict(ref.state_dict())
    >>> x = torch.randn(2, 3, 10, 10)
    >>> torch.allclose(layer(x), ref(x), atol=1e-6)
    True
    """

    _ndim = 2


class GridConv3d(_GridConvNd):
    r"""``torch.nn.Conv3d`` as :math:`y = \sum_k A_k^\top x\,\Theta_k + \beta` with a 3-D shift basis."""

    _ndim = 3
