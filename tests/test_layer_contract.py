"""The layer contract: every layer of ``structconv.nn`` is ``conv(layer.basis(x, ...), x, layer.theta())``.

Each case builds a layer (float64, eval mode, so that no dropout is drawn) and hands it, with its
inputs, to :func:`structconv.testing.check_layer`: the layer's output, and the gradients with
respect to the input and every parameter, must equal :func:`structconv.conv` on the layer's own
:meth:`basis` and :meth:`theta` plus what the formula leaves out (the bias), in the layer's
layout (the per-layer contracts of :mod:`structconv.testing.layer`).  Where a layer's ``forward``
reaches its output by another route (the grid's native kernel,
MultiHeadSelfAttention's bias handling), this ties two computations; where ``forward`` already
calls ``conv(self.basis(...), x, self.theta())``, it pins the layout and what is added.

Pooling has no :math:`\\Theta` (it is :math:`I` per channel): its contract is
``apply_shifts(layer.basis(x), x)``, the structured product :math:`A^\\top x` alone.
"""

from __future__ import annotations

import pytest
import torch
from layer_cases import CASES

from structconv import nn as snn
from structconv.nn.positional_heads import Encoding
from structconv.testing import check_layer, contract_for

#: The layers of ``structconv.nn``: its other names are PositionalAttention's encodings (configuration).
LAYERS = sorted(n for n in snn.__all__ if not issubclass(getattr(snn, n), Encoding))


def test_every_layer_has_a_case() -> None:
    assert {n.split("[")[0] for n in CASES} == set(LAYERS)


def test_every_encoding_configures_a_case() -> None:
    """Each encoding of ``structconv.nn.__all__`` is bound by some PositionalAttention case (heads or content)."""
    encodings = {n: getattr(snn, n) for n in snn.__all__ if n not in LAYERS}
    used = set()
    for build, _ in CASES.values():
        layer = build()
        parts = (getattr(layer, "encoding", None), getattr(layer, "content", None))
        used |= {n for n, klass in encodings.items() if any(isinstance(part, klass) for part in parts)}
    assert used == set(encodings)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_is_conv_of_its_basis_and_parameter(name: str) -> None:
    build, inputs = CASES[name]
    torch.manual_seed(0)
    layer = build().double().eval()
    args = inputs()
    assert any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args) or list(layer.parameters())
    check_layer(layer, *args, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", LAYERS)
def test_every_layer_has_its_own_contract(name: str) -> None:
    """No layer of the package falls back to the generic contract by accident: each is in CONTRACTS."""
    from structconv.testing import CONTRACTS

    assert getattr(snn, name) in CONTRACTS
    assert contract_for(CASES[name][0]()) is CONTRACTS[getattr(snn, name)]


def test_pooling_has_no_parameter() -> None:
    """Pooling's Θ is the identity per channel: it has a basis and no parameter (see the module notes)."""
    for name in ("AvgPool1d", "AvgPool2d", "AvgPool3d"):
        layer = getattr(snn, name)(2)
        assert not list(layer.parameters()) and not hasattr(layer, "theta")
