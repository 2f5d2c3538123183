"""Bad input: each error names the argument, what it got and what it expected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from structconv import DenseBasis, LowRank, Separable, SparseBasis, conv

A = np.ones((2, 3, 4))
X = np.ones((5, 3, 6))
T = np.ones((2, 6, 7))


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((A, X, np.ones((3, 6, 7))), ValueError, r"theta has K=3 members .* the basis has K=2"),
        (
            (A, np.ones((5, 4, 6)), T),
            ValueError,
            r"x has shape \(5, 4, 6\) but the basis has M=3 input entries; expected x of shape \(B, 3, P\)",
        ),
        ((A, X, np.ones((2, 5, 7))), ValueError, r"theta has P=5 input channels but x has 6"),
        ((A, np.ones((3,)), T), ValueError, r"x must have shape \(B, M, P\) or \(M, P\), got shape \(3,\)"),
        ((A, X, np.ones((2, 6))), ValueError, r"theta must have shape \(K, P, Q\), got shape \(2, 6\)"),
        ((np.ones((3, 4)), X, T), ValueError, r"basis must have shape \(K, M, N\) or \(B, K, M, N\)"),
        ((A, np.ones((0, 3, 6)), T), ValueError, r"x has an empty dimension"),
        ((A, X, np.ones((2, 6, 0))), ValueError, r"theta has an empty dimension"),
        ((A, X.astype(np.float32), T), TypeError, r"dtype float64 but x has dtype float32"),
        ((A, X, T.astype(np.float32)), TypeError, r"theta has dtype float32 but x has dtype float64"),
        ((A, torch.ones(5, 3, 6, dtype=torch.float64), T), TypeError, r"x is a torch array"),
        (
            (DenseBasis(torch.ones(2, 3, 4, dtype=torch.float64)), X, T),
            TypeError,
            r"torch basis but x is a numpy array",
        ),
        ((A, X.astype(int), T), TypeError, r"x must hold floating-point numbers, got dtype int64"),
        ((A, [[1.0]], T), TypeError, r"x must be a numpy.ndarray or a torch.Tensor, got list"),
        ((np.full((2, 3, 4), np.nan), X, T), ValueError, r"basis contains non-finite values"),
        ((np.ones((4, 2, 3, 4)), X, T), ValueError, r"per-instance with batch 4 but x has batch 5"),
    ],
)
def test_bad_operands_raise_named_errors(args, error, message):
    with pytest.raises(error, match=message):
        conv(*args)


def test_unknown_order_lists_valid_names():
    with pytest.raises(
        ValueError, match=r"order='bogus' is not valid .* expected one of \('auto', 'ax', 'xtheta', 'atheta'\)"
    ):
        conv(A, X, T, order="bogus")
    with pytest.raises(ValueError, match=r"'ax\+full'"):
        conv(A, X, Separable(np.ones((1, 2)), np.ones((1, 6, 7))), order="nope")


def test_factor_shapes_are_checked():
    with pytest.raises(ValueError, match=r"first dimensions \(H\) must agree"):
        Separable(np.ones((2, 3)), np.ones((3, 4, 5)))
    with pytest.raises(ValueError, match=r"must agree on K \(first\) and D \(last\)"):
        LowRank(np.ones((2, 3, 4)), np.ones((2, 5, 3)))


def test_sparse_constructor_errors():
    with pytest.raises(ValueError, match=r"indices row 2 \(n\) must lie in \[0, 3\)"):
        SparseBasis(np.array([[0], [0], [3]]), np.array([1.0]), (1, 2, 3))
    with pytest.raises(ValueError, match=r"indices must have shape \(3, nnz=2\)"):
        SparseBasis(np.array([[0, 0], [0, 0]]), np.array([1.0, 1.0]), (1, 2, 3))
    with pytest.raises(ValueError, match="values contains non-finite"):
        SparseBasis(np.array([[0], [0], [0]]), np.array([np.inf]), (1, 2, 3))
    with pytest.raises(ValueError, match="positive sizes"):
        SparseBasis(np.zeros((3, 0), dtype=int), np.zeros(0), (1, 0, 3))
    with pytest.raises(TypeError, match="indices must be integers"):
        SparseBasis(np.array([[0.0], [0.0], [0.0]]), np.array([1.0]), (1, 2, 3))


def test_mixed_devices_are_refused():
    meta = torch.ones(5, 3, 6, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match="device"):
        conv(DenseBasis(torch.ones(2, 3, 4, dtype=torch.float64)), meta, torch.ones(2, 6, 7, dtype=torch.float64))


# --- grid bases and layers -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"grid": (4, 4), "kernel": 7}, ValueError, r"kernel spans 7 entries along grid dimension 0 .* only 4"),
        ({"grid": (4, 4), "kernel": 3, "dilation": 3}, ValueError, r"kernel spans 7 entries"),
        ({"grid": (8, 8), "kernel": 3, "stride": 0}, ValueError, r"stride must be positive, got 0"),
        ({"grid": (8, 8), "kernel": 3, "dilation": (1, -1)}, ValueError, r"dilation must be positive"),
        ({"grid": (8, 8), "kernel": 3, "padding": -1}, ValueError, r"padding must be non-negative"),
        ({"grid": (8, 8), "kernel": 3, "padding": (1, 1, 1)}, ValueError, r"padding must have 2 entries"),
        ({"grid": (8, 8), "kernel": 3, "padding": ((1, 1), (1,))}, ValueError, r"padding given as pairs"),
        ({"grid": (8, 8), "kernel": 3, "padding": "full"}, ValueError, r"padding must be 'same', 'valid'"),
        ({"grid": (8, 8), "kernel": 3, "stride": 2, "padding": "same"}, ValueError, r"'same' needs stride 1"),
        ({"grid": (8, 0), "kernel": 3}, ValueError, r"grid must be positive"),
        ({"grid": (8, 8), "kernel": (3, 3, 3)}, ValueError, r"kernel must have 2 entries"),
        ({"grid": (8, 8), "kernel": 2.5}, TypeError, r"kernel must be an int or a sequence"),
        ({"grid": (8, 8), "kernel": 3, "boundary": "reflect"}, ValueError, r"boundary must be one of"),
        ({"grid": (8, 8)}, ValueError, r"give kernel .* or offsets"),
        ({"grid": (8, 8), "kernel": 3, "offsets": [[0, 0]]}, ValueError, r"offsets replaces kernel"),
        ({"grid": (8, 8), "offsets": [[0, 0], [0, 0]]}, ValueError, r"offsets must be distinct"),
        ({"grid": (8, 8), "offsets": [[0, 0, 0]]}, ValueError, r"offsets must have shape \(K, 2\)"),
        ({"grid": (8, 8), "kernel": 3, "like": [1.0]}, TypeError, r"like must be a numpy.ndarray or a torch.Tensor"),
    ],
)
def test_grid_basis_errors(kwargs, error, message):
    from structconv import grid_basis

    with pytest.raises(error, match=message):
        grid_basis(**kwargs)


def test_grid_shapes_must_match_the_input():
    from structconv import grid_basis

    A = grid_basis((8, 8), 3, padding=1)
    with pytest.raises(ValueError, match=r"the basis has M=64 input entries"):
        conv(A, np.ones((2, 49, 3)), np.ones((9, 3, 4)))
    with pytest.raises(ValueError, match=r"theta has K=4 members"):
        conv(A, np.ones((2, 64, 3)), np.ones((4, 3, 4)))
    with pytest.raises(ValueError, match=r"theta has P=5 input channels but x has 3"):
        conv(A, np.ones((2, 64, 3)), np.ones((9, 5, 4)))
    with pytest.raises(TypeError, match=r"dtype"):  # a weightless basis follows x; theta must match x
        conv(A, np.ones((2, 64, 3), dtype=np.float32), np.ones((9, 3, 4), dtype=np.float64))


def test_grid_layer_errors():
    from structconv.nn import GridConv2d

    layer = GridConv2d(3, 4, 3, padding=1)
    with pytest.raises(ValueError, match=r"GridConv2d: expected 3 input channels \(dim 1\), got input of shape"):
        layer(torch.randn(2, 5, 8, 8))
    with pytest.raises(ValueError, match=r"GridConv2d: input must have shape \(B, C, S1, S2\)"):
        layer(torch.randn(8, 8))
    with pytest.raises(ValueError, match=r"kernel spans 3 entries .* only 2"):
        GridConv2d(3, 4, 3)(torch.randn(1, 3, 2, 2))
    with pytest.raises(ValueError, match=r"in_channels must be divisible by groups"):
        GridConv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"padding_mode must be one of"):
        GridConv2d(4, 4, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match=r"'same' needs stride 1"):
        GridConv2d(4, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match=r"in_channels must be a positive integer"):
        GridConv2d(0, 4, 3)


def test_shift_helpers_errors():
    from structconv import apply_shifts, avg_pool_basis, grid_basis, shift_matrix

    with pytest.raises(ValueError, match=r"d must have one entry per grid dimension \(2\)"):
        shift_matrix((3, 3), 1)
    A = avg_pool_basis((4, 4), 2)
    with pytest.raises(ValueError, match=r"x has 9 entries \(dim 1\) but the basis grid \(4, 4\) has M=16"):
        apply_shifts(A, np.ones((1, 9, 2)))
    with pytest.raises(ValueError, match=r"order='native' needs a torch basis"):
        apply_shifts(A, np.ones((1, 16, 2)), order="native")
    with pytest.raises(TypeError, match=r"basis must be a GridBasis"):
        apply_shifts(DenseBasis(np.ones((1, 16, 4))), np.ones((1, 16, 2)))
    with pytest.raises(ValueError, match=r"a NumPy basis lives on the CPU"):
        grid_basis((4, 4), 3, padding=1).to(device="cuda")


def test_grid_errors_found_in_review():
    from structconv import GridBasis, apply_shifts, avg_pool_basis, grid_basis

    with pytest.raises(ValueError, match=r"padding must be at most half the kernel"):
        avg_pool_basis((6, 6), 2, padding=2, count_include_pad=False)
    with pytest.raises(ValueError, match=r"padding must be an int"):
        avg_pool_basis((6, 6), 3, padding="same")
    with pytest.raises(ValueError, match=r"normalize=True but some output reads no in-grid entry"):
        GridBasis(4, 4, [[9]], weights=np.ones((1, 1)), normalize=True).column_scale()
    with pytest.raises(TypeError, match=r"weights must hold floating-point numbers"):
        GridBasis(4, 4, [[0]], weights=np.ones((1, 1), dtype=int))
    with pytest.raises(TypeError, match=r"weights must be a numpy.ndarray or a torch.Tensor"):
        GridBasis(4, 4, [[0]], weights=[[1.0]])
    assert grid_basis((5, 5), offsets=[[0, 0], [1, 1]], dilation=(1, 1)).K == 2
    with pytest.raises(TypeError, match=r"build the basis with like=x"):
        apply_shifts(avg_pool_basis((4, 4), 2), torch.ones(1, 16, 2, dtype=torch.float64))
    from structconv.nn import GridConv2d

    with pytest.raises(ValueError, match=r"order must be one of"):
        GridConv2d(2, 2, 3, order="fast")


# --- graphs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda g: g.gcn_basis(np.array([[0, 5], [1, 0]]), 3),
            ValueError,
            r"edge_index refers to node 5 but num_nodes=3",
        ),
        (lambda g: g.gcn_basis(np.array([[0, -1], [1, 0]])), ValueError, r"node numbers >= 0, got -1"),
        (
            lambda g: g.gcn_basis(np.array([[0, 1, 2]])),
            ValueError,
            r"edge_index must have shape \(2, E\), got \(1, 3\)",
        ),
        (lambda g: g.gcn_basis(np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])), ValueError, r"must be square"),
        (
            lambda g: g.gcn_basis(np.array([[0, 1], [1, 0]]), edge_weight=np.array([1.0, -2.0])),
            ValueError,
            r"edge weights \(edge_weight, or the entries of a matrix graph\) must be non-negative for gcn",
        ),
        (
            lambda g: g.gcn_basis(np.array([[0, 1], [1, 0]]), edge_weight=np.array([1.0, np.nan])),
            ValueError,
            r"edge_weight contains non-finite values",
        ),
        (
            lambda g: g.gcn_basis(np.array([[0, 1], [1, 0]]), edge_weight=np.array([1.0])),
            ValueError,
            r"edge_weight must have shape \(E,\) = \(2,\)",
        ),
        (lambda g: g.graph_basis(np.array([[0, 1], [1, 0]]), "powers", K=0), ValueError, r"K must be an integer >= 1"),
        (lambda g: g.graph_basis(np.array([[0, 1], [1, 0]]), "spectral"), ValueError, r"kind must be one of"),
        (lambda g: g.graph_basis(np.array([[0, 1], [1, 0]]), "relational"), ValueError, r"needs edge_type"),
        (
            lambda g: g.graph_basis(
                np.array([[0, 1], [1, 0]]), "relational", edge_type=np.array([0, 3]), num_relations=2
            ),
            ValueError,
            r"edge_type must lie in \[0, num_relations=2\)",
        ),
        (
            lambda g: g.graph_basis(np.array([[0, 1], [1, 0]]), "chebyshev", K=2, lambda_max=-1.0),
            ValueError,
            r"lambda_max must be a positive number",
        ),
        (lambda g: g.gcn_basis("edges"), TypeError, r"graph must be an edge_index"),
    ],
)
def test_graph_errors(call, error, message):
    import structconv.structures.graph as g

    with pytest.raises(error, match=message):
        call(g)


def test_graph_layer_errors():
    from structconv.nn import GATConv, GCNConv, TAGConv

    layer = GCNConv(4, 2)
    edge_index = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"GCNConv: x has 3 channels \(dim 1\) but the layer expects 4"):
        layer(torch.randn(2, 3), edge_index)
    with pytest.raises(ValueError, match=r"edge_index refers to node 1 but num_nodes=1"):
        layer(torch.randn(1, 4), edge_index)
    with pytest.raises(ValueError, match=r"GCNConv: x must be node features of shape \(N, 4\)"):
        layer(torch.randn(2, 2, 2, 4), edge_index)  # (B, N, F) is a static batch; 4-D is not
    with pytest.raises(ValueError, match=r"TAGConv: K must be a positive integer"):
        TAGConv(4, 2, K=0)
    with pytest.raises(ValueError, match=r"GATConv: dropout must lie in \[0, 1\)"):
        GATConv(4, 2, dropout=1.5)
    with pytest.raises(ValueError, match=r"an edge_index \(2, E\) must hold integers"):
        layer(torch.randn(3, 4), torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0]]))
