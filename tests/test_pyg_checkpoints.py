"""PyG checkpoints: a model trained with PyG's graph layers loads into structconv's, and back.

Each model is two graph layers nested inside a user's module (so every key carries a prefix),
built once from ``torch_geometric.nn`` and once from ``structconv.nn``.  The PyG model is
trained a few steps, its ``state_dict`` saved and loaded into the structconv model with
``strict=True``; both must then give the same outputs (float64), and
:func:`structconv.nn.pyg_state.pyg_state_dict` must give PyG back exactly its own entries.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from structconv import nn as snn
from structconv.nn.pyg_state import pyg_state_dict

pyg_nn = pytest.importorskip("torch_geometric.nn")

N, P, H, Q, R = 9, 5, 4, 3, 3


def layers(lib: Any, kind: str) -> tuple[Any, Any]:
    """The model's two graph layers of ``kind``, from ``lib`` (PyG's or structconv's ``nn``)."""
    if kind == "gcn":
        return lib.GCNConv(P, H), lib.GCNConv(H, Q, improved=True)
    if kind == "sg":
        return lib.SGConv(P, H, K=2), lib.SGConv(H, Q, K=1, bias=False)
    if kind == "tag":
        return lib.TAGConv(P, H, K=2), lib.TAGConv(H, Q, K=3, bias=False)
    if kind == "cheb":
        return lib.ChebConv(P, H, K=3), lib.ChebConv(H, Q, K=2, normalization="rw")
    if kind == "gat":  # bipartite weights on one x, then edge features, a residual, averaged heads
        first = lib.GATConv((P, P), H, heads=2)
        return first, lib.GATConv(2 * H, Q, heads=3, concat=False, edge_dim=2, residual=True)
    if kind == "rgcn":
        return lib.RGCNConv(P, H, R, num_bases=2), lib.RGCNConv(H, 2, R, num_blocks=2, aggr="add")
    raise AssertionError(kind)


