"""``torch.export`` (strict and not) and ONNX export of models of the graph layers, for a fixed graph size.

The exported program takes the graph as an input, so the laws hold for any graph with the size it was
exported for: the program equals the eager layer, and PyG's layer built under the same seed, on
Hypothesis-drawn graphs of that many edges (self-loops and duplicates among them: the exported code
keeps every edge, as a compiled call does).  ONNX programs run in ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch_geometric.nn as pyg_nn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from structconv import nn as snn

NODES, EDGES = 7, 12
EDGE_INDEX = torch.tensor([[0, 0, 1, 2, 2, 3, 4, 5, 2, 1, 6, 3], [1, 1, 2, 2, 3, 4, 5, 0, 2, 3, 0, 6]])
EDGE_TYPE = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0])


class _TwoLayers(nn.Module):
    def __init__(self, first: nn.Module, second: nn.Module) -> None:
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.second(torch.relu(self.first(x, edge_index, *extra)), edge_index, *extra)
        return out


#: Two-layer models written once for either library (``lib`` is ``torch_geometric.nn`` or ``structconv.nn``).
MODELS: dict[str, Callable[[Any], nn.Module]] = {
    "gcn": lambda lib: _TwoLayers(lib.GCNConv(4, 6), lib.GCNConv(6, 3)),
    "sg": lambda lib: _TwoLayers(lib.SGConv(4, 6, K=2), lib.SGConv(6, 3, K=2)),
    "tag": lambda lib: _TwoLayers(lib.TAGConv(4, 6, K=2), lib.TAGConv(6, 3, K=2)),
    "cheb": lambda lib: _TwoLayers(lib.ChebConv(4, 6, K=3), lib.ChebConv(6, 3, K=3)),
    "gat": lambda lib: _TwoLayers(lib.GATConv(4, 3, heads=2), lib.GATConv(6, 3, heads=1)),
    "sage": lambda lib: _TwoLayers(lib.SAGEConv(4, 6), lib.SAGEConv(6, 3, project=True, normalize=True)),
    "gin": lambda lib: _TwoLayers(lib.GINConv(nn.Linear(4, 6), train_eps=True), lib.GINConv(nn.Linear(6, 3))),
    "rgcn": lambda lib: _TwoLayers(lib.RGCNConv(4, 6, 2), lib.RGCNConv(6, 3, 2, num_bases=2)),
}


def _models(name: str) -> tuple[nn.Module, nn.Module]:
    """Structconv's model and PyG's, each drawn under seed 0 (equal parameters: the initial draws are PyG's)."""
    built = []
    for lib in (snn, pyg_nn):
        torch.manual_seed(0)
        built.append(MODELS[name](lib).eval())
    return built[0], built[1]


def _inputs(name: str, edge_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = torch.linspace(-1, 1, NODES * 4).reshape(NODES, 4)
    return (x, edge_index, EDGE_TYPE) if name == "rgcn" else (x, edge_index)


graphs = st.lists(st.tuples(st.integers(0, NODES - 1), st.integers(0, NODES - 1)), min_size=EDGES, max_size=EDGES)
_EXPORTED: dict[tuple[str, bool], Any] = {}


def _exported(name: str, strict: bool) -> tuple[Any, nn.Module, nn.Module]:
    """The program of ``name``'s model exported once per module run, with the models it came from."""
    if (name, strict) not in _EXPORTED:
        ours, peer = _models(name)
        program = torch.export.export(ours, _inputs(name, EDGE_INDEX), strict=strict)
        _EXPORTED[name, strict] = (program, ours, peer)
    return _EXPORTED[name, strict]  # type: ignore[no-any-return]


@pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
@settings(max_examples=5, deadline=None)
@given(edges=graphs)
def test_export_computes_the_layer_for_any_graph_of_its_size(name: str, strict: bool, edges: list[Any]) -> None:
    program, ours, peer = _exported(name, strict)
    for edge_index in (EDGE_INDEX, torch.tensor(edges).T):
        args = _inputs(name, edge_index)
        got = program.module()(*args)
        torch.testing.assert_close(got, ours(*args), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, peer(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_export_runs_in_onnx_runtime(name: str, tmp_path: Any) -> None:
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    ours, peer = _models(name)
    program = torch.onnx.export(ours, _inputs(name, EDGE_INDEX), dynamo=True, verbose=False)
    assert program is not None
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    names = [i.name for i in session.get_inputs()]
    other = torch.stack([EDGE_INDEX[0].roll(3), EDGE_INDEX[1]])  # another graph of the same size
    for edge_index in (EDGE_INDEX, other):
        args = _inputs(name, edge_index)
        (got,) = session.run(None, {n: a.numpy() for n, a in zip(names, args, strict=True)})
        torch.testing.assert_close(torch.from_numpy(got), peer(*args).detach(), rtol=1e-5, atol=1e-5)
