"""GCN and SGC: one member built from the GCN-normalised graph (PyG's ``gcn_norm``)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..backend.checks import positive_int
from ..bases.base import Basis
from ..structures.edge_list import checked_basis
from ..structures.graph import PolynomialBasis, gcn_edges, is_matrix_graph
from .graph_common import _CachedGraphLayer, _read
from .pyg_state import PyGKey, member_keys, same_key


class GCNConv(_CachedGraphLayer):
    r"""Graph convolution of Kipf & Welling: one member, the GCN-normalised adjacency.

    Basis: the GCN-normalised graph :math:`\hat A` of :func:`structconv.gcn_basis` (K = 1)

    Θ: ``weight``, the one channel map every neighbour shares, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math::

        y = \hat A^\top x\,\Theta + \beta,
        \qquad \hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2},
        \quad \tilde d_n = \textstyle\sum_m \tilde a_{mn},

    with :math:`\tilde a_{mn}` the weight of the edge :math:`m \to n` in :math:`A + I` (self-loops
    and ``improved`` as PyG's ``gcn_norm``).  A drop-in for PyG's ``GCNConv``: its
    arguments in its order, ``cached``, its checkpoints (``lin.weight`` is ``weight[0]``
    transposed); what differs is listed in ``docs/peers/graph.rst``, the derivation is in
    ``docs/graph.rst``.  Glorot weights, zero bias.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    improved : bool, default False
        Weigh the added self-loops 2 instead of 1 (:math:`A + 2I`), as PyG's ``improved``.
    cached : bool, default False
        Keep the first graph's basis and reuse it; a later graph of another size, node count,
        weighting or device is refused (PyG reuses silently); :meth:`reset_cache` forgets it.
    add_self_loops : bool, optional
        Add :math:`I` before normalising; ``None`` (the default) follows ``normalize``, as in PyG.
        ``True`` needs ``normalize=True``.
    normalize : bool, default True
        Normalise symmetrically; ``False`` contracts the raw (weighted) adjacency.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    flow : {"source_to_target", "target_to_source"}
        The direction of an ``edge_index``'s edges, as PyG's ``flow``.

    Shapes
    ------
    - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or a static batch
      :math:`(B, |\mathcal{V}|, F_{in})`, edge indices :math:`(2, |\mathcal{E}|)` or a sparse
      adjacency :math:`(|\mathcal{V}|, |\mathcal{V}|)` (PyG's ``adj_t``) or a prebuilt
      :class:`~structconv.Basis`, edge weights :math:`(|\mathcal{E}|)` *(optional)*
    - **output:** node features :math:`(|\mathcal{V}|, F_{out})` (:math:`(B, |\mathcal{V}|, F_{out})`
      for a batch)

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GCNConv
    >>> x = torch.randn(4, 3)
    >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3],
    ...                            [1, 0, 2, 1, 3, 2]])  # a path, both ways
    >>> layer = GCNConv(3, 2)
    >>> A = torch.eye(4)  # A + I, entry [m, n] for the edge m -> n
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> d = A.sum(0).rsqrt()
    >>> A_hat = d[:, None] * A * d
    >>> ref = A_hat.T @ x @ layer.weight[0] + layer.bias
    >>> torch.allclose(layer(x, edge_index), ref, atol=1e-6)
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


class SGConv(_CachedGraphLayer):
    r"""Simple graph convolution (Wu et al.): one member, the :math:`K`-th power of the GCN-normalised adjacency.

    Basis: the power :math:`\hat A^K` of the GCN-normalised graph (:func:`structconv.gcn_basis`), a
    :class:`~structconv.PolynomialBasis` (K = 1)

    Θ: ``weight``, one channel map, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math::

        y = (\hat A^K)^\top x\,\Theta + \beta,
        \qquad \hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}.

    (The exponent :math:`K` is the constructor's ``K``; the basis has one member whatever it is.)
    Equals PyG's ``SGConv`` built with the same arguments when ``weight[0]`` is its ``lin.weight``
    transposed and ``bias`` its ``lin.bias`` (``load_state_dict`` does both), for every ``K``,
    ``add_self_loops``, ``flow``, edge weights and sparse ``adj_t``
    (``tests/peers/test_pyg_graph.py``).  The constructor takes PyG's positional arguments in
    PyG's order with PyG's defaults (``SGConv(16, 32, 2)`` is ``K=2`` in both); ``flow``, as
    PyG's keyword, is keyword-only.

    **cached.**  ``cached=True`` keeps the basis :math:`\hat A^K` of the first graph seen, as
    :class:`GCNConv`'s (a later graph of another size is refused, :meth:`reset_cache` forgets
    it).  PyG's ``SGConv`` caches the propagated features :math:`\hat A^K x` instead, so there a
    later call's new ``x`` is ignored; here it is used (the same output for the same ``x``).

    The powers are applied by repeated sparse products, never formed.  Self-loops as
    :class:`GCNConv`'s.  Weights and bias as ``torch.nn.Linear`` (as PyG's ``SGConv``).
    ``load_state_dict`` also reads PyG's ``lin.weight`` (transposed into ``weight[0]``) and
    ``lin.bias``; :func:`structconv.nn.pyg_state.pyg_state_dict` gives them back.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    K : int, default 1
        The number of hops, the power of :math:`\hat A`.
    cached : bool, default False
        Keep the first graph's basis and reuse it; a later graph of another size, node count,
        weighting or device is refused (PyG reuses silently); :meth:`reset_cache` forgets it.
    add_self_loops : bool, default True
        Add :math:`I` before normalising.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    flow : {"source_to_target", "target_to_source"}
        The direction of an ``edge_index``'s edges, as PyG's ``flow``.

    Shapes
    ------
    - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or a static batch
      :math:`(B, |\mathcal{V}|, F_{in})`, edge indices :math:`(2, |\mathcal{E}|)` or a sparse
      adjacency :math:`(|\mathcal{V}|, |\mathcal{V}|)` (PyG's ``adj_t``) or a prebuilt
      :class:`~structconv.Basis`, edge weights :math:`(|\mathcal{E}|)` *(optional)*
    - **output:** node features :math:`(|\mathcal{V}|, F_{out})` (:math:`(B, |\mathcal{V}|, F_{out})`
      for a batch)

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import SGConv
    >>> x = torch.randn(4, 3)
    >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    >>> layer = SGConv(3, 2, K=2)
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
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight.data[0].T, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_channels)
            nn.init.uniform_(self.bias, -bound, bound)
        self.reset_cache()

    def pyg_keys(self) -> list[PyGKey]:
        """``weight[0]`` is PyG's ``lin.weight`` transposed, ``bias`` its ``lin.bias``."""
        keys = [member_keys("weight", ["lin.weight"])]
        return keys + ([same_key("bias", "lin.bias")] if self.bias is not None else [])

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "SGConv")
        matrix, weighted = is_matrix_graph(graph), edge_weight is not None
        rule = {"improved": False, "add_self_loops": self.add_self_loops, "normalize": True}
        edges = gcn_edges(edges, matrix=matrix, weighted=weighted, **rule)
        return PolynomialBasis(edges.to_basis(), [self.K], "powers")
