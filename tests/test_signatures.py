"""Public constructors and builders: structconv's own take no positional boolean; drop-ins take their peer's.

Two laws over the public surface (``structconv.__all__``, ``structconv.nn.__all__``):

- structconv's own builders and layers: a parameter with a ``bool`` default is keyword-only;
- every drop-in (issue 32): each positional-or-keyword parameter of its peer (PyTorch Geometric
  or ``torch.nn``, read by :func:`inspect.signature`) is ours at the same position with the same
  default, our own options come after them keyword-only, and a positional call with the peer's
  arguments builds a layer equal to the peer built the same way (its ``state_dict`` loaded).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

import structconv as sc
from structconv import nn as snn

pyg_nn = pytest.importorskip("torch_geometric.nn")

PEERS: dict[str, Any] = {
    "GCNConv": pyg_nn.GCNConv,
    "SGConv": pyg_nn.SGConv,
    "TAGConv": pyg_nn.TAGConv,
    "ChebConv": pyg_nn.ChebConv,
    "GATConv": pyg_nn.GATConv,
    "RGCNConv": pyg_nn.RGCNConv,
    "GINConv": pyg_nn.GINConv,
    "SAGEConv": pyg_nn.SAGEConv,
    "GridConv1d": torch.nn.Conv1d,
    "GridConv2d": torch.nn.Conv2d,
    "GridConv3d": torch.nn.Conv3d,
    "AvgPool1d": torch.nn.AvgPool1d,
    "AvgPool2d": torch.nn.AvgPool2d,
    "AvgPool3d": torch.nn.AvgPool3d,
    "MultiHeadSelfAttention": torch.nn.MultiheadAttention,
}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _callables() -> list[tuple[str, Any]]:
    found = []
    for module, names in ((sc, sc.__all__), (snn, snn.__all__)):
        for name in names:
            obj = getattr(module, name)
            if callable(obj) and not (module is snn and name in PEERS):
                found.append((f"{module.__name__}.{name}", obj))
    return found


@pytest.mark.parametrize(("name", "obj"), _callables(), ids=[n for n, _ in _callables()])
def test_no_boolean_is_positional(name: str, obj: Any) -> None:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        pytest.skip(f"{name} has no inspectable signature")
    flags = [p.name for p in signature.parameters.values() if p.kind in _POSITIONAL and isinstance(p.default, bool)]
    assert not flags, f"{name}: boolean options {flags} may be given by position"


def test_every_drop_in_has_a_peer() -> None:
    assert set(PEERS) <= set(snn.__all__)


def _positional(klass: Any) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(klass).parameters.values() if p.kind in _POSITIONAL]


@pytest.mark.parametrize("name", sorted(PEERS))
def test_peer_parameters_at_the_peer_positions_with_the_peer_defaults(name: str) -> None:
    peer, ours = _positional(PEERS[name]), _positional(getattr(snn, name))
    assert [p.name for p in ours] == [p.name for p in peer], f"{name}: positional parameters differ from the peer's"
    for mine, theirs in zip(ours, peer, strict=True):
        assert mine.default == theirs.default, (
            f"{name}: {mine.name} defaults to {mine.default!r}, not {theirs.default!r}"
        )
    # structconv's own options (not the peer's) come after, keyword-only.
    own = [p for p in inspect.signature(getattr(snn, name)).parameters.values() if p.kind not in _POSITIONAL]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in own), f"{name}: {own}"


# --- positional calls with the peer's arguments build the peer's layer ----------------------------------------

X = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
EDGES = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0, 2], [1, 0, 2, 3, 4, 5, 0, 3, 5]])
TYPES = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])


def _graph(layer: Any) -> torch.Tensor:
    return layer(X, EDGES)


def _graph_typed(layer: Any) -> torch.Tensor:
    return layer(X, EDGES, TYPES)


def _image(d: int, channels: int = 2) -> Callable[[Any], torch.Tensor]:
    x = torch.randn(2, channels, *(7,) * d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return lambda layer: layer(x)


def _attention(layer: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 5, 6, dtype=torch.float64, generator=g)
    v = torch.randn(2, 5, 4, dtype=torch.float64, generator=g)
    out, weights = layer(q, k, v)
    return torch.cat([out.flatten(), weights.flatten()])


CALLS: list[tuple[str, tuple[Any, ...], Callable[[Any], torch.Tensor]]] = [
    ("GCNConv", (4, 3, True, False, True, True, False), _graph),
    ("GCNConv", (4, 3, False, True, False, False), _graph),
    ("SGConv", (4, 3, 2, False, False, True), _graph),
    ("TAGConv", (4, 3, 2, False, False), _graph),
    ("ChebConv", (4, 3, 3, "rw", False), _graph),
    ("GATConv", (4, 3, 2, False, 0.1, 0.6), _graph),
    ("GATConv", (4, 3, 2, True, 0.3, 0.0, False, None, "mean", False, True), _graph),
    ("RGCNConv", (4, 3, 3, 2, None, "sum", False, False, True), _graph_typed),
    ("RGCNConv", (4, 3, 3, None, None, "mean", True, True, False), _graph_typed),
    ("SAGEConv", (4, 3, "sum", True, False, True, False), _graph),
    ("SAGEConv", ((4, 4), 3, "mean", False, True, False, True), _graph),
    ("GridConv1d", (2, 4, 3, 2, 1, 1, 1, False, "circular"), _image(1)),
    ("GridConv2d", (2, 4, 3, 1, "same", 2, 2, True, "reflect"), _image(2)),
    ("GridConv3d", (2, 4, 2, 2, 1, 1, 1, True, "zeros", None, torch.float64), _image(3)),
    ("AvgPool1d", (3, 2, 1, True, False), _image(1)),
    ("AvgPool2d", (3, 2, 1, True, False, 2), _image(2)),
    ("AvgPool3d", (2, 1, 1, False, True, None), _image(3)),
    ("MultiHeadSelfAttention", (8, 2, 0.0, True, True, True, 6, 4, True), _attention),
]


@pytest.mark.filterwarnings("ignore:improved=True on an edge_index")
@pytest.mark.parametrize(("name", "args", "run"), CALLS, ids=[f"{n}{a}" for n, a, _ in CALLS])
def test_a_positional_call_builds_the_peer(
    name: str, args: tuple[Any, ...], run: Callable[[Any], torch.Tensor]
) -> None:
    torch.manual_seed(0)
    peer = PEERS[name](*args).double().eval()
    with torch.no_grad():
        for p in peer.parameters():  # no zero bias hides a mismatch
            p.normal_(0.0, 0.5)
    ours = getattr(snn, name)(*args).double().eval()
    ours.load_state_dict(peer.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(run(ours), run(peer))


def test_pyg_example_calls() -> None:
    """PyG's ``examples/gat.py`` and ``examples/gcn.py`` calls, the import swapped and nothing else."""
    hidden, heads = 8, 4
    conv1 = snn.GATConv(4, hidden, heads, dropout=0.6)
    conv2 = snn.GATConv(hidden * heads, 3, heads=1, concat=False, dropout=0.6)
    assert conv2(conv1(X.float(), EDGES), EDGES).shape == (6, 3)
    gcn = snn.GCNConv(4, 3, cached=True, normalize=True)
    assert gcn(X.float(), EDGES).shape == (6, 3)
    assert "cached=True" in repr(gcn)


