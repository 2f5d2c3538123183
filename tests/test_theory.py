"""Propositions 1 and 3 of Andreoli as laws over random cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import REPRESENTATIONS, as_numpy, make_basis, problems
from hypothesis import assume, given
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


# --- the conv = attention theorem: borders spelled as torch spells padding modes ---------------------------
TORCH_MODES = ("zeros", "circular", "replicate")


def _conv_reference(x: torch.Tensor, weight: torch.Tensor, mode: str, dilation: int) -> torch.Tensor:
    layer = torch.nn.Conv2d(
        int(weight.shape[1]), int(weight.shape[0]), tuple(weight.shape[2:]), padding="same", dilation=dilation,
        padding_mode=mode, bias=False, dtype=weight.dtype,
    )  # fmt: skip
    with torch.no_grad():
        layer.weight.copy_(weight)
        return layer(x)


def test_the_natural_first_call_is_zero_padding_like_torch() -> None:
    from torch.nn import functional as F  # noqa: N812

    from structconv.theory import conv_to_attention

    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64), torch.randn(4, 3, 3, 3, generator=g)
    weight = weight.double()
    basis, theta, _ = conv_to_attention(weight, (8, 8))
    y = conv(basis, x.flatten(2).transpose(1, 2), theta).transpose(1, 2).reshape(2, 4, 8, 8)
    torch.testing.assert_close(y, F.conv2d(x, weight, padding=1), rtol=0, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("mode", TORCH_MODES)
@given(
    seed=st.integers(0, 2**31),
    kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    dilation=st.integers(1, 2),
    grid=st.tuples(st.integers(4, 8), st.integers(4, 8)),
    soft=st.booleans(),
)
def test_conv_to_attention_is_torchs_convolution_in_every_padding_mode(
    mode: str, seed: int, kernel: tuple[int, int], dilation: int, grid: tuple[int, int], soft: bool
) -> None:
    from structconv.theory import attention_alpha_bound, conv_to_attention

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, *grid, generator=g, dtype=torch.float64)
    weight = torch.randn(2, 3, *kernel, generator=g, dtype=torch.float64)
    # torch's circular padding wraps at most once
    assume(mode != "circular" or all(dilation * (k - 1) <= s for k, s in zip(kernel, grid, strict=True)))
    alpha = attention_alpha_bound(torch.float64) if soft else None
    basis, theta, _ = conv_to_attention(weight, grid, alpha=alpha, padding_mode=mode, dilation=dilation)
    assert basis.shape[0] == math.prod(kernel)
    y = conv(basis, x.flatten(2).transpose(1, 2), theta).transpose(1, 2).reshape(2, 2, *grid)
    torch.testing.assert_close(y, _conv_reference(x, weight, mode, dilation), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("old", "new"), [("periodic", "circular"), ("zero", "zeros"), ("padded", "zeros")])
def test_the_border_names_before_torchs_are_refused_naming_the_spelling_now(old: str, new: str) -> None:
    from structconv.theory import attention_to_conv, conv_to_attention, nearest_convolution

    weight = torch.randn(2, 2, 3, 3, dtype=torch.float64)
    hint = rf"padding_mode must be one of .* got '{old}' \('{old}' is spelled padding_mode='{new}' now"
    with pytest.raises(ValueError, match=r"conv_to_attention: " + hint):
        conv_to_attention(weight, (5, 5), padding_mode=old)
    basis, theta, _ = conv_to_attention(weight, (5, 5))
    with pytest.raises(ValueError, match=r"nearest_convolution: " + hint):
        nearest_convolution(basis, (5, 5), padding_mode=old)
    with pytest.raises(ValueError, match=hint):
        attention_to_conv(basis, theta, (5, 5), padding_mode=old)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'boundary'"):
        conv_to_attention(weight, (5, 5), boundary="periodic")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"positional argument"):
        nearest_convolution(basis, (5, 5), "circular")  # type: ignore[misc]


def test_the_converse_reads_only_translations_and_the_defaults_are_zero_padding() -> None:
    import inspect

    from structconv.theory import attention_to_conv, conv_heads, conv_to_attention, nearest_convolution

    for function in (conv_to_attention, conv_heads, nearest_convolution, attention_to_conv):
        parameter = inspect.signature(function).parameters["padding_mode"]
        assert parameter.default == "zeros" and parameter.kind is inspect.Parameter.KEYWORD_ONLY, function
    basis, _, _ = conv_to_attention(torch.randn(2, 2, 3, 3, dtype=torch.float64), (5, 5), padding_mode="replicate")
    with pytest.raises(ValueError, match=r"padding_mode must be one of \('zeros', 'circular'\)"):
        nearest_convolution(basis, (5, 5), padding_mode="replicate")


def test_conv_heads_place_every_offset_and_refuse_what_changes_the_size() -> None:
    from structconv.theory import conv_heads

    weight = torch.randn(4, 4, 3, 2, dtype=torch.float64)
    heads = conv_heads(weight, (6, 6), dilation=(2, 1))
    # "same" splits an odd total with the extra entry after, as torch does
    assert heads.offsets.tolist() == [[-2, 0], [-2, 1], [0, 0], [0, 1], [2, 0], [2, 1]]
    assert heads.margin == (2, 1) and heads.boundary == "zero"
    assert conv_heads(weight, (6, 6), padding_mode="circular").margin == (0, 0)
    with pytest.raises(ValueError, match=r"padding=0 gives an output grid \(4, 5\) on the grid \(6, 6\)"):
        conv_heads(weight, (6, 6), padding=0, where="here")
    with pytest.raises(ValueError, match=r"bias must have shape \(Q,\) = \(4,\)"):
        conv_heads(weight, (6, 6), torch.zeros(3, dtype=torch.float64))
