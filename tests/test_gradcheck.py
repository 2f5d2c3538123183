"""float64 gradcheck through every torch path of the engine (the bases' own values too, where they are leaves)."""

from __future__ import annotations

import pytest
import torch

from structconv import ComposedBasis, ConcatBasis, DenseBasis, LowRank, Separable, SparseBasis, conv
from structconv.testing import check_basis

ORDERS = ("ax", "xtheta", "atheta")


def _inputs(batched: bool):
    g = torch.Generator().manual_seed(0)
    shape = (2, 3, 4, 5) if batched else (3, 4, 5)
    A = torch.randn(*shape, generator=g, dtype=torch.float64)
    A = A * (torch.rand(*shape, generator=g, dtype=torch.float64) < 0.6)
    x = torch.randn(2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    return A, x, t


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("order", ORDERS)
def test_dense_basis_x_theta(batched, order):
    A, x, t = _inputs(batched)
    assert torch.autograd.gradcheck(
        lambda a, xx, tt: conv(DenseBasis(a), xx, tt, order=order), (A.requires_grad_(), x, t)
    )


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("order", ORDERS)
def test_sparse_values_x_theta(batched, order):
    A, x, t = _inputs(batched)
    pattern = SparseBasis.from_dense(A)
    values = pattern.values.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda v, xx, tt: conv(SparseBasis(pattern.indices, v, pattern.shape), xx, tt, order=order), (values, x, t)
    )


def test_concat_and_composed():
    """Every order of a mixed concatenation and of a composition: values against the einsum, gradcheck of x and Θ."""
    A, x, t = _inputs(False)
    mixed = ConcatBasis([DenseBasis(A[:1]), SparseBasis.from_dense(A[1:])])
    composed = ComposedBasis(SparseBasis.from_dense(A), DenseBasis(torch.eye(5, dtype=torch.float64)[None]))
    for basis in (mixed, composed):
        assert set(ORDERS) <= set(check_basis(basis, x=x, theta=t))


FACTOR_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta")


def test_factorised_parameters():
    """gradcheck of x and both factors of a Separable and a LowRank Θ, through every order, dense and sparse."""
    A, x, _ = _inputs(False)
    g = torch.Generator().manual_seed(1)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)

    coef, chan, val, out = r(2, 3), r(2, 2, 3), r(3, 2, 2), r(3, 3, 2)
    for basis in (DenseBasis(A), SparseBasis.from_dense(A)):
        assert set(FACTOR_ORDERS) <= set(check_basis(basis, x=x, theta=Separable(coef, chan)))
        assert set(FACTOR_ORDERS) <= set(check_basis(basis, x=x, theta=LowRank(val, out)))
