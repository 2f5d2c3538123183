"""Propositions 1 and 3 of Andreoli as laws over random cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REPRESENTATIONS, as_numpy, make_basis, problems
from hypothesis import given
from hypothesis import strategies as st

from structconv import ComposedBasis, DenseBasis, SparseBasis, combine, compose, conv, decompose


@given(m=st.integers(1, 4), n=st.integers(1, 4), p=st.integers(1, 3), q=st.integers(1, 3), seed=st.integers(0, 10**6))
def test_prop1_decompose_is_the_inverse_of_combine(m, n, p, q, seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(m * n, m, n))
    phi = rng.normal(size=(m, n, p, q))
    theta = decompose(A, phi)
    np.testing.assert_allclose(combine(A, theta), phi, atol=1e-8)
    x = rng.normal(size=(2, m, p))
    np.testing.assert_allclose(conv(A, x, theta), np.einsum("bmp,mnpq->bnq", x, phi), atol=1e-8)


def test_prop1_on_torch_and_on_the_canonical_basis():
    m, n = 2, 3
    eye = np.eye(m * n).reshape(m * n, m, n)
    phi = np.random.default_rng(0).normal(size=(m, n, 2, 2))
    np.testing.assert_allclose(decompose(eye, phi), phi.reshape(m * n, 2, 2))
    theta_t = decompose(torch.from_numpy(eye), torch.from_numpy(phi))
    np.testing.assert_allclose(theta_t.numpy(), phi.reshape(m * n, 2, 2))


def test_prop1_refuses_dependent_or_incomplete_bases():
    phi = np.ones((2, 2, 1, 1))
    with pytest.raises(ValueError, match=r"K = M\*N = 4"):
        decompose(np.ones((3, 2, 2)), phi)
    with pytest.raises(ValueError, match="linearly dependent"):
        decompose(np.ones((4, 2, 2)), phi)
    with pytest.raises(ValueError, match=r"expected \(2, 2, P, Q\)"):
        decompose(np.eye(4).reshape(4, 2, 2), np.ones((2, 3, 1, 1)))


@pytest.mark.parametrize("representation", REPRESENTATIONS)
@given(problem=problems(batched=False), k2=st.integers(1, 3), n2=st.integers(1, 5), q2=st.integers(1, 4))
def test_prop3_composition_equals_applying_in_sequence(problem, representation, k2, n2, q2):
    rng = problem["rng"]
    A1, x, t1 = problem["A"], problem["x"], problem["theta"]
    A2 = rng.normal(size=(k2, A1.shape[2], n2)) * (rng.random((k2, A1.shape[2], n2)) < 0.6)
    t2 = rng.normal(size=(k2, t1.shape[2], q2))
    basis, theta = compose(make_basis(A1, representation), t1, make_basis(A2, representation), t2)
    assert basis.shape == (A1.shape[0] * k2, A1.shape[1], n2)
    expected = conv(A2, conv(A1, x, t1), t2)
    for order in ("ax", "xtheta", "atheta"):
        np.testing.assert_allclose(as_numpy(conv(basis, x, theta, order=order)), expected, atol=1e-9)
    # member k'K'' + k'' is the product of A'_k' and A''_k''
    dense = as_numpy(basis.to_dense())
    np.testing.assert_allclose(dense[k2 - 1], A1[0] @ A2[k2 - 1], atol=1e-12)


@given(problem=problems(batched=True))
def test_prop3_for_per_instance_bases(problem):
    rng = problem["rng"]
    A1, x, t1 = problem["A"], problem["x"], problem["theta"]
    B, _, _, N = A1.shape
    A2 = rng.normal(size=(B, 2, N, 3))
    t2 = rng.normal(size=(2, t1.shape[2], 2))
    expected = conv(A2, conv(A1, x, t1), t2)
    for make in (DenseBasis, SparseBasis.from_dense):
        basis, theta = compose(make(A1), t1, make(A2), t2)
        np.testing.assert_allclose(conv(basis, x, theta), expected, atol=1e-9)


@given(problem=problems(batched=False))
def test_composed_basis_transpose_and_torch_sparse_product(problem):
    A1 = problem["A"]
    A2 = problem["rng"].normal(size=(2, A1.shape[2], 3))
    lazy = ComposedBasis(DenseBasis(A1), SparseBasis.from_dense(A2))
    dense = lazy.to_dense()
    np.testing.assert_allclose(lazy.T.to_dense(), np.swapaxes(dense, -1, -2), atol=1e-12)
    t1 = np.ones((A1.shape[0], 1, 1))
    t2 = np.ones((2, 1, 1))
    sp, _ = compose(
        SparseBasis.from_dense(torch.from_numpy(A1)),
        torch.from_numpy(t1),
        SparseBasis.from_dense(torch.from_numpy(A2)),
        torch.from_numpy(t2),
    )
    np.testing.assert_allclose(sp.to_dense().numpy(), dense, atol=1e-12)


def test_compose_refuses_mismatched_dimensions():
    with pytest.raises(ValueError, match="a1 has N=4 output entries but a2 has M=5"):
        compose(np.ones((1, 3, 4)), np.ones((1, 2, 2)), np.ones((1, 5, 4)), np.ones((1, 2, 2)))
    with pytest.raises(ValueError, match="theta1 has Q=3 output channels but theta2 has P=2"):
        compose(np.ones((1, 3, 4)), np.ones((1, 2, 3)), np.ones((1, 4, 4)), np.ones((1, 2, 2)))
