"""``structconv.nn`` grid layers against ``torch.nn.Conv{1,2,3}d`` and ``torch.nn.AvgPool{1,2,3}d``, option by option.

Each test is one row of ``docs/peers/torch_grid.rst``: an option of torch's layer (semantics from
its documentation: output sizes, ``padding='same'`` splitting the total with the extra entry
after, ``padding_mode`` framing by ``F.pad`` then a convolution without padding, pooling's
``ceil_mode`` and divisors), where our layer, loaded with torch's ``state_dict``, must give
torch's output and gradients (input and every parameter; float64 and float32 tight, bfloat16
loose), through every order of the engine (``auto``, ``ax``, ``xtheta``), or both layers must
refuse the call with an error (ours names the argument), or the comparison is not applicable
(and what we do instead is checked against an independent reference).  Shapes and options are
drawn by Hypothesis.  The fragment is generated from :data:`CASES`::

    .venv/bin/python tests/peers/test_torch_grid.py > docs/peers/torch_grid.rst
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from peer_table import EQUAL, NA, REFUSED, PeerTable, case_name
from torch.nn import functional as F  # noqa: N812

from structconv import nn as snn
from structconv.testing import compare_to_peer, run_module

TOLERANCES = {  # (rtol, atol relative to the largest reference value)
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 2e-5),
    torch.bfloat16: (0.0, 5e-2),
}
DTYPES = list(TOLERANCES)
ORDERS = ("auto", "ax", "xtheta")
POOL_ORDERS = ("auto", "native", "shift")  # apply_shifts's
POOLS = (snn.AvgPool1d, snn.AvgPool2d, snn.AvgPool3d)
FEW = settings(max_examples=10, deadline=None)


INTRO = (
    ":class:`structconv.nn.GridConv1d`, ``2d``, ``3d`` loaded with the ``state_dict`` of "
    "``torch.nn.Conv{{1,2,3}}d``, and :class:`structconv.nn.AvgPool1d`, ``2d``, ``3d`` against "
    "``torch.nn.AvgPool{{1,2,3}}d`` (torch {version}), option by option, in 1, 2 and 3 dimensions.  "
    "*equal*: the same output and gradients (input and every parameter) through every order of the "
    "engine (``auto``, i.e. native, ``ax`` and ``xtheta``; pooling: native and slicing), in float64 and "
    "float32 (relative 1e-7 and 1e-4), and in bfloat16 within twice torch's own bfloat16 error from the "
    "float64 result plus 5 % of the largest value, on shapes and options drawn by Hypothesis.  "
    "*refused*: both layers raise (ours names the argument).  *n.a.*: the comparison does not apply; "
    "the note says what we do instead, which is tested."
)

TABLE = PeerTable(
    "torch_grid", "test_torch_grid", "Grid layers against torch.nn", INTRO, ("option", "result", "note"), (45, 10, 45)
)


def case(status: str, form: str, note: str = "") -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a test as one row of the fragment."""
    return TABLE.case(form, status, note)


# --- running both layers and comparing them ---------------------------------------------------------
def compare(ref: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype, seed: int = 0) -> None:
    """``ours(x)`` equals ``ref(x)`` (output, input and parameter gradients) through every order.

    :func:`structconv.testing.compare_to_peer` loads ``ref``'s ``state_dict`` and compares.  In
    bfloat16 both layers are measured against torch's layer in float64 on the same rounded
    values: ours must be within twice torch's own error plus 5 % of the largest sum of the terms'
    magnitudes (what rounding scales with: an output that cancels to nearly zero still carries
    the rounding of its terms, e.g. of the x·Θ intermediate, which torch's fused kernel keeps in
    float32).  torch's bfloat16 circular conv once returned NaN on a first call only (CI, seed
    767; not reproducible after): ours is then held to the rounding bound alone (the harness
    counts a peer's error that is not finite as 0).
    """
    rtol, atol = TOLERANCES[dtype]
    ref, ours = ref.to(dtype), ours.to(dtype)
    exact, slack = None, None
    if dtype == torch.bfloat16:
        exact = copy.deepcopy(ref).double()
        absolute = copy.deepcopy(ref).double()
        with torch.no_grad():
            for p in absolute.parameters():
                p.abs_()
        run = run_module(absolute, x.to(dtype).abs(), dtype=torch.float64, seed=seed, absolute=True)
        magnitude = run.named()

        def slack(key: str, truth: Mapping[str, Any]) -> float:
            return atol * (float(magnitude[key].abs().max()) or 1.0)

    orders = POOL_ORDERS if isinstance(ours, POOLS) else ORDERS if hasattr(ours, "order") else ("auto",)
    for order in orders:
        if hasattr(ours, "order"):
            ours.order = order
        compare_to_peer(
            ours, ref, x, dtype=dtype, rtol=rtol, atol=atol, seed=seed, exact=exact, slack=slack,
            name=f"{case_name()}, order={order}",
        )  # fmt: skip


