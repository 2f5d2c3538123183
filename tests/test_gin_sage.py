"""GIN and GraphSAGE: the bases under their names, the scalar parameter, the drop-ins against PyG, your own layer.

The laws: ``graph_basis``' ``"identity"``, ``"mean"`` and ``"gin"`` equal their dense definitions on
graphs with repeated edges, loops and isolated nodes; an :class:`~structconv.Aggregation` contracts
as the dense einsum of :math:`c_k I` in every order; ``GINConv`` and ``SAGEConv`` equal PyG's layers
(outputs and every gradient) on the same parameters in float64, float32 and bfloat16, with PyG's
initial draws, checkpoints and bipartite pairs; a layer written on :class:`~structconv.nn.GraphLayer`
in a few lines passes the kit's check of meaning.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structconv import Aggregation, conv, explain, graph_basis
from structconv import nn as snn
from structconv.nn.pyg_state import pyg_state_dict
from structconv.testing import check_layer

pyg = pytest.importorskip("torch_geometric.nn")


@st.composite
def graphs(draw: Any) -> tuple[torch.Tensor, int]:
    """An ``edge_index`` on up to 7 nodes: repeated edges, loops and isolated nodes all possible."""
    n = draw(st.integers(1, 7))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20))
    index = torch.tensor(edges, dtype=torch.long).reshape(-1, 2).T
    return index, n


def _dense(edge_index: torch.Tensor, n: int, targets: int | None = None) -> torch.Tensor:
    """The adjacency ``[m, n]`` (repeated edges summed), in float64."""
    a = torch.zeros(n, n if targets is None else targets, dtype=torch.float64)
    a.index_put_((edge_index[0], edge_index[1]), torch.ones(edge_index.shape[1], dtype=torch.float64), accumulate=True)
    return a


# --- the bases under their names ----------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(graphs())
def test_identity_mean_and_gin_bases_are_their_definitions(graph: tuple[torch.Tensor, int]) -> None:
    edge_index, n = graph
    like = torch.zeros(1, dtype=torch.float64)
    a = _dense(edge_index, n)
    mean = a / a.sum(0).clamp(min=1)  # in-degree counts edges; a node without in-edges averages nothing
    eye = torch.eye(n, dtype=torch.float64)
    cases = {
        "identity": eye[None],
        "mean": mean[None],
        "gin": torch.stack([eye, a]),
        ("mean", "identity"): torch.stack([mean, eye]),
        ("adjacency", "mean", "identity"): torch.stack([a, mean, eye]),
    }
    for kind, expected in cases.items():
        got = graph_basis(edge_index, kind, num_nodes=n, like=like).to_dense()  # type: ignore[arg-type]
        torch.testing.assert_close(got, expected, msg=f"kind {kind!r}")
    numpy_basis = graph_basis(edge_index.numpy(), ("mean", "identity"), num_nodes=n)
    np.testing.assert_allclose(numpy_basis.to_dense(), torch.stack([mean, eye]).numpy())


def test_a_sequence_kind_names_what_it_stacks() -> None:
    with pytest.raises(ValueError, match=r"one-member kinds, each one of \('adjacency', 'identity', 'mean', 'gcn'\)"):
        graph_basis(torch.tensor([[0], [1]]), ("mean", "powers"))
    with pytest.raises(ValueError, match="identity member reads each target's own row"):
        _bipartite_identity()


@pytest.mark.parametrize("kind", ["gcn", ("gcn",), ("mean", "gcn")])
def test_gcn_normalisation_refuses_bipartite_edges(kind: Any) -> None:
    """GCN's symmetric normalisation reads a node's degree on both sides: a bipartite graph is refused, by name."""
    from structconv.structures.edge_list import as_edges

    edges = as_edges(torch.tensor([[0, 1, 3], [1, 0, 1]]), 4, num_targets=2)
    with pytest.raises(ValueError, match=r"gcn normalisation needs a square graph.*bipartite: 4 sources, 2 targets"):
        graph_basis(edges, kind)
    index = torch.tensor([[0, 1, 3], [1, 0, 1]])
    square = as_edges(index, 4, num_targets=4)  # its targets named, as many as its sources
    torch.testing.assert_close(graph_basis(square, kind).to_dense(), graph_basis(index, kind, num_nodes=4).to_dense())


def _bipartite_identity() -> None:
    from structconv.structures.edge_list import as_edges
    from structconv.structures.normalize import identity_edges

    identity_edges(as_edges(torch.tensor([[0, 1], [1, 2]]), 2, num_targets=3))


# --- the scalar parameter ---------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(graphs(), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["ax", "xtheta", "atheta", "auto"]))
def test_an_aggregation_is_the_dense_einsum_of_scaled_identities(
    graph: tuple[torch.Tensor, int], channels: int, batch: int, order: str
) -> None:
    edge_index, n = graph
    g = torch.Generator().manual_seed(n * 31 + channels)
    basis = graph_basis(edge_index, ("mean", "identity", "adjacency"), num_nodes=n, like=torch.zeros(1).double())
    x = torch.randn(batch, n, channels, dtype=torch.float64, generator=g)
    coef = torch.randn(3, dtype=torch.float64, generator=g)
    expected = torch.einsum("kmn,bmp,k->bnp", basis.to_dense(), x, coef)
    torch.testing.assert_close(conv(basis, x, Aggregation(coef, channels), order=order), expected)
    x_np, c_np = x.numpy(), coef.numpy()
    got_np = conv(basis.to_dense().numpy(), x_np, Aggregation(c_np, channels), order=order)
    np.testing.assert_allclose(got_np, expected.numpy(), atol=1e-12)


def test_an_aggregation_is_differentiable_in_its_scalars_and_input() -> None:
    edge_index = torch.tensor([[0, 1, 2, 3, 3], [1, 2, 0, 0, 3]])
    basis = graph_basis(edge_index, "gin", like=torch.zeros(1).double())
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    eps = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    for order in ("ax", "xtheta"):

        def f(x: torch.Tensor, eps: torch.Tensor, order: str = order) -> torch.Tensor:
            return conv(basis, x, Aggregation(torch.stack([1 + eps, torch.ones_like(eps)]), 3), order=order)

        assert torch.autograd.gradcheck(f, (x, eps))


def test_an_aggregation_refuses_a_channel_count_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="channels must be a positive int"):
        Aggregation(torch.ones(2), 0)
    with pytest.raises(ValueError, match=r"theta has P=3 input channels but x has 4"):
        conv(graph_basis(torch.tensor([[0], [1]]), "gin"), torch.randn(2, 4), Aggregation(torch.ones(2), 3))


# --- the drop-ins against PyG -----------------------------------------------------------------------------
N, P, Q = 9, 4, 3
EDGES = torch.tensor(
    [[0, 0, 1, 2, 2, 3, 4, 5, 2, 1, 7], [1, 1, 2, 2, 3, 4, 5, 0, 2, 3, 6]]
)  # 8 isolated; loops; repeats

SAGE_OPTIONS: list[dict[str, Any]] = [
    {},
    {"aggr": "sum"},
    {"aggr": "add", "root_weight": False},
    {"normalize": True, "bias": False},
    {"project": True},
]


def _pair(ours: Any, theirs: Any, dtype: torch.dtype) -> tuple[Any, Any]:
    """Both layers in ``dtype``, ours holding PyG's parameters (redrawn so no zero hides a mismatch)."""
    theirs = theirs.to(dtype)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p, dtype=torch.float64).to(dtype) * 0.5)
    ours = ours.to(dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _grads(layer: Any, x: Any, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
    """The output and the gradients of ``<y, w>`` for the input(s) and every parameter, in PyG's parameter order."""
    xs = [t.detach().clone().requires_grad_() for t in (x if isinstance(x, tuple) else (x,))]
    layer.zero_grad()
    y = layer(tuple(xs) if isinstance(x, tuple) else xs[0], *args, **kwargs)
    w = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape).to(y.dtype)
    (y * w).sum().backward()
    return [y.detach(), *(t.grad for t in xs)]  # type: ignore[misc]


def _param_grads(layer: Any) -> dict[str, torch.Tensor]:
    """Each parameter's gradient under PyG's names and shapes (translated as the checkpoints are, ``pyg_keys``)."""
    grads = {name: p.grad for name, p in layer.named_parameters() if p.grad is not None}
    for key in layer.pyg_keys():
        for name, grad in zip(key.theirs, key.to_theirs(grads.pop(key.ours)), strict=True):
            grads[name] = grad
    return grads


TOL = {torch.float64: {}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 3e-2, "atol": 6e-2}}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("options", SAGE_OPTIONS, ids=str)
def test_sage_equals_pyg_outputs_and_gradients(options: dict[str, Any], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ours, theirs = _pair(snn.SAGEConv(P, Q, **options), pyg.SAGEConv(P, Q, **options), dtype)
    x = torch.randn(N, P, generator=torch.Generator().manual_seed(1)).to(dtype)
    got, want = _grads(ours, x, EDGES), _grads(theirs, x, EDGES)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])
    theirs_grads = {n: p.grad for n, p in theirs.named_parameters()}
    for name, grad in _param_grads(ours).items():
        torch.testing.assert_close(grad, theirs_grads[name], **TOL[dtype], msg=f"gradient of {name}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("train_eps", [False, True])
def test_gin_equals_pyg_outputs_and_gradients(train_eps: bool, dtype: torch.dtype) -> None:
    def mlp() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(P, 8), torch.nn.ReLU(), torch.nn.Linear(8, Q))

    torch.manual_seed(0)
    ours, theirs = _pair(snn.GINConv(mlp(), 0.25, train_eps), pyg.GINConv(mlp(), 0.25, train_eps), dtype)
    x = torch.randn(N, P, generator=torch.Generator().manual_seed(1)).to(dtype)
    for a, b in zip(_grads(ours, x, EDGES), _grads(theirs, x, EDGES), strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype])
    theirs_grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs_grads[name].grad, **TOL[dtype], msg=f"gradient of {name}")


