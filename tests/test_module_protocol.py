"""Every layer of ``structconv.nn`` behaves as an ``nn.Module`` after it has run.

Each layer is built, run once (so that plans and the bases' derived caches exist), then:
``copy.deepcopy``, a pickle round trip and ``torch.save``/``torch.load`` give a layer with equal
outputs; its ``state_dict`` loaded into a fresh layer gives equal outputs; ``torch.compile``
(the ``aot_eager`` backend: dynamo's trace and AOT autograd's backward graph, without the cost of
Inductor's code generation) is one graph (``fullgraph=True``), also when the layer's first call is
the compiled one, and gives the eager outputs and gradients; and ``torch.jit.script`` and
``torch.jit.trace`` refuse with one sentence pointing to ``torch.compile``.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from layer_cases import Causal, MeanSAGE
from torch import nn

import structconv as sc
from structconv import nn as snn
from structconv.nn._module import script_refusal, trace_warning
from structconv.nn.positional_heads import Encoding

Inputs = tuple[Any, ...]

_EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 0, 2, 5]])
_EDGE_TYPE = torch.tensor([0, 1, 0, 1, 0, 1, 1])


def _basis(kind: str) -> sc.Basis:
    """A fixed torch basis on 6 entries (a fresh layer must get the same one)."""
    generator = torch.Generator().manual_seed(3)
    dense = torch.randn(2, 6, 6, generator=generator) * (torch.rand(2, 6, 6, generator=generator) < 0.5)
    if kind == "sparse":
        return sc.SparseBasis.from_dense(dense)
    if kind == "polynomial":
        return sc.graph_basis(_EDGE_INDEX, "powers", K=2, like=dense)
    return sc.ConcatBasis([sc.DenseBasis(dense[:1]), sc.SparseBasis.from_dense(dense[1:])])


def _graph() -> Inputs:
    return (torch.randn(6, 3), _EDGE_INDEX)


#: name -> (build the layer, make its inputs); the name before "[" is the class in ``structconv.nn``.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs]]] = {
    "AvgPool1d": (lambda: snn.AvgPool1d(2), lambda: (torch.randn(2, 3, 8),)),
    "AvgPool2d": (lambda: snn.AvgPool2d(2), lambda: (torch.randn(2, 3, 6, 6),)),
    "AvgPool3d": (lambda: snn.AvgPool3d(2), lambda: (torch.randn(1, 2, 4, 4, 4),)),
    "GridConv1d": (lambda: snn.GridConv1d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 8),)),
    "GridConv2d": (lambda: snn.GridConv2d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 6, 6),)),
    "GridConv3d": (lambda: snn.GridConv3d(2, 3, 3, padding=1), lambda: (torch.randn(1, 2, 4, 4, 4),)),
    "ChebConv": (lambda: snn.ChebConv(3, 4, K=3), _graph),
    "GATConv": (lambda: snn.GATConv(3, 2, heads=2), _graph),
    "GCNConv": (lambda: snn.GCNConv(3, 4), _graph),
    "SGConv": (lambda: snn.SGConv(3, 4, K=2), _graph),
    "SAGEConv": (lambda: snn.SAGEConv(3, 4, project=True), _graph),
    "GINConv": (lambda: snn.GINConv(nn.Linear(3, 4), train_eps=True), _graph),
    "GraphLayer": (lambda: MeanSAGE(3, 4), _graph),
    "GridLayer": (lambda: Causal(3, 4), lambda: (torch.randn(2, 3, 8),)),
    "TAGConv": (lambda: snn.TAGConv(3, 4, K=2), _graph),
    "RGCNConv": (lambda: snn.RGCNConv(3, 4, num_relations=2), lambda: (*_graph(), _EDGE_TYPE)),
    "MultiHeadSelfAttention": (
        lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True),
        lambda: (torch.randn(2, 5, 4),) * 3,
    ),
    "PositionalAttention": (lambda: snn.PositionalAttention((3, 3), 4, 2), lambda: (torch.randn(2, 9, 4),)),
    "StructConv": (lambda: snn.StructConv(_basis("sparse"), 3, 4), lambda: (torch.randn(2, 6, 3),)),
    "StructConv[polynomial]": (lambda: snn.StructConv(_basis("polynomial"), 3, 4), lambda: (torch.randn(2, 6, 3),)),
    "StructConv[concat]": (lambda: snn.StructConv(_basis("concat"), 3, 4), lambda: (torch.randn(2, 6, 3),)),
}
#: The layers of ``structconv.nn``: its other names are PositionalAttention's encodings (configuration).
LAYERS = sorted(n for n in snn.__all__ if not issubclass(getattr(snn, n), Encoding))


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a layer's output (MultiHeadSelfAttention returns a pair, its second may be None)."""
    items = out if isinstance(out, tuple) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _ran(name: str) -> tuple[nn.Module, Inputs, list[torch.Tensor]]:
    """The layer, after one call, its inputs and that call's outputs."""
    build, inputs = CASES[name]
    torch.manual_seed(0)
    layer, args = build(), inputs()
    with torch.no_grad():
        layer(*args)  # a first call under no_grad keeps every derived cache (see bases.sparse.Derived)
    return layer, args, _tensors(layer(*args))


