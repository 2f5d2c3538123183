"""The windowed order of local positional heads: its error bound, its dtypes, its gradients and the planner's choice."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from structconv import QuadraticPosition, conv, explain
from structconv import nn as snn
from structconv.bases.kronecker import KroneckerBasis
from structconv.bases.local import LocalBasis, local_weights
from structconv.bases.window import Window
from structconv.nn import PositionalAttention
from structconv.structures.positional import window_radius

D64 = torch.float64


def _mechanism(seed: int, grid: tuple[int, ...], heads: int, boundary: str, reach: float) -> QuadraticPosition:
    rng = np.random.default_rng(seed)
    centres = torch.from_numpy(rng.uniform(-reach, reach, size=(heads, len(grid))))
    alpha = torch.from_numpy(np.exp(rng.uniform(math.log(0.05), math.log(50.0), size=heads)))
    return QuadraticPosition(grid, centres, alpha, boundary)


def _windowed(mech: QuadraticPosition, threshold: float, padding: tuple[int, ...]) -> KroneckerBasis:
    exact = mech.basis(padding=padding)
    assert isinstance(exact, KroneckerBasis)
    window = mech.window(threshold, padding=padding, min_side=0)
    assume(window is not None)  # heads as wide as the grid have none: the exact factors are as cheap
    assert window is not None
    return KroneckerBasis(exact.factors, window=window)


def _matrices(basis: KroneckerBasis, order: str) -> torch.Tensor:
    """Every member as an (M, N) matrix, read through ``order`` (x and Theta the identities)."""
    M = basis.M
    eye = torch.eye(M, dtype=basis.dtype)[None]
    return torch.stack([conv(basis.select([k]), eye, eye, order=order)[0].T for k in range(basis.K)])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    grid=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    boundary=st.sampled_from(["zero", "periodic"]),
    pad=st.integers(0, 2),
    reach=st.sampled_from([0.0, 2.0, 12.0]),  # 12: centres far beyond the grid, targets off the keys
    threshold=st.sampled_from([1e-2, 1e-4, 1e-7]),
)
def test_each_windowed_column_is_within_its_stated_bound_of_the_softmax(
    seed: int, grid: tuple[int, ...], boundary: str, pad: int, reach: float, threshold: float
) -> None:
    """The law of :meth:`QuadraticPosition.window`: L1(column, exact column) <= bound <= threshold, renormalised."""
    padding = (pad,) * len(grid) if boundary == "zero" else (0,) * len(grid)
    tokens = tuple(s + 2 * p for s, p in zip(grid, padding, strict=True))
    mech = _mechanism(seed, tokens, 3, boundary, reach)
    basis = _windowed(mech, threshold, padding)
    assert basis.window is not None
    exact, windowed = _matrices(basis, "ax"), _matrices(basis, "window")
    distance = (exact - windowed).abs().sum(1)  # (K, N): L1 per column
    bound = torch.from_numpy(basis.window.bound)
    assert bool((bound <= threshold).all())
    assert bool((distance <= bound[:, None] + 1e-12).all()), (distance.max(1).values, bound)
    # Columns over the keys that exist (zero tokens included) sum to one: renormalised, not truncated.
    if not any(padding):
        torch.testing.assert_close(windowed.sum(1), torch.ones_like(distance))


def test_the_radius_meets_the_bound_at_every_width_and_is_the_least_that_does() -> None:
    alpha = np.array([0.05, 0.5, 1.0, 2.0, 5.0, 1e4])
    radius, bound = window_radius(alpha, 2, 1e-6, limit=200)
    assert radius is not None
    assert bool((bound <= 1e-6).all())
    # One less than the chosen radius (where above 1) breaks the bound.
    R, a = radius.astype(float) - 1, alpha
    with np.errstate(divide="ignore"):  # R = 0 where the radius is 1: no bound, as the window needs
        log_bound = np.log(8) + a / 4 - a * R * R - np.log1p(-np.exp(-a * (2 * R + 1)))
    assert bool((log_bound[radius > 1] > np.log(1e-6)).all())
    assert list(radius[:5]) == sorted(radius[:5], reverse=True)  # wider heads, larger windows
    assert window_radius(np.array([1e-4]), 2, 1e-6, limit=50)[0] is None  # needs the whole axis


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_windowed_order_in_low_precision_follows_the_float64_softmax(dtype: torch.dtype) -> None:
    """float32 and bfloat16 windows stay within the bound plus the dtype's rounding of the float64 exact heads."""
    torch.manual_seed(0)
    grid, K, P, Q = (40, 36), 4, 8, 6
    mech = _mechanism(3, grid, K, "zero", 3.0)
    exact = mech.basis()
    window = mech.window(1e-5)
    assert window is not None
    x, theta = torch.randn(2, math.prod(grid), P, dtype=D64), torch.randn(K, P, Q, dtype=D64) / math.sqrt(K * P)
    reference = conv(exact, x, theta)
    low = KroneckerBasis(exact.factors, window=window).to(dtype=dtype)
    y = conv(low, x.to(dtype), theta.to(dtype), order="window").double()
    scale = float(sum((x @ theta[k]).abs().max() for k in range(K)))  # the bound's factor
    eps = float(torch.finfo(dtype).eps)
    tol = (float(window.bound.max()) + 8 * eps) * scale
    assert float((y - reference).abs().max()) <= tol