@pytest.mark.parametrize("layer", ["sage", "sage-project", "gin"])
def test_bipartite_pairs_equal_pyg(layer: str) -> None:
    make = {
        "sage": lambda m: m.SAGEConv(P, Q),
        "sage-project": lambda m: m.SAGEConv((P, P), Q, project=True),
        "gin": lambda m: m.GINConv(torch.nn.Linear(P, Q), eps=-0.5),
    }[layer]
    torch.manual_seed(0)
    ours, theirs = _pair(make(snn), make(pyg), torch.float64)
    g = torch.Generator().manual_seed(3)
    x_src, x_dst = torch.randn(6, P, generator=g).double(), torch.randn(4, P, generator=g).double()
    edges = torch.tensor([[0, 1, 5, 5, 2, 2], [0, 0, 3, 1, 1, 1]])  # target 2 receives nothing
    for a, b in zip(_grads(ours, (x_src, x_dst), edges), _grads(theirs, (x_src, x_dst), edges), strict=True):
        torch.testing.assert_close(a, b)
    if layer != "sage-project":  # PyG's project needs the targets' features for its root term's shape
        y = ours((x_src, None), edges, size=(6, 4))
        torch.testing.assert_close(y, theirs((x_src, None), edges, size=(6, 4)))


def test_a_sparse_adj_t_reads_as_pyg_reads_it() -> None:
    torch.manual_seed(0)
    ours, theirs = _pair(snn.SAGEConv(P, Q), pyg.SAGEConv(P, Q), torch.float64)
    x = torch.randn(N, P, dtype=torch.float64)
    edges = EDGES.unique(dim=1)  # a matrix holds each edge once
    adj_t = torch.sparse_coo_tensor(edges.flip(0), torch.ones(edges.shape[1], dtype=torch.float64), (N, N))
    torch.testing.assert_close(ours(x, adj_t.coalesce()), theirs(x, adj_t.coalesce()))
    torch.testing.assert_close(ours(x, adj_t.coalesce()), theirs(x, edges))


