"""The layer contract: every layer of ``structconv.nn`` is ``conv(layer.basis(x, ...), x, layer.parameter())``.

Each case builds a layer (float64, eval mode, so that no dropout is drawn), calls it, and calls
:func:`structconv.conv` on the layer's own :meth:`basis` and :meth:`parameter`, then adds what the
formula leaves out (the bias) and puts the result in the layer's layout.  Outputs and the
gradients with respect to the input and every parameter must agree.  Where a layer's ``forward``
reaches its output by another route (GAT's fused aggregation, the grid's native kernel,
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
from structconv.structures.grid import apply_shifts

D64 = torch.float64
_EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 3], [1, 2, 3, 4, 0, 2, 5, 0]])
_EDGE_TYPE = torch.tensor([0, 1, 0, 1, 0, 1, 1, 0])

Inputs = tuple[Any, ...]
#: (the layer, its inputs) -> the output through the contract, in the layer's layout
Contract = Callable[[Any, Inputs], torch.Tensor]


def _plus_bias(layer: nn.Module, y: torch.Tensor) -> torch.Tensor:
    bias = getattr(layer, "bias", None)
    return y if bias is None else y + bias


def _grid_flat(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, *grid)`` as the engine's ``(B, M, C)``."""
    return x.flatten(2).transpose(1, 2)


def _grid_back(y: torch.Tensor, basis: Any) -> torch.Tensor:
    """The engine's ``(B, M_out, Q)`` as ``(B, Q, *out_grid)``."""
    return y.transpose(1, 2).reshape(int(y.shape[0]), int(y.shape[2]), *basis.out_grid)


def _pool(layer: Any, args: Inputs) -> torch.Tensor:
    (x,) = args
    basis = layer.basis(x)
    return _grid_back(apply_shifts(basis, _grid_flat(x), layer.method)[:, 0], basis)  # no Θ: A^T x alone


def _grid(layer: Any, args: Inputs) -> torch.Tensor:
    (x,) = args
    basis = layer.basis(x)
    y = _grid_back(sc.conv(basis, _grid_flat(x), layer.parameter()), basis)
    return y if layer.bias is None else y + layer.bias.reshape(-1, *([1] * (x.ndim - 2)))


def _nodes(layer: Any, args: Inputs) -> torch.Tensor:
    """Graph layers and StructConv: ``x`` is already ``(N, P)`` or ``(B, N, P)``."""
    return _plus_bias(layer, sc.conv(layer.basis(*args), args[0], layer.parameter()))


def _mha(layer: Any, args: Inputs) -> torch.Tensor:
    value = args[2]  # batch first; no appended tokens in these cases
    y = sc.conv(layer.basis(*args), value, layer.parameter())
    bias = layer.output_bias()
    return y if bias is None else y + bias


def _positional(layer: Any, args: Inputs) -> torch.Tensor:
    (x,) = args
    flat = x.reshape(int(x.shape[0]), -1, layer.embed_dim)
    return _plus_bias(layer, sc.conv(layer.basis(flat), flat, layer.parameter())).reshape(x.shape)


def _graph() -> Inputs:
    return (torch.randn(6, 3, dtype=D64), _EDGE_INDEX)


def _tokens() -> Inputs:
    x = torch.randn(2, 5, 4, dtype=D64)
    return (x, x, x)


def _fixed_basis() -> sc.Basis:
    generator = torch.Generator().manual_seed(3)
    dense = torch.randn(2, 6, 6, generator=generator, dtype=D64)
    return sc.SparseBasis.from_dense(dense * (torch.rand(2, 6, 6, generator=generator) < 0.5))


