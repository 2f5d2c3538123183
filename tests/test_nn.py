"""The generic StructConv layer."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import memory_budget

from structconv import SparseBasis, conv
from structconv import nn as snn
from structconv.nn import StructConv


def test_forward_is_conv_plus_bias_and_gradients_flow():
    torch.manual_seed(0)
    A = torch.randn(3, 6, 4)
    layer = StructConv(SparseBasis.from_dense(A), 5, 2)
    x = torch.randn(7, 6, 5)
    y = layer(x)
    torch.testing.assert_close(y, conv(A, x, layer.weight.detach()) + layer.bias.detach())
    y.sum().backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None


def test_identity_basis_matches_linear_layer_initialisation_and_output():
    torch.manual_seed(0)
    layer = StructConv(torch.eye(10)[None], 64, 32)
    assert layer.fan_in() == 64
    bound = 1 / math.sqrt(64)
    assert layer.weight.abs().max() <= bound
    assert layer.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    linear = torch.nn.Linear(64, 32)
    with torch.no_grad():
        linear.weight.copy_(layer.weight[0].T)
        linear.bias.copy_(layer.bias)
    x = torch.randn(4, 10, 64)
    torch.testing.assert_close(layer(x), linear(x))


def test_initialisation_preserves_variance_for_a_weighted_basis():
    torch.manual_seed(0)
    A = 0.5 * torch.randn(4, 200, 200) / math.sqrt(200)
    layer = StructConv(A, 256, 256, bias=False)
    x = torch.randn(8, 200, 256)
    # U(-b, b) has variance b^2/3 = 1/(3F): output variance is a third of the input's.
    assert layer(x).var().item() == pytest.approx(1 / 3, rel=0.1)


def test_module_moves_carry_the_basis():
    layer = StructConv(torch.eye(3)[None], 2, 2).double()
    assert layer.basis().dtype == torch.float64
    assert layer(torch.randn(1, 3, 2, dtype=torch.float64)).dtype == torch.float64


def test_bad_construction():
    import numpy as np

    with pytest.raises(TypeError, match="the basis of a torch layer must be a torch one"):
        StructConv(np.ones((1, 2, 2)), 2, 2)
    with pytest.raises(ValueError, match="in_channels must be a positive integer"):
        StructConv(torch.ones(1, 2, 2), 0, 2)
    with pytest.raises(ValueError, match="shared by the batch"):
        StructConv(torch.ones(3, 1, 2, 2), 2, 2)


def test_struct_conv_refuses_a_bool_width() -> None:
    with pytest.raises(ValueError, match="out_channels must be a positive integer, got True"):
        snn.StructConv(torch.ones(1, 4, 6), 3, True, bias=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("x", [[[[0.5, 1.0]] * 4], ((0.5, 1.0),) * 4], ids=["nested list", "tuple"])
def test_struct_conv_names_an_input_that_is_not_a_tensor(x: object) -> None:
    """As torch.nn.Linear refuses a list: a TypeError naming x (it used to be an AttributeError on .shape)."""
    with pytest.raises(TypeError, match=r"StructConv: x must be a torch.Tensor of shape \(B, M, P\) or \(M, P\), got"):
        StructConv(torch.ones(1, 4, 2), 2, 1)(x)


def test_rgcn_refuses_parameters_beyond_memory_before_allocating() -> None:
    message = r"RGCNConv: num_relations=10000000000, .* asks for parameters that would take .* GiB"
    with memory_budget(0.5), pytest.raises(ValueError, match=message):
        snn.RGCNConv(2, 3, 10**10)