@pytest.mark.parametrize("name", ["SAGEConv", "SAGEConv-project", "GINConv"])
def test_the_same_seed_draws_the_same_layer_and_the_same_next_number(name: str) -> None:
    def build(module: Any) -> Any:
        if name == "GINConv":
            return module.GINConv(torch.nn.Sequential(torch.nn.Linear(P, 5), torch.nn.ReLU(), torch.nn.Linear(5, Q)))
        return module.SAGEConv(P, Q, project=name.endswith("project"))

    torch.manual_seed(7)
    ours, after_ours = build(snn), torch.rand(3)
    torch.manual_seed(7)
    theirs, after_theirs = build(pyg), torch.rand(3)
    assert torch.equal(after_ours, after_theirs)
    mine = pyg_state_dict(ours)
    assert mine.keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        assert torch.equal(mine[key], value), key
    theirs.load_state_dict(mine)  # and PyG reads ours


def test_options_sage_does_not_contract_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"aggr must be one of \('mean', 'sum', 'add'\).*'max'"):
        snn.SAGEConv(4, 3, aggr="max")
    with pytest.raises(ValueError, match=r"in_channels=\(4, 5\): a pair of different widths"):
        snn.SAGEConv((4, 5), 3)
    layer = snn.SAGEConv(4, 3)
    with pytest.raises(ValueError, match=r"x_dst must be target features \(N_dst, 4\)"):
        layer((torch.randn(3, 4), torch.randn(2, 5)), torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"x=\(x_src, None\) needs size"):
        layer((torch.randn(3, 4), None), torch.tensor([[0], [1]]))


