"""The compiled form: ``contraction(...)`` is ``conv`` planned and checked once, in two layouts.

Laws: a compiled call equals :func:`structconv.conv` with the same order (bit for bit: the same
order runs) for every order and parameter kind; the ``"channels_first"`` layout with a
:class:`~structconv.ConvWeight` equals torch's convolution with its bias; later calls neither
re-check nor re-plan; anything that differs from what was compiled is refused with a message.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given
from torch.nn import functional as F  # noqa: N812

import structconv as sc
from structconv import ConvWeight, LowRank, Separable, contraction, conv, explain, grid_basis
from structconv.engine import compiled as compiled_module
from structconv.engine.operands import kind_of

D64 = torch.float64


def _theta(kind: str, K: int, P: int, Q: int, rng: np.random.Generator, lib: str) -> Any:
    def arr(*shape: int) -> Any:
        a = rng.standard_normal(shape)
        return torch.from_numpy(a) if lib == "torch" else a

    if kind == "lowrank":
        return LowRank(arr(K, P, 2), arr(K, Q, 2))
    if kind == "separable":
        return Separable(arr(2, K), arr(2, P, Q))
    return arr(K, P, Q)


@given(
    K=st.integers(1, 4),
    M=st.integers(1, 6),
    N=st.integers(1, 6),
    P=st.integers(1, 4),
    Q=st.integers(1, 4),
    B=st.integers(1, 3),
    kind=st.sampled_from(["full", "lowrank", "separable"]),
    lib=st.sampled_from(["numpy", "torch"]),
    seed=st.integers(0, 2**16),
)
def test_a_compiled_call_is_conv_with_the_same_order(
    K: int, M: int, N: int, P: int, Q: int, B: int, kind: str, lib: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a, x = rng.standard_normal((K, M, N)), rng.standard_normal((B, M, P))
    if lib == "torch":
        a, x = torch.from_numpy(a), torch.from_numpy(x)
    theta = _theta(kind, K, P, Q, rng, lib)
    for order in ["auto", *explain(a, x, theta).orders]:
        c = contraction(a, x, theta, order=order)
        expected = conv(a, x, theta, order=order)
        for _ in range(2):  # the first call checks; the second runs on what it bound
            got = c(x, theta)
            assert got.shape == expected.shape
            assert np.array_equal(np.asarray(got), np.asarray(expected)), order


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geometry", [{"padding": 1}, {"stride": 2, "padding": 1}, {"dilation": 2, "padding": 2}])
def test_channels_first_with_a_conv_weight_is_torch_convolution(groups: int, geometry: dict[str, int]) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(4, 6, 3, groups=groups, **geometry).double()
    x = torch.randn(2, 4, 9, 8, dtype=D64)
    A = grid_basis((9, 8), 3, like=x, **geometry)
    theta = ConvWeight(ref.weight, groups=groups)
    orders = explain(A, x.flatten(2).transpose(1, 2), theta).orders
    assert "native" in orders
    for order in orders:
        c = contraction(A, x, theta, order=order, layout="channels_first")
        torch.testing.assert_close(c(x, ref.weight, bias=ref.bias), ref(x), msg=order)
        torch.testing.assert_close(c(x, theta, bias=ref.bias), ref(x), msg=order)  # the object or its weight


@given(
    grid=st.tuples(st.integers(3, 7), st.integers(3, 7)),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    padding=st.sampled_from([0, 1, ((0, 1), (1, 0)), ((2, 1), (0, 2))]),
    boundary=st.sampled_from(["zero", "periodic"]),
    groups=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_the_bound_native_run_is_the_native_order_on_every_window(
    grid: tuple[int, int],
    stride: int,
    dilation: int,
    padding: Any,
    boundary: str,
    groups: int,
    seed: int,
) -> None:
    """Asymmetric frames, crops and wrapped borders included: the run bound once is conv's native order."""
    try:
        A = grid_basis(
            grid, 2, stride=stride, dilation=dilation, padding=padding, boundary=boundary, like=torch.ones(1)
        )
    except ValueError:  # a kernel wider than the padded grid
        return
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, *grid, dtype=D64, generator=generator)
    weight = torch.randn(6, 4 // groups, 2, 2, dtype=D64, generator=generator)
    bias = torch.randn(6, dtype=D64, generator=generator)
    c = contraction(A, x, ConvWeight(weight, groups=groups), order="native", layout="channels_first")
    rows = conv(A, x.flatten(2).transpose(1, 2), ConvWeight(weight, groups=groups), order="native") + bias
    expected = rows.transpose(1, 2).reshape(2, 6, *A.entry_shapes[1])
    for _ in range(2):  # the first call checks; later ones run what was bound
        torch.testing.assert_close(c.run_keyed(x, weight, bias), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("order", ["native", "ax", "xtheta"])
def test_channels_first_gradients(order: str) -> None:
    torch.manual_seed(1)
    x = torch.randn(1, 2, 5, 5, dtype=D64, requires_grad=True)
    w = torch.randn(4, 1, 3, 3, dtype=D64, requires_grad=True)
    b = torch.randn(4, dtype=D64, requires_grad=True)
    c = contraction(grid_basis((5, 5), 3, padding=1, like=x), x, ConvWeight(w, groups=2), order=order,
                    layout="channels_first")  # fmt: skip
    assert torch.autograd.gradcheck(lambda x, w, b: c(x, w, bias=b), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda x, w, b: c(x, w, bias=b), (x, w, b))


def test_the_native_order_takes_the_weight_as_stored() -> None:
    """Planned with the weight's groups: the native order's cost is a 1/G share, and it is chosen."""
    x = torch.randn(2, 64, 16, 16)
    A = grid_basis((16, 16), 3, padding=1)
    depthwise = explain(A, x.flatten(2).transpose(1, 2), ConvWeight(torch.randn(64, 1, 3, 3), groups=64))
    full = explain(A, x.flatten(2).transpose(1, 2), ConvWeight(torch.randn(64, 64, 3, 3)))
    assert depthwise.chosen == full.chosen == "native"
    assert depthwise.candidate("native").flops * 64 == pytest.approx(full.candidate("native").flops)
    assert depthwise.sizes["G"] == 64


def test_later_calls_do_not_check_or_plan_again(monkeypatch: pytest.MonkeyPatch) -> None:
    A = grid_basis((6, 6), 3, padding=1)
    x, theta = torch.randn(2, 36, 3), torch.randn(9, 3, 4)
    c = contraction(A, x, theta)
    first = c(x, theta)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a compiled call checked or planned again")

    monkeypatch.setattr(compiled_module, "prepare", refuse)
    monkeypatch.setattr(compiled_module, "_plan", refuse)
    torch.testing.assert_close(c(x, theta), first)


def test_mismatches_are_refused_by_name() -> None:
    A = grid_basis((6, 6), 3, padding=1)
    x, theta = torch.randn(2, 36, 3), torch.randn(9, 3, 4)
    c = contraction(A, x, theta)
    c(x, theta)
    with pytest.raises(ValueError, match=r"x has shape \(3, 36, 3\).*compiled for shape \(2, 36, 3\)"):
        c(torch.randn(3, 36, 3), theta)
    with pytest.raises(ValueError, match=r"dtype torch.float64.*compiled for.*torch.float32"):
        c(x.double(), theta)
    with pytest.raises(ValueError, match=r"theta's arrays must have shapes \(9, 3, 4\)"):
        c(x, torch.randn(9, 3, 5))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        c(x, theta, bias=torch.randn(5))
    with pytest.raises(ValueError, match=r"basis must have the structure"):
        c(x, theta, basis=grid_basis((6, 6), 3))
    with pytest.raises(ValueError, match=r"layout must be one of"):
        contraction(A, x, theta, layout="nhwc")
    with pytest.raises(ValueError, match=r"x must have shape \(B, 36, 3\)"):
        contraction(A, (2, 35, 3), (9, 3, 4))
    with pytest.raises(ValueError, match=r"theta has K=8 members but the basis has K=9"):
        contraction(A, x, (8, 3, 4))
    with pytest.raises(ValueError, match=r"channels_first layout must have shape \(B, 3, 6, 6\)"):
        contraction(A, (2, 3, 36), ConvWeight(torch.randn(4, 3, 3, 3)), layout="channels_first")


def test_a_first_call_makes_conv_s_checks() -> None:
    """Compiled from shapes, the first call still refuses what conv refuses (here: mixed dtypes)."""
    c = contraction(grid_basis((4, 4), 3, padding=1, like=torch.empty(0)), (1, 16, 2), (9, 2, 3))
    with pytest.raises(TypeError, match="dtype"):
        c(torch.randn(1, 16, 2), torch.randn(9, 2, 3, dtype=D64))


def test_a_per_call_basis_of_the_same_structure() -> None:
    """Graph layers rebuild their basis each call: the compiled form takes it if its structure is the one compiled."""
    index = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])
    x, theta = torch.randn(4, 3, dtype=D64), torch.randn(1, 3, 2, dtype=D64)
    first = sc.gcn_basis(torch.from_numpy(index), like=x)
    second = sc.gcn_basis(torch.from_numpy(index), edge_weight=torch.rand(4, dtype=D64), like=x)
    c = contraction(first, x, theta)
    torch.testing.assert_close(c(x, theta, basis=second), conv(second, x, theta))


