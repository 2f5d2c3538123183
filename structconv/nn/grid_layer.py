r"""The base of a grid layer of your own: its basis for an input's grid, and :math:`\Theta`."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..backend.checks import positive_int
from ..bases.base import Basis
from ._grid_common import split_input
from ._module import CompiledRuns, NotScriptable, StructureOutsideGraph, warn_jit_trace


class GridLayer(StructureOutsideGraph, CompiledRuns, NotScriptable, nn.Module):
    r"""A grid layer of your own: write :meth:`grid_basis` (and :meth:`theta` if not ``weight``).

    Basis: what :meth:`grid_basis` builds for the input's grid and a tensor of its dtype and
    device (K members; a grid basis of :func:`structconv.grid_basis`, or any basis that knows
    its grids, ``entry_shapes``), built once per grid, dtype and device

    Θ: ``weight`` (K, P, Q), drawn as ``torch.nn.Conv{d}d`` draws a weight of K taps, or what an
    overridden :meth:`theta` returns

    .. math:: y = \sum_k A_k^\top x\,\Theta_k + \beta

    in torch's image layout: ``(B, P, *grid)`` in, ``(B, Q, *out_grid)`` out, through the
    contraction compiled for each input shape (:func:`structconv.contraction`,
    ``layout="channels_first"``).  The layer has ``state_dict``, ``.to``, ``torch.compile``
    (``fullgraph=True``) and the layer contract that :func:`structconv.testing.check_layer`
    checks.  A basis that depends on a setting of yours forgets its grids when the setting is
    assigned if the class names it in ``settings``.

    Parameters
    ----------
    in_channels : int
        :math:`P`.
    out_channels : int
        :math:`Q`.
    members : int, default 1
        :math:`K`, the members of ``weight`` (of the basis, when :meth:`theta` is ``weight``).
    dims : int, default 2
        The grid's dimensions: 1 for sequences, 2 for images, 3 for volumes.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.

    Shapes
    ------
    - **input:** :math:`(B, P, *grid)` or unbatched :math:`(P, *grid)`
    - **output:** :math:`(B, Q, *out\_grid)` or :math:`(Q, *out\_grid)`

    Examples
    --------
    WaveNet's dilated causal convolution: two taps ``dilation`` apart, the past padded in.

    >>> import torch
    >>> from structconv import grid_basis
    >>> from structconv.nn import GridLayer
    >>> class Causal(GridLayer):
    ...     def __init__(self, in_channels, out_channels, dilation):
    ...         super().__init__(in_channels, out_channels, members=2, dims=1)
    ...         self.dilation = dilation
    ...     def grid_basis(self, grid, like):
    ...         pad = ((self.dilation, 0),)
    ...         return grid_basis(grid, 2, dilation=self.dilation, padding=pad, like=like)
    >>> Causal(3, 5, dilation=4)(torch.randn(2, 3, 16)).shape
    torch.Size([2, 5, 16])
    """

    def __init__(
        self, in_channels: int, out_channels: int, members: int = 1, *, dims: int = 2, bias: bool = True
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.in_channels = positive_int(in_channels, "in_channels", where=name)
        self.out_channels = positive_int(out_channels, "out_channels", where=name)
        self.dims = positive_int(dims, "dims", where=name)
        members = positive_int(members, "members", where=name)
        self.weight = nn.Parameter(torch.empty(members, self.in_channels, self.out_channels))
        self.bias = nn.Parameter(torch.empty(self.out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Draw ``weight`` and ``bias`` from :math:`\mathcal U(\pm 1/\sqrt{PK})`, ``torch.nn.Conv{d}d``'s default."""
        bound = 1.0 / math.sqrt(self.in_channels * int(self.weight.shape[0]))
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def grid_basis(self, grid: tuple[int, ...], like: torch.Tensor) -> Basis:
        """The basis on an input of sizes ``grid``, with ``like``'s dtype and device.  Your layer defines it."""
        raise NotImplementedError(
            f"{type(self).__name__}: define grid_basis(self, grid, like) returning the layer's basis on that grid, "
            "e.g. structconv.grid_basis(grid, 3, padding=1, like=like)"
        )

    def theta(self) -> Any:
        r""":math:`\Theta`, the parameter ``weight`` of shape ``(K, P, Q)``."""
        return self.weight

    def basis(self, x: torch.Tensor) -> Basis:
        """The basis on ``x``'s grid (``(B, P, *grid)`` or ``(P, *grid)``), on its dtype and device."""
        xb, _ = split_input(x, self.dims, self.in_channels, type(self).__name__)
        grid = tuple(int(s) for s in xb.shape[2:])
        key = ("basis", grid, xb.dtype, xb.device)
        built: Basis = self.compiled_run(key, lambda: self._placed(grid, xb))
        return built

    def _placed(self, grid: tuple[int, ...], like: torch.Tensor) -> Basis:
        basis = self.grid_basis(grid, like)
        if not isinstance(basis, Basis):
            raise TypeError(
                f"{type(self).__name__}: grid_basis must return a structconv Basis, got {type(basis).__name__}"
            )
        return basis.to(device=like.device, dtype=like.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer to ``x`` of shape ``(B, P, *grid)`` (or unbatched ``(P, *grid)``)."""
        if torch.compiler.is_compiling():
            self.prepare_outside_graph(x)  # the grid's basis and plan, built eagerly before the graph reads them
        warn_jit_trace(self)
        xb, unbatched = split_input(x, self.dims, self.in_channels, type(self).__name__)
        basis = self.basis(xb)
        if int(xb.shape[0]) == 0:  # an empty batch: torch's convolutions return an empty output
            return xb.new_zeros((0, self.out_channels, *basis.entry_shapes[1]))
        y = self.contract(basis, xb, self.theta(), bias=self.bias, layout="channels_first")
        return y[0] if unbatched else y

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, members={self.weight.shape[0]}, dims={self.dims}, "
            f"bias={self.bias is not None}"
        )