@pytest.mark.parametrize("options", [{}, {"project": True, "normalize": True}, {"root_weight": False}], ids=str)
def test_sage_passes_the_kit_against_its_dense_definition(options: dict[str, Any]) -> None:
    layer = snn.SAGEConv(P, Q, **options).double()
    x = torch.randn(N, P, dtype=torch.float64)
    mean = _dense(EDGES, N) / _dense(EDGES, N).sum(0).clamp(min=1)

    def sage(x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        w = layer.weight
        source = torch.relu(layer.lin(x)) if layer.lin is not None else x
        y = mean.T @ source @ w[0] + layer.bias if layer.bias is not None else mean.T @ source @ w[0]
        y = y + x @ w[1] if layer.root_weight else y
        return torch.nn.functional.normalize(y, dim=-1) if layer.normalize else y

    check_layer(layer, x, EDGES, reference=sage)


def test_gin_passes_the_kit_and_gradcheck() -> None:
    layer = snn.GINConv(torch.nn.Linear(P, Q), eps=0.3, train_eps=True).double()
    x = torch.randn(N, P, dtype=torch.float64, requires_grad=True)
    a = _dense(EDGES, N)
    check_layer(layer, x, EDGES, reference=lambda x, e: layer.nn((1 + layer.eps) * x + a.T @ x))
    eps = layer.eps
    assert torch.autograd.gradcheck(lambda x, e: snn.GINConv.aggregate(layer, x, EDGES), (x, eps))


def test_sage_gradcheck_in_float64() -> None:
    layer = snn.SAGEConv(P, Q, normalize=True).double()
    x = torch.randn(N, P, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *params: layer(x, EDGES), (x, *layer.parameters()))


# --- your own layer ---------------------------------------------------------------------------------------
class LinearGIN(snn.GraphLayer):
    """GIN's linear core, :math:`((1 + \\epsilon) x_n + \\sum_{m \\to n} x_m) W`: seven lines."""

    def __init__(self, in_channels: int, out_channels: int, eps: float = 0.0) -> None:
        super().__init__(in_channels, out_channels)
        self.eps = eps

    def graph_basis(self, edges: Any) -> Any:
        return graph_basis(edges, "gin")  # [I, A]

    def theta(self) -> torch.Tensor:
        return torch.stack([(1 + self.eps) * self.weight[0], self.weight[0]])


class MeanSAGE(snn.GraphLayer):
    """GraphSAGE-mean: four lines."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, members=2)

    def graph_basis(self, edges: Any) -> Any:
        return graph_basis(edges, ("mean", "identity"))


def test_own_layers_in_a_few_lines_equal_pyg_and_pass_the_kit() -> None:
    x = torch.randn(N, P, dtype=torch.float64)
    gin, peer = LinearGIN(P, Q, eps=0.5).double(), pyg.GINConv(torch.nn.Linear(P, Q, bias=False), eps=0.5).double()
    with torch.no_grad():
        peer.nn.weight.copy_(gin.weight[0].T)
    check_layer(gin, x, EDGES, reference=lambda x, e: peer(x, e) + gin.bias)
    sage, peer_sage = MeanSAGE(P, Q).double(), pyg.SAGEConv(P, Q).double()
    with torch.no_grad():
        peer_sage.lin_l.weight.copy_(sage.weight[0].T)
        peer_sage.lin_r.weight.copy_(sage.weight[1].T)
        peer_sage.lin_l.bias.copy_(sage.bias)  # type: ignore[union-attr]
    check_layer(sage, x, EDGES, reference=peer_sage)
    cached = MeanSAGE(P, Q)
    cached.cached = True
    first = cached(x.float(), EDGES)
    assert cached._cached_basis is not None and torch.equal(cached(x.float(), EDGES), first)


def test_a_layer_without_its_basis_says_what_to_write() -> None:
    class Forgot(snn.GraphLayer):
        pass

    with pytest.raises(NotImplementedError, match=r"Forgot: define graph_basis\(self, edges\)"):
        Forgot(3, 2)(torch.randn(4, 3), torch.tensor([[0], [1]]))


def test_graph_layer_options_compile_in_one_graph() -> None:
    torch._dynamo.reset()
    for layer in (snn.SAGEConv(P, Q), snn.GINConv(torch.nn.Linear(P, Q), train_eps=True)):
        x = torch.randn(N, P)
        compiled = torch.compile(layer, fullgraph=True, dynamic=False)
        torch.testing.assert_close(compiled(x, EDGES), layer(x, EDGES))


# --- a basis built on every call ---------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(graphs(), st.integers(1, 3), st.sampled_from(["ax", "xtheta"]))
def test_an_edge_basis_multiplies_alike_with_constant_and_trainable_weights(
    graph: tuple[torch.Tensor, int], members: int, order: str
) -> None:
    """Constant weights run as a sparse matrix, trainable ones by gather-scatter: the same numbers and gradients."""
    from structconv import EdgeBasis

    edge_index, n = graph
    g = torch.Generator().manual_seed(n + members)
    weights = torch.rand(edge_index.shape[1], members, dtype=torch.float64, generator=g)
    theta = torch.randn(members, 3, 2, dtype=torch.float64, generator=g)
    x = torch.randn(2, n, 3, dtype=torch.float64, generator=g, requires_grad=True)
    constant = EdgeBasis(edge_index[0], edge_index[1], weights, (n, n))
    trainable = EdgeBasis(edge_index[0], edge_index[1], weights.clone().requires_grad_(), (n, n))
    assert (constant._products() is not None) == bool(edge_index.shape[1]) and trainable._products() is None
    y_c, y_t = conv(constant, x, theta, order=order), conv(trainable, x, theta, order=order)
    expected = torch.einsum("kmn,bmp,kpq->bnq", constant.to_dense(), x, theta)
    torch.testing.assert_close(y_c, expected)
    torch.testing.assert_close(y_t, expected)
    (g_c,) = torch.autograd.grad(y_c.sum(), x)
    (g_t,) = torch.autograd.grad(y_t.sum(), x)
    torch.testing.assert_close(g_c, g_t)


def test_explain_shows_the_build_of_a_basis_built_from_entries() -> None:
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    x = torch.randn(4, 3)
    sparse = explain(graph_basis(edge_index, "gin"), x, Aggregation(torch.ones(2), 3))
    assert sparse.build is not None and sparse.build.irregular > 0
    assert "build" in str(sparse)
    dense = explain(graph_basis(edge_index, "gin").to_dense(), x, Aggregation(torch.ones(2), 3))
    assert dense.build is None and "build" not in str(dense)


def test_a_bipartite_sparse_adj_t_reads_as_pyg_reads_it() -> None:
    g = torch.Generator().manual_seed(4)
    x_src, x_dst = torch.randn(4, P, generator=g).double(), torch.randn(2, P, generator=g).double()
    edges = torch.tensor([[0, 1, 3, 3], [0, 1, 1, 0]])
    adj_t = torch.sparse_coo_tensor(edges.flip(0), torch.ones(4, dtype=torch.float64), (2, 4)).to_sparse_csr()
    for make in (lambda m: m.SAGEConv(P, Q), lambda m: m.GINConv(torch.nn.Linear(P, Q))):
        torch.manual_seed(0)
        ours, theirs = _pair(make(snn), make(pyg), torch.float64)
        torch.testing.assert_close(ours((x_src, x_dst), adj_t), theirs((x_src, x_dst), adj_t))


def test_gin_runs_on_the_meta_device() -> None:
    layer = snn.GINConv(torch.nn.Linear(P, Q)).to("meta")
    assert layer(torch.empty(N, P, device="meta"), EDGES).shape == (N, Q)


def test_reset_parameters_forgets_a_graph_layer_s_cached_basis() -> None:
    layer = MeanSAGE(P, Q)
    layer.cached = True
    layer(torch.randn(N, P), EDGES)
    assert layer._cached_basis is not None
    layer.reset_parameters()
    assert layer._cached_basis is None


def test_an_edge_basis_follows_its_weights_changed_in_place() -> None:
    from structconv import EdgeBasis

    weights = torch.rand(EDGES.shape[1], 2, dtype=torch.float64)
    basis = EdgeBasis(EDGES[0], EDGES[1], weights, (N, N))
    x, theta = torch.randn(N, P, dtype=torch.float64), torch.randn(2, P, Q, dtype=torch.float64)
    first = conv(basis, x, theta)
    with torch.no_grad():
        weights.mul_(2.0)
    torch.testing.assert_close(conv(basis, x, theta), 2.0 * first)


def test_gin_takes_batched_features_and_graphs_without_nodes_as_pyg() -> None:
    torch.manual_seed(0)
    ours, theirs = _pair(snn.GINConv(torch.nn.Linear(P, Q)), pyg.GINConv(torch.nn.Linear(P, Q)), torch.float64)
    x = torch.randn(2, N, P, dtype=torch.float64)
    torch.testing.assert_close(ours(x, EDGES), theirs(x, EDGES))
    empty, no_edges = torch.empty(0, P, dtype=torch.float64), torch.empty(2, 0, dtype=torch.long)
    assert ours(empty, no_edges).shape == theirs(empty, no_edges).shape == (0, Q)


def test_a_graph_layer_takes_a_pair_without_target_features_and_its_size() -> None:
    layer = MeanSAGE(P, Q).double()
    x_src = torch.randn(4, P, dtype=torch.float64)
    edges = torch.tensor([[0, 1, 3], [0, 1, 1]])
    y = layer((x_src, None), edges, size=(4, 2))
    mean = _dense(edges, 4, 2) / _dense(edges, 4, 2).sum(0).clamp(min=1)
    torch.testing.assert_close(y, mean.T @ x_src @ layer.weight[0] + layer.bias)


def test_a_grid_layer_of_an_empty_batch_is_empty_as_torch_s() -> None:
    from layer_cases import Causal

    assert Causal(3, 4)(torch.randn(0, 3, 8)).shape == torch.nn.Conv1d(3, 4, 2)(torch.randn(0, 3, 9)).shape[:2] + (8,)
