"""The softmax edge basis (GAT's attention): every order against the dense einsum, its own order, dropout.

:class:`~structconv.bases.softmax_edges.SoftmaxEdgeBasis` holds per-edge logits and represents the
softmax over each target's edges.  Its hooks are the normalised :class:`~structconv.EdgeBasis`'s, and
its own order ``"segment"`` normalises per target after the aggregation; all must equal
:math:`\\sum_k A_k^\\top x \\Theta_k` with :math:`A` formed densely from an independent softmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import structconv as sc
from structconv import nn as snn
from structconv.backend import x_theta
from structconv.bases import softmax_edges
from structconv.bases.softmax_edges import Projected, SoftmaxEdgeBasis, head_placement
from structconv.testing import check_basis

FULL_ORDERS = ("ax", "xtheta", "atheta", "segment", "auto")
LOWRANK_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta", "segment", "auto")
#: (rtol, atol) of each dtype against the float64 reference, relative to the output's largest value.
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-5), torch.bfloat16: (0.0, 5e-2)}
D64 = torch.float64


@st.composite
def graphs(draw: Any) -> dict[str, Any]:
    """A random bipartite multigraph: repeated edges, and targets (at least the last) with no edges."""
    M, N = draw(st.integers(1, 7)), draw(st.integers(2, 7))
    E = draw(st.integers(0, 3 * max(M, N)))
    K = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    src, dst = rng.integers(0, M, size=E), rng.integers(0, N - 1, size=E)
    if E > 1:
        src[-1], dst[-1] = src[0], dst[0]  # a repeated edge: two terms of the softmax
    logits = rng.normal(scale=3.0, size=(E, K))
    return {"M": M, "N": N, "K": K, "src": src, "dst": dst, "logits": logits, "rng": rng}


def reference_dense(g: dict[str, Any], mask: np.ndarray | None = None) -> np.ndarray:
    """:math:`A_{k,mn} = \\sum_{e: m \\to n} \\delta_{ek} e^{s_{ek}} / \\sum_{e \\to n} e^{s_{ek}}`, per target."""
    A = np.zeros((g["K"], g["M"], g["N"]))
    s = g["logits"]
    for n in range(g["N"]):
        into = np.flatnonzero(g["dst"] == n)
        if not len(into):
            continue
        w = np.exp(s[into] - s[into].max(0))
        alpha = w / w.sum(0)
        if mask is not None:
            alpha = alpha * mask[into]
        for j, e in enumerate(into):
            A[:, g["src"][e], n] += alpha[j]
    return A


def basis_of(g: dict[str, Any], dtype: torch.dtype = D64, **kw: Any) -> SoftmaxEdgeBasis:
    src, dst = torch.from_numpy(g["src"]), torch.from_numpy(g["dst"])
    return SoftmaxEdgeBasis(src, dst, torch.from_numpy(g["logits"]).to(dtype), (g["M"], g["N"]), **kw)


def assert_near(y: torch.Tensor, ref: np.ndarray, dtype: torch.dtype, what: str) -> None:
    rtol, atol = TOL[dtype]
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    np.testing.assert_allclose(y.detach().double().numpy(), ref, rtol=rtol, atol=atol * scale, err_msg=what)


# --- every order against the dense einsum -----------------------------------------------------------------
@given(g=graphs(), dtype=st.sampled_from([D64, torch.float32, torch.bfloat16]), dropout=st.sampled_from([0.0, 0.5]))
def test_every_order_equals_the_dense_einsum(g: dict[str, Any], dtype: torch.dtype, dropout: float) -> None:
    basis = basis_of(g, dtype, dropout=dropout, generator=torch.Generator().manual_seed(1))
    mask = None if basis.mask is None else basis.mask.double().numpy()
    dense = reference_dense(g, mask)
    assert_near(basis.to_dense(), dense, dtype, "to_dense")
    rng, K, M = g["rng"], g["K"], g["M"]
    x, theta = rng.normal(size=(2, M, 3)), rng.normal(size=(K, 3, 4))
    xt, tt = (torch.from_numpy(a).to(dtype) for a in (x, theta))
    x_q, theta_q = xt.double().numpy(), tt.double().numpy()  # the reference sees the inputs as rounded
    ref = np.einsum("kmn,bmp,kpq->bnq", dense, x_q, theta_q)
    for order in FULL_ORDERS:
        assert_near(sc.conv(basis, xt, tt, order=order), ref, dtype, f"full {order}")
    for concat in (True, False):
        value = torch.from_numpy(rng.normal(size=(K, 3, 2))).to(dtype)
        lowrank = sc.LowRank(value, head_placement(K, 2, concat=concat, like=value))
        ref = np.einsum("kmn,bmp,kpq->bnq", dense, x_q, lowrank.full().double().numpy())
        for order in LOWRANK_ORDERS:
            assert_near(sc.conv(basis, xt, lowrank, order=order), ref, dtype, f"lowrank {order} concat={concat}")


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_the_conformance_kit_passes_every_order(dropout: float) -> None:
    """structconv.testing.check_basis: every order equals the independent dense form, gradients, immutability."""
    g = _small()
    basis = basis_of(g, dropout=dropout, generator=torch.Generator().manual_seed(2))
    mask = None if basis.mask is None else basis.mask.numpy()
    dense = torch.from_numpy(reference_dense(g, mask))
    for theta in (None, sc.LowRank(torch.randn(2, 3, 2, dtype=D64), head_placement(2, 2, concat=True, like=dense))):
        orders = check_basis(basis, theta=theta, x=torch.randn(2, 5, 3, dtype=D64), dense=dense)
        assert "segment" in orders


@given(g=graphs(), concat=st.booleans())
def test_projected_values_and_placement_give_the_same_result(g: dict[str, Any], concat: bool) -> None:
    """Reused values and a placement by reshape (or mean) change nothing but the work."""
    rng, K, M = g["rng"], g["K"], g["M"]
    x = torch.from_numpy(rng.normal(size=(1, M, 3)))
    theta = sc.LowRank(torch.from_numpy(rng.normal(size=(K, 3, 2))), head_placement(K, 2, concat=concat, like=x))
    rows = torch.einsum("bmp,kpd->bmkd", x, theta.value).contiguous()
    projected = Projected(x, theta.value, rows, theta.out, "concat" if concat else "mean")
    plain, reused = basis_of(g), basis_of(g, projected=projected)
    expected = sc.conv(plain, x, theta, order="segment")
    torch.testing.assert_close(sc.conv(reused, x, theta, order="segment"), expected)
    # Other arrays (a copy of x) are not the projected ones: computed afresh, the same result.
    torch.testing.assert_close(sc.conv(reused, x.clone(), theta, order="segment"), expected)


def test_head_placement_places_or_averages_the_heads() -> None:
    heads = torch.randn(5, 3, 2, dtype=D64)  # (N, K, D)
    concat = head_placement(3, 2, concat=True, like=heads)
    mean = head_placement(3, 2, concat=False, like=heads)
    assert concat.shape == (3, 6, 2) and mean.shape == (3, 2, 2)
    torch.testing.assert_close(torch.einsum("nkd,kqd->nq", heads, concat), heads.reshape(5, 6))
    torch.testing.assert_close(torch.einsum("nkd,kqd->nq", heads, mean), heads.mean(1))


# --- gradients of the own order ---------------------------------------------------------------------------
def _small() -> dict[str, Any]:
    src = np.array([0, 1, 2, 3, 1, 1, 4])
    dst = np.array([1, 2, 0, 0, 0, 0, 2])  # target 3 has no edges; (1 -> 0) is repeated
    rng = np.random.default_rng(0)
    return {"M": 5, "N": 4, "K": 2, "src": src, "dst": dst, "logits": rng.normal(size=(7, 2)), "rng": rng}


@pytest.mark.parametrize("order", ["segment", "xtheta", "ax", "atheta"])
@pytest.mark.parametrize("parameter", ["full", "lowrank"])
def test_gradcheck_with_respect_to_logits_x_and_theta(parameter: str, order: str) -> None:
    """Every order is differentiable in the logits too (the mask fixed); the own order twice."""
    g = _small()
    src, dst = torch.from_numpy(g["src"]), torch.from_numpy(g["dst"])
    logits = torch.from_numpy(g["logits"]).requires_grad_()
    x = torch.randn(1, 5, 2, dtype=D64, requires_grad=True)
    mask_draw = torch.Generator().manual_seed(0)

    if parameter == "full":
        theta = torch.randn(2, 2, 3, dtype=D64, requires_grad=True)

        def f(s: torch.Tensor, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
            basis = SoftmaxEdgeBasis(src, dst, s, (5, 4), dropout=0.3, generator=mask_draw.manual_seed(0))
            y: torch.Tensor = sc.conv(basis, x, theta, order=order)
            return y

        inputs: tuple[torch.Tensor, ...] = (logits, x, theta)
    else:
        value = torch.randn(2, 2, 2, dtype=D64, requires_grad=True)
        out = torch.randn(2, 3, 2, dtype=D64, requires_grad=True)

        def f(s: torch.Tensor, x: torch.Tensor, value: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # type: ignore[misc]
            basis = SoftmaxEdgeBasis(src, dst, s, (5, 4), dropout=0.3, generator=mask_draw.manual_seed(0))
            y: torch.Tensor = sc.conv(basis, x, sc.LowRank(value, out), order=order)
            return y

        inputs = (logits, x, value, out)
    assert torch.autograd.gradcheck(f, inputs)
    if order == "segment":
        assert torch.autograd.gradgradcheck(f, inputs)


# --- the planner ------------------------------------------------------------------------------------------
def _cora_sized(projected: bool) -> tuple[SoftmaxEdgeBasis, torch.Tensor, sc.LowRank]:
    """2,708 nodes, 10,556 edges plus a self-loop each, 8 heads of 8 from 1,433 features (Cora's GAT)."""
    g = torch.Generator().manual_seed(0)
    N, E, H, D, P = 2708, 10556, 8, 8, 1433
    nodes = torch.arange(N)
    src = torch.cat([torch.randint(0, N, (E,), generator=g), nodes])
    dst = torch.cat([torch.randint(0, N, (E,), generator=g), nodes])
    x = torch.randn(1, N, P, generator=g)
    theta = sc.LowRank(torch.randn(H, P, D, generator=g), head_placement(H, D, concat=True, like=x))
    rows = torch.einsum("bmp,kpd->bmkd", x, theta.value) if projected else None
    reuse = Projected(x, theta.value, rows, theta.out, "concat") if rows is not None else None
    return SoftmaxEdgeBasis(src, dst, torch.randn(E + N, H, generator=g), (N, N), projected=reuse), x, theta


@pytest.mark.parametrize("projected", [False, True])
def test_the_planner_picks_the_segment_order_on_a_cora_sized_graph(projected: bool) -> None:
    basis, x, theta = _cora_sized(projected)
    plan = sc.explain(basis, x, theta)
    assert plan.chosen == "segment", str(plan)
    assert [c.order for c in plan.candidates] == list(LOWRANK_ORDERS[:-1])
    assert "segment" in str(plan) and "softmax-edges" in str(plan)


def test_gat_forward_runs_the_segment_order_on_its_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer calls conv, which runs the segment order, and x W is not computed a second time."""
    torch.manual_seed(0)
    layer = snn.GATConv(6, 4, heads=3)
    x, ei = torch.randn(9, 6), torch.randint(0, 9, (2, 30))
    calls: list[str] = []
    products, aggregate = x_theta, SoftmaxEdgeBasis._aggregate  # what softmax_edges calls

    def counted_products(*args: Any) -> Any:
        calls.append("x_theta")
        return products(*args)

    def counted_aggregate(self: SoftmaxEdgeBasis, rows: torch.Tensor) -> Any:
        calls.append("segment")
        return aggregate(self, rows)

    monkeypatch.setattr(softmax_edges, "x_theta", counted_products)
    monkeypatch.setattr(SoftmaxEdgeBasis, "_aggregate", counted_aggregate)
    layer(x, ei)
    assert calls == ["segment"]  # the segment order ran on the values the scores were computed from
    calls.clear()
    sc.conv(layer.basis(x, ei), x, layer.theta(), order="segment")
    assert calls == ["x_theta", "segment"]  # the contract's basis holds none: computed by the order


# --- dropout ----------------------------------------------------------------------------------------------
def test_dropout_is_unbiased_and_drawn_once_per_basis() -> None:
    """Over many draws the mean output is the output without dropout, within 5 standard errors per entry."""
    g, p, draws = _small(), 0.4, 2000
    x = torch.from_numpy(g["rng"].normal(size=(1, 5, 3)))
    theta = torch.from_numpy(g["rng"].normal(size=(2, 3, 4)))
    plain = basis_of(g)
    expected = sc.conv(plain, x, theta)[0]
    # y_nq = sum over edges e -> n and members k of delta_ek c_ekq, the deltas independent with
    # variance p / (1 - p): the variance of each entry is that times the sum of the c_ekq squared.
    values = torch.einsum("mp,kpq->kmq", x[0], theta)
    c = plain.weights()[:, :, None] * values[:, plain.src].transpose(0, 1)  # (E, K, Q)
    variance = torch.zeros_like(expected).index_add(0, plain.dst, (c**2).sum(1)) * p / (1 - p)
    draw = torch.Generator().manual_seed(0)
    total = torch.zeros_like(expected)
    for i in range(draws):
        basis = basis_of(g, dropout=p, generator=draw)
        y = sc.conv(basis, x, theta, order="segment")[0]
        if i < 20:  # one mask for every order of one basis
            for order in ("ax", "xtheta", "atheta"):
                torch.testing.assert_close(sc.conv(basis, x, theta, order=order)[0], y)
        total += y
    mask = basis.mask
    assert mask is not None and set(mask.unique().tolist()) <= {0.0, 1 / (1 - p)}
    error = (total / draws - expected).abs()
    assert bool((error <= 5 * (variance / draws).sqrt() + 1e-12).all()), (error, (variance / draws).sqrt())


def test_gat_training_forward_equals_conv_of_its_basis_with_the_same_draw() -> None:
    torch.manual_seed(0)
    layer = snn.GATConv(5, 3, heads=2, dropout=0.5).double().train()
    x, ei = torch.randn(7, 5, dtype=D64), torch.randint(0, 7, (2, 20))
    torch.manual_seed(1)
    y = layer(x, ei)
    torch.manual_seed(1)
    contract = sc.conv(layer.basis(x, ei), x, layer.theta()) + layer.bias
    torch.testing.assert_close(y, contract)
    torch.manual_seed(1)
    _, (_, alpha) = layer(x, ei, return_attention_weights=True)
    assert bool((alpha == 0).any())  # the weights given back are the dropped ones, as PyG's


# --- value operations and refusals ------------------------------------------------------------------------
def test_select_to_and_transpose_keep_the_weights_and_the_mask() -> None:
    g = _small()
    basis = basis_of(g, dropout=0.5, generator=torch.Generator().manual_seed(3))
    dense = basis.to_dense()
    torch.testing.assert_close(basis[1].to_dense(), dense[1:2])
    torch.testing.assert_close(basis.to(dtype=torch.float32).to_dense(), dense.float())
    torch.testing.assert_close(basis.T.to_dense(), dense.transpose(1, 2))
    torch.testing.assert_close(basis.edges().to_dense(), dense)
    assert "SoftmaxEdgeBasis" in repr(basis) and basis.representation == "softmax-edges"


def test_refusals_name_the_argument() -> None:
    src, dst = np.array([0, 1]), np.array([1, 0])
    with pytest.raises(TypeError, match=r"logits must be a torch\.Tensor"):
        SoftmaxEdgeBasis(src, dst, np.zeros((2, 1)), (2, 2))
    s, d = torch.from_numpy(src), torch.from_numpy(dst)
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\)"):
        SoftmaxEdgeBasis(s, d, torch.zeros(2, 1), (2, 2), dropout=1.0)
    with pytest.raises(ValueError, match=r"dst must lie in \[0, 1\)"):
        SoftmaxEdgeBasis(s, d, torch.zeros(2, 1), (2, 1))
