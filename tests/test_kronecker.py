"""Kronecker bases: every order and hook against a dense einsum, gradients, dtypes, the planner's choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structconv import LowRank, conv, explain
from structconv.bases.kronecker import KroneckerBasis

D64 = torch.float64


def _case(seed: int, ins: list[int], outs: list[int], K: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    factors = [torch.randn(K, m, n, generator=g, dtype=D64) for m, n in zip(ins, outs, strict=True)]
    dense = factors[0]
    for f in factors[1:]:
        dense = torch.stack([torch.kron(a, b) for a, b in zip(dense, f, strict=True)])
    return factors, dense


sizes = st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    axes=sizes,
    K=st.integers(1, 3),
    B=st.integers(1, 3),
    backend=st.sampled_from(["numpy", "torch"]),
)
def test_every_order_and_hook_equals_the_dense_einsum(
    seed: int, axes: list[tuple[int, int]], K: int, B: int, backend: str
) -> None:
    ins, outs = [a for a, _ in axes], [b for _, b in axes]
    factors, dense = _case(seed, ins, outs, K)
    g = torch.Generator().manual_seed(seed + 1)
    M, P, Q, D = dense.shape[1], 3, 2, 2
    x = torch.randn(B, M, P, generator=g, dtype=D64)
    theta = torch.randn(K, P, Q, generator=g, dtype=D64)
    value, out = torch.randn(K, P, D, generator=g, dtype=D64), torch.randn(K, Q, D, generator=g, dtype=D64)
    conv_ = (lambda a: a.numpy()) if backend == "numpy" else (lambda a: a)
    A = KroneckerBasis([conv_(f) for f in factors])
    xs, th = conv_(x), conv_(theta)
    full = torch.einsum("kmn,bmp,kpq->bnq", dense, x, theta)
    low = torch.einsum("kmn,bmp,kpd,kqd->bnq", dense, x, value, out)
    for order in ("ax", "xtheta", "atheta"):
        np.testing.assert_allclose(np.asarray(conv(A, xs, th, order=order)), full.numpy(), atol=1e-10)
    for order in ("ax", "xtheta", "ax+full", "xtheta+full", "atheta"):
        got = conv(A, xs, LowRank(conv_(value), conv_(out)), order=order)
        np.testing.assert_allclose(np.asarray(got), low.numpy(), atol=1e-10)
    each = np.asarray(A.apply_each(xs))
    np.testing.assert_allclose(each, torch.einsum("kmn,bmp->bknp", dense, x).numpy(), atol=1e-10)
    s = torch.randn(B, K, M, P, generator=g, dtype=D64)
    members = torch.einsum("kmn,bkmp->bknp", dense, s)
    np.testing.assert_allclose(np.asarray(A.apply_members(conv_(s), reduce=False)), members.numpy(), atol=1e-10)
    np.testing.assert_allclose(np.asarray(A.apply_members(conv_(s), reduce=True)), members.sum(1).numpy(), atol=1e-10)


@pytest.mark.parametrize("order", ["ax", "xtheta"])
@pytest.mark.parametrize("factored", [False, True])
def test_own_orders_have_exact_first_and_second_derivatives(order: str, factored: bool) -> None:
    factors, _ = _case(0, [3, 2], [2, 3], 2)
    leaves = [f.clone().requires_grad_() for f in factors]
    x = torch.randn(2, 6, 3, dtype=D64, requires_grad=True)
    if factored:
        params = [
            torch.randn(2, 3, 2, dtype=D64, requires_grad=True),
            torch.randn(2, 4, 2, dtype=D64, requires_grad=True),
        ]

        def run(f1: torch.Tensor, f2: torch.Tensor, xx: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
            return conv(KroneckerBasis([f1, f2]), xx, LowRank(v, o), order=order)  # type: ignore[no-any-return]

    else:
        params = [torch.randn(2, 3, 4, dtype=D64, requires_grad=True)]

        def run(f1: torch.Tensor, f2: torch.Tensor, xx: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # type: ignore[misc]
            return conv(KroneckerBasis([f1, f2]), xx, t, order=order)  # type: ignore[no-any-return]

    inputs = (*leaves, x, *params)
    assert torch.autograd.gradcheck(run, inputs)
    assert torch.autograd.gradgradcheck(run, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_own_orders_in_low_precision_follow_the_float64_result(dtype: torch.dtype) -> None:
    factors, dense = _case(1, [5, 4], [5, 4], 3)
    factors = [f.softmax(1) for f in factors]  # attention-like weights, columns summing to one
    dense = torch.stack([torch.kron(a, b) for a, b in zip(*factors, strict=True)])
    x, theta = torch.randn(2, 20, 6, dtype=D64), torch.randn(3, 6, 5, dtype=D64)
    exact = torch.einsum("kmn,bmp,kpq->bnq", dense, x, theta)
    # |y| is bounded by the sum of |terms|: the rounding of every product is relative to that.
    scale = torch.einsum("kmn,bmp,kpq->bnq", dense, x.abs(), theta.abs())
    A = KroneckerBasis([f.to(dtype) for f in factors])
    for order in ("ax", "xtheta"):
        got = conv(A, x.to(dtype), theta.to(dtype), order=order)
        assert got.dtype == dtype
        assert bool(((got.double() - exact).abs() <= 8 * torch.finfo(dtype).eps * scale + 1e-30).all()), order


def test_the_planner_runs_positional_heads_through_the_kronecker_orders() -> None:
    from structconv.nn import PositionalAttention

    layer = PositionalAttention((16, 16), 32, 3)
    basis = layer.basis()
    assert isinstance(basis, KroneckerBasis)
    plan = explain(basis, torch.randn(2, 256, 32), layer.theta())
    assert plan.chosen in ("ax", "xtheta")
    dense = plan.candidate("atheta")
    assert plan.candidate(plan.chosen).score < dense.score


def test_dense_form_holds_no_subnormal_products() -> None:
    small = torch.full((1, 2, 2), 1e-20)
    dense = KroneckerBasis([small, small]).to_dense()
    assert bool((dense == 0).all())  # 1e-40 is subnormal in float32: flushed
    wide = KroneckerBasis([small.double(), small.double()]).to_dense()
    torch.testing.assert_close(wide, torch.full((1, 4, 4), 1e-40, dtype=D64), rtol=1e-6, atol=0)  # normal in float64