def _leaves(grid: tuple[int, ...], centres: list[list[float]], log_alpha: list[float]) -> tuple[torch.Tensor, ...]:
    """x, Theta, centres and log widths in float64, requiring gradients (x and Theta drawn in that order)."""
    K = len(centres)
    x = torch.randn(1, math.prod(grid), 3, dtype=D64, requires_grad=True)
    theta = torch.randn(K, 3, 2, dtype=D64, requires_grad=True)
    return (
        x,
        theta,
        torch.tensor(centres, dtype=D64, requires_grad=True),
        torch.tensor(log_alpha, dtype=D64, requires_grad=True),
    )


def _window_of(
    grid: tuple[int, ...], centres: torch.Tensor, log_alpha: torch.Tensor
) -> tuple[QuadraticPosition, Window]:
    mech = QuadraticPosition(grid, centres, log_alpha.exp(), positive=True)
    window = mech.window(1e-3, min_side=0)
    assert window is not None
    return mech, window


def test_the_window_order_has_the_gradients_of_its_formula() -> None:
    """float64 gradcheck and gradgradcheck through the window's weights (centres, widths), x and Theta."""
    torch.manual_seed(1)
    grid = (9, 7)
    x, theta, centres, log_alpha = _leaves(grid, [[0.3, -1.2], [2.2, 0.6]], [0.1, 0.7])

    def run(x: torch.Tensor, theta: torch.Tensor, centres: torch.Tensor, log_alpha: torch.Tensor) -> torch.Tensor:
        mech, window = _window_of(grid, centres, log_alpha)
        return conv(KroneckerBasis(mech.basis().factors, window=window), x, theta, order="window")

    assert torch.autograd.gradcheck(run, (x, theta, centres, log_alpha))
    assert torch.autograd.gradgradcheck(run, (x, theta, centres, log_alpha))


def test_the_planner_weighs_the_window_against_the_exact_passes_and_explain_states_its_radius_and_bound() -> None:
    """At width 400 up to 256x256 the exact per-axis GEMMs were faster (measured), from 512x512 the window."""
    layer = PositionalAttention((96, 96), 400, 9)
    assert layer.basis().window is None  # type: ignore[attr-defined]  # the layer reads no widths back there
    basis = layer.heads.mechanism().basis(1e-7)
    assert isinstance(basis, KroneckerBasis) and basis.window is not None
    plan = explain(basis, torch.empty(1, 96 * 96, 400), layer.parameter())
    assert plan.chosen == "ax" and "window" in plan.orders
    text = str(plan)
    assert "of the exact softmax" in text
    radius = basis.window.radius
    assert f"radius per head [{','.join(str(int(r)) for r in radius)}]" in text
    large = PositionalAttention((512, 512), 16, 9)
    assert explain(large.basis(), torch.empty(1, 512 * 512, 16), large.parameter()).chosen == "window"
    # On small grids no window is built, and nothing is read back to choose one.
    small = PositionalAttention((16, 16), 64, 9).basis()
    assert isinstance(small, KroneckerBasis) and small.window is None


