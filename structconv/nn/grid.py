r"""Drop-in grid convolutions: ``GridConv{1,2,3}d`` over shift bases.

Each layer is :func:`structconv.grid_basis` for the input's grid plus a parameter, contracted
by :func:`structconv.conv`.  They take torch's layouts (``(B, C, *grid)`` or unbatched
``(C, *grid)``) and torch's constructor arguments in torch's order with torch's defaults
(structconv's own ``order`` keyword-only), and keep torch's parameter names and shapes, so
``load_state_dict`` accepts the state of a ``torch.nn.Conv{1,2,3}d``.  The pooling layers over
the same bases are in ``structconv.nn.pool``.

Every option of torch's layers is expressed in the formula (``groups`` as a block-diagonal
:math:`\Theta_k`, ``padding_mode`` as the basis' boundary or ``x`` framed by ``F.pad``), as
``docs/grid.rst`` (Layers) sets out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 (torch's own convention)

from ..backend.cache import BoundedCache
from ..backend.checks import positive_int
from ..backend.shift_torch import conv_image
from ..backend.torch_autocast import AUTOCAST_DEVICES
from ..bases.conv_weight import ConvWeight
from ..bases.grid import GridBasis, Size, _ints
from ..engine.compiled import Contraction, contraction
from ..structures.grid import Padding, _padding, grid_basis
from ._grid_common import check_tensor, grid_and_like, own_init, split_input
from ._grid_docs import conv_doc
from ._module import CompiledRuns, NotScriptable, StructureOutsideGraph, own_parameter, warn_jit_trace

_PADDING_MODES = {"zeros": "zero", "circular": "periodic", "reflect": "zero", "replicate": "zero"}
_FRAMED = ("reflect", "replicate")  # framed explicitly by F.pad, then a basis with no padding
_ORDERS = ("auto", "native", "ax", "xtheta", "atheta")
#: (unbatched input, F.pad's framing or None, the compiled contraction)
_Run = tuple[bool, list[int] | None, Any]


class _EmptyBatch:
    """An empty batch's run: torch's empty output from the native kernel (the engine refuses empty arrays)."""

    def __init__(self, basis: GridBasis, groups: int) -> None:
        self.geometry, self.groups = basis.geometry, groups

    def run_keyed(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return conv_image(x, weight, self.geometry, bias, self.groups)

    def warm(self, cast: Any) -> None:
        return None  # rare: every empty batch goes through the checks


class _Entry(NamedTuple):
    """A layer's basis for one input grid, and the framing that goes with it."""

    basis: GridBasis
    pads: list[int] | None = None  # F.pad's argument for a framed padding mode (the basis is on the padded grid)