def test_autocast_converts_as_conv_does() -> None:
    A = grid_basis((6, 6), 3, padding=1)
    ref = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    c = contraction(A, x, ConvWeight(ref.weight), layout="channels_first")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, expected = c(x, ref.weight, bias=ref.bias), ref(x)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=0.05, rtol=0.02)


def _autocast_case(structure: str, kind: str, rng: np.random.Generator) -> tuple[Any, Any, int]:
    """A basis (grid, dense or sparse), a float32 ``theta`` of ``kind`` for it, and P."""
    P, Q = 3, 2
    if structure == "grid":
        A: Any = grid_basis((5, 4), 3, padding=1)
    else:
        dense = rng.random((4, 20, 20)) * (rng.random((4, 20, 20)) < 0.3)
        A = (sc.DenseBasis if structure == "dense" else sc.SparseBasis.from_dense)(torch.from_numpy(dense).float())
    if kind == "convweight":
        return A, ConvWeight(torch.from_numpy(rng.standard_normal((Q, P, 3, 3))).float()), P
    theta = _theta(kind, A.K, P, Q, rng, "torch")
    return A, kind_of(theta).cast(theta, lambda op: op.float()), P


@given(
    structure=st.sampled_from(["grid", "dense", "sparse"]),
    kind=st.sampled_from(["full", "lowrank", "separable", "convweight"]),
    layout=st.sampled_from(["rows", "channels_first"]),
    x_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    per_call_basis=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_under_autocast_every_call_is_conv_under_autocast(
    structure: str, kind: str, layout: str, x_dtype: torch.dtype, per_call_basis: bool, seed: int
) -> None:
    """Under autocast the first call and the later ones (the cast twin) are ``conv`` under autocast, bit for bit."""
    if structure != "grid" and (kind == "convweight" or layout == "channels_first"):
        return  # a ConvWeight and the image layout are a grid's
    rng = np.random.default_rng(seed)
    A, theta, P = _autocast_case(structure, kind, rng)
    B, Q = 2, 2
    bias = torch.from_numpy(rng.standard_normal(Q)).float()
    rows = torch.from_numpy(rng.standard_normal((B, A.M, P))).to(x_dtype)
    image = rows.transpose(1, 2).reshape(B, P, 5, 4) if layout == "channels_first" else rows
    for order in explain(A, rows.float(), theta).orders:
        c = contraction(A, image, theta, order=order, layout=layout)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = conv(A, rows, theta, order=order)
            if layout == "channels_first":
                expected = expected.transpose(1, 2).reshape(B, Q, 5, 4)
                with_bias = expected + bias.to(expected.dtype)[:, None, None]
            else:
                with_bias = expected + bias.to(expected.dtype)
            for _ in range(3):  # the first call checks and compiles the twin; the others run it
                basis = A.placed_like(image) if per_call_basis else None
                got = c(image, theta, basis=basis)
                assert got.dtype == expected.dtype and torch.equal(got, expected), order
                got = c(image, theta, bias=bias, basis=basis)  # torch's convolution fuses the bias
                torch.testing.assert_close(got, with_bias, **({} if layout == "rows" else {"atol": 0.02, "rtol": 0.02}))
        assert list(c._casts) == [torch.bfloat16]


def test_under_autocast_what_conv_refuses_or_converts_goes_through_conv() -> None:
    """float64 stays float64; a basis placed otherwise and a theta of another backend get conv's messages."""
    A = sc.DenseBasis(torch.rand(3, 6, 6))
    x, theta = torch.randn(2, 6, 4), torch.randn(3, 4, 5)
    c = contraction(A, x, theta)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c(x, theta)  # the twin exists from here on
        with pytest.raises(TypeError, match="convert explicitly"):
            c(x, theta, basis=sc.DenseBasis(torch.rand(3, 6, 6, dtype=D64)))
        with pytest.raises(TypeError, match="theta"):
            c(x, theta.numpy())
        with pytest.raises(ValueError, match="theta"):
            c(x, torch.randn(3, 4, 6))
    c64 = contraction(A.to(dtype=D64), x.double(), theta.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            got = c64(x.double(), theta.double())
            assert got.dtype == D64 and torch.equal(got, conv(A.to(dtype=D64), x.double(), theta.double()))


def test_under_autocast_later_calls_do_not_check_or_plan_again(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    c = contraction(grid_basis((6, 6), 3, padding=1), x, ConvWeight(ref.weight), layout="channels_first")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = c.run_keyed(x, ref.weight, ref.bias)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a compiled call checked or planned again")

        for name in ("prepare", "_plan", "conv", "autocast"):
            monkeypatch.setattr(compiled_module, name, refuse)
        torch.testing.assert_close(c.run_keyed(x, ref.weight, ref.bias), first)
        torch.testing.assert_close(c(x, ref.weight, bias=ref.bias), first)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_grid_layer_follows_a_changed_setting(dtype: torch.dtype) -> None:
    """A layer whose padding is changed after a call compiles anew, as torch's layer reads it on every call."""
    torch.manual_seed(2)
    ref = torch.nn.Conv2d(3, 5, 3, padding=1).to(dtype)
    ours = sc.nn.GridConv2d(3, 5, 3, padding=1).to(dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 7, 7, dtype=dtype)
    tol = {"atol": 0.05, "rtol": 0.02} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(ours(x), ref(x), **tol)
    ref.padding, ours.padding = (0, 0), 0
    torch.testing.assert_close(ours(x), ref(x), **tol)
    assert ours(x).shape == (2, 5, 5, 5)


def test_repr_names_the_order_and_layout() -> None:
    c = contraction(grid_basis((4, 4), 3, padding=1), (1, 16, 2), (9, 2, 3))
    assert "order=" in repr(c) and "layout='rows'" in repr(c)


def test_dense_basis_with_conv_weight_forms_theta() -> None:
    a = torch.randn(9, 16, 16, dtype=D64)
    w = torch.randn(6, 2, 3, 3, dtype=D64)
    x = torch.randn(2, 16, 4, dtype=D64)
    expected = torch.einsum("kmn,bmp,kpq->bnq", a, x, ConvWeight(w, groups=2).full())
    for order in explain(a, x, ConvWeight(w, groups=2)).orders:
        torch.testing.assert_close(conv(a, x, ConvWeight(w, groups=2), order=order), expected)


def test_conv_weight_is_checked() -> None:
    with pytest.raises(ValueError, match="groups must be a positive integer"):
        ConvWeight(torch.randn(4, 2, 3, 3), groups=0)
    with pytest.raises(ValueError, match="divisible by groups=3"):
        ConvWeight(torch.randn(4, 2, 3, 3), groups=3)
    with pytest.raises(ValueError, match=r"weight must have shape \(Q, P/G, k_1, ..., k_d\)"):
        ConvWeight(torch.randn(4, 2))


def test_grouped_layer_equals_torch_through_every_order() -> None:
    torch.manual_seed(3)
    ref = torch.nn.Conv2d(4, 8, 3, padding=1, groups=4)
    x = torch.randn(2, 4, 6, 6)
    for order in ("auto", "native", "ax", "xtheta", "atheta"):
        ours = sc.nn.GridConv2d(4, 8, 3, padding=1, groups=4, order=order)
        ours.load_state_dict(ref.state_dict())
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5, msg=order)
    assert F.conv2d is not None


def test_a_keyed_run_is_the_call() -> None:
    """``run_keyed`` (a layer that keyed its contraction by what the call compares) gives the call's result."""
    torch.manual_seed(4)
    ref = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    c = contraction(grid_basis((6, 6), 3, padding=1), x, ConvWeight(ref.weight), layout="channels_first")
    first = c.run_keyed(x, ref.weight, ref.bias)  # the first call verifies
    torch.testing.assert_close(first, ref(x))
    torch.testing.assert_close(c.run_keyed(x, ref.weight, ref.bias), c(x, ref.weight, bias=ref.bias))
    other = torch.randn_like(ref.weight)  # another parameter is compared, then read
    torch.testing.assert_close(c.run_keyed(x, other, None), F.conv2d(x, other, padding=1))
    with pytest.raises(ValueError, match="theta's arrays must have shapes"):
        c.run_keyed(x, torch.randn(4, 3, 2, 2), None)


@pytest.mark.parametrize("make", ["grid-native", "grid-ax", "gcn"])
def test_a_layer_refuses_a_bias_or_weight_changed_after_its_first_call(make: str) -> None:
    """The keyed run compares the parameter and the bias on every call, as the first call did."""
    from structconv.nn import GCNConv, GridConv2d

    if make == "gcn":
        layer: torch.nn.Module = GCNConv(3, 4)
        args: tuple[Any, ...] = (torch.randn(5, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]))
        weight = "weight"
    else:
        layer = GridConv2d(3, 4, 3, padding=1, order=make.removeprefix("grid-"))
        args, weight = (torch.randn(2, 3, 6, 6),), "weight"
    layer(*args)
    saved = layer.bias
    layer.bias = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="bias must have shape"):
        layer(*args)
    layer.bias = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="bias must have shape"):
        layer(*args)
    layer.bias = saved
    param = getattr(layer, weight)
    param.data = param.data[..., :1] if make == "gcn" else param.data[:, :, :1, :1]
    with pytest.raises(ValueError, match="theta"):
        layer(*args)
