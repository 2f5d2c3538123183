"""The engine: every order x representation x backend equals the naive dense einsum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from basis_kinds import KINDS as BASIS_KINDS
from basis_kinds import TORCH_ONLY, Convert
from conftest import (
    BACKENDS,
    REPRESENTATIONS,
    cuda,
    make_basis,
    memory_budget,
    problems,
    reference,
    to_backend,
)
from hypothesis import given
from hypothesis import strategies as st

from structconv import (
    Aggregation,
    ConvWeight,
    Cost,
    DenseBasis,
    LowRank,
    Separable,
    SparseBasis,
    contraction,
    conv,
    explain,
    grid_basis,
)
from structconv.engine import orders as engine_orders
from structconv.engine.orders import BASE_ORDERS, FULL, Kind, Order, Param, kind_of
from structconv.testing import check_basis, dense_reference

ORDERS = ("ax", "xtheta", "atheta", "auto")
FACTOR_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta", "auto")


@pytest.mark.parametrize("representation", REPRESENTATIONS)
@pytest.mark.parametrize("backend", BACKENDS)
@given(problem=problems())
def test_every_path_equals_dense_einsum(problem, representation, backend):
    """Every order explain lists, and auto: y of x's type, equal to the einsum on the drawn A."""
    A, x, theta = (to_backend(problem[k], backend) for k in ("A", "x", "theta"))
    basis = make_basis(A, representation)
    orders = check_basis(basis, x=x, theta=theta, dense=problem["A"], rtol=1e-10, atol=1e-10, gradients=False)
    assert set(ORDERS) <= set(orders)


@pytest.mark.parametrize("representation", ("dense", "sparse", "concat"))
@pytest.mark.parametrize("backend", BACKENDS)
@given(problem=problems(), rank=st.integers(1, 4))
def test_factorised_parameters_equal_their_full_form(problem, representation, backend, rank):
    """Every order of a Separable and a LowRank parameter (factors kept or formed) equals the einsum of the full one."""
    rng = problem["rng"]
    K, P, Q = problem["theta"].shape
    coef, chan = rng.normal(size=(rank, K)), rng.normal(size=(rank, P, Q))
    val, out = rng.normal(size=(K, P, rank)), rng.normal(size=(K, Q, rank))
    basis = make_basis(to_backend(problem["A"], backend), representation)
    x = to_backend(problem["x"], backend)
    for theta in (
        Separable(to_backend(coef, backend), to_backend(chan, backend)),
        LowRank(to_backend(val, backend), to_backend(out, backend)),
    ):
        orders = check_basis(basis, x=x, theta=theta, dense=problem["A"], rtol=1e-7, atol=1e-10, gradients=False)
        assert set(FACTOR_ORDERS) <= set(orders)


@pytest.mark.parametrize("order", ("ax", "xtheta"))
@pytest.mark.parametrize("factored", (False, True))
@pytest.mark.parametrize("instance", (False, True))
def test_dense_gemm_paths_gradcheck(order, factored, instance):
    """Dense bases' GEMM layouts (shared or per instance; full and LowRank parameters) differentiate like the einsum."""
    g = torch.Generator().manual_seed(3)
    shape = (2, 3, 5, 4) if instance else (3, 5, 4)
    A = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    o = torch.randn(3, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)

    def f(A, x, v, o):
        theta = LowRank(v, o) if factored else torch.einsum("kpd,kqd->kpq", v, o)
        return conv(DenseBasis(A), x, theta, order=order)

    torch.autograd.gradcheck(f, (A, x, v, o))
    torch.autograd.gradgradcheck(f, (A, x, v, o))
    expected = torch.einsum(("bkmn" if instance else "kmn") + ",bmp,kpd,kqd->bnq", A, x, v, o)
    torch.testing.assert_close(f(A, x, v, o), expected)
    if instance:  # the (B, M, K, N) memory order the engine reads without a copy gives the same
        mkn = A.detach().permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3).requires_grad_()
        torch.testing.assert_close(f(mkn, x, v, o), expected)