def conv_pair(d: int, seed: int, cin: int, cout: int, kernel: Any, **kwargs: Any) -> tuple[Any, Any]:
    """torch's ``Conv{d}d`` with drawn parameters, and ours loaded from its ``state_dict`` (float64)."""
    torch.manual_seed(seed)
    ref = getattr(torch.nn, f"Conv{d}d")(cin, cout, kernel, dtype=torch.float64, **kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.5)
    ours = getattr(snn, f"GridConv{d}d")(cin, cout, kernel, dtype=torch.float64, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def tensor(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@st.composite
def conv_setup(
    draw: Any,
    stride: bool = False,
    padding: tuple[str, ...] = ("none",),
    dilation: bool = False,
    mode: str = "zeros",
) -> dict[str, Any]:
    """A drawn convolution: ``d``, channels, kernel, options and an input grid that torch accepts."""
    d = draw(st.integers(1, 3))
    k = tuple(draw(st.integers(1, 3)) for _ in range(d))
    dil = tuple(draw(st.integers(1, 2)) for _ in range(d)) if dilation else (1,) * d
    kw: dict[str, Any] = {"padding_mode": mode}
    style = draw(st.sampled_from(padding))
    s = (1,) * d if style == "same" or not stride else tuple(draw(st.integers(1, 3)) for _ in range(d))
    extent = tuple(dl * (kk - 1) + 1 for kk, dl in zip(k, dil, strict=True))
    pad: tuple[int, ...]
    if style == "none":
        pad = (0,) * d
    elif style == "int":
        pad = (draw(st.integers(0, 2)),) * d
        kw["padding"] = pad[0]
    elif style == "tuple":
        pad = tuple(draw(st.integers(0, 2)) for _ in range(d))
        kw["padding"] = pad
    elif style == "same":
        pad = tuple(e - 1 for e in extent)
        kw["padding"] = "same"
    else:
        pad = (0,) * d
        kw["padding"] = "valid"
    # torch's limits: the kernel fits the padded input; reflect and circular pad less than the input.
    lo = tuple(max(e - p if style != "same" else 1, p + 1, 1) for e, p in zip(extent, pad, strict=True))
    grid = tuple(draw(st.integers(g, g + 3)) for g in lo)
    if dilation:
        kw["dilation"] = dil[0] if len(set(dil)) == 1 and draw(st.booleans()) else dil  # int or tuple
    if stride:
        kw["stride"] = s[0] if len(set(s)) == 1 and draw(st.booleans()) else s
    kernel: Any = k[0] if len(set(k)) == 1 and draw(st.booleans()) else k
    return {
        "d": d,
        "kernel": kernel,
        "kw": kw,
        "grid": grid,
        "B": draw(st.integers(1, 3)),
        "P": draw(st.integers(1, 3)),
        "Q": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 2**31)),
    }


def check_conv(c: dict[str, Any], dtype: torch.dtype, **extra: Any) -> None:
    kw = {**c["kw"], **extra}
    ref, ours = conv_pair(c["d"], c["seed"], c["P"], c["Q"], c["kernel"], **kw)
    compare(ref, ours, tensor(c["seed"], c["B"], c["P"], *c["grid"]), dtype, c["seed"])