def _assert_same_outputs(other: nn.Module, args: Inputs, expected: list[torch.Tensor]) -> None:
    got = _tensors(other(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_every_layer_has_a_case() -> None:
    assert {n.split("[")[0] for n in CASES} == set(LAYERS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_deepcopy_gives_an_independent_equal_layer(name: str) -> None:
    layer, args, expected = _ran(name)
    twin = copy.deepcopy(layer)
    _assert_same_outputs(twin, args, expected)
    mine = {id(p) for p in layer.parameters()}
    assert not mine & {id(p) for p in twin.parameters()}
    _assert_same_outputs(layer, args, expected)  # the original keeps working after the copy


@pytest.mark.parametrize("name", sorted(CASES))
def test_pickle_and_torch_save_round_trips_give_equal_outputs(name: str) -> None:
    layer, args, expected = _ran(name)
    _assert_same_outputs(pickle.loads(pickle.dumps(layer)), args, expected)
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    _assert_same_outputs(torch.load(buffer, weights_only=False), args, expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_into_a_fresh_layer_gives_equal_outputs(name: str) -> None:
    layer, args, expected = _ran(name)
    torch.manual_seed(1)  # a fresh layer with other parameters
    fresh = CASES[name][0]()
    fresh.load_state_dict(layer.state_dict())
    _assert_same_outputs(fresh, args, expected)


@pytest.mark.parametrize("warm", [True, False], ids=["after-a-call", "first-call-compiled"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_compile_is_one_graph_with_the_eager_outputs_and_gradients(name: str, warm: bool) -> None:
    """``fullgraph=True`` holds for a layer that has run eagerly and for one whose first call is compiled."""
    if warm:
        layer, args, _ = _ran(name)
    else:
        build, inputs = CASES[name]
        torch.manual_seed(0)
        layer, args = build(), inputs()
    floats = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]

    def run(module: Callable[..., Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        leaves = {i: args[i].detach().clone().requires_grad_() for i in floats}
        inputs = [leaves.get(i, a) for i, a in enumerate(args)]
        layer.zero_grad()
        outputs = _tensors(module(*inputs))
        sum(o.sum() for o in outputs).backward()
        grads = [p.grad.clone() for p in layer.parameters() if p.grad is not None]
        return outputs, grads + [leaves[i].grad for i in floats]

    torch._dynamo.reset()
    compiled_out, compiled_grads = run(torch.compile(layer, backend="aot_eager", fullgraph=True))
    eager_out, eager_grads = run(layer)
    assert len(compiled_grads) == len(eager_grads) and eager_grads
    for got, expected in zip(compiled_out + compiled_grads, eager_out + eager_grads, strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", LAYERS)
def test_torch_jit_script_refuses_with_one_sentence(name: str) -> None:
    layer, _, _ = _ran(name)
    sentence = script_refusal(type(layer).__name__)
    assert "torch.compile" in sentence
    with pytest.raises(TypeError) as raised:
        torch.jit.script(layer)
    assert str(raised.value) == sentence
    with pytest.raises(TypeError) as inside:  # as a submodule too
        torch.jit.script(nn.Sequential(layer))
    assert str(inside.value) == sentence


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_jit_trace_records_the_layer_and_says_what_it_froze(name: str) -> None:
    """A trace (TensorBoard's add_graph, trace-based exporters) computes the layer on the traced input, warns once.

    And it leaves the layer as it was: an eager call afterwards, on another input of the same
    shape, equals a fresh copy's.
    """
    build, inputs = CASES[name]
    torch.manual_seed(0)
    layer = build().eval()
    copy_ = copy.deepcopy(layer)
    args = inputs()
    with pytest.warns(torch.jit.TracerWarning) as caught:
        traced = torch.jit.trace(layer, args, check_trace=False)
    ours = [w for w in caught if str(w.message) == trace_warning(type(layer).__name__)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    torch.testing.assert_close(_tensors(traced(*args)), _tensors(layer(*args)))
    other = tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)
    torch.testing.assert_close(_tensors(layer(*other)), _tensors(copy_(*other)))


class _Halved(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 0.5 * weight


@pytest.mark.parametrize("wrap", ["parametrization", "weight_norm", "replaced"])
def test_grid_layers_read_a_reparametrised_weight_as_torch_does(wrap: str) -> None:
    """A weight given by a parametrization, by weight norm, or assigned anew is the one the call uses."""
    torch.manual_seed(0)
    peer = nn.Conv2d(3, 4, 3, padding=1)
    ours = snn.GridConv2d(3, 4, 3, padding=1)
    ours.load_state_dict(peer.state_dict())
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(ours(x), peer(x))  # runs compiled before the weight changes
    doubled = peer.weight.detach() * 2
    for layer in (peer, ours):
        if wrap == "parametrization":
            torch.nn.utils.parametrize.register_parametrization(layer, "weight", _Halved())
        elif wrap == "weight_norm":
            torch.nn.utils.parametrizations.weight_norm(layer)
        else:
            layer.weight = nn.Parameter(doubled.clone())
    torch.testing.assert_close(ours(x), peer(x))
    ours(x).sum().backward()
    assert all(p.grad is not None for p in ours.parameters())