@given(problem=problems())
def test_numpy_equals_torch(problem):
    for rep in ("dense", "sparse"):
        y_np = conv(make_basis(problem["A"], rep), problem["x"], problem["theta"])
        y_t = conv(
            make_basis(torch.from_numpy(problem["A"]), rep),
            torch.from_numpy(problem["x"]),
            torch.from_numpy(problem["theta"]),
        )
        np.testing.assert_allclose(y_t.numpy(), y_np, atol=1e-12)


@given(problem=problems(), a=st.floats(-3, 3), b=st.floats(-3, 3))
def test_linear_in_x_and_theta(problem, a, b):
    rng = problem["rng"]
    basis = SparseBasis.from_dense(problem["A"])
    x, t = problem["x"], problem["theta"]
    x2, t2 = rng.normal(size=x.shape), rng.normal(size=t.shape)
    np.testing.assert_allclose(
        conv(basis, a * x + b * x2, t), a * conv(basis, x, t) + b * conv(basis, x2, t), atol=1e-9
    )
    np.testing.assert_allclose(
        conv(basis, x, a * t + b * t2), a * conv(basis, x, t) + b * conv(basis, x, t2), atol=1e-9
    )


def test_two_dimensional_input_gives_two_dimensional_output():
    rng = np.random.default_rng(0)
    A, x, t = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 5)), rng.normal(size=(2, 5, 6))
    y = conv(A, x, t)
    assert y.shape == (4, 6)
    np.testing.assert_allclose(y, reference(A, x[None], t)[0])


def test_explain_reports_all_orders_and_auto_picks_the_cheapest():
    rng = np.random.default_rng(0)
    # Many members and wide channels: contracting A with x first is far cheaper than forming
    # x.Theta (B*M*K*Q) or Phi (M*N*P*Q); opt_einsum's costs must say so.
    A, x, t = rng.normal(size=(2, 50, 50)), rng.normal(size=(4, 50, 64)), rng.normal(size=(2, 64, 64))
    plan = explain(A, x, t)
    assert [c.order for c in plan.candidates] == ["ax", "xtheta", "atheta"]
    assert plan.chosen == min(plan.candidates, key=lambda c: c.score).order
    assert plan.candidate("atheta").flops > plan.candidate("ax").flops
    assert "opt_einsum equation: kmn,bmp,kpq->bnq" in str(plan)
    assert "<- chosen" in str(plan)
    assert explain(A, x, t, order="xtheta").chosen == "xtheta"


def test_dense_costs_are_opt_einsums():
    import opt_einsum

    rng = np.random.default_rng(0)
    A, x, t = rng.normal(size=(3, 7, 8)), rng.normal(size=(2, 7, 4)), rng.normal(size=(3, 4, 5))
    plan = explain(A, x, t)
    _, info = opt_einsum.contract_path("kmn,bmp,kpq->bnq", A, x, t, optimize=[(1, 2), (0, 1)])
    assert plan.candidate("xtheta").flops == float(info.opt_cost)


def test_sparse_costs_scale_with_nnz_not_with_m_times_n():
    sparse_few = SparseBasis(np.array([[0, 0], [1, 2], [3, 4]]), np.array([1.0, 2.0]), (1, 400, 400))
    dense_equivalent = DenseBasis(sparse_few.to_dense())
    for hook in ("cost_each", "cost_members"):
        kwargs = {} if hook == "cost_each" else {"reduce": True}
        sparse_cost, dense_cost = (
            getattr(sparse_few, hook)(2, 3, **kwargs),
            getattr(dense_equivalent, hook)(2, 3, **kwargs),
        )
        assert sparse_cost.irregular + sparse_cost.flops < dense_cost.flops / 1000
    assert sparse_few.cost_each(2, 3).irregular == pytest.approx(2 * 2 * 2 * 3)


def test_plans_are_cached_per_shape_key():
    rng = np.random.default_rng(0)
    A, t = rng.normal(size=(2, 5, 5)), rng.normal(size=(2, 3, 4))
    p1 = explain(A, rng.normal(size=(2, 5, 3)), t)
    p2 = explain(rng.normal(size=(2, 5, 5)), rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 3, 4)))
    assert p1 is p2