def test_a_layer_on_the_window_never_forms_dense_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward at 64x64 tokens form no (K, M, N) matrix and match the exact heads."""
    torch.manual_seed(2)
    layer = PositionalAttention((64, 64), 16, 4, padding=1)
    x = torch.randn(2, 64, 64, 16)

    def refuse(self: object) -> None:
        raise AssertionError("the window order formed a dense basis")

    with torch.no_grad():
        exact = PositionalAttention((64, 64), 16, 4, padding=1, threshold=None)
        exact.load_state_dict(layer.state_dict())
        expected = exact(x)
    monkeypatch.setattr(KroneckerBasis, "to_dense", refuse)
    y = layer(x)
    y.square().sum().backward()
    assert layer.heads.centres.grad is not None and bool(layer.heads.centres.grad.abs().sum() > 0)
    torch.testing.assert_close(y.detach(), expected, rtol=0, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    grid=st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple),
    boundary=st.sampled_from(["zero", "periodic"]),
    order=st.sampled_from(["ax", "xtheta"]),
)
def test_local_blocks_hold_the_windowed_heads_entry_by_entry(
    seed: int, grid: tuple[int, ...], boundary: str, order: str
) -> None:
    """LocalBasis(local_weights(window)) is the window order, through either order of the engine."""
    mech = _mechanism(seed, grid, 3, boundary, 2.0)
    basis = _windowed(mech, 1e-4, (0,) * len(grid))
    assert basis.window is not None
    local = LocalBasis(local_weights(basis.window), basis.window)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.normal(size=(2, basis.M, 3)))
    theta = torch.from_numpy(rng.normal(size=(3, 3, 4)))
    expected = conv(basis, x, theta, order="window")
    torch.testing.assert_close(conv(local, x, theta, order=order), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(local.to_dense(), _matrices(basis, "window"), rtol=0, atol=1e-15)


def test_local_blocks_have_the_gradients_of_their_formula() -> None:
    """float64 gradcheck and gradgradcheck of a fixed dropout mask on the local entries (centres, widths, x, Theta)."""
    torch.manual_seed(4)
    grid = (7, 6)
    x, theta, centres, log_alpha = _leaves(grid, [[0.3, -1.2], [1.6, 0.6]], [0.4, 0.9])
    mask = (torch.rand(local_weights(_window_of(grid, centres, log_alpha)[1]).shape) > 0.3).double() / 0.7

    def run(x: torch.Tensor, theta: torch.Tensor, centres: torch.Tensor, log_alpha: torch.Tensor) -> torch.Tensor:
        found = _window_of(grid, centres, log_alpha)[1]
        return conv(LocalBasis(local_weights(found) * mask, found), x, theta)

    assert torch.autograd.gradcheck(run, (x, theta, centres, log_alpha))
    assert torch.autograd.gradgradcheck(run, (x, theta, centres, log_alpha))


def test_shared_dropout_on_a_windowed_layer_drops_each_entry_once_per_step_for_the_whole_batch() -> None:
    """The paper's rule in block-local form: every windowed entry kept with probability 1 - p, scaled by 1/(1 - p)."""
    torch.manual_seed(5)
    p = 0.3
    layer = PositionalAttention((96,), 6, 3, attention_dropout=p).double().train()
    built = layer.basis()
    assert isinstance(built, KroneckerBasis) and built.window is not None
    windowed = local_weights(built.window)
    dropped = layer.dropped(built, batch=2)
    assert isinstance(dropped, LocalBasis)
    kept = dropped.weights[windowed > 0]
    entries = windowed[windowed > 0]
    ratio = kept / entries
    assert bool(((ratio == 0) | torch.isclose(ratio, torch.full_like(ratio, 1 / (1 - p)))).all())
    n, dropped_share = ratio.numel(), float((ratio == 0).double().mean())
    assert abs(dropped_share - p) < 5 * math.sqrt(p * (1 - p) / n)
    # One mask for the batch: two copies of an image get the same output in a training step.
    image = torch.randn(1, 96, 6, dtype=D64)
    y = layer(torch.cat([image, image]))
    torch.testing.assert_close(y[0], y[1], rtol=0, atol=0)


def test_training_with_dropout_at_64x64_never_forms_dense_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object) -> None:
        raise AssertionError("a dense (K, M, N) basis was formed")

    monkeypatch.setattr(KroneckerBasis, "to_dense", refuse)
    monkeypatch.setattr(LocalBasis, "to_dense", refuse)
    layer = PositionalAttention((64, 64), 8, 4, attention_dropout=0.1).train()
    y = layer(torch.randn(2, 64, 64, 8))
    y.square().sum().backward()
    assert layer.theta.grad is not None and layer.heads.centres.grad is not None


@pytest.mark.parametrize("boundary", ["zero", "periodic"])
def test_the_window_runs_alike_on_numpy_and_torch(boundary: str) -> None:
    rng = np.random.default_rng(6)
    centres, alpha = rng.normal(size=(3, 2)), np.array([0.5, 1.0, 3.0])
    x, theta = rng.normal(size=(2, 40 * 36, 4)), rng.normal(size=(3, 4, 5))
    on_numpy = QuadraticPosition((40, 36), centres, alpha, boundary).basis(1e-6)
    on_torch = QuadraticPosition((40, 36), torch.from_numpy(centres), torch.from_numpy(alpha), boundary).basis(1e-6)
    assert isinstance(on_numpy, KroneckerBasis) and on_numpy.window is not None
    expected = conv(on_torch, torch.from_numpy(x), torch.from_numpy(theta), order="window").numpy()
    np.testing.assert_allclose(conv(on_numpy, x, theta, order="window"), expected, rtol=1e-12, atol=1e-12)
    local = LocalBasis(local_weights(on_numpy.window), on_numpy.window)
    np.testing.assert_allclose(conv(local, x, theta), expected, rtol=1e-12, atol=1e-12)


def test_bad_windows_are_refused_with_the_argument_named() -> None:
    heads = QuadraticPosition((40,), torch.zeros(2, 1), torch.ones(2))
    for bad in (0.0, -1.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"threshold must lie in \(0, 1\)"):
            heads.window(bad)
    torus = QuadraticPosition((44,), torch.zeros(2, 1), torch.ones(2), boundary="periodic")
    with pytest.raises(ValueError, match=r"padding=\(2,\) adds zero tokens beyond the grid, and a periodic grid"):
        torus.basis(1e-7, padding=(2,))


def test_dropout_keeps_dense_heads_where_the_local_blocks_would_be_larger() -> None:
    """Wide heads on 33 positions: the block-local form would hold more entries than the dense heads."""
    layer = PositionalAttention((33,), 4, 2, heads=snn.QuadraticHeads(alpha=0.02), attention_dropout=0.1).train()
    built = layer.basis()
    assert isinstance(built, KroneckerBasis) and built.window is not None
    assert not isinstance(layer.dropped(built, batch=1), LocalBasis)
