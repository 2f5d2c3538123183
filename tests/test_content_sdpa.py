"""Content plus position heads through torch's fused attention: the ``"sdpa"`` order of their basis.

:class:`~structconv.nn.PositionalAttention` with :class:`~structconv.nn.ContentHeads` and a
positional encoding scores :math:`s\\,q_n\\cdot k_m + \\beta_{hmn}` with :math:`\\beta` independent of
the input, so its basis is a lazy :class:`~structconv.AttentionBasis` holding the projections
and :math:`\\beta` as additive scores; its ``"sdpa"`` order passes :math:`\\beta` to
``scaled_dot_product_attention`` as the float mask.  The laws: the fused order equals the dense
orders (forward and every gradient, the positional tables' through the mask included), float64
gradcheck, lower precisions against float64, the planner's choice at the paper's size, attention
dropout's law, and the per-axis positional scores against the gather over offsets.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import structconv.backend.torch as torch_backend
from structconv import AttentionBasis, BiAffine, attention_basis, conv, explain, learned_scores, quadratic_scores
from structconv.bases import attention as attention_module
from structconv.experiments.cifar.models import build_model
from structconv.nn import ContentHeads, LearnedHeads, PositionalAttention, QuadraticHeads
from structconv.structures.attention import content_and_position
from structconv.structures.relative import relative_offsets

D64 = torch.float64
DENSE = ("ax", "xtheta")


def _layer(
    grid: tuple[int, ...], E: int, H: int, D: int, Dp: int, content_bias: bool, seed: int, **options: Any
) -> Any:
    torch.manual_seed(seed)
    content = ContentHeads(key_dim=D, bias=content_bias)
    layer = PositionalAttention(
        grid, E, H, encoding=LearnedHeads(positional_dim=Dp), content=content, **options
    ).double()
    with torch.no_grad():  # away from the initial values (zero-free biases, larger position scores)
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


def _outputs_and_grads(layer: Any, x: torch.Tensor, order: str) -> list[torch.Tensor]:
    """The layer's ``conv`` in ``order`` and the gradients of a fixed functional of it, into x and every parameter."""
    leaves = [x, *layer.parameters()]
    y = conv(layer.basis(x), x, layer.theta(), order=order)
    weight = torch.linspace(-1.0, 2.0, y.numel(), dtype=y.dtype).reshape(y.shape)
    grads = torch.autograd.grad((y * weight).sum(), leaves, allow_unused=True)
    return [y.detach()] + [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves, strict=True)]


@given(
    seed=st.integers(0, 2**31),
    grid=st.sampled_from([(1, 1), (2, 3), (3, 3), (4, 2), (5,), (2, 2, 2)]),
    E=st.integers(1, 5),
    H=st.integers(1, 3),
    D=st.integers(1, 4),
    extra=st.integers(0, 3),
    bias=st.booleans(),
    B=st.integers(1, 3),
    chunked=st.booleans(),
)
def test_the_fused_order_equals_the_dense_orders_forward_and_gradients(
    seed: int,
    grid: tuple[int, ...],
    E: int,
    H: int,
    D: int,
    extra: int,
    bias: bool,
    B: int,
    chunked: bool,
) -> None:
    """float64, no dropout: y and the gradients into x, Θ, the content projections and the positional tables."""
    with pytest.MonkeyPatch.context() as patch:
        if chunked:  # one instance per chunk of the backward's recomputation
            patch.setattr(torch_backend, "CHUNK_ENTRIES", 1)
        _check_fused_against_dense(seed, grid, E, H, D, extra, bias, B)


