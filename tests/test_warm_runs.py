"""Warm runs: a layer's call once its key has been checked computes what the checked call computes.

``GridConv{1,2,3}d`` and ``PositionalAttention`` keep, per input key, a run with nothing checked
(:meth:`structconv.Contraction.warm`).  The laws: a warm call gives the checked call's bits (from
the same random state, the same dropout masks); the layer equals ``conv`` of its basis and
:math:`\\Theta`; moving, converting or reparametrising the layer forgets its warm runs; and a warm
call dispatches no more operators than the checked one.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils import parametrize
from torch.utils._python_dispatch import TorchDispatchMode

from structconv import conv
from structconv.nn import GaussianHeads, GridConv2d, LearnedHeads, PositionalAttention, QuadraticHeads


def _fresh(layer: Any) -> Any:
    """A copy of ``layer`` with no warm run (a copy carries none): its next call is the checked one."""
    twin = copy.deepcopy(layer)
    assert not twin.warm_runs
    return twin


def _both(layer: Any, x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked call of a fresh copy and the warm call of ``layer`` (warmed first), from one random state."""
    layer(x)
    assert layer.warm_runs, "the layer kept no warm run"
    torch.manual_seed(seed)
    cold = _fresh(layer)(x)
    torch.manual_seed(seed)
    return cold, layer(x)


ENCODINGS = {
    "quadratic": QuadraticHeads(alpha=0.7, width="spread", width_noise=0.05, centre_var=3.0),
    "quadratic-exp": QuadraticHeads(alpha=1.3),
    "learned": LearnedHeads(positional_dim=6),
    "gaussian": GaussianHeads(alpha=0.6, width_noise=0.1),
}


@settings(max_examples=25, deadline=None)
@given(
    encoding=st.sampled_from(sorted(ENCODINGS)),
    grid=st.sampled_from([(4, 4), (3, 5), (6,), (2, 3, 3)]),
    boundary=st.sampled_from(["zero", "periodic"]),
    training=st.booleans(),
    shared=st.sampled_from([None, False]),
    seed=st.integers(0, 2**16),
)
def test_a_warm_positional_call_is_the_checked_call(
    encoding: str, grid: tuple[int, ...], boundary: str, training: bool, shared: bool | None, seed: int
) -> None:
    torch.manual_seed(seed)
    layer = PositionalAttention(
        grid, 6, 3, encoding=ENCODINGS[encoding], attention_dropout=0.2, dropout_shared=shared,
        boundary=boundary, threshold=None,
    ).double().train(training)  # fmt: skip
    x = torch.randn(2, *grid, 6, dtype=torch.float64)
    cold, warm = _both(layer, x, seed)
    assert torch.equal(cold, warm)
    if not training:
        flat = x.reshape(2, -1, 6)
        expected = conv(layer.basis(flat), flat, layer.theta()) + layer.bias
        assert torch.allclose(layer(flat), expected, rtol=1e-12, atol=1e-12)


