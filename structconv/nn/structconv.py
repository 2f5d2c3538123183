r"""The generic layer: a fixed basis and a learnable :math:`\Theta` (and bias)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..backend.checks import check_backend, positive_int
from ..bases.base import Basis
from ..bases.convert import as_basis
from ._module import CompiledRuns, NotScriptable, warn_jit_trace


class StructConv(CompiledRuns, NotScriptable, nn.Module):
    r"""Convolution over a fixed basis: the formula itself, with a learnable :math:`\Theta` and bias.

    Basis: the one given, any torch :class:`~structconv.Basis` or dense tensor (K members), as :meth:`basis` returns it

    Θ: ``weight``, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math:: y_b = \sum_k A_k^\top x_b\,\Theta_k + \beta,

    :func:`structconv.conv` plus ``bias``.  For one identity ``(1, M, M)`` it is
    ``torch.nn.Linear(P, Q)`` (``weight[0]`` its ``weight`` transposed), initial draw included
    (:meth:`fan_in`).  Options past ``out_channels`` are keyword-only.

    Parameters
    ----------
    basis : Basis or torch.Tensor
        A torch :class:`~structconv.Basis` (or dense tensor) of shape ``(K, M, N)``.  It moves
        with the module (``.to``, ``.double``, ``.cuda``) but is not a parameter.
    in_channels : int
        :math:`P`, the width of the input.
    out_channels : int
        :math:`Q`, the width of the output.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    order : str, default "auto"
        Passed to :func:`structconv.conv`.
    device : optional
        Where the parameters and the basis live; the basis' device by default.
    dtype : optional
        The dtype of the parameters and the basis; the basis' dtype by default.

    Shapes
    ------
    - **input:** :math:`(B, M, P)` or :math:`(M, P)`
    - **output:** :math:`(B, N, Q)` or :math:`(N, Q)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import StructConv
    >>> layer = StructConv(torch.eye(5).expand(2, 5, 5), 3, 4)
    >>> layer(torch.randn(8, 5, 3)).shape
    torch.Size([8, 5, 4])
    >>> layer, linear = StructConv(torch.eye(5)[None], 3, 4), torch.nn.Linear(3, 4)
    >>> with torch.no_grad():
    ...     layer.weight[0] = linear.weight.T
    ...     layer.bias[:] = linear.bias
    >>> x = torch.randn(5, 3)
    >>> torch.allclose(layer(x), linear(x), atol=1e-6)
    True
    """

    def __init__(
        self,
        basis: Basis | torch.Tensor,
        in_channels: int,
        out_channels: int,
        *,
        bias: bool = True,
        order: str = "auto",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        basis = as_basis(basis)
        check_backend(basis.backend, "torch", "the basis of a torch layer")
        if basis.batch is not None:
            raise ValueError(
                "basis must be shared by the batch, shape (K, M, N); per-instance bases go to structconv.conv"
            )
        in_channels = positive_int(in_channels, "in_channels", where="StructConv")
        out_channels = positive_int(out_channels, "out_channels", where="StructConv")
        factory = {"device": device if device is not None else basis.device, "dtype": dtype or basis.dtype}
        self._fixed_basis = basis.to(device=factory["device"], dtype=factory["dtype"])
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.order = order
        self.weight = nn.Parameter(torch.empty(basis.K, in_channels, out_channels, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.reset_parameters()

    def basis(self, x: torch.Tensor | None = None) -> Basis:
        """The fixed basis ``(K, M, N)`` (the same for every ``x``; ``x`` is accepted for the layer contract)."""
        return self._fixed_basis

    def theta(self) -> torch.Tensor:
        r""":math:`\Theta`, the parameter ``weight`` of shape ``(K, P, Q)``."""
        return self.weight

    def fan_in(self) -> float:
        r"""The effective fan-in :math:`F = P\,e` used by :meth:`reset_parameters`.

        With independent zero-mean inputs of variance :math:`v`, each output has variance
        :math:`v\,P\,\mathrm{Var}(\Theta)\sum_{k,m}A_{kmn}^2`, so the fan-in counts the basis
        energy :math:`e = \frac1N\sum_{k,m,n}A_{kmn}^2` (:meth:`~structconv.Basis.energy`).  For a
        grid basis :math:`e` is the kernel volume :math:`K` away from borders, so the draw is
        ``torch.nn.Conv2d``'s default (fan-in :math:`PK`); for :math:`K = 1` and :math:`A_1 = I`
        it is ``torch.nn.Linear``'s.
        """
        return self.in_channels * max(self._fixed_basis.energy(), 1e-12)

    def reset_parameters(self) -> None:
        """Draw :math:`\\Theta` and the bias from :math:`\\mathcal U(\\pm 1/\\sqrt{F})`, :math:`F` = :meth:`fan_in`."""
        bound = 1.0 / math.sqrt(self.fan_in())
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer to ``x`` of shape ``(B, M, P)`` or ``(M, P)``."""
        warn_jit_trace(self)
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"StructConv: x must be a torch.Tensor of shape (B, M, P) or (M, P), got {type(x).__name__}"
            )
        return self.contract(self.basis(x), x, self.theta(), bias=self.bias, order=self.order)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> StructConv:
        super()._apply(fn, recurse)
        self._fixed_basis = self._fixed_basis.to(device=self.weight.device, dtype=self.weight.dtype)
        return self

    def extra_repr(self) -> str:
        b = self._fixed_basis
        return (
            f"basis={b.representation}(K={b.K}, M={b.M}, N={b.N}), in_channels={self.in_channels}, "
            f"out_channels={self.out_channels}, bias={self.bias is not None}, order={self.order!r}"
        )