def _check_fused_against_dense(
    seed: int, grid: tuple[int, ...], E: int, H: int, D: int, extra: int, bias: bool, B: int
) -> None:
    layer = _layer(grid, E, H, D, len(grid) + extra, bias, seed)
    x = torch.randn(B, math.prod(grid), E, dtype=D64, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    basis = layer.basis(x)
    assert isinstance(basis, AttentionBasis) and basis.bias is not None and "sdpa" in basis.own_orders()
    fused = _outputs_and_grads(layer, x, "sdpa")
    for order in DENSE:
        for got, want in zip(fused, _outputs_and_grads(layer, x, order), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    if math.prod(grid) > 1:  # the positional tables' gradient came through the kernel's mask
        names = [n for n, _ in layer.named_parameters()]
        reached = [float(g.abs().max()) > 0 for n, g in zip(names, fused[2:], strict=True) if n.startswith("encoding.")]
        assert reached and all(reached)


def test_gradcheck_of_the_fused_order_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused order, its chunked backward (two chunks) and its double backward, against finite differences."""
    monkeypatch.setattr(torch_backend, "CHUNK_ENTRIES", 2 * 6 * 6)  # two heads of 6 x 6: one instance a chunk
    g = torch.Generator().manual_seed(3)
    grid, K, P, D, Q = (2, 3), 2, 3, 2, 2

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=D64, generator=g).requires_grad_()

    x, key, query, kb, qb = leaf(2, 6, P), leaf(K, P, D), leaf(K, P, D), leaf(K, D), leaf(K, D)
    rows, cols, weight, theta = leaf(3, 2), leaf(5, 1), leaf(K, 3), leaf(K, P, Q)

    def run(x: Any, key: Any, query: Any, kb: Any, qb: Any, rows: Any, cols: Any, weight: Any, theta: Any) -> Any:
        content = BiAffine(key=key, query=query, key_bias=kb, query_bias=qb, scale=0.7)
        basis = attention_basis(x, mechanism=content + learned_scores(grid, (rows, cols), weight))
        return conv(basis, x, theta, order="sdpa")

    leaves = (x, key, query, kb, qb, rows, cols, weight, theta)
    assert torch.autograd.gradcheck(run, leaves)
    assert torch.autograd.gradgradcheck(run, leaves)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 0.05), (torch.float16, 0.01)])
def test_lower_precisions_follow_float64(dtype: torch.dtype, tol: float) -> None:
    """float32, bfloat16 and float16 weights through the fused order: within ``tol`` of the output's scale."""
    layer = _layer((4, 4), 8, 3, 4, 4, True, 0)
    x = torch.randn(3, 16, 8, dtype=D64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = conv(layer.basis(x), x, layer.theta(), order="ax")
    low = copy.deepcopy(layer).to(dtype)
    xl = x.to(dtype).requires_grad_()
    y = conv(low.basis(xl), xl, low.theta(), order="sdpa")
    assert y.dtype == dtype
    assert float((y.detach().double() - want).abs().max()) <= tol * float(want.abs().max())
    y.float().sum().backward()
    grads = [xl.grad, *(p.grad for n, p in low.named_parameters() if n != "bias")]  # conv adds no bias
    assert all(g is not None and g.dtype == dtype and bool(torch.isfinite(g).all()) for g in grads)
    # and under autocast: float32 parameters, bf16 products
    if dtype == torch.bfloat16:
        single = copy.deepcopy(layer).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ya = single(x.float())
        assert float((ya.detach().double() - want - layer.bias.detach()).abs().max()) <= tol * float(want.abs().max())


def test_the_planner_takes_the_fused_order_for_the_paper_layer_at_batch_100() -> None:
    """sa-learned-content's attention (width 400, 9 heads, 16x16 tokens): ``auto`` is ``"sdpa"``, explain lists it."""
    model = build_model("sa-learned-content").eval()
    layer = model.attention_layers()[0]
    x = torch.randn(100, 256, 400)
    basis = layer.basis(x)
    assert isinstance(basis, AttentionBasis) and tuple(basis.bias.shape) == (1, 9, 256, 256)
    plan = explain(basis, x, layer.theta())
    assert plan.chosen == "sdpa"
    assert {"ax", "xtheta", "sdpa"} <= {line.split()[0] for line in str(plan).splitlines()[3:] if line.strip()}
    # the keys, queries and values of 400 columns per head outweigh the 256 of the weights it spares
    assert plan.candidate("sdpa").memory < min(plan.candidate(o).memory for o in DENSE)
    assert plan.candidate("sdpa").flops <= min(plan.candidate(o).flops for o in DENSE)


def _mass_layer(p: float, **options: Any) -> tuple[Any, torch.Tensor]:
    """A layer whose output channel 0 is the kept mass of every head's column: Θ_h = e_0 e_0^T, x_0 = 1."""
    layer = _layer((6, 6), 4, 3, 2, 4, True, 5, attention_dropout=p, bias=False, **options)
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[:, 0, 0] = 1.0
    x = torch.randn(8, 36, 4, dtype=D64, generator=torch.Generator().manual_seed(2))
    x[..., 0] = 1.0
    return layer, x


def _assert_dropped_share(y: torch.Tensor, weights: torch.Tensor, p: float) -> None:
    r"""The dropped share of the mass, :math:`1 - (1-p)\sum y / (BNK)`, within 5σ of ``p``.

    A column :math:`n` of head :math:`h` keeps :math:`\sum_m P_m Z_m/(1-p)` with :math:`Z_m`
    Bernoulli(1 - p) independent: its dropped share has mean ``p`` and variance
    :math:`p(1-p)\sum_m P_m^2`; columns are independent.
    """
    columns = weights.shape[0] * weights.shape[1] * weights.shape[3]
    share = 1.0 - (1.0 - p) * float(y[..., 0].sum()) / columns
    sigma = math.sqrt(p * (1.0 - p) * float((weights * weights).sum())) / columns
    assert abs(share - p) <= 5 * sigma, (share, p, sigma)
    assert share != 0.0


@pytest.mark.parametrize("order", ["sdpa", "ax"])
def test_dropout_of_the_basis_drops_each_weight_with_probability_p(order: str) -> None:
    """``with_dropout(p)``: the fused order (sdpa's ``dropout_p``) and the dense orders drop mass p on average."""
    p = 0.3
    layer, x = _mass_layer(0.0)
    with torch.no_grad():
        basis = layer.basis(x)
        weights = basis.to_dense()
        dropped = basis.with_dropout(p)
        assert dropped.dropout == p and basis.dropout == 0.0  # a new basis; the first unchanged
        for seed in range(3):
            torch.manual_seed(seed)
            _assert_dropped_share(conv(dropped, x, layer.theta(), order=order), weights, p)
        theta = layer.theta()
        assert torch.equal(conv(basis, x, theta, order=order), conv(basis, x, theta, order=order))  # no dropout


@pytest.mark.parametrize("kernel_dropout", [False, True])
def test_the_layer_drops_in_training_and_is_deterministic_in_eval(
    kernel_dropout: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training: the share dropped is p (within 5σ); eval: the same result twice, equal to the dense order's.

    ``kernel_dropout``: as on CUDA, whose fused kernels drop weights, the layer hands the dropout
    to the fused order (``sdpa``'s ``dropout_p``); the CPU's take none, and the layer drops dense heads.
    """
    monkeypatch.setattr(attention_module, "fused_dropout", lambda device: kernel_dropout)
    p = 0.2
    layer, x = _mass_layer(p)
    with torch.no_grad():
        weights = layer.eval().basis(x).to_dense()
        layer.train()
        handed = layer.dropped(layer.basis(x), int(x.shape[0]))
        assert isinstance(handed, AttentionBasis) == kernel_dropout
        if kernel_dropout:
            assert handed.dropout == p and explain(handed, x, layer.theta()).chosen in ("sdpa", *DENSE)
        for seed in range(3):
            torch.manual_seed(seed)
            _assert_dropped_share(layer(x), weights, p)
        layer.eval()
        first, second = layer(x), layer(x)
        assert torch.equal(first, second)
        torch.testing.assert_close(first, conv(layer.basis(x), x, layer.theta(), order="ax"))


def test_eq5_relative_terms_keep_the_dense_path() -> None:
    """The query-position term of Eq. 5 depends on the query and the offset: no additive mask; dense scores."""
    torch.manual_seed(0)
    layer = PositionalAttention((3, 3), 4, 2, encoding=LearnedHeads(relative_terms=True), content=ContentHeads())
    assert content_and_position(layer.mechanism()) is None
    basis = layer.basis(torch.randn(2, 9, 4))
    assert isinstance(basis, AttentionBasis) and basis.projections is None and not basis.own_orders()


def test_quadratic_heads_with_content_take_the_fused_order_too() -> None:
    """Any input-independent encoding plus content (here quadratic) is a dot product plus a bias."""
    torch.manual_seed(0)
    layer = PositionalAttention((3, 4), 6, 2, encoding=QuadraticHeads(alpha=0.7), content=ContentHeads(bias=True))
    layer = layer.double()
    x = torch.randn(2, 12, 6, dtype=D64)
    basis = layer.basis(x)
    assert "sdpa" in basis.own_orders()
    torch.testing.assert_close(
        conv(basis, x, layer.theta(), order="sdpa"), conv(basis, x, layer.theta(), order="xtheta")
    )


@pytest.mark.parametrize("boundary", ["zero", "periodic"])
@pytest.mark.parametrize("grid", [(5,), (3, 4), (2, 3, 2)])
def test_per_axis_positional_scores_equal_the_gather_over_offsets(grid: tuple[int, ...], boundary: str) -> None:
    """``dense_scores`` of separable heads, per axis: values and gradients of the (K, O) gather's."""
    g = torch.Generator().manual_seed(0)
    lengths = relative_offsets(grid, boundary).lengths
    tables = [torch.randn(n, 2, dtype=D64, generator=g, requires_grad=True) for n in lengths]
    weight = torch.randn(3, 2 * len(grid), dtype=D64, generator=g, requires_grad=True)
    centres = torch.randn(3, len(grid), dtype=D64, generator=g, requires_grad=True)
    alpha = torch.rand(3, dtype=D64, generator=g).add(0.2).requires_grad_()
    for learned, mech in (
        (True, learned_scores(grid, tuple(tables), weight, boundary)),
        (False, quadratic_scores(grid, centres, alpha, boundary)),
    ):
        fast, slow = mech.dense_scores(), mech.relative.gather(mech.offset_scores())
        torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
        probe = torch.randn(fast.shape, dtype=D64, generator=g)
        leaves = [*tables, weight] if learned else [centres, alpha]
        fast_grads = torch.autograd.grad((fast * probe).sum(), leaves, retain_graph=True)  # slow shares the scores
        for a, b in zip(fast_grads, torch.autograd.grad((slow * probe).sum(), leaves), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_an_inference_forward_through_the_fused_order_is_one_graph_for_torch_compile() -> None:
    """In eval the layers plan ``"sdpa"`` and the model traces without graph breaks (training: test_cifar_train)."""
    import torch._dynamo as dynamo

    model = build_model("sa-learned-content", width=16, depth=2, ffn=16, heads=4).eval()
    x = torch.randn(2, 3, 32, 32)
    layer = model.attention_layers()[0]
    flat = torch.randn(2, 256, 16)
    assert explain(layer.basis(flat), flat, layer.theta()).chosen == "sdpa"
    model(x)
    dynamo.reset()
    explanation = dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, [str(b.reason)[:200] for b in explanation.break_reasons]
    assert explanation.graph_count == 1