def test_warm_positional_calls_with_padding_and_low_rank_heads() -> None:
    torch.manual_seed(0)
    conv2d = torch.nn.Conv2d(4, 4, 3, padding=1, dtype=torch.float64)
    layer = PositionalAttention.from_conv(conv2d, grid=(5, 5), alpha=2.0, head_dim=4)
    x = torch.randn(3, 5, 5, 4, dtype=torch.float64)
    cold, warm = _both(layer, x)
    assert torch.equal(cold, warm)
    one_hot = PositionalAttention.from_conv(conv2d, grid=(5, 5))
    one_hot(x)
    assert torch.allclose(one_hot(x).movedim(-1, 1), conv2d(x.movedim(-1, 1)), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_warm_calls_under_autocast_are_the_checked_calls(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    attention = PositionalAttention((4, 4), 8, 3, attention_dropout=0.1).train()
    grid = GridConv2d(3, 5, 3, padding=1)
    x, image = torch.randn(2, 16, 8), torch.randn(2, 3, 6, 6)
    with torch.autocast("cpu", dtype=dtype):
        for layer, inputs in ((attention, x), (grid, image)):
            cold, warm = _both(layer, inputs)
            assert warm.dtype == dtype and torch.equal(cold, warm)
    assert len(attention.warm_runs) == 1
    attention(x)  # autocast off: another key, another run
    assert len(attention.warm_runs) == 2


def test_moving_converting_or_reparametrising_forgets_the_warm_runs() -> None:
    torch.manual_seed(0)
    layer = GridConv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 5, 5)
    layer(x)
    layer.double()
    assert not layer.warm_runs
    assert torch.allclose(
        layer(x.double()), torch.nn.functional.conv2d(x.double(), layer.weight, layer.bias, padding=1)
    )
    layer.weight = torch.nn.Parameter(torch.ones(3, 2, 3, 3, dtype=torch.float64))
    assert not layer.warm_runs
    layer(x.double())
    parametrize.register_parametrization(layer, "bias", _Doubled())
    assert not layer.warm_runs
    expected = torch.nn.functional.conv2d(x.double(), layer.weight, layer.bias, padding=1)
    assert torch.allclose(layer(x.double()), expected) and torch.allclose(layer(x.double()), expected)
    attention = PositionalAttention((3, 3), 4, 2)
    attention(torch.randn(1, 9, 4))
    attention.to(torch.float64)
    assert not attention.warm_runs
    attention.encoding.centres.data += 1.0  # in place: the warm run reads the new values
    flat = torch.randn(1, 9, 4, dtype=torch.float64)
    attention(flat)
    assert torch.allclose(attention(flat), conv(attention.basis(flat), flat, attention.theta()) + attention.bias)


class _Doubled(torch.nn.Module):
    def forward(self, b: torch.Tensor) -> torch.Tensor:
        return 2 * b


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_warm_call_dispatches_no_more_operators_than_the_checked_one() -> None:
    torch.manual_seed(0)
    layer = PositionalAttention((8, 8), 16, 4, attention_dropout=0.1).train()
    x = torch.randn(2, 64, 16)
    fresh = _fresh(layer)
    with _Ops() as cold:
        fresh(x).sum().backward()
    with _Ops() as warm:
        fresh(x).sum().backward()
    assert warm.count <= cold.count


def test_a_weight_replaced_in_place_by_another_shape_is_refused_not_run() -> None:
    layer = GridConv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6)
    layer(x)
    layer.weight.data = layer.weight.data[:, :, :1, :1]  # no assignment: only the key can see it
    with pytest.raises(ValueError, match="theta"):
        layer(x)


def test_a_setting_changed_after_a_call_takes_effect_at_the_next() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8)
    for setting, value in (("attention_dropout", 0.5), ("dropout_shared", False), ("threshold", 1e-3)):
        encoding = GaussianHeads(alpha=8.0) if setting == "threshold" else QuadraticHeads()
        layer = PositionalAttention((4, 4), 8, 2, encoding=encoding, attention_dropout=0.1, threshold=None).train()
        layer(x)
        setattr(layer, setting, value)
        torch.manual_seed(1)
        warm = layer(x)
        torch.manual_seed(1)
        assert torch.equal(warm, _fresh(layer)(x)), setting


def test_parameters_changed_under_the_layer_are_refused_or_followed() -> None:
    layer = PositionalAttention((4, 4), 8, 2)
    x = torch.randn(2, 16, 8)
    layer(x)
    layer.bias.data = layer.bias.data[:1]  # would broadcast silently
    with pytest.raises(ValueError, match="bias must have shape"):
        layer(x)
    other = PositionalAttention((4, 4), 8, 2)
    other(x)
    other.encoding.double()  # the encoding alone: the layer's own _apply never runs
    with pytest.raises(TypeError, match="dtype"):
        other(x)
    third = PositionalAttention((4, 4), 8, 2).double()
    flat = torch.randn(2, 16, 8, dtype=torch.float64)
    third(flat)
    parametrize.register_parametrization(third.encoding, "centres", _Doubled())
    expected = conv(third.basis(flat), flat, third.theta()) + third.bias
    assert torch.allclose(third(flat), expected) and torch.allclose(third(flat), expected)


@pytest.mark.parametrize("encoding", ["learned", "gaussian"])
def test_half_precision_heads_under_bfloat16_autocast(encoding: str) -> None:
    torch.manual_seed(0)
    layer = PositionalAttention((4, 4), 8, 2, encoding=ENCODINGS[encoding], threshold=None).half()
    x = torch.randn(2, 16, 8, dtype=torch.float16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first, second = layer(x), layer(x)
    assert first.dtype == torch.bfloat16 and torch.equal(first, second)