#: name -> (build the layer, make its inputs, the contract); the name before "[" is the class in ``structconv.nn``.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs], Contract]] = {
    "AvgPool1d": (lambda: snn.AvgPool1d(2), lambda: (torch.randn(2, 3, 8, dtype=D64),), _pool),
    "AvgPool2d": (lambda: snn.AvgPool2d(3, 2, 1), lambda: (torch.randn(2, 3, 7, 6, dtype=D64),), _pool),
    "AvgPool3d": (lambda: snn.AvgPool3d(2), lambda: (torch.randn(1, 2, 4, 4, 4, dtype=D64),), _pool),
    "GridConv1d": (lambda: snn.GridConv1d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 8, dtype=D64),), _grid),
    "GridConv2d": (lambda: snn.GridConv2d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 6, 5, dtype=D64),), _grid),
    "GridConv2d[groups]": (
        lambda: snn.GridConv2d(4, 6, 3, stride=2, groups=2, padding_mode="circular", padding=1),
        lambda: (torch.randn(2, 4, 6, 6, dtype=D64),),
        _grid,
    ),
    "GridConv3d": (lambda: snn.GridConv3d(2, 3, 3, padding=1), lambda: (torch.randn(1, 2, 4, 4, 4, dtype=D64),), _grid),
    "ChebConv": (lambda: snn.ChebConv(3, 4, K=3), _graph, _nodes),
    "GATConv": (lambda: snn.GATConv(3, 2, heads=2), _graph, _nodes),
    "GATConv[mean]": (lambda: snn.GATConv(3, 2, heads=3, concat=False), _graph, _nodes),
    "GCNConv": (lambda: snn.GCNConv(3, 4), _graph, _nodes),
    "SGConv": (lambda: snn.SGConv(3, 4, K=2), _graph, _nodes),
    "TAGConv": (lambda: snn.TAGConv(3, 4, K=2), _graph, _nodes),
    "RGCNConv": (lambda: snn.RGCNConv(3, 4, num_relations=2), lambda: (*_graph(), _EDGE_TYPE), _nodes),
    "RGCNConv[bases]": (
        lambda: snn.RGCNConv(3, 4, num_relations=2, num_bases=2),
        lambda: (*_graph(), _EDGE_TYPE),
        _nodes,
    ),
    "MultiHeadSelfAttention": (lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True), _tokens, _mha),
    "MultiHeadSelfAttention[cross]": (
        lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True, kdim=3, vdim=5),
        lambda: (torch.randn(2, 4, 4, dtype=D64), torch.randn(2, 6, 3, dtype=D64), torch.randn(2, 6, 5, dtype=D64)),
        _mha,
    ),
    "PositionalAttention": (
        lambda: snn.PositionalAttention((3, 3), 4, 2),
        lambda: (torch.randn(2, 3, 3, 4, dtype=D64),),
        _positional,
    ),
    "PositionalAttention[content]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, content=True, head_dim=2),
        lambda: (torch.randn(2, 9, 4, dtype=D64),),
        _positional,
    ),
    "StructConv": (lambda: snn.StructConv(_fixed_basis(), 3, 4), lambda: (torch.randn(2, 6, 3, dtype=D64),), _nodes),
}


def test_every_layer_has_a_case() -> None:
    assert {n.split("[")[0] for n in CASES} == set(snn.__all__)


def _output(out: Any) -> torch.Tensor:
    """The output tensor (MultiHeadSelfAttention returns ``(output, weights)``)."""
    y: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return y


def _gradients(y: torch.Tensor, leaves: list[torch.Tensor], weight: torch.Tensor) -> list[torch.Tensor]:
    grads = torch.autograd.grad((y * weight).sum(), leaves, allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves, strict=True)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_is_conv_of_its_basis_and_parameter(name: str) -> None:
    build, inputs, contract = CASES[name]
    torch.manual_seed(0)
    layer = build().double().eval()
    args = tuple(a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs())
    inputs_ = {id(a): a for a in args if isinstance(a, torch.Tensor) and a.requires_grad}  # x may be q, k and v
    leaves = [*inputs_.values(), *layer.parameters()]
    assert leaves

    y = _output(layer(*args))
    expected = contract(layer, args)
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-12)

    weight = torch.randn_like(y)
    for got, want in zip(_gradients(y, leaves, weight), _gradients(expected, leaves, weight), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_pooling_has_no_parameter() -> None:
    """Pooling's Θ is the identity per channel: it has a basis and no parameter (see the module notes)."""
    for name in ("AvgPool1d", "AvgPool2d", "AvgPool3d"):
        layer = getattr(snn, name)(2)
        assert not list(layer.parameters()) and not hasattr(layer, "parameter")