class Net(torch.nn.Module):
    """A user's model: the graph layers one level down (``encoder.convs.0``), then a linear head."""

    def __init__(self, lib: Any, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.encoder = torch.nn.ModuleDict({"convs": torch.nn.ModuleList(layers(lib, kind))})
        self.head = torch.nn.Linear(2 if kind == "rgcn" else Q, 2)

    def forward(self, x: torch.Tensor, graph: dict[str, torch.Tensor]) -> torch.Tensor:
        for i, conv in enumerate(self.encoder["convs"]):
            if self.kind == "rgcn":
                x = conv(x, graph["edge_index"], graph["edge_type"])
            elif self.kind == "gat":
                x = conv(x, graph["edge_index"], graph["edge_attr"]) if i else conv(x, graph["edge_index"])
            else:
                x = conv(x, graph["edge_index"], graph["edge_weight"])
            x = x.relu() if i == 0 else x
        out: torch.Tensor = self.head(x)
        return out


def random_graph(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Node features, a directed weighted graph with its edge features and types, and regression targets."""
    gen = torch.Generator().manual_seed(seed)
    E = 3 * N
    graph = {
        "edge_index": torch.randint(0, N, (2, E), generator=gen),
        "edge_weight": torch.rand(E, generator=gen, dtype=torch.float64) + 0.1,
        "edge_attr": torch.randn(E, 2, generator=gen, dtype=torch.float64),
        "edge_type": torch.randint(0, R, (E,), generator=gen),
    }
    x = torch.randn(N, P, generator=gen, dtype=torch.float64)
    return x, graph, torch.randn(N, 2, generator=gen, dtype=torch.float64)


def trained_pyg(kind: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, dict[str, torch.Tensor]]:
    """A PyG model trained a few steps (so no parameter keeps its initial value)."""
    torch.manual_seed(seed)
    model = Net(pyg_nn, kind).double()
    x, graph, target = random_graph(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x, graph), target).backward()
        opt.step()
    return model.eval(), x, graph


def saved(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` written with ``torch.save`` and read back, as a checkpoint file would be."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, torch.Tensor] = torch.load(buffer, weights_only=True)
    return loaded


KINDS = ["gcn", "sg", "tag", "cheb", "gat", "rgcn"]


@pytest.mark.parametrize("kind", KINDS)
def test_pyg_checkpoint_loads_and_goes_back(kind: str) -> None:
    ref, x, graph = trained_pyg(kind)
    checkpoint = saved(ref.state_dict())
    ours = Net(snn, kind).double().eval()
    result = ours.load_state_dict(checkpoint)  # strict
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        torch.testing.assert_close(ours(x, graph), ref(x, graph), rtol=1e-10, atol=1e-12)

    back = pyg_state_dict(ours)
    assert set(back) == set(checkpoint)
    for key, value in checkpoint.items():
        assert torch.equal(back[key], value), key  # transposes and reshapes are exact
    fresh = Net(pyg_nn, kind).double().eval()
    fresh.load_state_dict(saved(back))  # strict
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, graph), ref(x, graph), rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_own_checkpoint_unchanged(kind: str) -> None:
    """structconv's own ``state_dict`` keeps its names and still loads (``theta``, not ``lin.weight``)."""
    torch.manual_seed(1)
    ours, again = Net(snn, kind).double().eval(), Net(snn, kind).double().eval()
    state = ours.state_dict()
    if kind in ("gcn", "sg", "tag", "cheb"):
        assert "encoder.convs.0.weight" in state
    again.load_state_dict(saved(state))
    x, graph, _ = random_graph(1)
    with torch.no_grad():
        torch.testing.assert_close(again(x, graph), ours(x, graph), rtol=0, atol=0)


def test_training_continues_alike() -> None:
    """Gradients after loading agree too: one more step from the checkpoint lands on the same parameters."""
    ref, x, graph = trained_pyg("gat")
    ours = Net(snn, "gat").double()
    ours.load_state_dict(ref.state_dict())
    target = torch.ones(N, 2, dtype=torch.float64)
    for model in (ref, ours):
        model.train()
        model.zero_grad(set_to_none=True)  # PyG's model still holds its last training step's gradients
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.nn.functional.mse_loss(model(x, graph), target).backward()
        opt.step()
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(pyg_state_dict(ours)[key], value, rtol=1e-9, atol=1e-12, msg=key)


def test_missing_pyg_key_is_reported_by_its_name() -> None:
    ref, _, _ = trained_pyg("tag")
    checkpoint = ref.state_dict()
    del checkpoint["encoder.convs.1.lins.2.weight"]
    ours = Net(snn, "tag").double()
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "encoder\.convs\.1\.lins\.2\.weight"'):
        ours.load_state_dict(checkpoint)
    result = ours.load_state_dict(checkpoint, strict=False)
    assert result.missing_keys == ["encoder.convs.1.lins.2.weight"] and not result.unexpected_keys


def test_missing_pyg_bias_and_gat_vector_are_reported() -> None:
    ref, _, _ = trained_pyg("gat")
    checkpoint = ref.state_dict()
    del checkpoint["encoder.convs.0.bias"], checkpoint["encoder.convs.1.att_edge"]
    del checkpoint["encoder.convs.1.lin_edge.weight"]
    result = Net(snn, "gat").double().load_state_dict(checkpoint, strict=False)
    assert sorted(result.missing_keys) == [
        "encoder.convs.0.bias",
        "encoder.convs.1.att_edge",
        "encoder.convs.1.lin_edge.weight",
    ]
    assert not result.unexpected_keys


def test_unexpected_and_mismatched_pyg_keys() -> None:
    # A checkpoint of a deeper TAGConv: its extra hop is unexpected, not dropped.
    ref = pyg_nn.TAGConv(P, H, K=3)
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "lins\.3\.weight"'):
        snn.TAGConv(P, H, K=2).load_state_dict(ref.state_dict())
    # A checkpoint of other sizes: the size mismatch names PyG's key and both shapes.
    with pytest.raises(RuntimeError, match=r"size mismatch for lin\.weight: .* \(4, 6\) .* \(4, 5\)"):
        snn.GCNConv(P, H).load_state_dict(pyg_nn.GCNConv(6, H).state_dict())
    with pytest.raises(RuntimeError, match=r"size mismatch for att_src"):
        snn.GATConv(P, H, heads=2).load_state_dict(pyg_nn.GATConv(P, H, heads=3).state_dict())
    # PyG's keys of the other GAT form (bipartite weights into a shared-weight layer) are refused.
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"lin\.weight\""):
        snn.GATConv(P, H).load_state_dict(pyg_nn.GATConv((P, P), H).state_dict())


def test_assign_keeps_parameters() -> None:
    """``load_state_dict(..., assign=True)`` takes the translated tensors as the parameters."""
    ref = pyg_nn.ChebConv(P, H, K=3).double()
    ours = snn.ChebConv(P, H, K=3)
    ours.load_state_dict(ref.state_dict(), assign=True)
    assert ours.weight.dtype == torch.float64 and ours.weight.is_contiguous()
    assert isinstance(ours.weight, torch.nn.Parameter) and ours.weight.requires_grad
    torch.testing.assert_close(ours.weight, torch.stack([lin.weight.T for lin in ref.lins]).detach())
