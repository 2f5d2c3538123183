"""Compiled with Inductor, ``fullgraph=True``: the graph layers on graphs whose self-loops and isolated nodes
take the compiled path's own rules, and the grid layers' periodic window.

Eagerly a layer drops an ``edge_index``'s self-loops (a shape read from the values); compiled it keeps
every edge and gives the loops weight 0 (GCN, SG, Cheb) or masks them out of the softmax (GAT), so that
no shape depends on the values.  The laws: the compiled forward and every gradient equal the eager ones,
and a node number out of range still fails, naming ``edge_index``.  ``test_module_protocol`` checks
one graph for every layer with the faster ``aot_eager`` backend; this file runs Inductor's code.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from structconv import nn as snn

#: 7 nodes: a self-loop on 2 (and a second one on 2), a duplicate edge 0 -> 1, node 6 isolated.
EDGE_INDEX = torch.tensor([[0, 0, 1, 2, 2, 3, 4, 5, 2, 1], [1, 1, 2, 2, 3, 4, 5, 0, 2, 3]])
NODES = 7


class _TwoLayers(nn.Module):
    def __init__(self, first: nn.Module, second: nn.Module) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x, edge_index, *extra))
        out: torch.Tensor = self.second(h, edge_index, *extra)
        return out


MODELS: dict[str, Callable[[], nn.Module]] = {
    "gcn": lambda: _TwoLayers(snn.GCNConv(4, 6), snn.GCNConv(6, 3)),
    "gcn-improved-cached": lambda: _TwoLayers(snn.GCNConv(4, 6, improved=True, cached=True), snn.GCNConv(6, 3)),
    "sg": lambda: _TwoLayers(snn.SGConv(4, 6, K=2), snn.SGConv(6, 3, K=2)),
    "tag": lambda: _TwoLayers(snn.TAGConv(4, 6, K=2), snn.TAGConv(6, 3, K=2)),
    "cheb": lambda: _TwoLayers(snn.ChebConv(4, 6, K=3), snn.ChebConv(6, 3, K=3)),
    "sage": lambda: _TwoLayers(snn.SAGEConv(4, 6), snn.SAGEConv(6, 3, project=True, normalize=True)),
    "gin": lambda: _TwoLayers(snn.GINConv(nn.Linear(4, 6), train_eps=True), snn.GINConv(nn.Linear(6, 3), eps=0.5)),
    "gat": lambda: _TwoLayers(snn.GATConv(4, 3, heads=2), snn.GATConv(6, 3, heads=1)),
    "gat-edge-mean": lambda: _TwoLayers(
        snn.GATConv(4, 3, heads=2, edge_dim=2, fill_value="mean"), snn.GATConv(6, 3, edge_dim=2, fill_value="max")
    ),
}


def _compare(model: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """Compiled (Inductor, one graph) against eager: outputs, the input's and every parameter's gradient."""
    model.eval()  # no dropout: the compiled and eager draws differ

    def run(module: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        x = args[0].detach().clone().requires_grad_()
        model.zero_grad()
        y = module(x, *args[1:])
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in model.parameters()]  # type: ignore[list-item]

    torch._dynamo.reset()
    compiled = run(torch.compile(model, fullgraph=True, dynamic=False))
    eager = run(model)
    assert all(g is not None for g in eager)
    for got, expected in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_graph_model_equals_eager_with_loops_and_isolated_nodes(name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    x = torch.randn(NODES, 4)
    extra = (torch.rand(EDGE_INDEX.shape[1], 2),) if "edge" in name else ()
    _compare(model, (x, EDGE_INDEX, *extra))


def test_compiled_gcn_refuses_a_node_number_out_of_range() -> None:
    """The range check is an assertion inside the graph: no host read, still an error naming edge_index."""
    torch._dynamo.reset()
    layer = torch.compile(snn.GCNConv(4, 3), fullgraph=True, dynamic=False)
    x = torch.randn(NODES, 4)
    layer(x, EDGE_INDEX)
    bad = EDGE_INDEX.clone()
    bad[1, 3] = NODES  # same shape: the compiled graph runs again, without recompiling
    with pytest.raises(RuntimeError, match=r"edge_index's node numbers \(num_nodes=7\) must lie in \[0, 7\)"):
        layer(x, bad)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: snn.GridConv2d(3, 4, 3, padding=1, padding_mode="circular"), (2, 3, 9, 7)),
        (lambda: snn.GridConv1d(2, 3, 5, padding=2, dilation=2, padding_mode="circular"), (2, 2, 6)),
        (lambda: snn.GridConv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect"), (2, 3, 8, 8)),
        (lambda: snn.AvgPool2d(3, stride=2, padding=1), (2, 3, 9, 9)),
        (lambda: snn.PositionalAttention((4, 4), 8, 3, encoding="gaussian"), (2, 16, 8)),
    ],
    ids=["conv2d-circular", "conv1d-circular-wider-than-grid", "conv2d-reflect", "avgpool2d", "positional-gaussian"],
)
def test_compiled_grid_layer_equals_eager_from_its_first_call(
    make: Callable[[], nn.Module], shape: tuple[int, ...]
) -> None:
    """A layer whose first call is compiled builds its structure outside the graph (one graph, as eager)."""
    torch.manual_seed(0)
    layer = make()
    model = _Grid(layer)
    _compare(model, (torch.randn(*shape),))


class _Grid(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer(x)
        return out


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: snn.GridConv2d(3, 4, 3, padding=1), (2, 3, 6, 6)),
        (lambda: snn.PositionalAttention((4, 4), 8, 3), (2, 16, 8)),
    ],
    ids=["conv2d", "positional"],
)
def test_a_compiled_call_writes_no_python_state(
    make: Callable[[], nn.Module], shape: tuple[int, ...], autocast: bool
) -> None:
    """The code torch.compile runs around the graph only reads: no cache reordered, no attribute set.

    Every write the traced forward made to a Python object would be replayed after the graph on
    every call (a reordered cache dictionary was rebuilt entry by entry, a layer at a time).
    """
    import dis

    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()  # the cases share call's code object, whose entries would pile up
    torch.manual_seed(0)
    layer = make()

    def call(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = layer(x)
        return out

    x = torch.randn(*shape)
    compiled = torch.compile(call, dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        layer(x)  # eager first: the caches filled as a training loop fills them
        compiled(x)
        compiled(x)
    (entry,) = _debug_get_cache_entry_list(call.__code__)
    writes = [
        f"{i.opname} {i.argval}"
        for i in dis.get_instructions(entry.code)
        if i.opname in ("STORE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR") or i.argval in ("clear", "move_to_end")
    ]
    assert writes == []


@pytest.mark.parametrize("name", ["gcn", "cheb", "gat"])
def test_a_first_call_compiled_under_autocast_is_one_graph(name: str) -> None:
    """No eager call first: the layers' contractions and their cast twins are built while tracing, in one graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x = torch.randn(NODES, 4)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(x, EDGE_INDEX)
        expected = model(x, EDGE_INDEX)
    torch.testing.assert_close(got.float(), expected.float(), atol=0.05, rtol=0.05)
