"""GCN and SGC: one member built from the GCN-normalised graph (PyG's ``gcn_norm``)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..bases.base import Basis
from ..structures.edge_list import checked_basis
from ..structures.graph import PolynomialBasis, is_matrix_graph
from .graph_common import _gcn_edges, _GraphLayer, _positive, _read
from .pyg_state import PyGKey, member_keys, same_key


class GCNConv(_GraphLayer):
    r"""Graph convolution of Kipf & Welling: :math:`y = \hat A^\top x\,\Theta + \beta`, one member.

    :math:`\hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (:func:`structconv.gcn_basis`).  With
    :math:`K = 1` every neighbour shares one channel map, which is what limits GCN: it can
    only average its neighbourhood, never tell neighbours apart.  Arguments as PyG's
    ``GCNConv`` (no ``cached``: pass a prebuilt basis instead); ``flow`` as PyG's.  Self-loops
    and ``improved`` as PyG's ``gcn_norm`` (see the module notes).  ``x`` may be sparse
    (densified) or a static batch ``(B, N, P)``.  Glorot weights, zero bias.

    **PyG checkpoints.**  ``load_state_dict`` also reads PyG's ``GCNConv`` entries (``lin.weight``,
    transposed into ``theta[0]``, and ``bias``); :func:`structconv.nn.pyg_state.pyg_state_dict`
    gives them back (:mod:`structconv.nn.pyg_state`).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
        flow: str = "source_to_target",
    ) -> None:
        super().__init__(in_channels, out_channels, 1, bias, flow)
        if add_self_loops is None:  # as PyG: loops go with the normalisation
            add_self_loops = normalize
        elif add_self_loops and not normalize:
            raise ValueError("GCNConv: add_self_loops=True needs normalize=True (as in PyG)")
        self.improved, self.add_self_loops, self.normalize = improved, add_self_loops, normalize
        self.reset_parameters()

    def pyg_keys(self) -> list[PyGKey]:
        """``theta[0]`` is PyG's ``lin.weight`` transposed; ``bias`` is PyG's."""
        return [member_keys("theta", ["lin.weight"])]

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "GCNConv")
        matrix = is_matrix_graph(graph)
        loops = self.add_self_loops and self.normalize
        edges = _gcn_edges(edges, matrix, edge_weight is not None, self.improved, loops, self.normalize)
        return checked_basis(edges)  # read by as_edges and normalised: no second check, every call


class SGConv(_GraphLayer):
    r"""Simple graph convolution (Wu et al.): one member :math:`\hat A^K`, :math:`y = (\hat A^K)^\top x\Theta + \beta`.

    Weights and bias as ``torch.nn.Linear`` (as PyG's ``SGConv``); self-loops as
    :class:`GCNConv`'s.  ``load_state_dict`` also reads PyG's ``lin.weight`` (transposed into
    ``theta[0]``) and ``lin.bias``; :func:`structconv.nn.pyg_state.pyg_state_dict` gives them back.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int = 1,
        add_self_loops: bool = True,
        bias: bool = True,
        flow: str = "source_to_target",
    ) -> None:
        self.K = _positive(K, "K", "SGConv")
        super().__init__(in_channels, out_channels, 1, bias, flow)
        self.add_self_loops = add_self_loops
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.theta.data[0].T, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_channels)
            nn.init.uniform_(self.bias, -bound, bound)

    def pyg_keys(self) -> list[PyGKey]:
        """``theta[0]`` is PyG's ``lin.weight`` transposed, ``bias`` its ``lin.bias``."""
        keys = [member_keys("theta", ["lin.weight"])]
        return keys + ([same_key("bias", "lin.bias")] if self.bias is not None else [])

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "SGConv")
        edges = _gcn_edges(edges, is_matrix_graph(graph), edge_weight is not None, False, self.add_self_loops)
        return PolynomialBasis(edges.to_basis(), [self.K], "powers")
