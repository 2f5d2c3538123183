r"""GIN: each node's own features, scaled by :math:`1 + \epsilon`, plus its in-neighbours', then a network."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..backend.torch_autocast import check_input_dtype
from ..bases.base import Basis
from ..bases.factor import Aggregation
from ..structures.graph import graph_basis
from ._module import CompiledRuns, warn_jit_trace
from .graph_common import _check_device, _check_empty, _check_flow, _features, _flip, _read, _stacked
from .pyg_state import PyGState


def reset_module(module: Any) -> None:
    """Redraw ``module``'s parameters as PyG's ``reset`` does: its ``reset_parameters``, else its children's."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
        return
    for child in module.children() if isinstance(module, nn.Module) else ():
        reset_module(child)


class GINConv(CompiledRuns, PyGState):
    r"""The graph isomorphism network (Xu et al.): :math:`\mathrm{nn}((1 + \epsilon) x_n + \sum_{m \to n} x_m)`.

    Basis: :math:`[I, A]` (``graph_basis(edges, "gin")``)

    Θ: :math:`(1 + \epsilon, 1)`, one scalar per member and no channel map (:meth:`theta`, an
    :class:`~structconv.Aggregation`); ``nn`` follows

    .. math:: y = \mathrm{nn}\Big(\sum_k c_k A_k^\top x\Big), \qquad c = (1 + \epsilon, 1).

    A drop-in for PyG's ``GINConv``: its arguments, ``state_dict`` (``eps``, ``nn.*``), initial
    draws (``nn`` redrawn at construction, as PyG does), call and bipartite pairs
    ``(x_src, x_dst)``.

    Parameters
    ----------
    nn : callable
        The network applied to the aggregated features, e.g. an MLP; a module is registered.
    eps : float, default 0.0
        :math:`\epsilon`'s initial value.
    train_eps : bool, default False
        Learn :math:`\epsilon` (a parameter ``eps``); else ``eps`` is a buffer.
    flow : {"source_to_target", "target_to_source"}, default "source_to_target"
        The direction of an ``edge_index``'s edges, as PyG's ``flow``; keyword-only.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)` or a pair :math:`((N_{src}, P), (N_{dst}, P))`;
      ``edge_index`` :math:`(2, E)` or a sparse ``adj_t``; ``size`` :math:`(N_{src}, N_{dst})`
    - **output:** ``nn``'s, on :math:`N` (or :math:`N_{dst}`) rows

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GINConv
    >>> layer = GINConv(torch.nn.Linear(3, 2), eps=0.5)
    >>> x, edge_index = torch.randn(4, 3), torch.tensor([[0, 1, 2, 2], [1, 2, 1, 3]])
    >>> A = torch.zeros(4, 4)
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> torch.allclose(layer(x, edge_index), layer.nn(1.5 * x + A.T @ x), atol=1e-6)
    True
    """

    def __init__(
        self, nn: Callable[..., Any], eps: float = 0.0, train_eps: bool = False, *, flow: str = "source_to_target"
    ) -> None:
        super().__init__()
        if not callable(nn):
            raise TypeError(f"GINConv: nn must be a callable (a module such as an MLP), got {type(nn).__name__}")
        self.nn = nn
        self.initial_eps = float(eps)
        self.flow = _check_flow(flow, "GINConv")
        if train_eps:
            self.eps = torch.nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("eps", torch.empty(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Redraw ``nn`` (PyG's ``reset``) and set ``eps`` to its initial value."""
        reset_module(self.nn)
        self.eps.data.fill_(self.initial_eps)

    def theta(self, channels: int) -> Aggregation:
        r""":math:`\Theta_0 = (1 + \epsilon) I`, :math:`\Theta_1 = I` on ``channels`` channels."""
        eps = self.eps.reshape(())
        return Aggregation(torch.stack([1 + eps, torch.ones_like(eps)]), channels)

    def basis(self, x: Any, edge_index: Any, size: Any = None) -> Basis:
        """:math:`[I, A]` on ``x``'s nodes (a pair: the targets' rows after the sources')."""
        rows, targets = _stacked(x, size, "GINConv")
        return self._built(_features(rows, _width(rows), "GINConv", static=targets is None), edge_index, targets)

    def _built(self, x: torch.Tensor, edge_index: Any, targets: int | None) -> Basis:
        if isinstance(edge_index, Basis):
            return edge_index
        basis = graph_basis(_read(_flip(edge_index, self.flow, "GINConv"), x, None, "GINConv", targets), "gin")
        return basis.to(x.device) if x.device.type == "meta" else basis  # built where the graph's values are

    def aggregate(self, x: Any, edge_index: Any, size: Any = None) -> torch.Tensor:
        r""":math:`(1 + \epsilon) x_n + \sum_{m \to n} x_m`, what ``nn`` is applied to."""
        warn_jit_trace(self)
        rows, targets = _stacked(x, size, "GINConv")
        rows = _features(rows, _width(rows), "GINConv", static=targets is None)  # (B, N, P) as PyG takes it
        _check_device(rows, self.eps, "GINConv")
        check_input_dtype(rows, self.eps, "GINConv")
        if int(rows.shape[-2]) == 0 and not isinstance(edge_index, Basis):  # no nodes: nothing to sum
            _check_empty(edge_index, "GINConv")
            return rows * (1 + self.eps)
        theta = self.theta(int(rows.shape[-1]))
        if theta.coef.dtype != rows.dtype:  # a float32 eps beside bf16 features: the scalars follow x
            theta = Aggregation(theta.coef.to(rows.dtype), theta.channels)
        return self.contract(self._built(rows, edge_index, targets), rows, theta)

    def forward(self, x: Any, edge_index: Any, size: Any = None) -> Any:
        """``nn`` of :meth:`aggregate` of ``x`` (or a pair ``(x_src, x_dst)``) on ``edge_index``."""
        return self.nn(self.aggregate(x, edge_index, size))

    def extra_repr(self) -> str:
        return f"eps={self.initial_eps}, train_eps={isinstance(self.eps, torch.nn.Parameter)}"


def _width(x: Any) -> int:
    """The channels of node features ``x`` (0 for what is not a tensor: :func:`_features` refuses it)."""
    return int(x.shape[-1]) if isinstance(x, torch.Tensor) and x.ndim >= 1 else 0