def test_sparse_paths_never_materialise_the_dense_basis(monkeypatch):
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 6, 5)) * (rng.random((3, 6, 5)) < 0.3)
    x, t = rng.normal(size=(2, 6, 3)), rng.normal(size=(3, 3, 2))
    basis = SparseBasis.from_dense(A)

    def forbidden(self):
        raise AssertionError("to_dense called")

    monkeypatch.setattr(SparseBasis, "to_dense", forbidden)
    orders = check_basis(basis, x=x, theta=t, dense=A, rtol=1e-7, atol=1e-12)  # every order, and auto
    assert {"ax", "xtheta", "atheta"} <= set(orders)


def test_autograd_flows_to_dense_basis_x_and_theta_in_float32():
    A = torch.randn(3, 5, 4, requires_grad=True)
    x = torch.randn(2, 5, 3, requires_grad=True)
    t = torch.randn(3, 3, 2, requires_grad=True)
    for order in ("ax", "xtheta", "atheta"):
        conv(A, x, t, order=order).square().sum().backward()
    assert all(v.grad is not None and torch.isfinite(v.grad).all() for v in (A, x, t))


@cuda
@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_cuda_matches_cpu(representation):
    """Every order on CUDA: a CUDA tensor back, equal to the einsum on the host."""
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 6, 5)) * (rng.random((3, 6, 5)) < 0.5)
    x, t = rng.normal(size=(2, 6, 3)), rng.normal(size=(3, 3, 2))
    dev = torch.device("cuda")
    basis = make_basis(torch.from_numpy(A).to(dev), representation)
    x_cuda, t_cuda = torch.from_numpy(x).to(dev), torch.from_numpy(t).to(dev)
    orders = check_basis(basis, x=x_cuda, theta=t_cuda, dense=A, rtol=1e-7, atol=1e-10, gradients=False)
    assert set(ORDERS) <= set(orders)


def test_forced_order_refuses_intermediates_beyond_the_device() -> None:
    """``order="atheta"`` on a 300 x 300 grid would densify 754 GiB: refused with the size, nothing allocated."""
    A = grid_basis((300, 300), 3, padding=1, like=torch.zeros(1))
    x, theta = torch.randn(1, 90000, 4), torch.randn(9, 4, 4)
    refused = r"order='atheta''s intermediates would take 754 GiB on cpu"
    with memory_budget(0.5), pytest.raises(ValueError, match=refused):
        conv(A, x, theta, order="atheta")
    assert conv(A, x, theta, order="xtheta").shape == (1, 90000, 4)
    # A forced "atheta" that fits still runs, and equals the planner's choice.
    small = grid_basis((6, 6), 3, padding=1, like=torch.zeros(1, dtype=torch.float64))
    xs, ts = torch.randn(2, 36, 3, dtype=torch.float64), torch.randn(9, 3, 2, dtype=torch.float64)
    torch.testing.assert_close(conv(small, xs, ts, order="atheta"), conv(small, xs, ts))


def test_order_must_be_a_string() -> None:
    with pytest.raises(TypeError, match=r"order must be a string such as 'auto' or 'ax', got list: \['ax'\]"):
        conv(np.ones((1, 2, 2)), np.ones((2, 1)), np.ones((1, 1, 1)), order=["ax"])  # type: ignore[arg-type]


def test_numpy_float16_runs_on_sparse_bases() -> None:
    """scipy.sparse has no float16: the product runs in float32 and the answer comes back in float16 (every order)."""
    rng = np.random.default_rng(0)
    A = (rng.random((2, 5, 4)) > 0.5) * rng.random((2, 5, 4))
    x, theta = rng.random((3, 5, 3)), rng.random((2, 3, 2))
    basis = SparseBasis.from_dense(A.astype(np.float16))
    orders = check_basis(basis, x=x.astype(np.float16), theta=theta.astype(np.float16), dense=A, rtol=1e-2, atol=1e-2)
    assert {"auto", "ax", "xtheta", "atheta"} <= set(orders)