# --- convolutions: equal ------------------------------------------------------------------------------
@case(EQUAL, "``Conv{1,2,3}d`` defaults: ``kernel_size`` int or tuple, ``stride=1``, ``padding=0``, bias")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup())
def test_conv_defaults(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(EQUAL, "``stride`` (int or per-dimension tuple), with padding")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(stride=True, padding=("none", "int", "tuple")))
def test_conv_stride(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(EQUAL, "``padding`` int or per-dimension tuple (zeros)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("int", "tuple"), dilation=True))
def test_conv_padding(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(EQUAL, "``padding='same'`` (odd and even kernels, dilation: the extra entry after)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("same",), dilation=True))
def test_conv_padding_same(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(EQUAL, "``padding='valid'``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("valid",), stride=True))
def test_conv_padding_valid(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(EQUAL, "``dilation`` (int or tuple), with stride and padding")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(dilation=True, stride=True, padding=("int", "tuple", "none")))
def test_conv_dilation(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(
    EQUAL,
    "``groups``: grouped, depthwise (``groups = in_channels``) and channel multipliers; weight "
    "``(out, in/groups, *kernel)``",
    "a block-diagonal :math:`\\Theta_k`; native: ``F.conv{d}d(groups=)``; ``ax``/``xtheta``: the expanded "
    "block-diagonal :math:`\\Theta`",
)
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(stride=True, dilation=True, padding=("none", "int", "same")), G=st.integers(1, 4))
def test_conv_groups(dtype: torch.dtype, c: dict[str, Any], G: int) -> None:
    for P, Q in ((G * c["P"], G * c["Q"]), (G, G), (G, G * c["Q"])):  # grouped, depthwise, multiplier
        check_conv({**c, "P": P, "Q": Q}, dtype, groups=G)


@case(EQUAL, "``bias=False``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("int", "same")))
def test_conv_no_bias(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype, bias=False)


@case(EQUAL, "``padding_mode='circular'`` (padding at most the input size)", "the ``periodic`` boundary")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("int", "tuple", "same"), stride=True, dilation=True, mode="circular"))
def test_conv_circular(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(
    EQUAL,
    "``padding_mode='reflect'``",
    "``x`` framed by ``F.pad(mode='reflect')``, then the shift basis with no padding on the padded grid",
)
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("int", "tuple", "same"), stride=True, dilation=True, mode="reflect"))
def test_conv_reflect(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(
    EQUAL,
    "``padding_mode='replicate'``",
    "``x`` framed by ``F.pad(mode='replicate')``, then the shift basis with no padding on the padded grid",
)
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("int", "tuple", "same"), stride=True, dilation=True, mode="replicate"))
def test_conv_replicate(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_conv(c, dtype)


@case(EQUAL, "unbatched input ``(C, *grid)``, every padding mode")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=conv_setup(padding=("int", "same")), mode=st.sampled_from(["zeros", "circular", "reflect", "replicate"]))
def test_conv_unbatched(dtype: torch.dtype, c: dict[str, Any], mode: str) -> None:
    ref, ours = conv_pair(c["d"], c["seed"], c["P"], c["Q"], c["kernel"], **{**c["kw"], "padding_mode": mode})
    compare(ref, ours, tensor(c["seed"], c["P"], *c["grid"]), dtype, c["seed"])


@case(EQUAL, "empty batch ``B = 0`` (empty output of torch's shape; zero parameter gradients)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(
    c=conv_setup(padding=("int", "same"), stride=True),
    mode=st.sampled_from(["zeros", "circular", "reflect", "replicate"]),
    G=st.integers(1, 2),
)
def test_conv_empty_batch(dtype: torch.dtype, c: dict[str, Any], mode: str, G: int) -> None:
    kw = {**c["kw"], "padding_mode": mode, "groups": G}
    ref, ours = conv_pair(c["d"], c["seed"], G * c["P"], G * c["Q"], c["kernel"], **kw)
    compare(ref, ours, tensor(c["seed"], 0, G * c["P"], *c["grid"]), dtype, c["seed"])


@case(EQUAL, "``state_dict`` both ways, ``reset_parameters`` (same draws), ``dtype=`` factory argument")
@given(c=conv_setup(padding=("int",)), G=st.integers(1, 3))
@FEW
def test_conv_state_and_initialisation(c: dict[str, Any], G: int) -> None:
    d, kernel = c["d"], c["kernel"]
    torch.manual_seed(c["seed"])
    ref = getattr(torch.nn, f"Conv{d}d")(G * c["P"], G * c["Q"], kernel, groups=G, dtype=torch.float32, **c["kw"])
    torch.manual_seed(c["seed"])
    ours = getattr(snn, f"GridConv{d}d")(G * c["P"], G * c["Q"], kernel, groups=G, dtype=torch.float32, **c["kw"])
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    for name, p in ref.state_dict().items():  # the same draws from the same distribution
        torch.testing.assert_close(ours.state_dict()[name], p)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    ref.load_state_dict(ours.state_dict())  # and back
    x = tensor(c["seed"], 2, G * c["P"], *c["grid"]).float()
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)


@case(EQUAL, "second-order gradients (``create_graph=True``), every order", "float64 and float32")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@FEW
@given(c=conv_setup(padding=("int", "same"), stride=True), G=st.integers(1, 2))
def test_conv_double_backward(dtype: torch.dtype, c: dict[str, Any], G: int) -> None:
    rtol, atol = TOLERANCES[dtype]
    ref, ours = conv_pair(c["d"], c["seed"], G * c["P"], G * c["Q"], c["kernel"], groups=G, **c["kw"])
    ref, ours = ref.to(dtype), ours.to(dtype)
    x = tensor(c["seed"], c["B"], G * c["P"], *c["grid"]).to(dtype)

    def second(layer: torch.nn.Module) -> list[torch.Tensor]:
        xl = x.clone().requires_grad_()
        gx, gw = torch.autograd.grad(layer(xl).pow(2).sum(), (xl, layer.weight), create_graph=True)
        return list(torch.autograd.grad(gx.pow(2).sum() + gw.pow(3).sum(), (xl, layer.weight, layer.bias)))

    expected = second(ref)
    for order in ORDERS:
        ours.order = order
        for a, b in zip(second(ours), expected, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol * (float(b.abs().max()) or 1.0), msg=order)


# --- convolutions: refused by both ------------------------------------------------------------------
def both_refuse(make_ref: Callable[[], Any], make_ours: Callable[[], Any], match: str) -> None:
    with pytest.raises((ValueError, RuntimeError)):
        make_ref()
    with pytest.raises((ValueError, TypeError), match=match):
        make_ours()


@case(REFUSED, "``in_channels`` or ``out_channels`` not divisible by ``groups``; ``groups <= 0``")
@pytest.mark.parametrize("d", [1, 2, 3])
def test_conv_groups_not_dividing(d: int) -> None:
    for cin, cout, g in ((3, 4, 2), (4, 3, 2), (4, 4, 0)):
        both_refuse(
            lambda: getattr(torch.nn, f"Conv{d}d")(cin, cout, 3, groups=g),  # noqa: B023
            lambda: getattr(snn, f"GridConv{d}d")(cin, cout, 3, groups=g),  # noqa: B023
            r"divisible by groups|groups must be a positive integer",
        )


@case(REFUSED, "``padding='same'`` with a stride")
@pytest.mark.parametrize("d", [1, 2, 3])
def test_conv_same_with_stride(d: int) -> None:
    both_refuse(
        lambda: getattr(torch.nn, f"Conv{d}d")(2, 2, 3, stride=2, padding="same"),
        lambda: getattr(snn, f"GridConv{d}d")(2, 2, 3, stride=2, padding="same"),
        r"padding='same' needs stride 1",
    )


@case(REFUSED, "unknown ``padding_mode``; ``padding='full'`` or negative padding")
def test_conv_bad_padding_arguments() -> None:
    x = tensor(0, 1, 2, 5, 5)
    for kw, match in (
        ({"padding_mode": "mirror"}, r"padding_mode must be one of"),
        ({"padding": "full"}, r"padding must be 'same', 'valid'"),
        ({"padding": -1}, r"padding must be non-negative"),
    ):
        both_refuse(
            lambda: torch.nn.Conv2d(2, 2, 3, **kw)(x),  # noqa: B023 (torch checks negative padding when called)
            lambda: snn.GridConv2d(2, 2, 3, **kw)(x),  # noqa: B023
            match,
        )


@case(REFUSED, "``padding_mode='reflect'`` with padding not smaller than the input")
@pytest.mark.parametrize("d", [1, 2, 3])
def test_conv_reflect_too_much_padding(d: int) -> None:
    ref, ours = conv_pair(d, 0, 2, 2, 1, padding=3, padding_mode="reflect")
    x = tensor(0, 1, 2, *([3] * d))
    both_refuse(lambda: ref(x), lambda: ours(x), r"padding_mode='reflect' needs padding smaller than the input")


@case(REFUSED, "kernel larger than the padded input; input with the wrong number of channels or dimensions")
@pytest.mark.parametrize("d", [1, 2, 3])
def test_conv_bad_inputs(d: int) -> None:
    ref, ours = conv_pair(d, 0, 2, 3, 3, padding=0)
    for x, match in (
        (tensor(0, 1, 2, *([2] * d)), r"kernel spans 3 entries"),
        (tensor(0, 1, 3, *([5] * d)), r"expected 2 input channels"),
        (tensor(0, 1, 1, 2, *([5] * d)), r"input must have shape"),
    ):
        both_refuse(lambda: ref(x), lambda: ours(x), match)  # noqa: B023


# --- convolutions: not applicable -------------------------------------------------------------------
@case(
    NA,
    "``padding_mode='circular'`` with padding larger than the input",
    "torch refuses (it wraps at most once); ours wraps the torus again (the periodic basis), checked "
    "against indexing modulo the size",
)
@given(d=st.integers(1, 3), seed=st.integers(0, 2**31), size=st.integers(1, 3), pad=st.integers(1, 5))
@FEW
def test_conv_circular_wraps_more_than_once(d: int, seed: int, size: int, pad: int) -> None:
    pad = max(pad, size + 1)
    ref, ours = conv_pair(d, seed, 2, 3, 3, padding=pad, padding_mode="circular")
    x = tensor(seed, 2, 2, *([size] * d))
    with pytest.raises(RuntimeError, match="wrapping around more than once"):
        ref(x)
    xp = x
    for i in range(d):
        xp = xp.index_select(2 + i, torch.arange(-pad, size + pad) % size)
    expected = getattr(F, f"conv{d}d")(xp, ref.weight, ref.bias)
    for order in ORDERS:
        ours.order = order
        torch.testing.assert_close(ours(x), expected)


@case(
    NA,
    "``padding`` as per-dimension ``(before, after)`` pairs",
    "not a torch option; checked against ``F.pad`` then ``F.conv{d}d`` without padding",
)
@given(d=st.integers(1, 3), seed=st.integers(0, 2**31), data=st.data())
@FEW
def test_conv_padding_pairs(d: int, seed: int, data: Any) -> None:
    pairs = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in range(d))
    ref, _ = conv_pair(d, seed, 2, 3, 3)
    x = tensor(seed, 2, 2, *([4] * d))
    pads = [p for pair in reversed(pairs) for p in pair]
    for mode in ("zeros", "replicate"):
        ours = getattr(snn, f"GridConv{d}d")(2, 3, 3, padding=pairs, padding_mode=mode, dtype=torch.float64)
        ours.load_state_dict(ref.state_dict())
        xp = F.pad(x, pads) if mode == "zeros" else F.pad(x, pads, mode=mode)
        torch.testing.assert_close(ours(x), getattr(F, f"conv{d}d")(xp, ref.weight, ref.bias))


# --- average pooling ------------------------------------------------------------------------------------
@st.composite
def pool_setup(
    draw: Any, ceil: bool | None = False, include: bool | None = True, divisor: bool = False
) -> dict[str, Any]:
    """A drawn pooling: ``d``, kernel, stride, padding (at most half the kernel) and an input torch accepts."""
    d = draw(st.integers(2, 3) if divisor else st.integers(1, 3))
    k = tuple(draw(st.integers(1, 4)) for _ in range(d))
    s = tuple(draw(st.integers(1, 3)) for _ in range(d))
    p = tuple(draw(st.integers(0, kk // 2)) for kk in k)
    # avg_pool3d refuses an input smaller than the kernel (padding aside); see the n.a. row.
    grid = tuple(draw(st.integers(kk, kk + 5)) for kk in k)
    kw: dict[str, Any] = {"kernel_size": k, "padding": p}
    if draw(st.booleans()):
        kw["stride"] = s
    kw["ceil_mode"] = draw(st.booleans()) if ceil is None else ceil
    kw["count_include_pad"] = draw(st.booleans()) if include is None else include
    if divisor:
        kw["divisor_override"] = draw(st.integers(-7, 7).filter(bool))  # torch takes any integer but 0
    return {"d": d, "kw": kw, "grid": grid, "B": draw(st.integers(1, 3)), "C": draw(st.integers(1, 3)),
            "seed": draw(st.integers(0, 2**31))}  # fmt: skip


def check_pool(c: dict[str, Any], dtype: torch.dtype, batch: int | None = None, unbatched: bool = False) -> None:
    d = c["d"]
    ref = getattr(torch.nn, f"AvgPool{d}d")(**c["kw"])
    B = c["B"] if batch is None else batch
    shape = (c["C"], *c["grid"]) if unbatched else (B, c["C"], *c["grid"])
    x = tensor(c["seed"], *shape)
    ours = getattr(snn, f"AvgPool{d}d")(**c["kw"])
    if d == 3 and dtype == torch.bfloat16:
        for order in POOL_ORDERS:
            ours.order = order
            cpu_bfloat16_pool3d(ref, ours, x)
    else:
        compare(ref, ours, x, dtype, c["seed"])  # through every order


def cpu_bfloat16_pool3d(ref: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor) -> None:
    """torch has no CPU bfloat16 ``avg_pool3d``: ours is held to torch's float64 result on the rounded input."""
    xb = x.to(torch.bfloat16)
    with pytest.raises(NotImplementedError, match="BFloat16"):
        ref(xb)
    got, want = run_module(ours, xb, dtype=torch.bfloat16), run_module(ref, xb, dtype=torch.float64)
    for a, b in ((got.outputs["output"], want.outputs["output"]), (got.inputs["input"], want.inputs["input"])):
        assert a is not None and b is not None
        assert a.shape == b.shape and a.dtype == torch.bfloat16
        if b.numel():
            torch.testing.assert_close(
                a.double(), b, rtol=1e-2, atol=TOLERANCES[torch.bfloat16][1] * float(b.abs().max())
            )


@case(EQUAL, "``AvgPool{1,2,3}d``: ``kernel_size``, ``stride`` (default: the kernel), ``padding``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=pool_setup())
def test_pool_defaults(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_pool(c, dtype)


@case(EQUAL, "``count_include_pad=False``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=pool_setup(include=False))
def test_pool_count_exclude_pad(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_pool(c, dtype)


@case(
    EQUAL,
    "``ceil_mode=True``, with and without ``count_include_pad``",
    "torch's rule (the last window starts inside the input or the left padding); divisors clipped to the "
    "padded grid (an explicit column scale)",
)
@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=30, deadline=None)
@given(c=pool_setup(ceil=True, include=None))
def test_pool_ceil_mode(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_pool(c, dtype)


@case(EQUAL, "``divisor_override`` (``AvgPool2d``, ``AvgPool3d``; negative too), with ``ceil_mode``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=pool_setup(ceil=None, include=None, divisor=True))
def test_pool_divisor_override(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_pool(c, dtype)


@case(EQUAL, "unbatched input ``(C, *grid)``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=pool_setup(ceil=None, include=None))
def test_pool_unbatched(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_pool(c, dtype, unbatched=True)


@case(EQUAL, "empty batch ``B = 0``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(c=pool_setup(ceil=None, include=None))
def test_pool_empty_batch(dtype: torch.dtype, c: dict[str, Any]) -> None:
    check_pool(c, dtype, batch=0)


@case(REFUSED, "``padding`` larger than half the kernel; ``divisor_override=0``; no output window")
@pytest.mark.parametrize("d", [1, 2, 3])
def test_pool_refusals(d: int) -> None:
    x = tensor(0, 1, 2, *([4] * d))
    for kw, size, match in (
        ({"kernel_size": 2, "padding": 2}, 4, r"padding must be at most half the kernel"),
        ({"kernel_size": 2, "divisor_override": 0}, 4, r"divisor_override must be a non-zero integer"),
        ({"kernel_size": 3, "stride": 1, "ceil_mode": True}, 1, r"kernel 3 leaves no output"),
        ({"kernel_size": 3}, 2, r"kernel spans 3 entries"),
    ):
        if d == 1 and "divisor_override" in kw:
            continue  # torch.nn.AvgPool1d has no divisor_override (see the n.a. row)
        xs = x[(..., *([slice(0, size)] * d))]
        both_refuse(
            lambda: getattr(torch.nn, f"AvgPool{d}d")(**kw)(xs),  # noqa: B023
            lambda: getattr(snn, f"AvgPool{d}d")(**kw)(xs),  # noqa: B023
            match,
        )


@case(
    NA,
    "``divisor_override`` on ``AvgPool1d``",
    "torch's ``AvgPool1d`` has no such argument; ours checked against ``F.avg_pool2d`` on a height-1 image",
)
@given(c=pool_setup(ceil=None, include=None))
@FEW
def test_pool1d_divisor_override(c: dict[str, Any]) -> None:
    if c["d"] != 1:
        c = {
            **c,
            "d": 1,
            "grid": c["grid"][:1],
            "kw": {k: v[:1] if isinstance(v, tuple) else v for k, v in c["kw"].items()},
        }
    kw = {**c["kw"], "divisor_override": 3}
    x = tensor(c["seed"], c["B"], c["C"], *c["grid"])
    k, p = kw["kernel_size"][0], kw["padding"][0]
    s = kw.get("stride", kw["kernel_size"])[0]
    expected = F.avg_pool2d(x[:, :, None], (1, k), (1, s), (0, p), kw["ceil_mode"], kw["count_include_pad"], 3)[:, :, 0]
    torch.testing.assert_close(snn.AvgPool1d(**kw)(x), expected)


@case(
    NA,
    "``AvgPool3d`` in bfloat16 on the CPU",
    "torch has no CPU kernel (``avg_pool3d_out_frame``); ours runs (depthwise ``F.conv3d``), checked against "
    "torch's float64 result on the rounded input (relative 1e-2 plus 5 % of the largest value); every "
    "pooling row applies this check to its 3-D bfloat16 cases",
)
@given(c=pool_setup(ceil=None, include=None))
@FEW
def test_pool3d_cpu_bfloat16(c: dict[str, Any]) -> None:
    if c["d"] != 3:
        c = {
            **c,
            "d": 3,
            "grid": (c["grid"] * 3)[:3],
            "kw": {k: (v * 3)[:3] if isinstance(v, tuple) else v for k, v in c["kw"].items()},
        }
    check_pool(c, torch.bfloat16)


@case(
    NA,
    "``AvgPool3d`` on an input smaller than the kernel (padding aside)",
    "torch's ``avg_pool3d`` refuses it where ``avg_pool1d/2d`` accept it; ours pools, checked against "
    "``avg_pool1d`` along each axis (3-D average pooling is separable)",
)
@given(data=st.data(), seed=st.integers(0, 2**31), ceil=st.booleans(), include=st.booleans())
@FEW
def test_pool3d_input_smaller_than_kernel(data: Any, seed: int, ceil: bool, include: bool) -> None:
    k = tuple(data.draw(st.integers(2, 3)) for _ in range(3))
    p = tuple(kk // 2 for kk in k)
    grid = (data.draw(st.integers(1, k[0] - 1)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)))
    kw = {"kernel_size": k, "stride": 1, "padding": p, "ceil_mode": ceil, "count_include_pad": include}
    x = tensor(seed, 2, 2, *grid)
    with pytest.raises(RuntimeError, match="smaller than kernel size"):
        torch.nn.AvgPool3d(**kw)(x)
    expected = x
    for axis in range(3):
        moved = expected.movedim(2 + axis, -1)
        flat = moved.reshape(-1, 1, moved.shape[-1])
        pooled = F.avg_pool1d(flat, k[axis], 1, p[axis], ceil, include)
        expected = pooled.reshape(*moved.shape[:-1], pooled.shape[-1]).movedim(-1, 2 + axis)
    torch.testing.assert_close(snn.AvgPool3d(**kw)(x), expected)


# --- the fragment -----------------------------------------------------------------------------------


def render() -> str:
    """``docs/peers/torch_grid.rst``: one row per case, and the counts."""
    return TABLE.render(torch.__version__.split("+")[0])


def test_fragment_is_current() -> None:
    assert TABLE.fragment.read_text() == render(), "regenerate: .venv/bin/python tests/peers/test_torch_grid.py"


if __name__ == "__main__":
    sys.stdout.write(render())
