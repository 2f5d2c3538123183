"""Same seed, same fresh layer: every PyG drop-in draws its parameters as PyG's layer does.

The law, for every layer and option set: under one ``torch.manual_seed``, building structconv's
layer and building PyG's give equal parameters (ours read under PyG's names and shapes,
:func:`~structconv.nn.pyg_state.pyg_state_dict`) and leave the generator in the same state (the
next draw is equal), so that dropout, splits and negative sampling after them are the same too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from structconv import nn as snn
from structconv.nn.pyg_state import pyg_state_dict

pyg = pytest.importorskip("torch_geometric.nn")


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))


#: (layer, positional arguments, options): PyG's constructor arguments, given alike to both.
CASES: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("GCNConv", (8, 4), {}),
    ("GCNConv", (8, 4), {"bias": False, "improved": True, "cached": True}),
    ("SGConv", (8, 4), {"K": 2}),
    ("SGConv", (8, 4), {"bias": False}),
    ("TAGConv", (8, 4), {"K": 2}),
    ("TAGConv", (8, 4), {"K": 1, "bias": False, "normalize": False}),
    ("ChebConv", (8, 4, 3), {}),
    ("ChebConv", (8, 4, 1), {"bias": False, "normalization": "rw"}),
    ("GATConv", (8, 4), {}),
    ("GATConv", (8, 4), {"heads": 3, "concat": False, "bias": False}),
    ("GATConv", (8, 4), {"heads": 2, "edge_dim": 3, "residual": True}),
    ("GATConv", ((8, 6), 4), {"heads": 2, "edge_dim": 2}),
    ("RGCNConv", (8, 4, 3), {}),
    ("RGCNConv", (8, 4, 3), {"num_bases": 2, "root_weight": False}),
    ("RGCNConv", (8, 4, 4), {"num_blocks": 2, "bias": False}),
    ("SAGEConv", (8, 4), {}),
    ("SAGEConv", (8, 4), {"project": True, "aggr": "sum", "bias": False}),
    ("SAGEConv", (8, 4), {"root_weight": False}),
    ("GINConv", (), {"eps": 0.5}),
    ("GINConv", (), {"train_eps": True}),
]


def _build(module: Any, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> Callable[[], Any]:
    if name == "GINConv":
        return lambda: module.GINConv(_mlp(), **options)
    return lambda: getattr(module, name)(*args, **options)


@pytest.mark.parametrize(("name", "args", "options"), CASES, ids=[f"{n}{a}{o}" for n, a, o in CASES])
def test_one_seed_builds_pyg_s_layer_and_leaves_the_generator_where_pyg_does(
    name: str, args: tuple[Any, ...], options: dict[str, Any]
) -> None:
    torch.manual_seed(11)
    ours = _build(snn, name, args, options)()
    after_ours = torch.rand(4)
    torch.manual_seed(11)
    theirs = _build(pyg, name, args, options)()
    after_theirs = torch.rand(4)
    mine, expected = pyg_state_dict(ours), theirs.state_dict()
    assert mine.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(mine[key], value, rtol=0, atol=0, msg=f"{name}: {key} drawn otherwise")
    assert torch.equal(after_ours, after_theirs), f"{name}: the generator is left in another state"


@pytest.mark.parametrize("name", ["GCNConv", "SGConv", "TAGConv", "GATConv", "SAGEConv"])
def test_reset_parameters_draws_as_pyg_s_reset(name: str) -> None:
    """A later ``reset_parameters()`` (one draw of each parameter, as PyG's) gives PyG's values again."""
    args: tuple[Any, ...] = (8, 4)
    ours, theirs = getattr(snn, name)(*args), getattr(pyg, name)(*args)
    torch.manual_seed(5)
    ours.reset_parameters()
    torch.manual_seed(5)
    theirs.reset_parameters()
    mine = pyg_state_dict(ours)
    for key, value in theirs.state_dict().items():
        torch.testing.assert_close(mine[key], value, rtol=0, atol=0, msg=f"{name}: {key}")
