"""Grid bases against torch's own convolutions and pooling, and the laws of shift matrices."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from conftest import cuda, memory_budget
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F  # noqa: N812

from structconv import DenseBasis, GridBasis, apply_shifts, avg_pool_basis, conv, explain, grid_basis, shift_matrix

ORDERS = ("native", "ax", "xtheta")
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def to_bmp(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).transpose(1, 2)


def to_theta(weight: torch.Tensor) -> torch.Tensor:
    return weight.flatten(2).permute(2, 1, 0)


def from_bnq(y: Any, like_shape: tuple[int, ...]) -> torch.Tensor:
    y = torch.as_tensor(y)
    return y.transpose(1, 2).reshape(like_shape)


def torch_pad(x: torch.Tensor, before: tuple[int, ...], after: tuple[int, ...], mode: str) -> torch.Tensor:
    if mode == "circular":  # F.pad refuses to wrap more than once; index modulo the size instead
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            size = x.shape[2 + i]
            x = x.index_select(2 + i, torch.arange(-b, size + a) % size)
        return x
    pads: list[int] = []
    for b, a in zip(reversed(before), reversed(after), strict=True):
        pads += [b, a]
    return F.pad(x, pads, mode=mode) if mode == "circular" else F.pad(x, pads)


@st.composite
def conv_cases(draw: Any, boundary: str = "zero") -> dict[str, Any]:
    d = draw(st.integers(1, 3))
    grid = tuple(draw(st.integers(1, 7 if d < 3 else 5)) for _ in range(d))
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(d))
    stride = tuple(draw(st.integers(1, 3)) for _ in range(d))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(d))
    extent = tuple(dl * (k - 1) + 1 for k, dl in zip(kernel, dilation, strict=True))
    style = draw(st.sampled_from(["int", "tuple", "pairs", "same", "valid"]))
    if style == "same":
        stride = (1,) * d
    cap = grid if boundary == "periodic" else tuple(e + 1 for e in extent)
    if style == "int":
        padding: Any = draw(st.integers(0, min(cap)))
    elif style == "tuple":
        padding = tuple(draw(st.integers(0, c)) for c in cap)
    elif style == "pairs":
        padding = tuple((draw(st.integers(0, c)), draw(st.integers(0, c))) for c in cap)
    else:
        padding = style
    before, after = _pads(padding, extent, d)
    for g, b, a, e in zip(grid, before, after, extent, strict=True):
        if g + b + a < e:
            padding, before, after = tuple((e, e) for e in extent), extent, extent
            if boundary == "periodic" and any(e > g for e, g in zip(extent, grid, strict=True)):
                kernel, dilation, extent = (1,) * d, (1,) * d, (1,) * d
                padding, before, after = 0, (0,) * d, (0,) * d
            break
    seed = draw(st.integers(0, 2**31))
    return {
        "d": d,
        "grid": grid,
        "kernel": kernel,
        "stride": stride,
        "dilation": dilation,
        "padding": padding,
        "before": before,
        "after": after,
        "B": draw(st.integers(1, 3)),
        "P": draw(st.integers(1, 4)),
        "Q": draw(st.integers(1, 4)),
        "seed": seed,
    }


def _pads(padding: Any, extent: tuple[int, ...], d: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if padding == "valid":
        return (0,) * d, (0,) * d
    if padding == "same":
        before = tuple((e - 1) // 2 for e in extent)
        return before, tuple(e - 1 - b for e, b in zip(extent, before, strict=True))
    if isinstance(padding, int):
        return (padding,) * d, (padding,) * d
    if isinstance(padding[0], tuple):
        return tuple(p[0] for p in padding), tuple(p[1] for p in padding)
    return tuple(padding), tuple(padding)


def torch_reference(c: dict[str, Any], x: torch.Tensor, weight: torch.Tensor, boundary: str) -> torch.Tensor:
    xp = torch_pad(x, c["before"], c["after"], "circular" if boundary == "periodic" else "zeros")
    return CONV[c["d"]](xp, weight, stride=c["stride"], dilation=c["dilation"])


def tensors(c: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(c["seed"])
    x = torch.randn(c["B"], c["P"], *c["grid"], generator=g, dtype=torch.float64)
    weight = torch.randn(c["Q"], c["P"], *c["kernel"], generator=g, dtype=torch.float64)
    return x, weight


def build(c: dict[str, Any], boundary: str, like: Any) -> GridBasis:
    return grid_basis(
        c["grid"],
        c["kernel"],
        stride=c["stride"],
        padding=c["padding"],
        dilation=c["dilation"],
        boundary=boundary,
        like=like,
    )


@pytest.mark.parametrize("boundary", ["zero", "periodic"])
@given(data=st.data())
def test_every_path_equals_torch_convolution(boundary: str, data: Any) -> None:
    c = data.draw(conv_cases(boundary))
    x, weight = tensors(c)
    ref = torch_reference(c, x, weight, boundary)
    A = build(c, boundary, x)
    assert A.shape == (math.prod(c["kernel"]), math.prod(c["grid"]), math.prod(ref.shape[2:]))
    assert A.out_grid == tuple(ref.shape[2:])
    xb, theta = to_bmp(x), to_theta(weight)
    for order in (*ORDERS, "atheta", "auto"):
        y = conv(A, xb, theta, order=order)
        torch.testing.assert_close(from_bnq(y, ref.shape), ref, msg=f"order={order}")
    torch.testing.assert_close(from_bnq(conv(A.to_sparse(), xb, theta), ref.shape), ref, msg="sparse")
    torch.testing.assert_close(from_bnq(conv(DenseBasis(A.to_dense()), xb, theta), ref.shape), ref, msg="dense")
    # The NumPy path (no torch inside) equals the torch path.
    An = build(c, boundary, None)
    for order in ("ax", "xtheta", "auto"):
        yn = conv(An, xb.numpy().copy(), theta.numpy().copy(), order=order)
        np.testing.assert_allclose(from_bnq(yn, ref.shape).numpy(), ref.numpy(), rtol=1e-9, atol=1e-9)


@given(
    d=st.integers(1, 3),
    taps=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    stride=st.integers(1, 2),
    padding=st.sampled_from(["same", 0, 1]),
)
def test_irregular_offsets_equal_a_zero_filled_box_kernel(
    d: int, taps: int, seed: int, stride: int, padding: Any
) -> None:
    rng = np.random.default_rng(seed)
    box = tuple(int(v) for v in rng.integers(1, 5, size=d))
    cells = rng.choice(math.prod(box), size=min(taps, math.prod(box)), replace=False)
    offsets = np.stack(np.unravel_index(cells, box), 1) - 1  # any origin: only positions matter
    grid = tuple(int(v) for v in rng.integers(4, 8, size=d))
    if padding == "same":
        stride = 1
    x = torch.from_numpy(rng.normal(size=(2, 3, *grid)))
    theta = torch.from_numpy(rng.normal(size=(len(cells), 3, 2)))
    A = grid_basis(grid, stride=stride, padding=padding, offsets=offsets, like=x)
    rel = offsets - offsets.min(0)
    extent = tuple(int(v) + 1 for v in rel.max(0))
    weight = torch.zeros(2, 3, *extent, dtype=torch.float64)
    for j, pos in enumerate(rel):
        weight[(slice(None), slice(None), *pos)] = theta[j].T
    before, after = _pads(padding, extent, d)
    ref = CONV[d](torch_pad(x, before, after, "zeros"), weight, stride=stride)
    for order in (*ORDERS, "auto"):
        torch.testing.assert_close(from_bnq(conv(A, to_bmp(x), theta, order=order), ref.shape), ref)


@given(
    d=st.integers(1, 3),
    seed=st.integers(0, 2**31),
    count_include_pad=st.booleans(),
    ceil_mode=st.booleans(),
    data=st.data(),
)
def test_average_pooling_equals_torch(d: int, seed: int, count_include_pad: bool, ceil_mode: bool, data: Any) -> None:
    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(d))
    stride = tuple(data.draw(st.integers(1, 3)) for _ in range(d))
    padding = tuple(data.draw(st.integers(0, k // 2)) for k in kernel)
    grid = tuple(data.draw(st.integers(k, k + 5)) for k in kernel)
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(2, 3, *grid)))
    ref = POOL[d](x, kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    A = avg_pool_basis(
        grid, kernel, stride=stride, padding=padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad, like=x
    )
    for method in ("native", "shift"):
        y = apply_shifts(A, to_bmp(x), order=method)[:, 0]
        torch.testing.assert_close(from_bnq(y, ref.shape), ref, msg=method)
    # Through the engine with Θ = I it is the same (and so is the NumPy basis).
    eye = torch.eye(3, dtype=torch.float64)[None]
    torch.testing.assert_close(from_bnq(conv(A, to_bmp(x), eye), ref.shape), ref)
    An = avg_pool_basis(
        grid, kernel, stride=stride, padding=padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad
    )
    yn = apply_shifts(An, to_bmp(x).numpy().copy())[:, 0]
    np.testing.assert_allclose(from_bnq(yn, ref.shape).numpy(), ref.numpy(), atol=1e-12)


@given(d=st.integers(1, 3), seed=st.integers(0, 2**31), data=st.data())
def test_shift_matrix_is_definition_1(d: int, seed: int, data: Any) -> None:
    grid = tuple(data.draw(st.integers(1, 4)) for _ in range(d))
    shift = tuple(data.draw(st.integers(-4, 4)) for _ in range(d))
    periodic = data.draw(st.booleans())
    A = shift_matrix(grid, shift, boundary="periodic" if periodic else "zero").to_dense()[0]
    positions = list(np.ndindex(*grid))
    expected = np.zeros((len(positions), len(positions)))
    for m, pm in enumerate(positions):
        for n, pn in enumerate(positions):
            diff = np.subtract(pn, pm)
            if periodic:
                diff = np.mod(diff - shift, grid)
                expected[m, n] = float(not diff.any())
            else:
                expected[m, n] = float(tuple(diff) == shift)
    np.testing.assert_array_equal(A, expected)


@given(d=st.integers(1, 3), data=st.data())
def test_periodic_shift_matrices_compose_by_adding_shifts(d: int, data: Any) -> None:
    grid = tuple(data.draw(st.integers(1, 5)) for _ in range(d))
    s1 = tuple(data.draw(st.integers(-5, 5)) for _ in range(d))
    s2 = tuple(data.draw(st.integers(-5, 5)) for _ in range(d))
    A1 = shift_matrix(grid, s1, boundary="periodic").to_dense()[0]
    A2 = shift_matrix(grid, s2, boundary="periodic").to_dense()[0]
    A12 = shift_matrix(grid, tuple(a + b for a, b in zip(s1, s2, strict=True)), boundary="periodic").to_dense()[0]
    np.testing.assert_array_equal(A1 @ A2, A12)


@given(data=st.data())
def test_periodic_grid_convolution_is_shift_equivariant(data: Any) -> None:
    c = data.draw(conv_cases("periodic"))
    if data.draw(st.booleans()):  # make sure the law's condition is often met
        c.update(stride=(1,) * c["d"], padding="same", before=None, after=None)
        c["kernel"] = tuple(min(k, g) for k, g in zip(c["kernel"], c["grid"], strict=True))
        c["dilation"] = (1,) * c["d"]
    x, weight = tensors(c)
    A = build(c, "periodic", x)
    t = tuple(data.draw(st.integers(-3, 3)) for _ in range(c["d"]))
    dims = tuple(range(2, 2 + c["d"]))
    # Rolling the input by stride * t rolls the output by t.
    x_rolled = torch.roll(x, tuple(s * v for s, v in zip(c["stride"], t, strict=True)), dims)
    out_shape = (c["B"], c["Q"], *A.out_grid)

    def run(inp: torch.Tensor) -> torch.Tensor:
        return from_bnq(conv(A, to_bmp(inp), to_theta(weight), order="ax"), out_shape)

    # The law holds when the outputs tile the whole torus (output grid x stride = grid).
    if all(o * s == g for o, s, g in zip(A.out_grid, c["stride"], c["grid"], strict=True)):
        torch.testing.assert_close(run(x_rolled), torch.roll(run(x), t, dims))


@pytest.mark.parametrize("order", [*ORDERS, "atheta", "sparse"])
@pytest.mark.parametrize("case", ["same", "strided", "periodic", "weighted"])
def test_gradcheck(order: str, case: str) -> None:
    torch.manual_seed(0)
    grid = (4, 3)
    x = torch.randn(1, 12, 2, dtype=torch.float64, requires_grad=True)
    theta = torch.randn(9, 2, 2, dtype=torch.float64, requires_grad=True)
    if case == "same":
        A = grid_basis(grid, 3, padding="same", like=x)
    elif case == "strided":
        A = grid_basis(grid, 3, stride=2, dilation=(1, 2), padding=(2, 1), like=x)
    elif case == "periodic":
        A = grid_basis(grid, 3, padding=1, boundary="periodic", like=x)
    else:
        base = grid_basis(grid, 3, padding=1, like=x)
        w = torch.randn(9, 9, dtype=torch.float64, requires_grad=True)
        g = base.geometry
        A = GridBasis(g.grid, g.out_grid, g.offsets, stride=g.stride, weights=w)

    def f(x: torch.Tensor, theta: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        basis = A
        if rest:
            basis = GridBasis(A.grid, A.out_grid, A.offsets, stride=A.stride, weights=rest[0])
        if order == "sparse":
            return conv(basis.to_sparse(), x, theta)
        return conv(basis, x, theta, order=order)

    inputs = (x, theta) + ((w,) if case == "weighted" else ())
    assert torch.autograd.gradcheck(f, inputs)
    # Double backward too (issue 14: the fused ax / xtheta backward passes were once-differentiable).
    assert torch.autograd.gradgradcheck(f, inputs)


def test_module_loads_a_trained_conv2d_state_dict() -> None:
    from structconv.nn import GridConv2d

    torch.manual_seed(0)
    ref = torch.nn.Conv2d(3, 6, 3, stride=2, padding=1, dilation=1)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(5):  # a few real training steps, so the weights are not the initial ones
        x = torch.randn(8, 3, 12, 12)
        loss = (ref(x) - 1.0).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    layer = GridConv2d(3, 6, 3, stride=2, padding=1)
    assert set(layer.state_dict()) == set(ref.state_dict())
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 12, 12)
    for order in ("auto", "ax", "xtheta"):
        layer.order = order
        torch.testing.assert_close(layer(x), ref(x), atol=1e-5, rtol=1e-5)
    # And back: the torch layer accepts ours.
    back = torch.nn.Conv2d(3, 6, 3, stride=2, padding=1)
    back.load_state_dict(layer.state_dict())
    torch.testing.assert_close(back(x), ref(x))


@pytest.mark.parametrize(
    ("ndim", "kwargs"),
    [
        (1, {"kernel_size": 4, "padding": "same", "dilation": 2}),
        (1, {"kernel_size": 3, "stride": 2, "padding": 2, "bias": False}),
        (2, {"kernel_size": (3, 2), "padding": (1, 0), "stride": (1, 2)}),
        (2, {"kernel_size": 3, "padding": 1, "padding_mode": "circular"}),
        (2, {"kernel_size": 2, "padding": "valid"}),
        (3, {"kernel_size": 3, "padding": 1, "stride": 2}),
        (3, {"kernel_size": (1, 2, 3), "padding": "same", "padding_mode": "circular"}),
    ],
)
def test_modules_match_torch_layers(ndim: int, kwargs: dict[str, Any]) -> None:
    from structconv import nn as snn

    torch.manual_seed(1)
    ref = getattr(torch.nn, f"Conv{ndim}d")(3, 4, **kwargs)
    layer = getattr(snn, f"GridConv{ndim}d")(3, 4, **kwargs)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, *([7] * ndim))
    torch.testing.assert_close(layer(x), ref(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer(x[0]), ref(x[0]), atol=1e-5, rtol=1e-5)  # unbatched


def test_module_initialisation_matches_torch_distribution() -> None:
    from structconv.nn import GridConv2d

    torch.manual_seed(0)
    ours = GridConv2d(16, 32, 3)
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(16, 32, 3)
    torch.testing.assert_close(ours.weight, ref.weight)
    torch.testing.assert_close(ours.bias, ref.bias)


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False},
        {"kernel_size": 3, "stride": 2, "padding": 1, "divisor_override": 5},
    ],
)
def test_pool_modules_match_torch(ndim: int, kwargs: dict[str, Any]) -> None:
    from structconv import nn as snn

    if ndim == 1:  # torch.nn.AvgPool1d has no divisor_override
        kwargs = {k: v for k, v in kwargs.items() if k != "divisor_override"}
    ref = getattr(torch.nn, f"AvgPool{ndim}d")(**kwargs)
    x = torch.randn(2, 3, *([6] * ndim))
    for method in ("auto", "shift"):
        layer = getattr(snn, f"AvgPool{ndim}d")(order=method, **kwargs)
        torch.testing.assert_close(layer(x), ref(x))
        torch.testing.assert_close(layer(x[0]), ref(x[0]))  # unbatched, as torch takes it


def test_auto_runs_native_on_torch_and_a_shift_order_on_numpy() -> None:
    x = torch.randn(4, 64, 8, dtype=torch.float64)
    theta = torch.randn(9, 8, 16, dtype=torch.float64)
    assert explain(grid_basis((8, 8), 3, padding=1, like=x), x, theta).chosen == "native"
    chosen = explain(grid_basis((8, 8), 3, padding=1), x.numpy(), theta.numpy()).chosen
    assert chosen in ("ax", "xtheta")
    with pytest.raises(ValueError, match="order='native' is not valid"):
        conv(grid_basis((8, 8), 3, padding=1), x.numpy(), theta.numpy(), order="native")


def test_memory_does_not_grow_with_the_grid_and_no_path_densifies(monkeypatch: Any) -> None:
    small = grid_basis((32, 32), 3, padding=1)
    large = grid_basis((512, 512), 3, padding=1)
    assert small.nbytes() == large.nbytes() == 9 * 2 * 8
    x = torch.randn(2, 32 * 32, 4)
    theta = torch.randn(9, 4, 5)
    A = grid_basis((32, 32), 3, padding=1, like=x)
    ref = conv(A, x, theta, order="native")

    def boom(self: Any) -> Any:
        raise AssertionError("densified")

    monkeypatch.setattr(GridBasis, "to_dense", boom)
    for order in ("ax", "xtheta"):
        torch.testing.assert_close(conv(A, x, theta, order=order), ref)
    torch.testing.assert_close(A.apply_each(x).shape, torch.Size([2, 9, 1024, 4]))


def test_value_operations() -> None:
    rng = np.random.default_rng(0)
    A = grid_basis((5, 6), 3, stride=2, padding=1)
    dense = A.to_dense()
    np.testing.assert_array_equal(A.T.to_dense(), np.swapaxes(dense, 1, 2))
    sub = A[[4, 0, 8]]
    assert isinstance(sub, GridBasis)
    np.testing.assert_array_equal(sub.to_dense(), dense[[4, 0, 8]])
    assert A.energy() == pytest.approx(float((dense**2).sum()) / A.N)
    x, theta = rng.normal(size=(2, 30, 3)), rng.normal(size=(3, 3, 2))
    np.testing.assert_allclose(conv(sub, x, theta), np.einsum("kmn,bmp,kpq->bnq", dense[[4, 0, 8]], x, theta))
    At = A.to(dtype=np.float32)
    assert At.dtype == np.float32
    torch_basis = grid_basis((5, 6), 3, like=torch.zeros(1)).to(dtype=torch.float64)
    assert torch_basis.dtype == torch.float64 and torch_basis.backend == "torch"
    # apply_members equals the dense einsum, reduced or not.
    s = rng.normal(size=(2, 9, 30, 4))
    np.testing.assert_allclose(A.apply_members(s, reduce=False), np.einsum("kmn,bkmc->bknc", dense, s))
    np.testing.assert_allclose(A.apply_members(s, reduce=True), np.einsum("kmn,bkmc->bnc", dense, s))


@cuda
@pytest.mark.parametrize("order", [*ORDERS, "auto"])
def test_cuda_paths_equal_cpu(order: str) -> None:
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    weight = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    ref = F.conv2d(x, weight, padding=1)
    xc, wc = x.cuda(), weight.cuda()
    A = grid_basis((9, 9), 3, padding=1, like=xc)
    y = conv(A, to_bmp(xc), to_theta(wc), order=order)
    torch.testing.assert_close(from_bnq(y.cpu(), ref.shape), ref)


def test_sparse_form_stores_one_entry_per_in_grid_tap() -> None:
    A = grid_basis((6, 5), 3, padding=1)
    sparse = A.to_sparse()
    assert sparse.nnz == int(A.geometry.valid_counts.sum())
    np.testing.assert_array_equal(sparse.to_dense(), A.to_dense())


def _einsum_reference(A: GridBasis, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    dense = torch.as_tensor(A.to_sparse().to_dense())
    return torch.einsum("kmn,bmp,kpq->bnq", dense, x, theta)


@pytest.mark.parametrize("shift", [-6, -5, -4, 4, 5, 6])
def test_windows_wholly_outside_the_grid_read_zeros(shift: int) -> None:
    x = torch.randn(1, 4, 2, dtype=torch.float64)
    theta = torch.randn(1, 2, 3, dtype=torch.float64)
    A = shift_matrix(4, shift, like=x)
    for order in (*ORDERS, "auto"):
        torch.testing.assert_close(conv(A, x, theta, order=order), _einsum_reference(A, x, theta))
    B = grid_basis(4, 3, dilation=5, padding=5, like=x)[2]
    torch.testing.assert_close(conv(B, x, theta), _einsum_reference(B, x, theta))
    torch.testing.assert_close(apply_shifts(B, x), apply_shifts(B, x, order="shift"))


def test_repeated_taps_add_up_on_every_path() -> None:
    x = torch.randn(1, 16, 2, dtype=torch.float64)
    theta = torch.randn(2, 2, 3, dtype=torch.float64)
    A = grid_basis((4, 4), 3, padding=1, like=x)[[4, 4]]
    for order in (*ORDERS, "auto"):
        torch.testing.assert_close(conv(A, x, theta, order=order), _einsum_reference(A, x, theta))
    torch.testing.assert_close(apply_shifts(A, x), apply_shifts(A, x, order="shift"))


def test_equal_learnable_tap_weights_get_their_own_gradients() -> None:
    x = torch.randn(2, 25, 3, dtype=torch.float64)
    base = grid_basis((5, 5), 3, padding=1, like=x)
    grads = []
    for method in ("auto", "shift"):
        w = torch.full((1, 9), 0.5, dtype=torch.float64, requires_grad=True)
        A = GridBasis(base.grid, base.out_grid, base.offsets, weights=w)
        apply_shifts(A, x, order=method).pow(2).sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_shift_gemm_under_autocast() -> None:
    x, theta = torch.randn(2, 64, 4), torch.randn(9, 4, 5)
    A = grid_basis((8, 8), 3, padding=1, like=x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(A, x, theta, order="ax")
    torch.testing.assert_close(y.float(), conv(A, x, theta, order="native"), atol=0.1, rtol=0.05)


def test_layers_follow_changed_settings_and_numpy_integers() -> None:
    from structconv.nn import GridConv2d

    layer = GridConv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 8, 8)
    assert layer(x).shape == (1, 3, 8, 8)
    layer.stride = (2, 2)
    assert layer(x).shape == (1, 3, 4, 4)
    assert grid_basis(np.int64(8), np.int64(3), stride=np.int64(2)).out_grid == (3,)


@given(
    d=st.integers(1, 3),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    dilation=st.integers(1, 2),
    padding=st.sampled_from([0, 1, 2, "same", "valid"]),
    circular=st.booleans(),
    batch=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_layers_direct_native_route_equals_the_engine_and_torch(
    d: int, kernel: int, stride: int, dilation: int, padding: Any, circular: bool, batch: int, seed: int
) -> None:
    """The layer runs the planner's order through its compiled contraction; it equals ``conv`` and torch's layer."""
    from structconv import nn as snn

    if padding == "same":
        stride = 1
    mode = "circular" if circular and padding not in ("same", "valid") else "zeros"
    kw = {"stride": stride, "dilation": dilation, "padding": padding, "padding_mode": mode, "dtype": torch.float64}
    torch.manual_seed(seed)
    ref = getattr(torch.nn, f"Conv{d}d")(2, 3, kernel, **kw)
    layer = getattr(snn, f"GridConv{d}d")(2, 3, kernel, **kw)
    layer.load_state_dict(ref.state_dict())
    size = dilation * (kernel - 1) + 3
    x = torch.randn(max(batch, 1), 2, *([size] * d), dtype=torch.float64, requires_grad=True)
    y = layer(x)
    basis = layer.basis(tuple(x.shape[2:]), x)
    (compiled,) = (run[2] for run in layer._runs.values())
    assert compiled.order == explain(basis, to_bmp(x), layer.theta()).chosen, "the layer must run the engine's plan"
    expected = ref(x)
    torch.testing.assert_close(y, expected)
    gy = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, layer.weight, layer.bias), gy)
    theirs = torch.autograd.grad(expected, (x, ref.weight, ref.bias), gy)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
    via_engine = conv(basis, to_bmp(x), to_theta(layer.weight), order="ax")
    via_engine = from_bnq(via_engine, tuple(y.shape)) + layer.bias.reshape(-1, *([1] * d))
    torch.testing.assert_close(y, via_engine)


def test_layer_native_order_under_autocast_and_dtype_errors() -> None:
    from structconv.nn import GridConv2d

    torch.manual_seed(0)
    ref = torch.nn.Conv2d(4, 5, 3, padding=1)
    layer = GridConv2d(4, 5, 3, padding=1)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, expected = layer(x), ref(x)
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected)
    (compiled,) = (run[2] for run in layer._runs.values())
    assert compiled.order == "native"  # a 3x3 box kernel: the planner's native order, in the autocast dtype
    with pytest.raises(TypeError, match="dtype"):
        layer(x.double())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, np.float32, np.float64])
def test_a_basis_of_offsets_alone_applies_to_any_float_array(dtype: Any) -> None:
    """Issue 14: ``grid_basis`` without ``like`` runs on the array it is applied to (README's example)."""
    rng = np.random.default_rng(0)
    x64, w64 = rng.normal(size=(2, 3, 6, 5)), rng.normal(size=(4, 3, 3, 3))
    ref = F.conv2d(torch.from_numpy(x64), torch.from_numpy(w64), padding=1).numpy()
    A = grid_basis((6, 5), 3, padding=1)  # NumPy float64 by default, but it holds offsets only
    assert A.placement_free
    x: Any
    if isinstance(dtype, torch.dtype):
        x, w = torch.from_numpy(x64).to(dtype), torch.from_numpy(w64).to(dtype)
        xb, theta = to_bmp(x), to_theta(w)
    else:
        x, w = x64.astype(dtype), w64.astype(dtype)
        xb, theta = x.reshape(2, 3, 30).swapaxes(1, 2), w.reshape(4, 3, 9).transpose(2, 1, 0)
    tol = 0.1 if dtype == torch.bfloat16 else 1e-4
    orders = ("auto", "ax", "xtheta") + (("native",) if isinstance(x, torch.Tensor) else ())
    for order in orders:
        y = conv(A, xb, theta, order=order)
        assert type(y) is type(x) and y.dtype == x.dtype
        got = torch.as_tensor(y).double().numpy().swapaxes(1, 2).reshape(ref.shape)
        np.testing.assert_allclose(got, ref, atol=tol * np.abs(ref).max(), err_msg=order)
    assert explain(A, xb, theta).chosen in (*ORDERS, "atheta")
    # apply_shifts adapts likewise; a basis with tap weights keeps its placement and refuses.
    assert apply_shifts(A, xb).dtype == x.dtype
    weighted = GridBasis(A.grid, A.out_grid, A.offsets, weights=np.ones((1, 9)))
    assert not weighted.placement_free and weighted.placed_like(xb) is weighted
    if dtype != np.float64:
        with pytest.raises(TypeError, match=r"dtype|backend"):
            conv(weighted, xb, theta[:1])


def test_an_integer_like_is_refused() -> None:
    for like in (torch.zeros(1, dtype=torch.int64), np.zeros(1, dtype=np.int64), torch.zeros(1, dtype=torch.bool)):
        with pytest.raises(TypeError, match="like must hold floating-point numbers"):
            grid_basis((4, 4), 3, like=like)
        with pytest.raises(TypeError, match="like must hold floating-point numbers"):
            avg_pool_basis((4, 4), 2, like=like)


def test_explicit_column_scale() -> None:
    """``scale`` is :math:`c_n`: every path, the sparse form and the value operations apply it."""
    x = torch.randn(2, 12, 3, dtype=torch.float64)
    A = avg_pool_basis((4, 3), 2, stride=1, padding=1, like=x, ceil_mode=True)
    c = torch.linspace(0.5, 2.0, A.N, dtype=torch.float64)
    g = A.geometry
    S = GridBasis(g.grid, g.out_grid, g.offsets, stride=g.stride, weights=A.tap_weights(), scale=c)
    assert A.scale is None  # stride 1: no window overhangs, the plain mean
    dense = torch.as_tensor(A.to_dense())
    torch.testing.assert_close(torch.as_tensor(S.to_dense()), dense * c)
    for method in ("native", "shift"):
        torch.testing.assert_close(apply_shifts(S, x, order=method)[:, 0], torch.einsum("mn,bmc->bnc", dense[0] * c, x))
    assert S.to(dtype=torch.float32).scale.dtype == torch.float32 and S[[0]].scale is c
    assert not S.placement_free and S.nbytes() == A.nbytes() + c.numel() * 8
    with pytest.raises(ValueError, match=r"scale must be a torch array of shape \(20,\)"):
        GridBasis(g.grid, g.out_grid, g.offsets, stride=g.stride, weights=A.tap_weights(), scale=c[:3])
    with pytest.raises(ValueError, match="normalize=True or an explicit scale"):
        GridBasis(g.grid, g.out_grid, g.offsets, stride=g.stride, weights=A.tap_weights(), normalize=True, scale=c)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    grid=st.lists(st.integers(2, 5), min_size=1, max_size=3),
    taps=st.integers(1, 6),
    normalize=st.booleans(),
    boundary=st.sampled_from(["zero", "periodic"]),
)
def test_weighted_taps_run_as_depthwise_convolutions_equal_to_the_gathered_taps(
    seed: int, grid: list[int], taps: int, normalize: bool, boundary: str
) -> None:
    # A one-member basis with tap weights (a truncated Gaussian head) runs as a native depthwise
    # convolution in apply_each and apply_members; the dense basis is the reference.
    rng = np.random.default_rng(seed)
    d = len(grid)
    # The centre tap keeps every window on the grid (a normalised basis refuses empty windows).
    offsets = np.unique(np.vstack([np.zeros((1, d), dtype=np.int64), rng.integers(-2, 3, size=(taps, d))]), axis=0)
    weights = torch.tensor(rng.random((1, len(offsets))) + 0.1, dtype=torch.float64, requires_grad=True)
    basis = GridBasis(grid, grid, offsets, boundary=boundary, weights=weights, normalize=normalize)
    dense = DenseBasis(basis.to_dense().detach())
    x = torch.tensor(rng.normal(size=(2, basis.M, 3)), dtype=torch.float64, requires_grad=True)
    expected = torch.einsum("kmn,bmc->bknc", dense.array, x)
    torch.testing.assert_close(basis.apply_each(x), expected)
    torch.testing.assert_close(basis.apply_members(x[:, None], reduce=True), expected[:, 0])
    torch.testing.assert_close(basis.apply_members(x[:, None], reduce=False), expected)
    theta = torch.randn(1, 3, 2, dtype=torch.float64)
    for order in ("ax", "xtheta"):
        torch.testing.assert_close(conv(basis, x, theta, order=order), conv(dense, x, theta))
    # The tap weights' gradient through the depthwise kernel (x enters linearly, checked above).
    xs = x.detach()

    def heads(w: torch.Tensor) -> torch.Tensor:
        return GridBasis(grid, grid, offsets, boundary=boundary, weights=w, normalize=normalize).apply_each(xs)  # type: ignore[no-any-return]

    assert torch.autograd.gradcheck(heads, (weights,))


