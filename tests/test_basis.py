"""Basis values: dense/sparse agreement, transpose, selection, concatenation, moves."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch
from conftest import as_numpy, problems
from hypothesis import given
from hypothesis import strategies as st

from structconv import ConcatBasis, DenseBasis, SparseBasis, as_basis, concat, conv


@given(problem=problems())
def test_representations_agree_on_the_dense_tensor(problem):
    A = problem["A"]
    for basis in (DenseBasis(A), SparseBasis.from_dense(A), SparseBasis.from_dense(torch.from_numpy(A))):
        np.testing.assert_array_equal(as_numpy(basis.to_dense()), A)
        assert basis.shape == A.shape


@given(problem=problems())
def test_transpose_swaps_input_and_output_entries(problem):
    A = problem["A"]
    for basis in (DenseBasis(A), SparseBasis.from_dense(A), ConcatBasis([SparseBasis.from_dense(A)])):
        np.testing.assert_array_equal(as_numpy(basis.T.to_dense()), np.swapaxes(A, -1, -2))
        np.testing.assert_array_equal(as_numpy(basis.T.T.to_dense()), A)


@given(problem=problems(), data=st.data())
def test_select_restricts_members_in_order(problem, data):
    A = problem["A"]
    K = A.shape[-3]
    members = data.draw(st.lists(st.integers(0, K - 1), min_size=1, max_size=4))
    expected = A[:, members] if A.ndim == 4 else A[members]
    for basis in (DenseBasis(A), SparseBasis.from_dense(A), ConcatBasis([DenseBasis(A)])):
        np.testing.assert_array_equal(as_numpy(basis.select(members).to_dense()), expected)
        np.testing.assert_array_equal(as_numpy(basis[members].to_dense()), expected)


def test_getitem_accepts_int_slice_and_negative_and_rejects_out_of_range():
    A = np.arange(24.0).reshape(4, 2, 3)
    b = SparseBasis.from_dense(A)
    np.testing.assert_array_equal(b[-1].to_dense(), A[[3]])
    np.testing.assert_array_equal(b[1:3].to_dense(), A[1:3])
    with pytest.raises(IndexError, match="out of range for K=4"):
        b[4]


def test_concat_keeps_representation_and_stacks_members():
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 3, 4))
    expected = np.concatenate([A1, A2])
    assert isinstance(concat([DenseBasis(A1), DenseBasis(A2)]), DenseBasis)
    sp = concat([SparseBasis.from_dense(A1), SparseBasis.from_dense(A2)])
    assert isinstance(sp, SparseBasis)
    mixed = concat([DenseBasis(A1), SparseBasis.from_dense(A2)])
    assert isinstance(mixed, ConcatBasis)
    for b in (sp, mixed, concat([mixed, DenseBasis(A1)])[:5]):
        np.testing.assert_array_equal(b.to_dense(), expected)


def test_sparse_duplicates_are_summed_and_constructors_agree():
    idx = np.array([[0, 0, 1], [1, 1, 0], [2, 2, 2]])
    b = SparseBasis(idx, np.array([1.0, 2.5, -1.0]), (2, 3, 3))
    assert b.nnz == 2
    assert b.to_dense()[0, 1, 2] == 3.5
    from_scipy = SparseBasis.from_scipy([scipy.sparse.coo_array(m) for m in b.to_dense()])
    np.testing.assert_array_equal(from_scipy.to_dense(), b.to_dense())
    from_torch = as_basis(torch.from_numpy(b.to_dense()).to_sparse())
    assert isinstance(from_torch, SparseBasis)
    np.testing.assert_array_equal(from_torch.to_dense().numpy(), b.to_dense())


def test_dtype_moves_and_numpy_device_errors():
    A = np.ones((1, 2, 2))
    for b in (DenseBasis(A), SparseBasis.from_dense(A)):
        assert b.to(dtype=np.float32).dtype == np.float32
        with pytest.raises(ValueError, match="lives on the CPU"):
            b.to(device="cuda")
    t = SparseBasis.from_dense(torch.ones(1, 2, 2))
    assert t.to(dtype=torch.float64).dtype == torch.float64
    assert t.to(device="cpu").device == "cpu"


def test_energy_is_mean_squared_column_norm():
    A = np.zeros((2, 3, 3))
    A[0] = np.eye(3)
    A[1, 0, 1] = 2.0
    for b in (DenseBasis(A), SparseBasis.from_dense(A), ConcatBasis([DenseBasis(A[:1]), DenseBasis(A[1:])])):
        assert b.energy() == pytest.approx((3 + 4) / 3)


def test_sparse_layouts_are_not_cached_when_values_require_grad():
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    basis = SparseBasis(torch.tensor([[0, 0], [0, 1], [1, 0]]), values, (1, 2, 2))
    x = torch.ones(1, 2, 1)
    for _ in range(2):  # a cached graph would fail on the second backward
        conv(basis, x, torch.ones(1, 1, 1)).sum().backward()
    assert values.grad is not None
    assert values.grad.tolist() == [2.0, 2.0]
