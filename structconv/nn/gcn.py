"""GCN and SGC: one member built from the GCN-normalised graph (PyG's ``gcn_norm``)."""

from __future__ import annotations

from typing import Any

import torch

from ..backend.checks import positive_int
from ..backend.torch import BACKEND
from ..backend.torch_autocast import check_input_dtype
from ..bases.base import Basis
from ..bases.factor import Aggregation
from ..structures.edge_list import checked_basis
from ..structures.graph import PolynomialBasis, gcn_edges, is_matrix_graph
from .graph_common import _CachedGraphLayer, _check_device, _read, pyg_linear_draw_
from .pyg_state import PyGKey, member_keys, same_key


class GCNConv(_CachedGraphLayer):
    r"""Graph convolution of Kipf & Welling: one member, the GCN-normalised adjacency.

    Basis: the GCN-normalised graph :math:`\hat A` of :func:`structconv.gcn_basis` (K = 1)

    Θ: ``weight``, the one channel map every neighbour shares, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math:: y = \hat A^\top x\,\Theta + \beta, \qquad
              \hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}, \quad \tilde D_{nn} = \textstyle\sum_m (A + I)_{mn}.

    A drop-in for PyG's ``GCNConv``, derived and compared in ``docs/graph.rst``.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    improved : bool, default False
        Weigh the added self-loops 2 instead of 1 (:math:`A + 2I`).
    cached : bool, default False
        Keep the first graph's basis; refuse a later graph of another size, node count,
        weighting or device.  :meth:`reset_cache` forgets it.
    add_self_loops : bool, optional
        Add :math:`I` before normalising; ``None`` (the default) follows ``normalize``.
    normalize : bool, default True
        Normalise symmetrically; ``False``: the raw, weighted adjacency (refusing ``add_self_loops=True``).
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    flow : {"source_to_target", "target_to_source"}, default "source_to_target"
        The direction of an ``edge_index``'s edges, as PyG's ``flow``; keyword-only.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)` or :math:`(B, N, P)`; ``edge_index`` :math:`(2, E)`, a
      sparse ``adj_t`` :math:`(N, N)` or a :class:`~structconv.Basis`; ``edge_weight`` :math:`(E,)`
    - **output:** :math:`(N, Q)` or :math:`(B, N, Q)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GCNConv
    >>> x, layer = torch.randn(4, 3), GCNConv(3, 2)
    >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # a path
    >>> A = torch.eye(4)  # A + I, entry [m, n] for the edge m -> n
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> d = A.sum(0).rsqrt()
    >>> y = (d[:, None] * A * d).T @ x @ layer.weight[0] + layer.bias
    >>> torch.allclose(layer(x, edge_index), y, atol=1e-6)
    True
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        cached: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
        *,
        flow: str = "source_to_target",
    ) -> None:
        super().__init__(in_channels, out_channels, 1, bias=bias, flow=flow)
        if add_self_loops is None:  # as PyG: loops go with the normalisation
            add_self_loops = normalize
        elif add_self_loops and not normalize:
            raise ValueError("GCNConv: add_self_loops=True needs normalize=True (as in PyG)")
        self.improved, self.add_self_loops, self.normalize = improved, add_self_loops, normalize
        self.cached = bool(cached)
        self.draw_as_built()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weights, a zero bias, and no cached basis (as PyG's)."""
        super().reset_parameters()
        self.reset_cache()

    def pyg_keys(self) -> list[PyGKey]:
        """``weight[0]`` is PyG's ``lin.weight`` transposed; ``bias`` is PyG's."""
        return [member_keys("weight", ["lin.weight"])]

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "GCNConv")
        matrix, weighted = is_matrix_graph(graph), edge_weight is not None
        loops = self.add_self_loops and self.normalize
        rule = {"improved": self.improved, "add_self_loops": loops, "normalize": self.normalize}
        # Read by as_edges and normalised: no second check, every call.
        return checked_basis(gcn_edges(edges, matrix=matrix, weighted=weighted, **rule))


def _constant(x: Any) -> bool:
    """Whether ``x``'s propagation may be kept: a dense tensor needing no gradient, outside any trace,
    autocast, inference mode (its tensors track no version, and a training call could not reuse
    them) or CUDA graph capture (a replay would not recompute it)."""
    return (
        isinstance(x, torch.Tensor)
        and x.layout == torch.strided
        and not x.requires_grad
        and not x.is_inference()
        and x.ndim in (2, 3)
        and int(x.shape[-2]) > 0
        and x.device.type != "meta"
        and not torch.is_inference_mode_enabled()
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()  # type: ignore[attr-defined,no-untyped-call]
        and not torch.is_autocast_enabled(x.device.type)
        and not (x.is_cuda and torch.cuda.is_current_stream_capturing())
    )


def _key(x: torch.Tensor) -> tuple[int, int]:
    """What tells a kept ``x`` changed: its version (in-place writes) and its storage (``x.data = ...``)."""
    return x._version, x.untyped_storage().data_ptr()