@pytest.mark.parametrize(
    ("builder", "args", "kwargs", "message"),
    [
        (grid_basis, ((8, 8), (30000, 30000)), {}, "kernel spans 30000 entries along grid dimension 0"),
        (grid_basis, (8, 10**10), {}, "kernel spans 10000000000 entries"),
        (grid_basis, ((8,), 3), {"dilation": 10**12}, "kernel spans 2000000000001 entries"),
        (grid_basis, ((30000, 30000), (30000, 30000)), {}, "900,000,000 positions; its tap table would need 13.4 GiB"),
        (avg_pool_basis, (8, 10**10), {}, "kernel spans 10000000000 entries"),
        (avg_pool_basis, (8, 10**10), {"ceil_mode": True}, "74.5 GiB"),
    ],
)
def test_builders_refuse_sizes_before_allocating(builder: Any, args: Any, kwargs: Any, message: str) -> None:
    """A kernel larger than the grid, or one with implausibly many taps, is refused from its sizes alone."""
    with memory_budget(0.5), pytest.raises(ValueError, match=message):
        builder(*args, **kwargs)


@pytest.mark.parametrize(
    ("grid", "d", "error", "message"),
    [
        (3, 2.5, TypeError, "d must be an int or a sequence of ints, got float"),
        ((3, 3), (1, 2.0), TypeError, "d must hold integers, got 2.0"),
        ((3, 3), 1, ValueError, "d must have one entry per grid dimension"),
    ],
)
def test_shift_matrix_refuses_offsets_that_are_not_integers(grid: Any, d: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        shift_matrix(grid, d)


def test_cpu_bfloat16_3d_shift_kernels_survive_torchs_strided_conv3d() -> None:
    """torch's CPU bfloat16 conv3d returns wrong values for a (1, 1, 4) kernel, stride 4, on a 2x3x5 grid."""
    x = torch.randn(3, 1, 2, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = F.avg_pool3d(x, (1, 1, 4))
    A = avg_pool_basis((2, 3, 5), (1, 1, 4), like=x.to(torch.bfloat16))
    y = apply_shifts(A, x.to(torch.bfloat16).flatten(2).transpose(1, 2), order="shift")[:, 0]
    torch.testing.assert_close(y.double().transpose(1, 2).reshape(ref.shape), ref, rtol=0, atol=2e-2)


@pytest.mark.parametrize(
    ("builder", "kwargs", "message"),
    [
        (grid_basis, {"kernel": 1, "padding": 2**64}, r"padding must be at most 2\*\*63 - 1 \(a 64-bit integer\)"),
        (grid_basis, {"kernel": 1, "stride": [2**64]}, r"stride must be at most 2\*\*63 - 1"),
        (avg_pool_basis, {"kernel": 1, "stride": 2**64, "ceil_mode": True}, r"stride must be at most 2\*\*63 - 1"),
        (avg_pool_basis, {"kernel": 1, "stride": 2**64}, r"stride must be at most 2\*\*63 - 1"),
        (shift_matrix, {"d": 2**63}, r"d must be at most 2\*\*63 - 1"),
        (shift_matrix, {"d": -(2**62) - 1}, r"d must be at least -4611686018427387904, got"),  # was "non-negative"
    ],
)
def test_builders_refuse_sizes_beyond_64_bit_integers(builder: Any, kwargs: dict[str, Any], message: str) -> None:
    """A size, stride or padding the int64 tap table cannot hold is refused, naming the argument."""
    with pytest.raises(ValueError, match=message):
        builder((2,), **kwargs)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_conv_modules_refuse_an_input_that_is_not_a_tensor(ndim: int) -> None:
    from structconv import nn as snn

    layer = getattr(snn, f"GridConv{ndim}d")(2, 3, 1)
    x = torch.zeros(1, 2, *([3] * ndim)).tolist()
    with pytest.raises(TypeError, match=rf"GridConv{ndim}d: input must be a torch.Tensor, got list"):
        layer(x)


@pytest.mark.parametrize("builder", [grid_basis, avg_pool_basis])
def test_builders_refuse_a_padded_grid_beyond_64_bit_integers(builder: Any) -> None:
    """Padding within int64 on a grid within int64 may still make a padded grid no int64 index reaches."""
    kwargs = {"padding": 2**63 - 1} if builder is grid_basis else {"padding": 1, "ceil_mode": True}
    grid = (2,) if builder is grid_basis else (2**63 - 2,)
    with pytest.raises(ValueError, match=r"padding .* makes grid dimension 0 .* more than 2\*\*63 - 1"):
        builder(grid, 2, **kwargs)