# --- the law of every kind of parameter -----------------------------------------------------------
#: A parameter of each kind the engine ships, for a basis of K members (a convolution weight: its
#: kernel, the grid's where the basis is one): P = Q = 4.
THETAS: dict[str, Any] = {
    "full": lambda K, kernel, rng, cv: cv(rng.normal(size=(K, 4, 4))),
    "separable": lambda K, kernel, rng, cv: Separable(cv(rng.normal(size=(2, K))), cv(rng.normal(size=(2, 4, 4)))),
    "lowrank": lambda K, kernel, rng, cv: LowRank(cv(rng.normal(size=(K, 4, 2))), cv(rng.normal(size=(K, 4, 2)))),
    "convweight": lambda K, kernel, rng, cv: ConvWeight(cv(rng.normal(size=(4, 2, *kernel))), groups=2),
    "aggregation": lambda K, kernel, rng, cv: Aggregation(cv(rng.normal(size=(K,))), 4),
}
KERNELS = {"grid": (3, 3)}
BACKEND_OF: dict[str, Convert] = {"numpy": np.asarray, "torch": torch.from_numpy}


def test_the_law_covers_every_kind_the_engine_ships() -> None:
    shipped = {FULL, *engine_orders._HELD.values()}
    assert {k.name for k in shipped if type(k).__module__.startswith("structconv.")} == set(THETAS)


@pytest.mark.parametrize("backend", sorted(BACKEND_OF))
@pytest.mark.parametrize("basis_kind", sorted(BASIS_KINDS))
@pytest.mark.parametrize("kind", sorted(THETAS))
def test_every_order_of_every_kind_equals_the_dense_reference_of_its_full_theta(
    kind: str, basis_kind: str, backend: str
) -> None:
    """The law of a kind: each of its orders (and auto), on every basis, is the einsum of its full Θ."""
    if backend == "numpy" and basis_kind in TORCH_ONLY:
        pytest.skip("a torch-only basis")
    cv, rng = BACKEND_OF[backend], np.random.default_rng(5)
    basis = BASIS_KINDS[basis_kind](cv)
    theta = THETAS[kind](basis.K, KERNELS.get(basis_kind, (basis.K,)), rng, cv)
    x = cv(rng.normal(size=(basis.batch or 2, basis.M, 4)))
    plan = explain(basis, x, theta)
    assert plan.parameter == kind_of(theta).name == kind
    expected = np.asarray(dense_reference(basis, x, theta))
    for order in (*plan.orders, "auto"):
        np.testing.assert_allclose(np.asarray(conv(basis, x, theta, order=order)), expected, rtol=1e-9, atol=1e-9)


