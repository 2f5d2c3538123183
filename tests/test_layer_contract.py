"""The layer contract: every layer of ``structconv.nn`` is ``conv(layer.basis(x, ...), x, layer.parameter())``.

Each case builds a layer (float64, eval mode, so that no dropout is drawn) and hands it, with its
inputs, to :func:`structconv.testing.check_layer`: the layer's output, and the gradients with
respect to the input and every parameter, must equal :func:`structconv.conv` on the layer's own
:meth:`basis` and :meth:`parameter` plus what the formula leaves out (the bias), in the layer's
layout (the per-layer contracts of :mod:`structconv.testing.layer`).  Where a layer's ``forward``
reaches its output by another route (the grid's native kernel,
MultiHeadSelfAttention's bias handling), this ties two computations; where ``forward`` already
calls ``conv(self.basis(...), x, self.parameter())``, it pins the layout and what is added.

Pooling has no :math:`\\Theta` (it is :math:`I` per channel): its contract is
``apply_shifts(layer.basis(x), x)``, the structured product :math:`A^\\top x` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import structconv as sc
from structconv import nn as snn
from structconv.nn.positional_base import Encoding
from structconv.testing import check_layer, contract_for

D64 = torch.float64
_EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 3], [1, 2, 3, 4, 0, 2, 5, 0]])
_EDGE_TYPE = torch.tensor([0, 1, 0, 1, 0, 1, 1, 0])

Inputs = tuple[Any, ...]


def _graph() -> Inputs:
    return (torch.randn(6, 3, dtype=D64), _EDGE_INDEX)


def _tokens() -> Inputs:
    x = torch.randn(2, 5, 4, dtype=D64)
    return (x, x, x)


def _fixed_basis() -> sc.Basis:
    generator = torch.Generator().manual_seed(3)
    dense = torch.randn(2, 6, 6, generator=generator, dtype=D64)
    return sc.SparseBasis.from_dense(dense * (torch.rand(2, 6, 6, generator=generator) < 0.5))


#: name -> (build the layer, make its inputs); the name before "[" is the class in ``structconv.nn``.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs]]] = {
    "AvgPool1d": (lambda: snn.AvgPool1d(2), lambda: (torch.randn(2, 3, 8, dtype=D64),)),
    "AvgPool2d": (lambda: snn.AvgPool2d(3, stride=2, padding=1), lambda: (torch.randn(2, 3, 7, 6, dtype=D64),)),
    "AvgPool3d": (lambda: snn.AvgPool3d(2), lambda: (torch.randn(1, 2, 4, 4, 4, dtype=D64),)),
    "GridConv1d": (lambda: snn.GridConv1d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 8, dtype=D64),)),
    "GridConv2d": (lambda: snn.GridConv2d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 6, 5, dtype=D64),)),
    "GridConv2d[groups]": (
        lambda: snn.GridConv2d(4, 6, 3, stride=2, groups=2, padding_mode="circular", padding=1),
        lambda: (torch.randn(2, 4, 6, 6, dtype=D64),),
    ),
    "GridConv3d": (lambda: snn.GridConv3d(2, 3, 3, padding=1), lambda: (torch.randn(1, 2, 4, 4, 4, dtype=D64),)),
    "ChebConv": (lambda: snn.ChebConv(3, 4, K=3), _graph),
    "GATConv": (lambda: snn.GATConv(3, 2, heads=2), _graph),
    "GATConv[mean]": (lambda: snn.GATConv(3, 2, heads=3, concat=False), _graph),
    "GCNConv": (lambda: snn.GCNConv(3, 4), _graph),
    "SGConv": (lambda: snn.SGConv(3, 4, K=2), _graph),
    "TAGConv": (lambda: snn.TAGConv(3, 4, K=2), _graph),
    "RGCNConv": (lambda: snn.RGCNConv(3, 4, num_relations=2), lambda: (*_graph(), _EDGE_TYPE)),
    "RGCNConv[bases]": (
        lambda: snn.RGCNConv(3, 4, num_relations=2, num_bases=2),
        lambda: (*_graph(), _EDGE_TYPE),
    ),
    "MultiHeadSelfAttention": (lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True), _tokens),
    "MultiHeadSelfAttention[cross]": (
        lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True, kdim=3, vdim=5),
        lambda: (torch.randn(2, 4, 4, dtype=D64), torch.randn(2, 6, 3, dtype=D64), torch.randn(2, 6, 5, dtype=D64)),
    ),
    "PositionalAttention": (
        lambda: snn.PositionalAttention((3, 3), 4, 2),
        lambda: (torch.randn(2, 3, 3, 4, dtype=D64),),
    ),
    "PositionalAttention[content]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, content=snn.ContentHeads(), head_dim=2),
        lambda: (torch.randn(2, 9, 4, dtype=D64),),
    ),
    "PositionalAttention[gaussian]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, heads=snn.GaussianHeads()),
        lambda: (torch.randn(2, 3, 3, 4, dtype=D64),),
    ),
    "PositionalAttention[learned]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, heads=snn.LearnedHeads(), content=snn.ContentHeads(bias=True)),
        lambda: (torch.randn(2, 9, 4, dtype=D64),),
    ),
    "StructConv": (lambda: snn.StructConv(_fixed_basis(), 3, 4), lambda: (torch.randn(2, 6, 3, dtype=D64),)),
}


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
        parts = (getattr(layer, "heads", None), getattr(layer, "content", None))
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
        assert not list(layer.parameters()) and not hasattr(layer, "parameter")
