"""Relative-position mechanisms, their shared bases, the positional layer and the conv = attention converse."""

from __future__ import annotations

import copy
import itertools
import math
from functools import partial
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from structconv import (
    BiAffine,
    DenseBasis,
    LowRank,
    PositionScores,
    attention_basis,
    conv,
    explain,
    gaussian_scores,
    grid_basis,
    learned_scores,
    quadratic_scores,
    relative_attention,
)
from structconv import nn as snn
from structconv.structures.positional import inner_positions, relative_offsets
from structconv.structures.shift_heads import _column_ids, _weakest_best
from structconv.theory.conv_attention import positional_basis

D64 = torch.float64


def _positions(grid: tuple[int, ...]) -> np.ndarray:
    return np.stack(np.meshgrid(*[np.arange(s) for s in grid], indexing="ij"), -1).reshape(-1, len(grid))


def _naive_delta(grid: tuple[int, ...], boundary: str) -> np.ndarray:
    """(M, N, d) offsets pos(m) - pos(n), wrapped on a torus, by explicit loops."""
    pos = _positions(grid)
    out = np.zeros((len(pos), len(pos), len(grid)), dtype=np.int64)
    for m, n in itertools.product(range(len(pos)), repeat=2):
        for i, s in enumerate(grid):
            delta = pos[m, i] - pos[n, i]
            if boundary == "periodic":
                delta = (delta + s // 2) % s - s // 2
            out[m, n, i] = delta
    return out


grids = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@given(grid=grids, boundary=st.sampled_from(["zero", "periodic"]))
def test_relative_offsets_index_every_pair(grid: tuple[int, ...], boundary: str) -> None:
    rel = relative_offsets(grid, boundary)
    np.testing.assert_array_equal(rel.offsets[rel.gather(np.arange(len(rel.offsets)))], _naive_delta(grid, boundary))
    assert len(rel.offsets) == math.prod(rel.lengths)


@given(seed=st.integers(0, 2**31), grid=grids, boundary=st.sampled_from(["zero", "periodic"]))
def test_per_axis_tables_gather_every_pair_as_a_dense_index(seed: int, grid: tuple[int, ...], boundary: str) -> None:
    """``gather`` and the shift form's column ids (from per-axis tables) equal indexing by the naive (M, N) offsets."""
    rel = relative_offsets(grid, boundary)
    delta = _naive_delta(grid, boundary)
    ids = np.ravel_multi_index(tuple(np.moveaxis(delta - np.asarray(rel.lows), -1, 0)), rel.lengths)
    scores = torch.from_numpy(np.random.default_rng(seed).normal(size=(2, 3, len(rel.offsets))))
    torch.testing.assert_close(rel.gather(scores), scores[..., torch.from_numpy(ids)], rtol=0, atol=0)
    columns = np.random.default_rng(seed).integers(0, math.prod(grid), size=3)
    np.testing.assert_array_equal(_column_ids(rel, columns), ids[:, columns])
    stored = sum(a.size for a in rel.axis_ids)
    assert stored == sum(2 * s - 1 for s in grid)  # O(S_i) per axis: no table of pairs is kept


_FIRST_CALL = """
import resource, sys, torch
from structconv import quadratic_scores
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mech = quadratic_scores((128, 128), torch.randn(9, 2), torch.full((9,), 0.5), positive=True)
basis = mech.basis(1e-7)
assert basis.shape == (9, 128 * 128, 128 * 128), basis.shape
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_the_first_mechanism_at_128x128_builds_no_table_of_pairs() -> None:
    """Quadratic heads at 128x128 tokens, in a fresh process: the first basis raises the peak by under 100 MiB.

    Before, the first call built O(N^2) int64 tables: 12 GB at its peak (issue 24).
    """
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, check=True)
    grown = int(done.stdout.split()[-1])
    assert grown < 100 * 2**20, f"peak memory grew by {grown / 2**20:.0f} MiB"


@given(seed=st.integers(0, 2**31), grid=grids, boundary=st.sampled_from(["zero", "periodic"]))
def test_isotropic_gaussian_is_the_quadratic_encoding(seed: int, grid: tuple[int, ...], boundary: str) -> None:
    rng = np.random.default_rng(seed)
    H, d = 3, len(grid)
    centres = torch.from_numpy(rng.normal(size=(H, d)))
    alpha = torch.from_numpy(rng.uniform(0.2, 3.0, size=H))
    quad = quadratic_scores(grid, centres, alpha, boundary)
    gauss = gaussian_scores(grid, centres, torch.sqrt(2 * alpha)[:, None, None] * torch.eye(d, dtype=D64), boundary)
    torch.testing.assert_close(gauss.offset_scores(), quad.offset_scores())
    # Against the explicit formula -alpha |delta - Delta|^2 (periodic: shortest wrapped difference).
    delta = torch.from_numpy(_naive_delta(grid, boundary)).double()
    diff = delta[None] - centres[:, None, None]
    if boundary == "periodic":  # the nearest image through the border, by trying every wrap
        size = torch.tensor(grid, dtype=D64)
        images = torch.stack([diff + j * size for j in range(-8, 9)])
        diff = images.gather(0, images.abs().argmin(0, keepdim=True))[0]
    torch.testing.assert_close(quad.dense_scores(), -alpha[:, None, None] * (diff**2).sum(-1))


def test_periodic_difference_on_an_odd_side_takes_the_nearest_image() -> None:
    """Side 5, centre 0.3: offset -2 is 2.3 away directly (2.7 through the border); +2 is 1.7 away."""
    quad = quadratic_scores((5,), torch.tensor([[0.3]], dtype=D64), torch.ones(1, dtype=D64), "periodic")
    offsets = relative_offsets((5,), "periodic").offsets[:, 0].tolist()
    scores = dict(zip(offsets, quad.offset_scores()[0].tolist(), strict=True))
    assert scores[-2] == pytest.approx(-(2.3**2))
    assert scores[2] == pytest.approx(-(1.7**2))
    quad = quadratic_scores((5,), torch.tensor([[-0.3]], dtype=D64), torch.ones(1, dtype=D64), "periodic")
    scores = dict(zip(offsets, quad.offset_scores()[0].tolist(), strict=True))
    assert scores[2] == pytest.approx(-(2.3**2))  # 2.3 directly; the old floor(s/2) wrap gave 2.7


@given(seed=st.integers(0, 2**31))
def test_non_isotropic_gaussian_scores_and_psd_precision(seed: int) -> None:
    rng = np.random.default_rng(seed)
    grid, H = (4, 5), 2
    centres = torch.from_numpy(rng.normal(size=(H, 2)))
    S = torch.from_numpy(rng.normal(size=(H, 2, 2)))
    mech = gaussian_scores(grid, centres, S)
    precision = torch.einsum("kij,kil->kjl", S, S)
    assert bool((torch.linalg.eigvalsh(precision) >= -1e-12).all())
    delta = torch.from_numpy(_naive_delta(grid, "zero")).double()
    diff = delta[None] - centres[:, None, None]
    ref = -0.5 * torch.einsum("hmni,hij,hmnj->hmn", diff, precision, diff)
    torch.testing.assert_close(mech.dense_scores(), ref)


def _tables(grid: tuple[int, ...], boundary: str, widths: tuple[int, ...], seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lengths = relative_offsets(grid, boundary).lengths
    return tuple(torch.randn(n, w, generator=g, dtype=D64) for n, w in zip(lengths, widths, strict=True))


def _embedding(grid: tuple[int, ...], boundary: str, tables: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """r_delta for every pair (M, N, D_p), concatenating per-axis rows, by explicit indexing."""
    delta = _naive_delta(grid, boundary)
    lows = relative_offsets(grid, boundary).lows
    parts = [tables[i][torch.from_numpy(delta[..., i] - lows[i])] for i in range(len(grid))]
    return torch.cat(parts, -1)


@given(seed=st.integers(0, 2**31), grid=grids, boundary=st.sampled_from(["zero", "periodic"]))
def test_learned_position_is_a_dot_product_with_the_embedding(seed: int, grid: tuple[int, ...], boundary: str) -> None:
    widths = tuple(2 + i for i in range(len(grid)))
    tables = _tables(grid, boundary, widths, seed)
    weight = torch.randn(3, sum(widths), dtype=D64, generator=torch.Generator().manual_seed(seed + 1))
    mech = learned_scores(grid, tables, weight, boundary)
    ref = torch.einsum("hc,mnc->hmn", weight, _embedding(grid, boundary, tables))
    torch.testing.assert_close(mech.dense_scores(), ref)


@given(seed=st.integers(0, 2**31), boundary=st.sampled_from(["zero", "periodic"]))
def test_relative_attention_has_the_four_terms_of_eq5(seed: int, boundary: str) -> None:
    g = torch.Generator().manual_seed(seed)
    grid, H, P, D, widths = (3, 4), 2, 5, 3, (2, 3)
    tables = _tables(grid, boundary, widths, seed)
    key, query = torch.randn(H, P, D, generator=g, dtype=D64), torch.randn(H, P, D, generator=g, dtype=D64)
    rel_key = torch.randn(H, sum(widths), D, generator=g, dtype=D64)
    u, v = torch.randn(H, D, generator=g, dtype=D64), torch.randn(H, D, generator=g, dtype=D64)
    x = torch.randn(2, 12, P, generator=g, dtype=D64)
    mech = relative_attention(
        grid, tables, key=key, query=query, rel_key=rel_key, u=u, v=v, boundary=boundary, scale=0.5
    )
    k, q = torch.einsum("bmp,hpd->bhmd", x, key), torch.einsum("bnp,hpd->bhnd", x, query)
    r_hat = torch.einsum("mnc,hcd->hmnd", _embedding(grid, boundary, tables), rel_key)
    ref = (
        torch.einsum("bhnd,bhmd->bhmn", q, k)
        + torch.einsum("bhnd,hmnd->bhmn", q, r_hat)
        + torch.einsum("hd,bhmd->bhm", u, k)[..., None]
        + torch.einsum("hd,hmnd->hmn", v, r_hat)[None]
    )
    torch.testing.assert_close(mech.scores(x, x), 0.5 * ref)


def _mechanisms(grid: tuple[int, ...], boundary: str, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    H, d = 3, len(grid)
    centres = torch.from_numpy(rng.uniform(-1.5, 1.5, size=(H, d)))
    return {
        "quadratic": quadratic_scores(grid, centres, torch.from_numpy(rng.uniform(0.3, 4.0, size=H)), boundary),
        "gaussian": gaussian_scores(grid, centres, torch.from_numpy(rng.normal(size=(H, d, d)) * 1.5), boundary),
        "learned": learned_scores(
            grid, _tables(grid, boundary, (2,) * d, seed), torch.from_numpy(rng.normal(size=(H, 2 * d))), boundary
        ),
    }


@pytest.mark.parametrize("kind", ["quadratic", "gaussian", "learned"])
@pytest.mark.parametrize("boundary", ["zero", "periodic"])
@given(seed=st.integers(0, 2**31), grid=st.tuples(st.integers(2, 7), st.integers(2, 7)))
def test_truncated_shift_form_is_within_its_threshold(kind: str, boundary: str, seed: int, grid: Any) -> None:
    mech = _mechanisms(grid, boundary, seed)[kind]
    dense = mech.basis(representation="dense").to_dense()
    torch.testing.assert_close(dense.sum(1), torch.ones(3, dense.shape[-1], dtype=D64))  # columns sum to 1
    threshold = 1e-4
    try:
        shifted = mech.basis(threshold, representation="shifts")
    except ValueError as err:  # weights spanning beyond the dtype: the dense form is the only one
        assert "dense form" in str(err)
        return
    got = shifted.to_dense()
    dropped = len(relative_offsets(grid, boundary).offsets)
    column_error = (got - dense).abs().sum(1)  # (H, N)
    assert float(column_error.max()) <= 2 * threshold * dropped + 1e-12
    x = torch.randn(2, grid[0] * grid[1], 3, dtype=D64)
    theta = torch.randn(3, 3, 2, dtype=D64)
    exact = mech.basis(1e-15, representation="shifts") if kind != "learned" else mech.basis(representation="dense")
    torch.testing.assert_close(conv(exact, x, theta), conv(dense, x, theta), atol=1e-10, rtol=1e-10)
    if kind != "gaussian":  # a sum of per-axis scores: the softmax is a Kronecker product, exactly
        kron = mech.basis(threshold, representation="kronecker")
        assert type(kron).__name__ == "KroneckerBasis"
        torch.testing.assert_close(kron.to_dense(), dense)
        for order in ("ax", "xtheta"):
            torch.testing.assert_close(conv(kron, x, theta, order=order), conv(dense, x, theta))


def test_far_centres_on_a_zero_grid_keep_each_columns_best_taps() -> None:
    # The best in-grid weight of border columns is far below the head's peak; truncating against
    # the peak would empty them.  The threshold is relative to the weakest column's best.
    mech = quadratic_scores((6, 6), torch.tensor([[4.0, 4.0]], dtype=D64), torch.tensor([1.0], dtype=D64))
    dense = mech.basis(representation="dense").to_dense()
    shifted = mech.basis(1e-6, representation="shifts").to_dense()
    assert float((shifted - dense).abs().sum(1).max()) < 1e-6 * 121


@pytest.mark.parametrize("kind", ["quadratic", "gaussian", "learned"])
def test_every_positional_mechanism_gradchecks(kind: str) -> None:
    grid, H = (3, 4), 3
    x = torch.randn(2, 12, 2, dtype=D64)
    theta = torch.randn(H, 2, 2, dtype=D64)
    rng = np.random.default_rng(7)
    centres = torch.from_numpy(rng.uniform(-1.5, 1.5, size=(H, 2)))
    tables = _tables(grid, "zero", (2, 2), 7)
    scores, params = {
        "quadratic": (partial(quadratic_scores, grid), (centres, torch.from_numpy(rng.uniform(0.3, 4.0, size=H)))),
        "gaussian": (partial(gaussian_scores, grid), (centres, torch.from_numpy(rng.normal(size=(H, 2, 2)) * 1.5))),
        "learned": (partial(learned_scores, grid, tables), (torch.from_numpy(rng.normal(size=(H, 4))),)),
    }[kind]
    params = tuple(p.clone().requires_grad_(True) for p in params)

    def f(*ps: torch.Tensor) -> torch.Tensor:
        mech = scores(*ps)
        dense = conv(mech.basis(representation="dense"), x, theta)
        return dense if kind == "gaussian" else dense + conv(mech.basis(representation="kronecker"), x, theta)

    assert torch.autograd.gradcheck(f, params)
    if kind != "learned":

        def g(*ps: torch.Tensor) -> torch.Tensor:
            return conv(scores(*ps).basis(1e-10, representation="shifts"), x, theta)

        assert torch.autograd.gradcheck(g, params)


def test_relative_attention_and_combined_mechanisms_gradcheck() -> None:
    g = torch.Generator().manual_seed(3)
    grid, H, P, D = (3, 3), 2, 3, 2
    tables = tuple(torch.randn(5, 2, generator=g, dtype=D64) for _ in range(2))
    parts = [torch.randn(*s, generator=g, dtype=D64, requires_grad=True) for s in ((H, P, D), (H, P, D), (H, 4, D))]
    u, v = (torch.randn(H, D, generator=g, dtype=D64, requires_grad=True) for _ in range(2))
    x = torch.randn(2, 9, P, generator=g, dtype=D64, requires_grad=True)
    theta = torch.randn(H, P, 2, generator=g, dtype=D64)

    def f(x: torch.Tensor, key: torch.Tensor, query: torch.Tensor, rel: torch.Tensor, u: Any, v: Any) -> Any:
        mech = relative_attention(grid, tables, key=key, query=query, rel_key=rel, u=u, v=v, scale=0.7)
        return conv(attention_basis(x, mechanism=mech), x, theta)

    assert torch.autograd.gradcheck(f, (x, *parts, u, v))
    centres = torch.randn(H, 2, generator=g, dtype=D64, requires_grad=True)
    alpha = torch.rand(H, generator=g, dtype=D64) + 0.5

    def h(x: torch.Tensor, key: torch.Tensor, query: torch.Tensor, c: torch.Tensor) -> Any:
        content = BiAffine(key=key, query=query, scale=0.5)
        position = quadratic_scores(grid, c, alpha)
        both = attention_basis(x, mechanism=content + position)
        prod = attention_basis(x, mechanism=content * position, leaky_relu=0.2)
        return conv(both, x, theta) + conv(prod, x, theta)

    assert torch.autograd.gradcheck(h, (x, parts[0], parts[1], centres))


def test_combined_mechanisms_add_and_multiply_scores() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, generator=g, dtype=D64)
    a = BiAffine(bilinear=torch.randn(2, 3, 3, generator=g, dtype=D64))
    b = quadratic_scores((2, 3), torch.randn(2, 2, generator=g, dtype=D64), torch.ones(2, dtype=D64))
    torch.testing.assert_close((a + b).scores(x, x), a.scores(x, x) + b.scores(x, x))
    torch.testing.assert_close((a * b).scores(x, x), a.scores(x, x) * b.scores(x, x))
    assert not (a + b).positional and (b + b).positional
    with pytest.raises(ValueError, match=r"sum of 2 and 1 heads"):
        _ = a + quadratic_scores((2, 3), torch.zeros(1, 2, dtype=D64), torch.ones(1, dtype=D64))


@pytest.mark.parametrize("grid", [(7,), (4, 5), (3, 4, 3)])
@pytest.mark.parametrize("boundary", ["zero", "periodic"])
def test_hard_heads_equal_the_grid_basis_in_every_dimension(grid: tuple[int, ...], boundary: str) -> None:
    A = grid_basis(grid, 3, padding="same", boundary=boundary)
    heads = positional_basis(grid, torch.from_numpy(A.offsets).double(), None, boundary)
    np.testing.assert_array_equal(heads.to_dense().numpy(), A.to_dense())
    # and soft heads at a large alpha approach them (D_p = d + 1 quadratic encoding in n-D)
    soft = quadratic_scores(grid, torch.from_numpy(A.offsets).double(), torch.full((A.K,), 40.0, dtype=D64), boundary)
    if boundary == "periodic":
        np.testing.assert_allclose(soft.basis().to_dense().numpy(), A.to_dense(), atol=1e-15)


def test_positional_errors() -> None:
    c = torch.zeros(2, 2, dtype=D64)
    with pytest.raises(ValueError, match=r"alpha must be positive"):
        quadratic_scores((3, 3), c, torch.tensor([1.0, -1.0], dtype=D64))
    with pytest.raises(ValueError, match=r"centres must have shape \(K, 2\)"):
        quadratic_scores((3, 3), torch.zeros(2, 3, dtype=D64), torch.ones(2, dtype=D64))
    with pytest.raises(ValueError, match=r"inv_sqrt_cov must have shape \(K, d, d\) = \(2, 2, 2\)"):
        gaussian_scores((3, 3), c, torch.ones(2, 2, dtype=D64))
    with pytest.raises(ValueError, match=r"tables\[1\] must have 5 rows"):
        learned_scores((3, 3), (torch.ones(5, 2), torch.ones(4, 2)), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"give one table per grid axis"):
        learned_scores((3, 3), (torch.ones(5, 2),), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"weight must have shape \(K, D_p\) with D_p = 4"):
        learned_scores((3, 3), (torch.ones(5, 2), torch.ones(5, 2)), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"threshold must lie in \(0, 1\)"):
        quadratic_scores((3, 3), c, torch.ones(2, dtype=D64)).basis(threshold=2.0, representation="shifts")
    with pytest.raises(ValueError, match=r"not separable by axis"):
        gaussian_scores((3, 3), c, torch.ones(2, 2, 2, dtype=D64)).basis(representation="kronecker")
    with pytest.raises(ValueError, match=r"needs 9 positions, got x with 8"):
        quadratic_scores((3, 3), c, torch.ones(2, dtype=D64)).scores(torch.ones(1, 8, 2), torch.ones(1, 8, 2))
    with pytest.raises(ValueError, match=r"per_axis must hold one \(K, L_i\) array per axis of the grid \(3, 3\)"):
        PositionScores((3, 3), per_axis=())
    with pytest.raises(ValueError, match=r"give exactly one of per_axis and per_offset"):
        PositionScores((3, 3))
    eq5 = {"key": torch.ones(2, 3, 2), "query": torch.ones(2, 3, 2), "u": torch.ones(2, 2), "v": torch.ones(2, 2)}
    with pytest.raises(ValueError, match=r"rel_key must have shape \(K, D_p, D\) = \(2, 4, 2\)"):
        relative_attention((3, 3), (torch.ones(5, 2), torch.ones(5, 2)), rel_key=torch.ones(2, 3, 2), **eq5)
    heads = quadratic_scores((6, 6), c, torch.ones(2, dtype=D64)).basis()
    for padding in [(1,), (-1, 1), (3, 3)]:
        with pytest.raises(ValueError, match=r"padding must give each axis of the grid \(6, 6\) fewer than half"):
            inner_positions(heads, (6, 6), padding)
    tables, rel = (torch.ones(5, 2),) * 2, torch.ones(2, 4, 2)
    with pytest.raises(ValueError, match=r"must share K heads of width D, got \(K, D\) = .*'v': \(2, 3\)"):
        relative_attention((3, 3), tables, rel_key=rel, **{**eq5, "v": torch.ones(2, 3)})
    with pytest.raises(ValueError, match=r"must share K heads of width D, got \(K, D\) = \{'key': \(3, 2\)"):
        relative_attention((3, 3), tables, rel_key=rel, **{**eq5, "key": torch.ones(3, 3, 2)})
    with pytest.raises(TypeError, match=r"u must be a numpy.ndarray or a torch.Tensor, got NoneType"):
        relative_attention((3, 3), tables, rel_key=rel, **{**eq5, "u": None})


# --- the layer ---------------------------------------------------------------------------------------
VARIANTS = [
    (snn.QuadraticHeads(alpha=0.7), False),
    (snn.GaussianHeads(alpha=0.7), False),
    (snn.LearnedHeads(positional_dim=6), False),
    (snn.LearnedHeads(positional_dim=6, relative_terms=True), True),
    (snn.QuadraticHeads(alpha=0.7), True),
]


@pytest.mark.parametrize(("heads", "content"), VARIANTS, ids=repr)
@pytest.mark.parametrize("head_dim", [None, 3])
def test_positional_layer_equals_the_dense_computation(
    heads: snn.PositionalHeads, content: bool, head_dim: int | None
) -> None:
    from structconv.nn import ContentHeads, PositionalAttention

    torch.manual_seed(0)
    layer = PositionalAttention(
        (4, 5), 8, 3, encoding=heads, content=ContentHeads() if content else None, head_dim=head_dim, threshold=1e-12,
    ).double()  # fmt: skip
    x = torch.randn(2, 4, 5, 8, dtype=D64, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    flat = x.reshape(2, 20, 8)
    weights = attention_basis(flat, mechanism=layer.mechanism()).to_dense()  # (B, H, M, N), dense softmax
    theta = layer.weight if head_dim is None else torch.einsum("hpd,hqd->hpq", layer.value, layer.out)
    ref = torch.einsum("bhmn,bmp,hpq->bnq", weights, flat, theta) + layer.bias
    torch.testing.assert_close(y.reshape(2, 20, 8), ref)
    if not content:  # position-only heads: one basis shared by the batch
        assert layer.basis().batch is None
    y.square().sum().backward()
    assert x.grad is not None
    for name, p in layer.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name


def test_positional_layer_errors() -> None:
    from structconv.nn import PositionalAttention, QuadraticHeads

    with pytest.raises(ValueError, match=r"PositionalAttention: encoding must be one of \('quadratic'"):
        PositionalAttention((4, 4), 8, 2, encoding="sinusoidal")
    with pytest.raises(ValueError, match=r"QuadraticHeads: alpha must be finite and positive"):
        PositionalAttention((4, 4), 8, 2, encoding=QuadraticHeads(alpha=0.0))
    with pytest.raises(ValueError, match=r"num_heads must be a positive integer"):
        PositionalAttention((4, 4), 8, 0)
    layer = PositionalAttention((4, 4), 8, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(B, 16, 8\) or \(B, 4, 4, 8\)"):
        layer(torch.randn(2, 15, 8))
    assert isinstance(layer.encoding, QuadraticHeads)
    assert {id(p) for p in layer.encoding.positional_parameters()} == {
        id(layer.encoding.centres),
        id(layer.encoding.log_alpha),
    }


# --- the converse: attention heads back to a convolution ------------------------------------------------
@pytest.mark.parametrize("padding_mode", ["zeros", "circular"])
@given(seed=st.integers(0, 2**31), k=st.sampled_from([1, 3]), size=st.integers(3, 6))
def test_one_hot_heads_come_back_as_the_grid_convolution(padding_mode: str, seed: int, k: int, size: int) -> None:
    from structconv.theory import attention_to_conv, conv_to_attention, nearest_convolution

    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(3, 2, k, k, generator=g, dtype=D64)
    basis, theta, _ = conv_to_attention(weight, (size, size), padding_mode=padding_mode)
    fit = nearest_convolution(basis, (size, size), padding_mode=padding_mode)
    assert fit.is_convolution() and np.allclose(fit.distance, 0.0) and fit.padding_mode == padding_mode
    grid, merged = attention_to_conv(basis, theta, (size, size), padding_mode=padding_mode)
    x = torch.randn(2, size * size, 2, generator=g, dtype=D64)
    torch.testing.assert_close(conv(grid, x, merged), conv(basis, x, theta))


def test_soft_heads_are_measured_against_their_nearest_shift() -> None:
    from structconv.theory import attention_to_conv, nearest_convolution

    centres = torch.tensor([[1.0, 0.0], [0.0, -1.0], [0.3, 0.4]], dtype=D64)
    mech = quadratic_scores((6, 6), centres, torch.tensor([30.0, 2.0, 0.5], dtype=D64), "periodic")
    fit = nearest_convolution(mech.basis(representation="dense"), (6, 6), padding_mode="circular")
    np.testing.assert_array_equal(fit.offsets, [[1, 0], [0, -1], [0, 0]])
    assert fit.distance[0] < 1e-10 < fit.distance[1] < fit.distance[2] < 1
    with pytest.raises(ValueError, match=r"head 1 is at distance .* from its nearest one-hot shift \(0, -1\)"):
        attention_to_conv(mech.basis(), torch.ones(3, 2, 2, dtype=D64), (6, 6), padding_mode="circular", tol=1e-6)


def test_theorem_channel_bound_padded_tokens_and_errors() -> None:
    from torch.nn import functional as F  # noqa: N812

    from structconv.theory import attention_alpha_bound, conv_to_attention

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 6, 7, generator=g)
    weight, bias = torch.randn(4, 3, 3, 3, generator=g) / 3, torch.randn(4, generator=g)
    ref = F.conv2d(x, weight, bias, padding=1)  # zero padding
    xb = x.flatten(2).transpose(1, 2)
    alpha = attention_alpha_bound(torch.float32)
    # zero padding is the default: soft heads normalise over zero tokens around the image
    basis, theta, b = conv_to_attention(weight, (6, 7), bias, alpha=alpha, head_dim=5, out_dim=6)
    assert isinstance(theta, LowRank) and theta.rank == 5 and b is not None
    y = conv(basis, xb, theta) + b
    assert y.shape == (2, 42, 6)
    torch.testing.assert_close(y[..., :4].transpose(1, 2).reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)
    assert float(y[..., 4:].abs().max()) < 1e-6  # the channels beyond Q stay zero
    # replicate: no tokens beyond the image, so soft heads renormalise over real pixels and the border differs
    soft, th, _ = conv_to_attention(weight, (6, 7), alpha=alpha, padding_mode="replicate")
    assert not torch.allclose((conv(soft, xb, th) + bias).transpose(1, 2).reshape(ref.shape), ref, atol=1e-3)
    with pytest.raises(ValueError, match=r"express at most min\(D_h, D_out\)=3 output channels .* Q=4"):
        conv_to_attention(weight, (6, 7), head_dim=3)
    with pytest.raises(ValueError, match=r"needs 9 heads .* num_heads=4"):
        conv_to_attention(weight, (6, 7), num_heads=4)
    with pytest.raises(ValueError, match=r"square kernel"):
        conv_to_attention(torch.randn(4, 3, 3, 1), (6, 7), num_heads=3)
    with pytest.raises(ValueError, match=r"padding_mode must be one of \('zeros', 'circular', 'replicate'\)"):
        conv_to_attention(weight, (6, 7), padding_mode="reflect")


@given(seed=st.integers(0, 2**31), shape=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_kronecker_basis_hooks_equal_its_dense_form(seed: int, shape: list[int]) -> None:
    from structconv.bases.kronecker import KroneckerBasis

    rng = np.random.default_rng(seed)
    outs = [int(v) for v in rng.integers(1, 4, size=len(shape))]
    factors = [rng.normal(size=(2, m, n)) for m, n in zip(shape, outs, strict=True)]
    A = KroneckerBasis(factors)
    dense = A.to_dense()
    expected = factors[0]
    for f in factors[1:]:
        expected = np.stack([np.kron(a, b) for a, b in zip(expected, f, strict=True)])
    np.testing.assert_allclose(dense, expected)
    x = rng.normal(size=(3, A.M, 2))
    theta = rng.normal(size=(2, 2, 3))
    for order in ("ax", "xtheta", "atheta"):
        np.testing.assert_allclose(conv(A, x, theta, order=order), conv(dense, x, theta), atol=1e-12)
    np.testing.assert_allclose(A.T.to_dense(), np.swapaxes(dense, -1, -2))
    torch_basis = KroneckerBasis([torch.from_numpy(f) for f in factors])
    got = conv(torch_basis, torch.from_numpy(x), torch.from_numpy(theta))
    torch.testing.assert_close(got, torch.from_numpy(conv(dense, x, theta)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "options",
    [
        {"encoding": "quadratic"},
        {"encoding": snn.QuadraticHeads(width="spread"), "threshold": 1e-3},
        {"encoding": "gaussian", "content": snn.ContentHeads()},
        {"encoding": "learned"},
        {"encoding": snn.LearnedHeads(relative_terms=True), "content": snn.ContentHeads()},
        {"encoding": "learned", "content": snn.ContentHeads(bias=True)},
        {"encoding": "quadratic", "head_dim": 3},
    ],
    ids=repr,
)
def test_positional_attention_in_low_precision_follows_float64(dtype: torch.dtype, options: dict[str, Any]) -> None:
    """Every positional path in float32 and bfloat16 (weights and under autocast) against float64: finite, close."""
    from structconv.nn import PositionalAttention

    torch.manual_seed(0)
    layer = PositionalAttention((5, 4), 8, 3, **options).double()
    x = torch.randn(2, 20, 8, dtype=D64)
    with torch.no_grad():
        expected = layer(x)
    scale = float(expected.abs().max())
    tol = {torch.float32: 1e-5, torch.bfloat16: 0.1}[dtype]
    low = copy.deepcopy(layer).to(dtype)
    xl = x.to(dtype).requires_grad_()
    y = low(xl)
    assert y.dtype == dtype and bool(torch.isfinite(y).all())
    assert float((y.double() - expected).abs().max()) <= tol * scale
    y.float().sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in low.parameters() if p.grad is not None)
    if dtype == torch.bfloat16:  # autocast: float32 parameters, bf16 compute
        f32 = copy.deepcopy(layer).float()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ya = f32(x.float())
        assert bool(torch.isfinite(ya).all())
        assert float((ya.double() - expected).abs().max()) <= tol * scale


def test_tables_on_a_device_are_cached_by_value_not_by_identity() -> None:
    """Offset tables freed and rebuilt (their ids free for reuse) still give each grid its own tables."""
    import gc

    from structconv.structures import relative

    like = torch.zeros(1, dtype=torch.float64)
    for grid in [(3, 4), (4, 3), (2, 5), (5, 2), (3, 3), (1, 7)] * 3:
        relative._RELATIVE.clear()  # new NumPy tables, possibly at the addresses of freed ones
        gc.collect(0)  # the tables hold no cycles; a full collection took ~5 s each late in the suite
        rel = relative_offsets(grid)
        np.testing.assert_array_equal(relative.table_on(rel, "offsets", like).numpy(), rel.offsets)
        for i in range(len(grid)):
            np.testing.assert_array_equal(relative.table_on(rel, f"axis_index{i}", like).numpy(), rel.axis_index(i))
    assert len(relative._PLACED) <= relative._PLACED.size


def test_positional_heads_follow_parameters_changed_in_place() -> None:
    """An encoding scores its parameters at every call, not a copy of its weights: an in-place update is seen."""
    layer = snn.PositionalAttention((4, 4), 3, 2, encoding="quadratic", boundary="periodic").double()
    before = layer.basis().to_dense().clone()
    with torch.no_grad():
        layer.encoding.centres.add_(0.5)
    after = layer.basis().to_dense()
    centres, alpha = layer.encoding.centres.detach().clone(), layer.encoding.alpha().detach().clone()
    fresh = quadratic_scores((4, 4), centres, alpha, "periodic").basis(representation="dense").to_dense()
    torch.testing.assert_close(after, fresh)
    assert not torch.allclose(after, before)


@given(
    seed=st.integers(0, 2**31),
    grid=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    kind=st.sampled_from(["quadratic", "gaussian"]),
)
def test_the_weakest_column_of_a_concave_head_is_a_corner(seed: int, grid: list[int], kind: str) -> None:
    # The shift form's floor (min over columns of the best score) is read at the 2^d corners only.
    g = torch.Generator().manual_seed(seed)
    d = len(grid)
    centres = torch.randn(3, d, generator=g, dtype=D64) * 3
    if kind == "quadratic":
        mech: Any = quadratic_scores(tuple(grid), centres, torch.rand(3, generator=g, dtype=D64) * 4 + 0.01)
    else:
        mech = gaussian_scores(tuple(grid), centres, torch.randn(3, d, d, generator=g, dtype=D64))
    dense = mech.dense_scores().numpy()
    expected = dense.max(axis=1).min(axis=1)
    floor = _weakest_best(mech.offset_scores().numpy(), mech.relative, mech.concave)
    np.testing.assert_allclose(floor, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("grid", "error", "message"),
    [
        (2.5, TypeError, "grid must be an int or a sequence of ints, got float"),
        (None, TypeError, "grid must be an int or a sequence of ints, got NoneType"),
        ((4, 4.5), TypeError, "grid must hold integers, got 4.5"),
        ((4, 0), ValueError, "grid must be positive"),
    ],
)
def test_a_grid_that_is_not_positive_integers_is_refused_not_truncated(grid: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=f"PositionalAttention: {message}"):
        snn.PositionalAttention(grid, 4, 2)


def test_heads_dropped_per_image_are_planned_not_forced() -> None:
    """Per-image dropped heads are stored ``(B, M, K, N)``: ``auto`` picks x·Θ first, which reads them in place."""
    torch.manual_seed(0)
    layer = snn.PositionalAttention((6, 6), 32, 3, attention_dropout=0.1, dropout_shared=False, threshold=None)
    x = torch.randn(2, 36, 32)
    layer.train()(x)
    (run,) = layer._runs.values()
    assert run.plan.requested == "auto" and run.order == "xtheta"
    assert run.basis.instance_rows


def test_the_memory_order_of_a_per_instance_basis_is_part_of_its_plan() -> None:
    """The same (B, K, M, N) entries in two memory orders: x·Θ first copies one of them, so they plan apart."""
    weights = torch.rand(2, 36, 3, 36)
    stored_by_rows = DenseBasis(weights.permute(0, 2, 1, 3))
    by_members = DenseBasis(weights.permute(0, 2, 1, 3).contiguous())
    assert stored_by_rows.instance_rows and not by_members.instance_rows
    assert stored_by_rows.plan_key() != by_members.plan_key()
    x, theta = torch.randn(2, 36, 4), torch.randn(3, 4, 4)
    by_rows, by_copy = (explain(b, x, theta) for b in (stored_by_rows, by_members))
    cost = {b: {c.order: c.memory for c in plan.candidates} for b, plan in (("rows", by_rows), ("copy", by_copy))}
    assert cost["copy"]["xtheta"] - cost["rows"]["xtheta"] == 2 * 3 * 36 * 36  # one copy of the basis
    assert cost["copy"]["ax"] == cost["rows"]["ax"]
    torch.testing.assert_close(conv(stored_by_rows, x, theta, order="xtheta"), conv(by_members, x, theta, order="ax"))