@given(
    kernel=st.sampled_from([(3, 3), (9,), (1, 9), (9, 1), (9, 1, 1), (3, 1, 3)]),
    groups=st.sampled_from([1, 2]),
    layout=st.sampled_from(["rows", "channels_first"]),
    seed=st.integers(0, 2**16),
)
def test_a_conv_weight_of_any_kernel_shape_is_its_full_theta_in_every_order(
    kernel: tuple[int, ...], groups: int, layout: str, seed: int
) -> None:
    """A kernel numbers its entries row-major, as a 3x3 box numbers its taps: any shape of 9 entries is one map.

    The native order takes the weight as a kernel over the box, so it reshapes it (it failed inside
    torch before); every other order forms the full Θ.
    """
    rng = np.random.default_rng(seed)
    A = grid_basis((5, 6), 3, padding=1)
    w = torch.from_numpy(rng.normal(size=(4, 4 // groups, *kernel)))
    theta = ConvWeight(w, groups=groups)
    x = torch.from_numpy(rng.normal(size=(2, A.M, 4)))
    A = A.placed_like(x)
    expected = dense_reference(A, x, theta)
    image = x.transpose(1, 2).reshape(2, 4, 5, 6)
    for order in (*explain(A, x, theta).orders, "auto"):
        torch.testing.assert_close(conv(A, x, theta, order=order), expected)
        if layout == "channels_first":
            c = contraction(A, image, theta, order=order, layout="channels_first")
            for _ in range(2):  # the checked first call, then the bound run
                got = c(image, w)
                torch.testing.assert_close(got.flatten(2).transpose(1, 2), expected)


# --- a new kind is one class ------------------------------------------------------------------------
@dataclass(frozen=True)
class Scaled:
    r"""A toy parameter :math:`\Theta_k = s_k W`: one channel map ``shared`` ``(P, Q)`` scaled by ``scale`` ``(K,)``."""

    scale: Any
    shared: Any
    rank: ClassVar[int] = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return int(self.scale.shape[0]), int(self.shared.shape[0]), int(self.shared.shape[1])

    def full(self) -> Any:
        return self.scale[:, None, None] * self.shared[None]


class _ScaledXTheta(Order):
    """x·W first (one GEMM for every member), then the members scaled and summed through the hook."""

    __slots__ = ()

    def cost(self, basis: Any, batch: int, prm: Param) -> Cost:
        B, K, M, P, Q = batch, basis.K, basis.M, prm.P, prm.Q
        return Cost(2.0 * B * M * P * Q + B * K * M * Q, float(B * K * M * Q)) + basis.cost_members(B, Q, reduce=True)

    def run(self, basis: Any, x: Any, prm: Param) -> Any:
        scale, shared = prm.operands
        return basis.apply_members(scale[None, :, None, None] * (x @ shared)[:, None], reduce=True)


class _Scaled(Kind):
    """The toy kind, in one class: no table of the engine names it."""

    name, operand_names, subscripts = "scaled", ("theta.scale", "theta.shared"), "k,pq"
    held: ClassVar[type | None] = Scaled
    dense_paths: ClassVar[dict[str, tuple[tuple[int, ...], ...]]] = {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 3), (0, 1), (0, 1)),
    }

    def operands_of(self, theta: Any) -> tuple[Any, ...]:
        return theta.scale, theta.shared

    def from_operands(self, operands: tuple[Any, ...], rank: int) -> Any:
        return Scaled(*operands)

    def full_shape(self, shapes: tuple[tuple[int, ...], ...], rank: int) -> tuple[int, int, int]:
        (K,), (P, Q) = shapes
        return K, P, Q

    def form_full(self, operands: tuple[Any, ...], rank: int) -> Any:
        scale, shared = operands
        return scale[:, None, None] * shared[None]

    def hook_order(self, name: str, own: Any) -> Order:
        return _ScaledXTheta(name) if name == "xtheta" else super().hook_order(name, own)


SCALED = _Scaled()


@pytest.mark.parametrize("basis_kind", ["dense", "dense-batched", "sparse", "grid", "kronecker", "attention"])
def test_a_new_kind_is_one_class(basis_kind: str) -> None:
    """A kind defined here, as one class, runs through conv, explain and contraction: every order is its law."""
    rng = np.random.default_rng(6)
    basis = BASIS_KINDS[basis_kind](torch.from_numpy)
    theta = Scaled(torch.from_numpy(rng.normal(size=basis.K)), torch.from_numpy(rng.normal(size=(4, 3))))
    x = torch.from_numpy(rng.normal(size=(basis.batch or 2, basis.M, 4)))
    plan = explain(basis, x, theta)  # type: ignore[arg-type]
    assert kind_of(theta) is SCALED and plan.parameter == "scaled" and plan.orders[:3] == BASE_ORDERS
    if basis_kind.startswith("dense"):  # its own dense paths: its equation in the plan
        assert plan.equation.endswith(",bmp,k,pq->bnq")
    expected = dense_reference(basis, x, theta)  # type: ignore[arg-type]
    for order in (*plan.orders, "auto"):
        torch.testing.assert_close(conv(basis, x, theta, order=order), expected)  # type: ignore[arg-type]
    compiled = contraction(basis, x, theta)  # type: ignore[arg-type]
    torch.testing.assert_close(compiled(x, theta), expected)  # type: ignore[arg-type]
