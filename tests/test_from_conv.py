"""PositionalAttention.from_conv: Cordonnier et al.'s construction as a layer that computes the convolution."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from structconv.nn import ContentHeads, GaussianHeads, GridConv2d, LearnedHeads, PositionalAttention, QuadraticHeads
from structconv.theory import attention_alpha_bound

#: torch's own note on even kernels under padding="same" (it pads a copy), not a failure of the layer.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")

D64 = torch.float64
MODES = ("zeros", "circular", "replicate")
#: The largest error of the layer against the convolution, relative to the output's scale: the
#: one-hot heads copy pixels exactly, so what is left is the rounding of the channel sums.
TOL = {torch.float64: 1e-13, torch.float32: 2e-6}


def _through(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer on a channels-first ``x`` (the convolution's layout)."""
    return layer(x.movedim(1, -1)).movedim(-1, 1)


def _assert_same(y: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    scale = max(1.0, float(ref.abs().max()))
    error = float((y - ref).abs().max())
    assert error <= tol * scale, f"max error {error:.3g} > {tol:g} x {scale:.3g}"


@st.composite
def convolutions(draw: Any, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple[int, int]]:
    """A random stride-1 size-keeping 2-D convolution (torch's or structconv's) and a grid it runs on."""
    kernel = draw(st.tuples(st.integers(1, 4), st.integers(1, 4)))
    dilation = draw(st.tuples(st.integers(1, 2), st.integers(1, 2)))
    grid = draw(st.tuples(st.integers(1, 7), st.integers(1, 7)))
    mode = draw(st.sampled_from(MODES))
    groups = draw(st.sampled_from([1, 1, 2]))
    channels = groups * draw(st.integers(1, 3))
    reach = [dl * (k - 1) for k, dl in zip(kernel, dilation, strict=True)]
    if mode == "circular":  # torch's circular padding wraps at most once
        assume(all(r - r // 2 <= s for r, s in zip(reach, grid, strict=True)))
    odd = all(r % 2 == 0 for r in reach)
    padding: Any = tuple(r // 2 for r in reach) if odd and draw(st.booleans()) else "same"
    options = {"padding": padding, "dilation": dilation, "groups": groups, "padding_mode": mode}
    bias = draw(st.booleans())
    kind = torch.nn.Conv2d if draw(st.booleans()) else GridConv2d
    torch.manual_seed(draw(st.integers(0, 2**31)))
    conv = kind(channels, channels, kernel, bias=bias, dtype=dtype, **options)
    with torch.no_grad():  # weights of order one, so the tolerance is relative to outputs of a few units
        conv.weight.normal_()
    return conv, grid


@pytest.mark.parametrize("dtype", [D64, torch.float32], ids=str)
@given(data=st.data())
def test_the_layer_computes_the_convolution(dtype: torch.dtype, data: Any) -> None:
    conv, grid = data.draw(convolutions(dtype))
    layer = PositionalAttention.from_conv(conv, grid)
    x = torch.randn(2, conv.in_channels, *grid, dtype=dtype)
    with torch.no_grad():
        y, ref = _through(layer, x), conv(x)
    _assert_same(y, ref, TOL[dtype])
    assert layer.num_heads == math.prod(conv.kernel_size)
    assert layer.weight.dtype == dtype and (layer.bias is None) == (conv.bias is None)
    assert isinstance(layer.encoding, QuadraticHeads)


@pytest.mark.parametrize("mode", MODES)
@given(seed=st.integers(0, 2**31), k=st.sampled_from([1, 3, 5]), size=st.integers(5, 8))
def test_soft_heads_at_the_alpha_bound_compute_the_convolution_to_the_dtypes_precision(
    mode: str, seed: int, k: int, size: int
) -> None:
    torch.manual_seed(seed)
    for dtype in (D64, torch.float32):
        conv = torch.nn.Conv2d(3, 3, k, padding=k // 2, padding_mode=mode, dtype=dtype)
        layer = PositionalAttention.from_conv(conv, (size, size), alpha=attention_alpha_bound(dtype))
        torch.testing.assert_close(
            layer.encoding.alpha(), torch.full((k * k,), attention_alpha_bound(dtype), dtype=dtype)
        )
        x = torch.randn(2, 3, size, size, dtype=dtype)
        with torch.no_grad():
            _assert_same(_through(layer, x), conv(x), 1e-11 if dtype == D64 else 1e-5)


def test_heads_of_lemma_1s_width_and_other_dimensions() -> None:
    torch.manual_seed(0)
    conv2 = torch.nn.Conv2d(4, 4, 3, padding=1, dtype=D64)
    low = PositionalAttention.from_conv(conv2, (5, 6), head_dim=5)
    assert low.head_dim == 5 and low.value.shape == (9, 4, 5)
    x = torch.randn(2, 4, 5, 6, dtype=D64)
    with torch.no_grad():
        _assert_same(_through(low, x), conv2(x), 1e-12)
    conv1 = torch.nn.Conv1d(3, 3, 5, padding="same", dilation=2, padding_mode="circular", dtype=D64)
    x1 = torch.randn(2, 3, 11, dtype=D64)
    with torch.no_grad():
        _assert_same(_through(PositionalAttention.from_conv(conv1, 11), x1), conv1(x1), 1e-12)
    conv3 = torch.nn.Conv3d(2, 2, (3, 1, 2), padding="same", dtype=D64)
    x3 = torch.randn(1, 2, 4, 3, 5, dtype=D64)
    layer3 = PositionalAttention.from_conv(conv3, (4, 3, 5))
    assert layer3.num_heads == 6 and layer3.padding == (1, 0, 1)
    with torch.no_grad():
        _assert_same(_through(layer3, x3), conv3(x3), 1e-12)


def test_the_layer_shows_the_encoding_the_grid_the_heads_the_widths_and_the_border() -> None:
    layer = PositionalAttention.from_conv(torch.nn.Conv2d(6, 6, 3, padding=1, bias=False), (8, 8))
    assert repr(layer) == (
        "PositionalAttention(grid=(8, 8), embed_dim=6, num_heads=9, "
        "encoding=QuadraticHeads(alpha=1024.0, width='exp'), "
        "content=None, head_dim=None, bias=False, padding=(1, 1))"
    )
    circular = PositionalAttention.from_conv(torch.nn.Conv2d(6, 6, 3, padding=1, padding_mode="circular"), (8, 8))
    assert "boundary='periodic'" in repr(circular) and "padding" not in repr(circular)
    assert torch.equal(circular.encoding.centres[4], torch.zeros(2))  # the kernel's centre is offset 0


@pytest.mark.parametrize(
    ("conv", "grid", "options", "error", "message"),
    [
        (torch.nn.Conv2d(3, 3, 3, stride=2, padding=1), (6, 6), {}, ValueError, r"stride=\(2, 2\), but stride must"),
        (torch.nn.Conv2d(3, 3, 3), (6, 6), {}, ValueError, r"padding=\(0, 0\) gives an output grid \(4, 4\)"),
        (torch.nn.Conv2d(3, 3, 3, padding=2), (6, 6), {}, ValueError, r"padding must keep the size"),
        (GridConv2d(3, 3, 3, padding="valid"), (6, 6), {}, ValueError, r"padding='valid' gives an output grid"),
        (torch.nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect"), (6, 6), {}, ValueError,
         r"padding_mode='reflect', which no head can read"),
        (torch.nn.Conv2d(3, 4, 3, padding=1), (6, 6), {}, ValueError, r"in_channels=3 and out_channels=4"),
        (torch.nn.Conv2d(3, 3, 3, padding=1), (6, 6, 6), {}, ValueError, r"grid has 3 dimensions but weight is a 2-D"),
        (torch.nn.Conv2d(3, 3, 3, padding=1), (6, 0), {}, ValueError, r"grid must be positive, got \(6, 0\)"),
        (torch.nn.Conv2d(3, 3, 3, padding=1), (6, 6), {"alpha": 0.0}, ValueError, r"alpha must be positive"),
        (torch.nn.Conv2d(3, 3, 3, padding=1), (6, 6), {"alpha": math.inf}, ValueError, r"alpha must be positive"),
        (torch.nn.Conv2d(3, 3, 3, padding=1), (6, 6), {"head_dim": 2}, ValueError,
         r"D_h=2 .* express at most min\(D_h, D_out\)=2 output channels .* Q=3"),
        (torch.nn.ConvTranspose2d(3, 3, 3, padding=1), (6, 6), {}, TypeError, r"conv must be a torch.nn.Conv1d/2d/3d"),
        (torch.nn.Linear(3, 3), (6, 6), {}, TypeError, r"got Linear"),
        (torch.nn.LazyConv2d(3, 3, padding=1), (6, 6), {}, ValueError, r"lazy convolution .* run it once"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)  # fmt: skip
def test_a_convolution_no_heads_express_is_refused_naming_the_argument(
    conv: torch.nn.Module, grid: Any, options: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=r"PositionalAttention\.from_conv: .*" + message):
        PositionalAttention.from_conv(conv, grid, **options)


# --- padding: zero tokens around the grid ---------------------------------------------------------------
LAYERS = {
    "quadratic": {"encoding": QuadraticHeads(alpha=0.7)},
    "gaussian": {"encoding": GaussianHeads(alpha=0.4, width_noise=0.1), "threshold": None},
    "gaussian-shifts": {"encoding": GaussianHeads(alpha=2.0)},
    "learned+content": {"encoding": LearnedHeads(positional_dim=4), "content": ContentHeads(bias=True)},
    "eq5": {"encoding": LearnedHeads(relative_terms=True), "content": ContentHeads()},
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_padding_is_the_unpadded_layer_on_the_framed_grid_cropped(name: str) -> None:
    """A layer with padding p on a grid g is the layer on g + 2p run on the zero-framed input, then cropped."""
    torch.manual_seed(3)
    grid, pad = (4, 5), (2, 1)
    padded = PositionalAttention(grid, 6, 3, padding=pad, head_dim=4, **LAYERS[name]).double()
    framed = PositionalAttention((8, 7), 6, 3, head_dim=4, **LAYERS[name]).double()
    framed.load_state_dict(padded.state_dict())
    x = torch.randn(2, *grid, 6, dtype=D64)
    big = torch.nn.functional.pad(x, (0, 0, 1, 1, 2, 2))
    torch.testing.assert_close(padded(x), framed(big)[:, 2:6, 1:6], rtol=1e-12, atol=1e-12)
    assert padded.basis(x.reshape(2, 20, 6)).shape[-2:] == (20, 20)


def test_padding_errors() -> None:
    with pytest.raises(ValueError, match=r"PositionalAttention: padding=1 adds zero tokens .* boundary='zero'"):
        PositionalAttention((4, 4), 4, 2, boundary="periodic", padding=1)
    with pytest.raises(ValueError, match=r"PositionalAttention: padding must be non-negative"):
        PositionalAttention((4, 4), 4, 2, padding=-1)
    with pytest.raises(ValueError, match=r"PositionalAttention: padding must have 2 entries"):
        PositionalAttention((4, 4), 4, 2, padding=(1, 1, 1))
    layer = PositionalAttention((4, 4), 4, 2, padding=(1, 0))
    assert layer.padding == (1, 0) and layer.tokens == (6, 4) and layer.encoding.grid == (6, 4)
