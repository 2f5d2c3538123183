"""Sparse and polynomial bases are values: derived data never outlives or leaks between bases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from structconv import PolynomialBasis, SparseBasis, conv, explain
from structconv.bases.edges import EdgeBasis
from structconv.structures.graph import as_edges, gcn_normalize

# Two entries at (0, 1, 0): they add up; the entries are not sorted.
INDEX = [[0, 0, 0, 0], [1, 0, 1, 1], [0, 1, 0, 1]]
VALUES = [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_sparse_basis_keeps_its_entries_and_derives_the_sorted_form(lib: str) -> None:
    index = np.array(INDEX) if lib == "numpy" else torch.tensor(INDEX)
    values = np.array(VALUES) if lib == "numpy" else torch.tensor(VALUES, dtype=torch.float64)
    A = SparseBasis(index, values, (1, 2, 2))
    assert A.stored == 4 and A.nnz == 3  # the sorted, summed form is derived; the entries stay
    assert A.stored == 4
    np.testing.assert_array_equal(np.asarray(A.indices), [[0, 0, 0], [0, 1, 1], [1, 0, 1]])
    np.testing.assert_allclose(np.asarray(A.values), [2.0, 4.0, 4.0])
    np.testing.assert_allclose(np.asarray(A.to_dense()[0]), [[0.0, 2.0], [4.0, 4.0]])


def test_public_attributes_cannot_be_written() -> None:
    A = SparseBasis(np.array(INDEX), np.array(VALUES), (1, 2, 2))
    P = PolynomialBasis(A, [0, 1], "powers")
    E = EdgeBasis(np.array([0]), np.array([1]), np.ones((1, 2)), (2, 2))
    for basis, name in ((A, "values"), (A, "indices"), (P, "matrix"), (P, "degrees"), (E, "weights")):
        with pytest.raises(AttributeError):
            setattr(basis, name, None)
    with pytest.raises(AttributeError):
        A.cache = {}  # type: ignore[attr-defined]  # no __dict__: nothing can be attached either


def test_derived_data_belongs_to_one_basis() -> None:
    A = SparseBasis(torch.tensor(INDEX), torch.tensor(VALUES, dtype=torch.float64), (1, 2, 2))
    x = torch.ones(1, 2, 1, dtype=torch.float64)
    conv(A, x, torch.ones(1, 1, 1, dtype=torch.float64), order="ax")
    assert "each" in A._derived  # the product's sparse matrix is kept with the basis
    for other in (A.to(dtype=torch.float32), A.select([0]), A.transpose(), A.T):
        assert "each" not in other._derived and "canonical" not in other._derived
    low = A.to(dtype=torch.float32)
    y = conv(low, x.float(), torch.ones(1, 1, 1), order="ax")
    assert y.dtype == torch.float32  # its own product, not the float64 one of A
    np.testing.assert_allclose(y.numpy()[0, :, 0], [4.0, 6.0])  # column sums of [[0, 2], [4, 4]]


def test_polynomial_members_are_kept_per_basis_and_plans_do_not_depend_on_it() -> None:
    edges = as_edges(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3, like=torch.ones(1, dtype=torch.float64))
    P = PolynomialBasis(gcn_normalize(edges, add_self_loops=False).to_basis(), range(3), "powers")
    x, theta = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(3, 4, 5, dtype=torch.float64)
    before = explain(P, x, theta).candidate("materialized")
    y = conv(P, x, theta, order="materialized")
    assert "materialized" in P._derived
    fresh = PolynomialBasis(P.matrix, P.degrees, P.family)
    assert explain(fresh, x, theta).candidate("materialized") == before  # formed or not: one cost
    torch.testing.assert_close(y, conv(P, x, theta, order="ax"))
    low = P.to(dtype=torch.float32)
    assert "materialized" not in low._derived
    assert low.materialize().dtype == torch.float32
    assert P.materialize().dtype == torch.float64


def test_differentiable_polynomial_members_are_not_kept() -> None:
    w = torch.rand(4, dtype=torch.float64, requires_grad=True)
    edges = as_edges(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3, w)
    P = PolynomialBasis(edges.to_basis(), [1, 2], "chebyshev")
    x, theta = torch.randn(1, 3, 2, dtype=torch.float64), torch.randn(2, 2, 3, dtype=torch.float64)
    conv(P, x, theta, order="materialized").sum().backward()
    assert "materialized" not in P._derived
    assert w.grad is not None and bool(w.grad.abs().sum() > 0)


def test_edge_weights_keep_their_floating_dtype_on_either_backend() -> None:
    index = np.array([[0, 1], [1, 0]])
    assert as_edges(index, 2, np.ones(2, dtype=np.float32)).weight.dtype == np.float32
    assert as_edges(index, 2, np.ones(2, dtype=np.int64)).weight.dtype == np.float64  # integers: the default
    assert as_edges(torch.from_numpy(index), 2, torch.ones(2, dtype=torch.float64)).weight.dtype == torch.float64
    assert as_edges(torch.from_numpy(index), 2, torch.ones(2, dtype=torch.int64)).weight.dtype == torch.float32
    # Mixed backends go to torch (NumPy converts), on the device and in the dtype of `like`.
    edges = as_edges(index, 2, like=torch.ones(1, dtype=torch.float64))
    assert isinstance(edges.src, torch.Tensor) and edges.weight.dtype == torch.float64