# --- cached ---------------------------------------------------------------------------------------------------


def _counted(layer: Any) -> list[int]:
    calls = [0]
    build = layer._basis

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return build(*args, **kwargs)

    layer._basis = counting
    return calls


@pytest.mark.parametrize("name", ["GCNConv", "SGConv"])
def test_cached_keeps_the_first_basis_and_equals_pyg(name: str) -> None:
    args = (4, 3, 2, True) if name == "SGConv" else (4, 3, False, True)
    torch.manual_seed(0)
    peer = PEERS[name](*args).double()
    ours = getattr(snn, name)(*args).double()
    ours.load_state_dict(peer.state_dict())
    calls = _counted(ours)
    first = ours(X, EDGES)
    torch.testing.assert_close(first, peer(X, EDGES))
    x2 = X.flip(0)  # PyG's SGConv would return its cached features here; ours uses the new x
    second = ours(x2 if name == "GCNConv" else X, EDGES)
    torch.testing.assert_close(second, peer(x2 if name == "GCNConv" else X, EDGES))
    basis = ours.basis(X, EDGES)
    assert calls[0] == 1 and basis is ours.basis(X, EDGES), "the basis is built once"
    # A graph of another size, or on other nodes, is refused (PyG would reuse its cache silently).
    with pytest.raises(ValueError, match=rf"{name}: cached=True keeps the first graph's basis"):
        ours(X, EDGES[:, :-1])
    with pytest.raises(ValueError, match=rf"{name}: cached=True"):
        ours(torch.cat([X, X[:1]]), EDGES)  # the same edges on one node more
    with pytest.raises(ValueError, match=rf"{name}: cached=True"):
        ours(X, EDGES, torch.ones(EDGES.shape[1], dtype=torch.float64))
    ours.reset_cache()
    ours(X, EDGES[:, :-1])
    assert calls[0] == 2
    ours.reset_parameters()  # as PyG's, forgets the cache
    ours(X, EDGES)
    assert calls[0] == 3
    uncached = getattr(snn, name)(4, 3)
    counted = _counted(uncached)
    uncached(X.float(), EDGES), uncached(X.float(), EDGES)
    assert counted[0] == 2 and "cached" not in repr(uncached)


def test_avg_pool3d_float16_on_the_cpu_is_refused_naming_the_dtype() -> None:
    x = torch.randn(1, 2, 4, 4, 4).half()
    with pytest.raises(
        NotImplementedError, match=r"^AvgPool3d: torch has no CPU kernel .* dtype torch\.float16"
    ) as info:
        snn.AvgPool3d(2)(x)
    assert "\n" not in str(info.value)
    assert snn.AvgPool3d(2)(x.bfloat16()).dtype == torch.bfloat16
    assert snn.AvgPool2d(2)(x[0]).dtype == torch.float16  # torch has the 2-d kernel
