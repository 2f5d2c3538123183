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