class _GridConvNd(StructureOutsideGraph, CompiledRuns, NotScriptable, nn.Module):
    _ndim = 0
    settings = frozenset(("kernel_size", "stride", "dilation", "padding", "padding_mode", "groups", "order"))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_init(cls, _GridConvNd.__init__)  # a wrong call's TypeError names the public layer

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
        *,
        order: str = "auto",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        in_channels = positive_int(in_channels, "in_channels", where=name)
        out_channels = positive_int(out_channels, "out_channels", where=name)
        groups = positive_int(groups, "groups", where=name)
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
        self._bases: BoundedCache[_Entry] = BoundedCache(size=8)  # per input grid
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

    def theta(self) -> ConvWeight:
        r""":math:`\Theta` as the layer stores it: :class:`~structconv.ConvWeight` of ``weight`` and ``groups``.

        Its ``full()`` is the ``(K, P, Q)`` tensor, block-diagonal for ``groups > 1``.
        """
        return ConvWeight(self.weight, self.groups)

    def basis(self, x: torch.Tensor | tuple[int, ...], like: torch.Tensor | None = None) -> GridBasis:
        """The shift basis this layer uses on the input ``x`` (or on a grid of sizes ``x``, placed like ``like``).

        The layer's output is ``conv(basis, x.flatten(2).transpose(1, 2), theta())`` in ``(B, M, Q)`` layout,
        plus the bias; for ``padding_mode`` ``"reflect"``/``"replicate"`` the basis is on the grid of ``x``
        framed by ``F.pad`` (see the module notes), and ``x`` is framed first.
        """
        grid, like = grid_and_like(x, like, self._ndim, type(self).__name__)
        return self._entry(grid, like).basis

    def _entry(self, grid: tuple[int, ...], like: torch.Tensor) -> _Entry:
        # The settings are part of the key: a layer whose attributes were changed builds anew.
        key = (grid, like.dtype, like.device, self.kernel_size, self.stride, self.dilation, repr(self.padding),
               self.padding_mode)  # fmt: skip
        return self._bases.find(key) or self._bases.put(key, self._build(grid, like))

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

        ``conv(self.basis(x), x, self.theta())`` plus the bias, through a
        :func:`structconv.contraction` compiled once per input shape, dtype and device in torch's
        ``"channels_first"`` layout: the planner's order for those shapes runs with no re-checking
        or re-planning.  For a plain box kernel on torch that order is ``"native"``, which takes
        the weight as stored and fuses the bias, so a call costs about what
        ``torch.nn.Conv{d}d``'s does.  An empty batch (``B = 0``) returns torch's empty output
        from the native kernel: the engine refuses empty arrays and there is nothing to contract.
        """
        if torch.compiler.is_compiling():
            self.prepare_outside_graph(x)  # the warm run, built eagerly before the graph reads it
        params = self._parameters
        weight = params.get("weight")  # None under a parametrization: every call checked
        key = None
        if weight is not None and isinstance(x, torch.Tensor) and torch._C._get_tracing_state() is None:
            # Everything the first call checked, so the warm run checks nothing (Contraction.warm).
            kind = x.device.type  # autocast_dtype(kind), spelt out: a call here is a cost on every call
            on = kind in AUTOCAST_DEVICES and torch.is_autocast_enabled(kind)
            cast = torch.get_autocast_dtype(kind) if on else None
            key = (x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device, cast)
            warm = self.warm_runs.get(key)
            if warm is not None:
                y: torch.Tensor = warm(x, weight, params.get("bias"))
                return y
        return self._checked(x, key)

    def _checked(self, x: torch.Tensor, key: tuple[Any, ...] | None) -> torch.Tensor:
        """The call with every check, through the contraction compiled for ``x``; then keeps the warm run."""
        warn_jit_trace(self)
        check_tensor(x, type(self).__name__)  # before the run cache reads x.shape
        weight = own_parameter(self, "weight")
        runs_key = (x.shape, x.dtype, x.device, weight.dtype, weight.device)
        unbatched, pads, compiled = self._runs.find(runs_key) or self.compiled_run(runs_key, partial(self._compile, x))
        xb = x[None] if unbatched else x
        if pads is not None:  # reflect / replicate: torch's explicit framing
            xb = F.pad(xb, pads, mode=self.padding_mode)
        bias = own_parameter(self, "bias")
        y: torch.Tensor = compiled.run_keyed(xb, weight, bias)
        if key is not None and bias is self._parameters.get("bias") and self.runs_eagerly():  # no parametrization
            warm = compiled.warm(key[-1])
            if warm is not None:
                run = warm if not unbatched and pads is None else _framed(warm, unbatched, pads, self.padding_mode)
                self.keep_warm_run(key, run)
        return y[0] if unbatched else y

    def _compile(self, x: torch.Tensor) -> _Run:
        xb, unbatched = split_input(x, self._ndim, self.in_channels, type(self).__name__)
        entry = self._entry(tuple(int(s) for s in xb.shape[2:]), xb)
        if entry.pads is not None:
            xb = F.pad(xb, entry.pads, mode=self.padding_mode)
        compiled: Contraction | _EmptyBatch
        if int(xb.shape[0]) == 0:  # nothing to contract
            compiled = _EmptyBatch(entry.basis, self.groups)
        else:
            compiled = contraction(entry.basis, xb, self.theta(), order=self.order, layout="channels_first")
        return unbatched, entry.pads, compiled

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


def _framed(run: Callable[..., torch.Tensor], unbatched: bool, pads: list[int] | None, mode: str) -> Any:
    """The warm ``run`` of a batched, framed input, taking the layer's own input (unbatched, or to be framed)."""

    def framed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        xb = x[None] if unbatched else x
        if pads is not None:  # reflect / replicate: torch's explicit framing
            xb = F.pad(xb, pads, mode=mode)
        y = run(xb, weight, bias)
        return y[0] if unbatched else y

    return framed


class GridConv1d(_GridConvNd):
    __doc__ = conv_doc(1)

    _ndim = 1


class GridConv2d(_GridConvNd):
    __doc__ = conv_doc(2)

    _ndim = 2


class GridConv3d(_GridConvNd):
    __doc__ = conv_doc(3)

    _ndim = 3
