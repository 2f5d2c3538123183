"""Attention mechanisms and bases; multi-head self-attention against torch's own layer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from structconv import BiAffine, DenseBasis, attention_basis, conv, masked_softmax
from structconv.nn import MultiHeadSelfAttention


@given(seed=st.integers(0, 2**31), K=st.integers(1, 3), M=st.integers(1, 6), N=st.integers(1, 6), P=st.integers(1, 4))
def test_bi_affine_scores_follow_equation_11(seed: int, K: int, M: int, N: int, P: int) -> None:
    rng = np.random.default_rng(seed)
    x, z = rng.normal(size=(2, M, P)), rng.normal(size=(2, N, P + 1))
    Lam, lam, lam2, xi = (rng.normal(size=s) for s in ((K, P, P + 1), (K, P), (K, P + 1), (K,)))
    mech = BiAffine(bilinear=Lam, linear=lam, linear_aux=lam2, offset=xi, scale=0.5)
    expected = 0.5 * (
        np.einsum("bmp,kpr,bnr->bkmn", x, Lam, z)
        + np.einsum("bmp,kp->bkm", x, lam)[..., None]
        + np.einsum("bnr,kr->bkn", z, lam2)[:, :, None]
        + xi[None, :, None, None]
    )
    np.testing.assert_allclose(mech.scores(x, z), expected)
    key, query = rng.normal(size=(K, P, 2)), rng.normal(size=(K, P + 1, 2))
    low = BiAffine(key=key, query=query)
    np.testing.assert_allclose(low.scores(x, z), np.einsum("bmp,kpr,bnr->bkmn", x, key @ query.transpose(0, 2, 1), z))


@given(
    seed=st.integers(0, 2**31), M=st.integers(1, 6), N=st.integers(1, 6), backend=st.sampled_from(["numpy", "torch"])
)
def test_masked_softmax_is_column_stochastic_and_never_nan(seed: int, M: int, N: int, backend: str) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(2, 3, M, N)) * 10
    mask = rng.random((M, N)) < 0.5
    mask[:, 0] = False  # one column attends to nothing
    cv = torch.from_numpy if backend == "torch" else (lambda a: a)
    w = np.asarray(masked_softmax(cv(scores), cv(mask)))
    assert np.isfinite(w).all()
    assert (w[..., ~mask] == 0).all()
    sums = w.sum(-2)
    np.testing.assert_allclose(sums[..., mask.any(0)], 1.0)
    np.testing.assert_allclose(sums[..., ~mask.any(0)], 0.0)
    additive = np.where(mask, 0.0, -np.inf)
    np.testing.assert_allclose(np.asarray(masked_softmax(cv(scores), cv(additive))), w)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_multi_head_self_attention_equals_torch(bias: bool, masked: bool) -> None:
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(12, 3, bias=bias, batch_first=True).double()
    if bias:  # non-zero biases, so that every bias path is exercised
        torch.nn.init.normal_(ref.in_proj_bias)
        torch.nn.init.normal_(ref.out_proj.bias)
    layer = MultiHeadSelfAttention(12, 3, bias=bias, batch_first=True).double()
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(4, 9, 12, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)  # torch: True = may NOT attend, [query, key]
    mask = causal if masked else None
    y_ref, w_ref = ref(x, x, x, attn_mask=mask)
    y, w = layer(x, x, x, attn_mask=mask)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(w, w_ref)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    (gx_ref,) = torch.autograd.grad(y_ref, x, g)
    torch.testing.assert_close(gx, gx_ref)


def test_multi_head_self_attention_reads_torch_conventions() -> None:
    """The three silent differences of issue 14: mask polarity, sequence-first input, add_zero_attn."""
    torch.manual_seed(1)
    for kwargs in ({"batch_first": False}, {"batch_first": True, "add_zero_attn": True}):
        ref = torch.nn.MultiheadAttention(8, 2, **kwargs).double()
        for p in ref.parameters():
            torch.nn.init.normal_(p)
        layer = MultiHeadSelfAttention(8, 2, **kwargs).double()
        layer.load_state_dict(ref.state_dict())
        x = torch.randn(*((3, 5) if kwargs["batch_first"] else (5, 3)), 8, dtype=torch.float64)  # L = 5, N = 3
        mask = torch.rand(5, 5) < 0.4
        mask.fill_diagonal_(False)  # True = masked; every query keeps itself
        for got, want in zip(layer(x, x, x, attn_mask=mask), ref(x, x, x, attn_mask=mask), strict=True):
            torch.testing.assert_close(got, want)
    with pytest.raises(TypeError, match=r"attn_mask must be a bool or floating-point tensor"):
        layer(x, x, x, attn_mask=mask.to(torch.int64))


DTYPES = {  # (rtol, atol) against the same computation in float64
    torch.float64: (1e-7, 1e-10),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (5e-2, 5e-2),
}


def _empty_column_mask(M: int, N: int, generator: torch.Generator) -> torch.Tensor:
    """``[m, n]`` True = allowed; column 1 allows nothing, the others keep their diagonal."""
    mask = torch.rand(M, N, generator=generator) < 0.6
    mask[torch.arange(min(M, N)), torch.arange(min(M, N))] = True
    mask[:, 1] = False
    return mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_masked_softmax_empty_column_is_zero_in_every_dtype(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    scores64 = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64) * 4
    mask = _empty_column_mask(6, 5, g)
    scores = scores64.to(dtype).requires_grad_()
    w = masked_softmax(scores, mask)
    assert w.dtype == dtype and bool(torch.isfinite(w).all())
    assert bool((w[..., 1] == 0).all())
    rtol, atol = DTYPES.get(dtype, (5e-3, 5e-3))
    torch.testing.assert_close(w.double(), masked_softmax(scores64, mask), rtol=rtol, atol=atol)
    (grad,) = torch.autograd.grad(w, scores, torch.full_like(w, 100.0))  # 1/tiny * 100 overflows float32
    assert bool(torch.isfinite(grad).all()) and bool((grad[..., 1] == 0).all())


ORDERS = ("ax", "xtheta", "atheta", "ax+full", "xtheta+full", "sdpa")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("order", ORDERS)
def test_attention_conv_with_an_empty_column_in_every_order_and_dtype(dtype: torch.dtype, order: str) -> None:
    from structconv import LowRank, conv

    g = torch.Generator().manual_seed(3)
    B, T, P, H, D = 2, 6, 4, 2, 3
    x64 = torch.randn(B, T, P, generator=g, dtype=torch.float64)
    parts64 = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((H, P, D), (H, P, D), (H, D))]
    u64, v64 = (
        torch.randn(H, P, 2, generator=g, dtype=torch.float64),
        torch.randn(H, 5, 2, generator=g, dtype=torch.float64),
    )
    mask = _empty_column_mask(T, T, g)

    def run(*args: torch.Tensor) -> Any:
        x, key, query, qb, u, v = args
        mech = BiAffine(key=key, query=query, query_bias=qb, scale=0.5)
        return conv(attention_basis(x, mechanism=mech, mask=mask), x, LowRank(u, v), order=order)

    ref = run(x64, *parts64, u64, v64)
    leaves = [t.to(dtype).requires_grad_() for t in (x64, *parts64, u64, v64)]
    y = run(*leaves)
    assert y.dtype == dtype and bool(torch.isfinite(y).all())
    rtol, atol = DTYPES[dtype]
    scale = float(ref.abs().max())
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol * scale)
    torch.testing.assert_close(y[:, 1].double(), torch.zeros_like(ref[:, 1]))  # column 1 attends to nothing
    grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
    assert all(bool(torch.isfinite(gr).all()) for gr in grads)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_multi_head_self_attention_fully_masked_query_is_finite(dtype: torch.dtype) -> None:
    """A query that may attend to nothing: torch gives NaN (need_weights=True), we give out_proj.bias."""
    torch.manual_seed(4)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    for p in ref.parameters():
        torch.nn.init.normal_(p)
    layer = MultiHeadSelfAttention(8, 2, batch_first=True).double()
    layer.load_state_dict(ref.state_dict())
    x64 = torch.randn(3, 5, 8, dtype=torch.float64)
    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[2] = True  # query 2 may attend to no key
    y_ref, w_ref = ref(x64, x64, x64, attn_mask=mask)
    assert bool(torch.isnan(y_ref[:, 2]).all()) and bool(torch.isnan(w_ref[:, 2]).all())
    y_sdpa, _ = ref(x64, x64, x64, attn_mask=mask, need_weights=False)  # torch's other path: out_proj.bias
    layer = layer.to(dtype)
    x = x64.to(dtype).requires_grad_()
    y, w = layer(x, x, x, attn_mask=mask)
    assert w is not None and bool(torch.isfinite(y).all()) and bool((w[:, 2] == 0).all())
    rtol, atol = DTYPES[dtype]
    scale = float(y_ref[:, [0, 1, 3, 4]].detach().abs().max())
    keep = [0, 1, 3, 4]
    torch.testing.assert_close(y[:, keep].double(), y_ref[:, keep], rtol=rtol, atol=atol * scale)
    torch.testing.assert_close(w[:, keep].double(), w_ref[:, keep], rtol=rtol, atol=atol)
    torch.testing.assert_close(y[:, 2].double(), y_sdpa[:, 2], rtol=rtol, atol=atol * scale)
    torch.testing.assert_close(y[:, 2], layer.out_proj.bias.expand(3, 8).detach())
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert bool(torch.isfinite(gx).all())


def test_gradcheck_attention_basis() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    key = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    lam = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(4, 4) < 0.7

    def f(x: Any, key: Any, lam: Any) -> Any:
        mech = BiAffine(key=key, query=key, linear=lam, scale=0.7)
        return attention_basis(x, mechanism=mech, mask=mask, leaky_relu=0.2).to_dense()

    assert torch.autograd.gradcheck(f, (x, key, lam))


def test_attention_errors() -> None:
    x = np.ones((2, 4, 3))
    with pytest.raises(ValueError, match=r"x has width P=3 but the mechanism expects P=5"):
        attention_basis(x, mechanism=BiAffine(bilinear=np.ones((1, 5, 5))))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) does not broadcast"):
        attention_basis(x, mechanism=BiAffine(bilinear=np.ones((1, 3, 3))), mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match=r"mask must be boolean \(True = allowed\) or hold only -inf and 0"):
        attention_basis(x, mechanism=BiAffine(bilinear=np.ones((1, 3, 3))), mask=np.full((4, 4), 2.0))
    with pytest.raises(ValueError, match=r"give bilinear .* or key and query"):
        BiAffine(bilinear=np.ones((1, 3, 3)), key=np.ones((1, 3, 2)), query=np.ones((1, 3, 2)))
    with pytest.raises(ValueError, match=r"same number of heads"):
        BiAffine(bilinear=np.ones((2, 3, 3)), offset=np.ones(3))
    with pytest.raises(ValueError, match=r"embed_dim=10 must be divisible by num_heads=3"):
        MultiHeadSelfAttention(10, 3)


@pytest.mark.parametrize("boundary", ["zero", "periodic"])
@given(data=st.data())
def test_hard_quadratic_attention_is_the_grid_convolution(boundary: str, data: Any) -> None:
    from torch.nn import functional as F  # noqa: N812

    from structconv import conv, grid_basis
    from structconv.theory.conv_attention import positional_basis

    k = data.draw(st.sampled_from([1, 3, 5]))
    grid = (data.draw(st.integers(k, k + 4)), data.draw(st.integers(k, k + 4)))
    P, Q = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    seed = data.draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, P, *grid, generator=g, dtype=torch.float64)
    weight = torch.randn(Q, P, k, k, generator=g, dtype=torch.float64)
    A = grid_basis(grid, k, padding="same", boundary=boundary, like=x)
    centres = torch.from_numpy(A.offsets).double()  # one head per kernel position, Δ_h = offset
    heads = positional_basis(grid, centres, boundary=boundary)
    np.testing.assert_array_equal(heads.to_dense().numpy(), A.to_dense().numpy())
    y = conv(heads, x.flatten(2).transpose(1, 2), weight.flatten(2).permute(2, 1, 0))
    pad = k // 2
    xp = F.pad(x, (pad,) * 4, mode="circular") if boundary == "periodic" else F.pad(x, (pad,) * 4)
    ref = F.conv2d(xp, weight)
    torch.testing.assert_close(y.transpose(1, 2).reshape(ref.shape), ref)


def test_soft_quadratic_attention_tends_to_the_hard_one() -> None:
    from structconv.theory.conv_attention import positional_basis

    centres = torch.tensor([[-1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    hard = positional_basis((6, 6), centres, boundary="periodic").to_dense()
    errors = [
        float(
            (positional_basis((6, 6), centres, torch.full((2,), a, dtype=torch.float64), "periodic").to_dense() - hard)
            .abs()
            .max()
        )
        for a in (1.0, 5.0, 20.0, 50.0)
    ]
    assert errors == sorted(errors, reverse=True) and errors[-1] < 1e-12
    # The scores follow the quadratic encoding v_h . r_delta up to a per-column constant.
    from structconv.structures.positional import quadratic_scores

    alpha = torch.tensor([0.5, 2.0], dtype=torch.float64)
    s = quadratic_scores((6, 6), centres, alpha).dense_scores()
    pos = torch.stack(torch.meshgrid(torch.arange(6.0), torch.arange(6.0), indexing="ij"), -1).reshape(-1, 2).double()
    delta = pos[:, None] - pos[None]
    r = torch.cat([(delta**2).sum(-1, keepdim=True), delta], -1)
    v = -alpha[:, None] * torch.cat([torch.ones(2, 1, dtype=torch.float64), -2 * centres], 1)
    encoded = torch.einsum("hc,mnc->hmn", v, r)
    diff = encoded - s
    torch.testing.assert_close(diff, diff[:, :1].expand_as(diff))
    with pytest.raises(ValueError, match=r"alpha must be positive"):
        quadratic_scores((6, 6), centres, torch.tensor([1.0, 0.0], dtype=torch.float64))


@given(seed=st.integers(0, 2**31), k=st.sampled_from([1, 3, 5]), size=st.integers(5, 9))
def test_conv_to_attention_reproduces_conv2d_at_the_alpha_bound(seed: int, k: int, size: int) -> None:
    from torch.nn import functional as F  # noqa: N812

    from structconv import conv
    from structconv.theory import attention_alpha_bound, conv_to_attention

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, size, size, generator=g)
    weight = torch.randn(6, 4, k, k, generator=g) / k
    bias = torch.randn(6, generator=g)
    ref = F.conv2d(F.pad(x, (k // 2,) * 4, mode="circular"), weight, bias)
    xb = x.flatten(2).transpose(1, 2)
    for alpha in (None, attention_alpha_bound(torch.float32)):
        basis, theta, b = conv_to_attention(weight, (size, size), bias, alpha=alpha, padding_mode="circular")
        assert k * k == basis.K
        y = (conv(basis, xb, theta) + b).transpose(1, 2).reshape(ref.shape)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_alpha_bound_values_and_errors() -> None:
    from structconv.theory import attention_alpha_bound, conv_to_attention

    assert 17.5 < attention_alpha_bound(torch.float32) < 18.5
    assert 37.5 < attention_alpha_bound(torch.float64) < 38.5
    with pytest.raises(ValueError, match=r"grid has 1 dimensions but weight is a 2-D kernel"):
        conv_to_attention(torch.randn(2, 2, 3, 3), 8)
    with pytest.raises(ValueError, match=r"alpha must be positive"):
        conv_to_attention(torch.randn(2, 2, 3, 3), (8, 8), alpha=-1.0)


@pytest.mark.parametrize("boundary", ["zero", "periodic"])
@given(data=st.data())
def test_truncated_shift_heads_equal_the_dense_softmax(boundary: str, data: Any) -> None:
    from structconv import conv
    from structconv.structures.positional import quadratic_scores
    from structconv.theory.conv_attention import positional_basis

    grid = (data.draw(st.integers(2, 7)), data.draw(st.integers(2, 7)))
    H = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    centres = rng.integers(-2, 3, size=(H, 2)).astype(np.float64)
    if boundary == "zero":  # the dense softmax's per-pixel distance is unambiguous: any real centre
        centres += rng.uniform(-0.5, 0.5, size=(H, 2))
    alpha = rng.uniform(0.3, 5.0, size=H)
    dense = positional_basis(grid, torch.from_numpy(centres), torch.from_numpy(alpha), boundary).to_dense()
    mech = quadratic_scores(grid, torch.from_numpy(centres), torch.from_numpy(alpha), boundary)
    shifted = mech.basis(threshold=1e-12, representation="shifts")
    np.testing.assert_allclose(shifted.to_dense().numpy(), dense.numpy(), atol=1e-9)
    x = torch.randn(2, grid[0] * grid[1], 3, dtype=torch.float64)
    theta = torch.randn(H, 3, 2, dtype=torch.float64)
    torch.testing.assert_close(conv(shifted, x, theta), conv(dense, x, theta))


def test_truncated_shift_heads_gradcheck() -> None:
    from structconv import conv
    from structconv.structures.positional import quadratic_scores

    x = torch.randn(1, 20, 2, dtype=torch.float64)
    theta = torch.randn(2, 2, 2, dtype=torch.float64)
    centres = torch.tensor([[0.3, -0.6], [1.0, 0.2]], dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([0.8, 2.0], dtype=torch.float64, requires_grad=True)

    def f(c: torch.Tensor, a: torch.Tensor) -> Any:
        return conv(quadratic_scores((4, 5), c, a).basis(threshold=1e-8, representation="shifts"), x, theta)

    assert torch.autograd.gradcheck(f, (centres, alpha))


@pytest.mark.parametrize("masked", ["none", "causal", "empty_column"])
@pytest.mark.parametrize("lowrank", [False, True])
def test_fused_sdpa_order_equals_the_dense_orders(masked: str, lowrank: bool) -> None:
    from structconv import LowRank, conv, explain

    g = torch.Generator().manual_seed(0)
    B, T, P, H, D = 3, 7, 6, 2, 4
    x = torch.randn(B, T, P, generator=g, dtype=torch.float64, requires_grad=True)
    key, query = (
        torch.randn(H, P, D, generator=g, dtype=torch.float64),
        torch.randn(H, P, D, generator=g, dtype=torch.float64),
    )
    mech = BiAffine(key=key, query=query, query_bias=torch.randn(H, D, generator=g, dtype=torch.float64), scale=0.5)
    mask = None
    if masked != "none":
        mask = torch.ones(T, T, dtype=torch.bool).tril()  # [key, query]: query n sees keys m >= n
        if masked == "empty_column":
            mask[:, 2] = False
    theta: Any = (
        LowRank(
            torch.randn(H, P, 3, generator=g, dtype=torch.float64),
            torch.randn(H, 5, 3, generator=g, dtype=torch.float64),
        )
        if lowrank
        else torch.randn(H, P, 5, generator=g, dtype=torch.float64)
    )
    basis = attention_basis(x, mechanism=mech, mask=mask)
    assert "sdpa" in basis.own_orders()
    fused = conv(basis, x, theta, order="sdpa")
    ref = conv(attention_basis(x, mechanism=mech, mask=mask), x, theta, order="ax")
    torch.testing.assert_close(fused, ref)
    assert bool(torch.isfinite(fused).all())
    (g1,) = torch.autograd.grad(fused.sum(), x)
    (g2,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g1, g2)
    assert bool(torch.isfinite(g1).all())
    big = torch.randn(2, 256, 32, dtype=torch.float64)
    big_mech = BiAffine(
        key=torch.randn(4, 32, 8, dtype=torch.float64), query=torch.randn(4, 32, 8, dtype=torch.float64)
    )
    assert (
        explain(attention_basis(big, mechanism=big_mech), big, torch.randn(4, 32, 32, dtype=torch.float64)).chosen
        == "sdpa"
    )


@given(
    seed=st.integers(0, 2**31),
    T=st.integers(1, 6),
    nan_at=st.integers(0, 5),
    separate_value=st.booleans(),
    masked=st.booleans(),
    key_bias=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]),
)
def test_every_order_keeps_a_nan_token_where_the_softmax_does(
    seed: int, T: int, nan_at: int, separate_value: bool, masked: bool, key_bias: bool, dtype: torch.dtype
) -> None:
    """NaN in one token's features: every order is NaN where the einsum reference is, and equal elsewhere.

    torch's fused CPU kernel returned 0 for a query whose every score is NaN (order ``"sdpa"``).
    With a mask it may also be NaN where the reference drops a masked NaN score.
    """
    from structconv import explain

    g = torch.Generator().manual_seed(seed)
    B, P, H, D = 2, 3, 2, 2
    x64 = torch.randn(B, T, P, generator=g, dtype=torch.float64)
    x64[0, nan_at % T, 0] = float("nan")
    # Values of x only unmasked: with a mask, a dense order's 0 weight times a NaN value is NaN
    # where a column attends to nothing (an artefact of the arithmetic, not of the softmax).
    value64 = torch.randn(B, T, P, generator=g, dtype=torch.float64) if separate_value or masked else x64
    key, query, theta = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((H, P, D), (H, P, D), (H, P, 4)))
    kb = torch.randn(H, D, generator=g, dtype=torch.float64) if key_bias else None
    mask = torch.rand(T, T, generator=g) < 0.7 if masked else None  # [key, query]
    # The reference: scores (B, H, key, query), the softmax over keys (a column that may attend
    # to nothing is 0), then sum_k A_k^T v Theta_k, all in float64.
    keys = torch.einsum("bmp,hpd->bhmd", x64, key) + (0.0 if kb is None else kb[None, :, None])
    scores = 0.5 * torch.einsum("bhmd,bnp,hpd->bhmn", keys, x64, query)
    allowed = torch.ones(T, T, dtype=torch.bool) if mask is None else mask
    weights = scores.masked_fill(~allowed, -torch.inf).softmax(2).masked_fill(~allowed.any(0), 0.0)
    ref = torch.einsum("bhmn,bmp,hpq->bnq", weights, value64, theta)
    mech = BiAffine(key=key.to(dtype), query=query.to(dtype), key_bias=None if kb is None else kb.to(dtype), scale=0.5)
    basis = attention_basis(x64.to(dtype), mechanism=mech, mask=mask)
    value = value64.to(dtype)
    for candidate in explain(basis, value, theta.to(dtype)).candidates:
        y = conv(basis, value, theta.to(dtype), order=candidate.order)
        assert bool(y.isnan()[ref.isnan()].all()), f"{candidate.order} lost a NaN"
        if candidate.order != "sdpa" or mask is None:
            assert torch.equal(y.isnan(), ref.isnan()), candidate.order
        # else torch's kernel adds the mask to the scores: a masked NaN score stays NaN there
        rtol, atol = DTYPES[dtype]
        finite = ~y.isnan()
        scale = max(1.0, float(ref[finite].abs().max())) if bool(finite.any()) else 1.0
        torch.testing.assert_close(y.double()[finite], ref[finite], rtol=rtol, atol=atol * scale)


def test_sdpa_is_only_offered_for_plain_scaled_dot_products() -> None:
    x = torch.randn(1, 4, 3)
    plain = BiAffine(key=torch.randn(1, 3, 2), query=torch.randn(1, 3, 2))
    assert attention_basis(x, mechanism=plain).own_orders().keys() == {"sdpa"}
    assert attention_basis(x, mechanism=plain, leaky_relu=0.2).own_orders().keys() == set()
    assert attention_basis(x, mechanism=plain, normalize=False).own_orders().keys() == set()
    extra = BiAffine(key=torch.randn(1, 3, 2), query=torch.randn(1, 3, 2), linear=torch.randn(1, 3))
    assert attention_basis(x, mechanism=extra).own_orders().keys() == set()
    assert (
        attention_basis(x.numpy(), mechanism=BiAffine(key=np.ones((1, 3, 2), "f4"), query=np.ones((1, 3, 2), "f4")))
        .own_orders()
        .keys()
        == set()
    )


def test_mask_errors_name_the_mask() -> None:
    x = torch.randn(2, 4, 3)
    mech = BiAffine(key=torch.randn(2, 3, 2), query=torch.randn(2, 3, 2))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 4\) does not broadcast to the scores \(2, 2, 4, 4\)"):
        attention_basis(x, mechanism=mech, mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask must be boolean"):
        attention_basis(x, mechanism=mech, mask=torch.full((4, 4), float("nan")))
    with pytest.raises(ValueError, match=r"mask must be boolean"):
        attention_basis(x, mechanism=mech, mask=torch.full((4, 4), float("inf")))
    with pytest.raises(TypeError, match=r"mechanism must be a structconv Mechanism"):
        attention_basis(x, mechanism="dot")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"key_bias must have shape \(K, D\) = \(2, 2\)"):
        BiAffine(key=torch.randn(2, 3, 2), query=torch.randn(2, 3, 2), key_bias=torch.randn(2, 3))


def test_gradcheck_through_the_fused_order() -> None:
    from structconv import LowRank, conv

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    key, query, value, out = (
        torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
        for s in ((2, 4, 3), (2, 4, 3), (2, 4, 2), (2, 3, 2))
    )
    bias = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(5, 5, generator=g) < 0.8
    mask.fill_diagonal_(True)

    def f(x: Any, key: Any, query: Any, bias: Any, value: Any, out: Any) -> Any:
        mech = BiAffine(key=key, query=query, key_bias=bias, query_bias=bias.flip(0), scale=0.6)
        fused = conv(attention_basis(x, mechanism=mech), x, LowRank(value, out), order="sdpa")
        masked = conv(attention_basis(x, mechanism=mech, mask=mask), x, LowRank(value, out), order="sdpa")
        return fused + masked

    assert torch.autograd.gradcheck(f, (x, key, query, bias, value, out))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("masked", ["none", "mask", "empty_column"])
def test_gradgradcheck_attention_conv_in_every_order(order: str, masked: str) -> None:
    """Second derivatives through every order; torch's fused SDPA backward alone is not differentiable."""
    from structconv import LowRank, conv

    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    key, query, u, v = (torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    bias = torch.randn(2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = None if masked == "none" else (_empty_column_mask(4, 4, g) if masked == "empty_column" else None)
    if masked == "mask":
        mask = torch.rand(4, 4, generator=g) < 0.7
        mask.fill_diagonal_(True)

    def f(*args: torch.Tensor) -> Any:
        x, key, query, bias, u, v = args
        mech = BiAffine(key=key, query=query, query_bias=bias, scale=0.7)
        return conv(attention_basis(x, mechanism=mech, mask=mask), x, LowRank(u, v), order=order)

    assert torch.autograd.gradgradcheck(f, (x, key, query, bias, u, v), fast_mode=True)
    s = torch.randn(2, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda s: masked_softmax(s, mask), (s,), fast_mode=True)


@pytest.mark.parametrize(
    ("options", "call"),
    [
        ({}, {}),
        ({}, {"need_weights": False}),
        ({"add_bias_kv": True, "add_zero_attn": True}, {"need_weights": False}),
        ({"kdim": 3}, {"attn_mask": "float"}),
        ({}, {"key_padding_mask": "bool", "need_weights": False}),
    ],
)
def test_gradgradcheck_multi_head_self_attention(options: dict[str, Any], call: dict[str, Any]) -> None:
    torch.manual_seed(7)
    layer = MultiHeadSelfAttention(4, 2, batch_first=True, dtype=torch.float64, **options)
    for p in layer.parameters():
        torch.nn.init.normal_(p)
    if call.get("attn_mask") == "float":
        call = {**call, "attn_mask": torch.randn(4, 5, dtype=torch.float64)}
    if call.get("key_padding_mask") == "bool":
        call = {**call, "key_padding_mask": torch.tensor([[False, False, True, False, False]] * 2)}
    q = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, layer.kdim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in layer.named_parameters()]

    def f(*args: torch.Tensor) -> Any:
        y, w = torch.func.functional_call(layer, dict(zip(names, args[3:], strict=True)), args[:3], call)
        return y if w is None else (y, w)

    assert torch.autograd.gradgradcheck(f, (q, k, v, *layer.parameters()), fast_mode=True)


def test_fused_order_first_backward_is_repeatable() -> None:
    """A retained graph gives the same gradient twice (the fused kernel's backward both times)."""
    from structconv import LowRank, conv

    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mech = BiAffine(
        key=torch.randn(2, 4, 3, generator=g, dtype=torch.float64),
        query=torch.randn(2, 4, 3, generator=g, dtype=torch.float64),
    )
    theta = LowRank(
        torch.randn(2, 4, 2, generator=g, dtype=torch.float64), torch.randn(2, 5, 2, generator=g, dtype=torch.float64)
    )
    y = conv(attention_basis(x, mechanism=mech), x, theta, order="sdpa")
    (g1,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
    (g2,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g1, g2)


def test_attention_basis_is_the_value_of_its_arrays() -> None:
    """Scores are evaluated when the basis is built; projections are held as arrays (by reference).

    Neither form keeps a dense copy of the weights.  A parameter changed in place after the build
    (an optimiser step) is seen by a basis built afterwards; one built before keeps the scores of
    its own build, or, holding the projection arrays themselves, follows them as a DenseBasis of
    a tensor changed in place does.
    """
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    bilinear = torch.randn(2, 3, 3, dtype=torch.float64)
    A = attention_basis(x, mechanism=BiAffine(bilinear=bilinear))
    assert A.projections is None
    before = A.to_dense().clone()
    assert A.weights() is not A.weights()  # normalised on every use, never stored
    bilinear.mul_(3.0)
    x.add_(0.5)
    torch.testing.assert_close(A.to_dense(), before)
    fresh = attention_basis(x, mechanism=BiAffine(bilinear=bilinear))
    assert not torch.allclose(fresh.to_dense(), before)
    theta = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(conv(A, x, theta), conv(DenseBasis(before), x, theta))
    # the Transformer form holds its projections: the same arrays, no copy
    key, query = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    T = attention_basis(x, mechanism=BiAffine(key=key, query=query, scale=0.5))
    assert T.projections is not None and T.projections.key is key
    key.mul_(-1.0)
    expected = attention_basis(x, mechanism=BiAffine(key=key.clone(), query=query, scale=0.5))
    torch.testing.assert_close(T.to_dense(), expected.to_dense())
    # NumPy alike
    xn, lam = x.numpy().copy(), bilinear.numpy().copy()
    An = attention_basis(xn, mechanism=BiAffine(bilinear=lam))
    first = An.to_dense().copy()
    lam *= -1.0
    np.testing.assert_allclose(An.to_dense(), first)
    assert not np.allclose(attention_basis(xn, mechanism=BiAffine(bilinear=lam)).to_dense(), first)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@given(seed=st.integers(0, 2**31), M=st.integers(1, 40), spread=st.floats(1.0, 400.0))
def test_masked_softmax_flushes_subnormal_weights_and_stays_within_their_bound(
    dtype: torch.dtype, seed: int, M: int, spread: float
) -> None:
    # Subnormal weights make CPU GEMMs about ten times slower; the softmax flushes them.  The
    # flushed weights are subnormal (checked with room for rounding: below M times the smallest
    # normal number), and the kept ones follow the float64 softmax to the dtype's rounding.
    g = torch.Generator().manual_seed(seed)
    scores = (torch.rand(3, M, 5, generator=g, dtype=torch.float64) * -spread).to(dtype)
    got = masked_softmax(scores)
    tiny = torch.finfo(dtype).tiny
    assert not bool(((got != 0) & (got.abs() < tiny)).any())
    exact = torch.softmax(scores.double(), dim=-2)
    flushed = exact[got == 0]
    assert bool((flushed <= M * tiny).all())
    # Rounding in ``dtype``: the shifted score s - max (|s - max| <= spread, so exp moves by up to
    # spread units in the last place), the exponential and the column sum (M terms).
    eps = torch.finfo(dtype).eps
    assert bool(((got.double() - exact).abs() <= eps * (spread + 2 * M + 2) * exact + M * tiny).all())
    ones = torch.ones(3, 5, dtype=torch.float64)
    assert torch.allclose(got.double().sum(-2), ones, atol=eps * 2 * (M + 2))


def test_masked_softmax_flush_keeps_gradients_exact_where_kept() -> None:
    scores = (torch.randn(2, 7, 3, dtype=torch.float64) * 300).requires_grad_()
    assert torch.autograd.gradcheck(masked_softmax, (scores,))
    assert torch.autograd.gradgradcheck(masked_softmax, (scores,))