class SGConv(_CachedGraphLayer):
    r"""Simple graph convolution (Wu et al.): one member, the :math:`K`-th power of the GCN-normalised adjacency.

    Basis: the power :math:`\hat A^K` of the GCN-normalised graph (:func:`structconv.gcn_basis`), a
    :class:`~structconv.PolynomialBasis` (K = 1)

    Θ: ``weight``, one channel map, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math:: y = (\hat A^K)^\top x\,\Theta + \beta, \qquad \hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}.

    A drop-in for PyG's ``SGConv``, derived and compared in ``docs/graph.rst``.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    K : int, default 1
        The number of hops, the power of :math:`\hat A` (the basis has one member whatever it is).
    cached : bool, default False
        Keep the first graph's basis :math:`\hat A^K` (:meth:`reset_cache` forgets it); a later
        graph of another size, node count, weighting or device is refused.  The propagated
        features :math:`(\hat A^K)^\top x` are kept too while the same ``x`` (the same tensor,
        needing no gradient, its version and storage unchanged) comes back, as PyG keeps them: a
        later call with that ``x`` only maps them by :math:`\Theta`; another ``x`` is propagated
        anew.  A write the version counter does not see (``x.data.mul_``, a NumPy array ``x``
        shares memory with) is not seen: call :meth:`reset_cache` after one.
    add_self_loops : bool, default True
        Add :math:`I` before normalising, as :class:`GCNConv`.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    flow : {"source_to_target", "target_to_source"}, default "source_to_target"
        The direction of an ``edge_index``'s edges, as PyG's ``flow``; keyword-only.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)` or :math:`(B, N, P)`; ``edge_index`` :math:`(2, E)`, a
      sparse ``adj_t`` :math:`(N, N)` or a :class:`~structconv.Basis`; ``edge_weight`` :math:`(E,)`
    - **output:** :math:`(N, Q)` or :math:`(B, N, Q)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import SGConv
    >>> x, layer = torch.randn(4, 3), SGConv(3, 2, K=2)
    >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    >>> A = torch.eye(4)
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> d = A.sum(0).rsqrt()
    >>> A_hat = d[:, None] * A * d
    >>> y = (A_hat @ A_hat).T @ x @ layer.weight[0] + layer.bias
    >>> torch.allclose(layer(x, edge_index), y, atol=1e-6)
    True
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int = 1,
        cached: bool = False,
        add_self_loops: bool = True,
        bias: bool = True,
        *,
        flow: str = "source_to_target",
    ) -> None:
        self.K = positive_int(K, "K", where="SGConv")
        super().__init__(in_channels, out_channels, 1, bias=bias, flow=flow)
        self.add_self_loops = add_self_loops
        self.cached = bool(cached)
        self.draw_as_built()
        self.reset_parameters()

    def draw_as_built(self) -> None:
        """PyG's ``Linear(in_channels, out_channels, bias)`` draws its weight and bias when built."""
        pyg_linear_draw_(self.weight.data[0], "kaiming", self.bias)

    def reset_parameters(self) -> None:
        """Draw as PyG's ``lin.reset_parameters()`` (``torch.nn.Linear``'s draws), and forget the cached basis."""
        pyg_linear_draw_(self.weight.data[0], "kaiming", self.bias)
        self.reset_cache()

    def pyg_keys(self) -> list[PyGKey]:
        """``weight[0]`` is PyG's ``lin.weight`` transposed, ``bias`` its ``lin.bias``."""
        keys = [member_keys("weight", ["lin.weight"])]
        return keys + ([same_key("bias", "lin.bias")] if self.bias is not None else [])

    def reset_cache(self) -> None:
        """Forget the cached basis and propagated features: the next call builds them again."""
        super().reset_cache()
        self._propagated: tuple[torch.Tensor, tuple[int, int], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` (``(N, P)`` or ``(B, N, P)``) on ``edge_index`` (or a prebuilt basis)."""
        if not self.cached or not _constant(x) or isinstance(edge_index, Basis):
            return self._run(x, edge_index, edge_weight)
        _check_device(x, self.weight, "SGConv")
        check_input_dtype(x, self.weight, "SGConv")
        basis = self.basis(x, edge_index, edge_weight)  # the cached basis, the graph compared with the first
        kept = self._propagated
        key = _key(x)
        if kept is None or kept[0] is not x or kept[1] != key:
            # The A·x-first order, its first product kept: (A^K)^T x through the engine (Θ = I).
            ones = torch.ones(1, dtype=x.dtype, device=x.device)
            kept = self._propagated = (x, key, self.contract(basis, x, Aggregation(ones, self.in_channels)))
        rows = kept[2] if x.ndim == 3 else kept[2][None]
        y: torch.Tensor = BACKEND.x_theta(rows, self.weight)[:, 0]  # the engine's x·Θ (its GEMM layout)
        y = y if x.ndim == 3 else y[0]
        return y if self.bias is None else y + self.bias

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "SGConv")
        matrix, weighted = is_matrix_graph(graph), edge_weight is not None
        rule = {"improved": False, "add_self_loops": self.add_self_loops, "normalize": True}
        edges = gcn_edges(edges, matrix=matrix, weighted=weighted, **rule)
        return PolynomialBasis(edges.to_basis(), [self.K], "powers")
