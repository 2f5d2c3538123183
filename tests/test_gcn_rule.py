"""One GCN rule: :func:`structconv.gcn_basis`, ``GCNConv``/``SGConv`` and PyG's ``gcn_norm`` agree.

The rule is :func:`structconv.structures.graph.gcn_edges`.  It follows PyG in full, including
that an ``edge_index`` without ``edge_weight`` gets loops of weight 1 under ``improved=True``,
which it announces with a warning (the one place where it is not the improved GCN's ``A + 2I``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

torch_geometric = pytest.importorskip("torch_geometric")
from torch_geometric.nn.conv.gcn_conv import gcn_norm  # noqa: E402

from structconv import gcn_basis  # noqa: E402
from structconv.nn import GCNConv  # noqa: E402

D64 = torch.float64
EDGES = torch.tensor([[0, 1, 2, 2, 3, 1, 4], [1, 2, 0, 3, 0, 1, 2]])  # node 1 has a loop, node 4 only sends
N = 5


def _pyg_dense(edge_weight: torch.Tensor | None, improved: bool, loops: bool, matrix: bool) -> torch.Tensor:
    if matrix:
        w = torch.ones(EDGES.shape[1], dtype=D64) if edge_weight is None else edge_weight
        adj_t = torch.sparse_coo_tensor(EDGES.flip(0), w, (N, N)).coalesce()
        out = gcn_norm(adj_t, None, N, improved=improved, add_self_loops=loops)[0].to_dense()
        return out.T  # adj_t: (target, source) -> the adjacency (source, target)
    index, value = gcn_norm(EDGES, edge_weight, N, improved=improved, add_self_loops=loops, dtype=D64)
    dense = torch.zeros(N, N, dtype=D64)
    return dense.index_put_((index[0], index[1]), value, accumulate=True)


@pytest.mark.parametrize("matrix", [False, True], ids=["edge_index", "adj_t"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("loops", [False, True])
def test_builder_layer_and_pyg_agree(matrix: bool, weighted: bool, improved: bool, loops: bool) -> None:
    weight = torch.rand(EDGES.shape[1], dtype=D64) + 0.5 if weighted else None
    expected = _pyg_dense(weight, improved, loops, matrix)
    x = torch.randn(N, 3, dtype=D64)
    quirk = improved and loops and not weighted and not matrix
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if matrix:
            w = torch.ones(EDGES.shape[1], dtype=D64) if weight is None else weight
            adj = torch.sparse_coo_tensor(EDGES, w, (N, N)).coalesce()  # the builder reads (source, target)
            built = gcn_basis(adj, improved=improved, add_self_loops=loops, like=x)
            adj_t = torch.sparse_coo_tensor(EDGES.flip(0), w, (N, N)).coalesce()
            layer = GCNConv(3, 2, improved=improved, add_self_loops=loops).double().basis(x, adj_t)
        else:
            built = gcn_basis(EDGES, N, edge_weight=weight, improved=improved, add_self_loops=loops, like=x)
            layer = GCNConv(3, 2, improved=improved, add_self_loops=loops).double().basis(x, EDGES, weight)
    torch.testing.assert_close(built.to_dense()[0], expected)
    torch.testing.assert_close(layer.to_dense()[0], expected)
    said = [w for w in caught if "PyG's gcn_norm" in str(w.message)]
    assert len(said) == (2 if quirk else 0)  # once from the builder, once from the layer
