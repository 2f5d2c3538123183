"""Graph bases against dense references built from their formulas, and graph layers against PyG."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse
import torch
from hypothesis import given
from hypothesis import strategies as st

from structconv import PolynomialBasis, conv, explain, gcn_basis, graph_basis
from structconv import nn as snn
from structconv.structures.graph import as_edges

pyg = pytest.importorskip("torch_geometric.nn")


@st.composite
def graphs(draw: Any, max_nodes: int = 8) -> dict[str, Any]:
    """A random directed multigraph, possibly with self-loops and isolated nodes."""
    N = draw(st.integers(2, max_nodes))
    E = draw(st.integers(0, 3 * N))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, N - 1, size=E), rng.integers(0, N - 1, size=E)  # node N-1 stays isolated
    return {"N": N, "index": np.stack([src, dst]), "weight": rng.uniform(0.1, 2.0, size=E), "rng": rng}


def dense_adjacency(g: dict[str, Any]) -> np.ndarray:
    A = np.zeros((g["N"], g["N"]))
    np.add.at(A, (g["index"][0], g["index"][1]), g["weight"])
    return A


def inv_power(d: np.ndarray, p: float) -> np.ndarray:
    out = np.zeros_like(d)
    out[d > 0] = d[d > 0] ** -p
    return out


# --- bases against their formulas -------------------------------------------------------------------
@given(g=graphs(), improved=st.booleans())
def test_gcn_basis_is_the_renormalised_adjacency(g: dict[str, Any], improved: bool) -> None:
    A = dense_adjacency(g)
    diag = np.diag(A).copy()
    had_loop = np.zeros(g["N"], bool)
    had_loop[g["index"][0][g["index"][0] == g["index"][1]]] = True
    # Loops are kept where present (their last weight, as PyG's add_remaining_self_loops) or added.
    last = {}
    for s, d, w in zip(*g["index"], g["weight"], strict=True):
        if s == d:
            last[s] = w
    np.fill_diagonal(A, 0.0)
    for n in range(g["N"]):
        A[n, n] = last.get(n, 2.0 if improved else 1.0)
    deg = A.sum(0)  # in-degree: messages gathered at the target (column)
    expected = inv_power(deg, 0.5)[:, None] * A * inv_power(deg, 0.5)[None]
    ours = gcn_basis(g["index"], g["N"], edge_weight=g["weight"], improved=improved).to_dense()[0]
    np.testing.assert_allclose(ours, expected, atol=1e-12)
    assert np.isfinite(ours).all()
    del diag, had_loop


@given(g=graphs(), K=st.integers(1, 4))
def test_powers_chebyshev_and_diffusion_bases(g: dict[str, Any], K: int) -> None:
    A = dense_adjacency(g)
    N = g["N"]
    deg_in = A.sum(0)
    S = inv_power(deg_in, 0.5)[:, None] * A * inv_power(deg_in, 0.5)[None]
    powers = graph_basis(g["index"], "powers", K=K, num_nodes=N, edge_weight=g["weight"])
    np.testing.assert_allclose(powers.to_dense(), np.stack([np.linalg.matrix_power(S, k) for k in range(K + 1)]))
    # Chebyshev of the scaled Laplacian, loops dropped, out-degrees (PyG's get_laplacian).
    B = A.copy()
    np.fill_diagonal(B, 0.0)
    for normalization in ("sym", "rw"):
        d = B.sum(1)
        if normalization == "sym":
            L = np.eye(N) - inv_power(d, 0.5)[:, None] * B * inv_power(d, 0.5)[None]
        else:
            L = np.eye(N) - inv_power(d, 1.0)[:, None] * B
        for lam in (None, 1.5):
            Lh = 2 * L / (lam or 2.0) - np.eye(N)
            T = [np.eye(N), Lh]
            while len(T) < K:
                T.append(2 * Lh @ T[-1] - T[-2])
            cheb = graph_basis(
                g["index"],
                "chebyshev",
                K=K,
                num_nodes=N,
                edge_weight=g["weight"],
                normalization=normalization,
                lambda_max=lam,
            )
            np.testing.assert_allclose(cheb.to_dense(), np.stack(T[:K]), atol=1e-10)
    # Diffusion (DCRNN): y = (D_out^-1 A)^k x and y = (D_in^-1 A^T)^k x; a member B acts as y = B^T x.
    forward = inv_power(A.sum(1), 1.0)[:, None] * A
    backward = inv_power(A.sum(0), 1.0)[:, None] * A.T
    diff = graph_basis(g["index"], "diffusion", K=K, num_nodes=N, edge_weight=g["weight"]).to_dense()
    expected = [np.eye(N)] + [np.linalg.matrix_power(forward, k).T for k in range(1, K + 1)]
    expected += [np.linalg.matrix_power(backward, k).T for k in range(1, K + 1)]
    np.testing.assert_allclose(diff, np.stack(expected), atol=1e-12)
    # Averaging preserves a constant signal on every node with an out-neighbour.
    x = np.ones((1, N, 1))
    theta = np.zeros((2 * K + 1, 1, 1))
    theta[1] = 1.0
    y = conv(graph_basis(g["index"], "diffusion", K=K, num_nodes=N), x, theta)
    has_out = A.sum(1) > 0
    np.testing.assert_allclose(y[0, has_out, 0], 1.0)


@given(g=graphs(), data=st.data())
def test_relational_basis_and_walks(g: dict[str, Any], data: Any) -> None:
    R = data.draw(st.integers(1, 3))
    E = g["index"].shape[1]
    etype = g["rng"].integers(0, R, size=E)
    walks = [[0], [0, R - 1]]
    basis = graph_basis(g["index"], "relational", num_nodes=g["N"], edge_type=etype, num_relations=R, walks=walks)
    dense = basis.to_dense()
    mats = []
    for r in range(R):
        Ar = np.zeros((g["N"], g["N"]))
        np.add.at(Ar, (g["index"][0][etype == r], g["index"][1][etype == r]), 1.0)
        count = Ar.sum(0)
        mats.append(Ar * inv_power(count, 1.0)[None])
    expected = mats + [mats[0], mats[0] @ mats[R - 1]]
    np.testing.assert_allclose(dense, np.stack(expected), atol=1e-12)


@given(g=graphs(), K=st.integers(1, 4), family=st.sampled_from(["powers", "chebyshev"]), data=st.data())
def test_polynomial_basis_every_order_equals_the_dense_einsum(
    g: dict[str, Any], K: int, family: str, data: Any
) -> None:
    backend = data.draw(st.sampled_from(["numpy", "torch"]))
    matrix = as_edges(g["index"], g["N"], g["weight"]).to_basis()
    if backend == "torch":
        matrix = as_edges(torch.from_numpy(g["index"]), g["N"], torch.from_numpy(g["weight"])).to_basis()
    degrees = data.draw(st.lists(st.integers(0, K), min_size=1, max_size=4))
    basis = PolynomialBasis(matrix, degrees, family)
    dense = basis.to_dense()
    dense_np = dense.numpy() if backend == "torch" else dense
    rng = g["rng"]
    x = rng.normal(size=(2, g["N"], 3))
    theta = rng.normal(size=(len(degrees), 3, 2))
    ref = np.einsum("kmn,bmp,kpq->bnq", dense_np, x, theta)
    cv = torch.from_numpy if backend == "torch" else (lambda a: a)
    for order in ("ax", "xtheta", "atheta", "materialized", "auto"):
        y = conv(basis, cv(x), cv(theta), order=order)
        np.testing.assert_allclose(np.asarray(y), ref, atol=1e-10, err_msg=order)
    s = rng.normal(size=(2, len(degrees), g["N"], 3))
    np.testing.assert_allclose(
        np.asarray(basis.apply_members(cv(s), reduce=False)), np.einsum("kmn,bkmc->bknc", dense_np, s), atol=1e-10
    )
    assert "materialized" in [c.order for c in explain(basis, cv(x), cv(theta)).candidates]


def test_graph_inputs_agree() -> None:
    index = np.array([[0, 1, 1, 2, 2], [1, 0, 2, 1, 1]])  # a repeated edge 2 -> 1
    weight = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    ref = gcn_basis(index, 4, edge_weight=weight).to_dense()
    adjacency = np.zeros((4, 4))
    np.add.at(adjacency, tuple(index), weight)
    assert adjacency[2, 1] == 9.0
    np.testing.assert_allclose(gcn_basis(adjacency).to_dense(), ref)
    np.testing.assert_allclose(gcn_basis(scipy.sparse.csr_matrix(adjacency)).to_dense(), ref)
    sparse_t = torch.from_numpy(adjacency).to_sparse()
    np.testing.assert_allclose(gcn_basis(sparse_t).to_dense().numpy(), ref)
    np.testing.assert_allclose(
        gcn_basis(torch.from_numpy(index), 4, edge_weight=torch.from_numpy(weight)).to_dense().numpy(), ref
    )


# --- layers against PyG ------------------------------------------------------------------------------
def _pair(kind: str, P: int, Q: int) -> tuple[Any, Any]:
    if kind == "gcn":
        ref = pyg.GCNConv(P, Q)
        ours = snn.GCNConv(P, Q)
        ours.weight.data = ref.lin.weight.data.T[None].clone()
    elif kind == "gcn-improved":
        ref = pyg.GCNConv(P, Q, improved=True)
        ours = snn.GCNConv(P, Q, improved=True)
        ours.weight.data = ref.lin.weight.data.T[None].clone()
    elif kind in ("tag", "cheb", "cheb-rw"):
        ref = {"tag": pyg.TAGConv(P, Q, K=3), "cheb": pyg.ChebConv(P, Q, K=3)}.get(
            kind, pyg.ChebConv(P, Q, K=2, normalization="rw")
        )
        ours = {"tag": snn.TAGConv(P, Q, K=3), "cheb": snn.ChebConv(P, Q, K=3)}.get(
            kind, snn.ChebConv(P, Q, K=2, normalization="rw", lambda_max=2.0)
        )
        ours.weight.data = torch.stack([lin.weight.data.T for lin in ref.lins])
    elif kind == "sg":
        ref = pyg.SGConv(P, Q, K=2)
        ours = snn.SGConv(P, Q, K=2)
        ours.weight.data = ref.lin.weight.data.T[None].clone()
        ours.bias.data = ref.lin.bias.data.clone()
        return ours, ref
    else:
        concat = kind == "gat"
        ref = pyg.GATConv(P, Q, heads=3, concat=concat)
        ours = snn.GATConv(P, Q, heads=3, concat=concat)
        ours.weight.data = ref.lin.weight.data.T.clone()
        ours.att_src.data = ref.att_src.data[0].clone()
        ours.att_dst.data = ref.att_dst.data[0].clone()
    ours.bias.data = ref.bias.data.clone()
    return ours, ref


def _ref_forward(ref: Any, kind: str, x: torch.Tensor, ei: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    if kind == "cheb-rw":
        return ref(x, ei, w, lambda_max=2.0)
    if kind.startswith("gat"):
        return ref(x, ei)
    return ref(x, ei, w)


KINDS = ["gcn", "gcn-improved", "tag", "cheb", "cheb-rw", "sg", "gat", "gat-mean"]


@pytest.mark.parametrize("kind", KINDS)
@given(g=graphs(max_nodes=10), weighted=st.booleans())
def test_layers_equal_pyg_outputs_and_gradients(kind: str, g: dict[str, Any], weighted: bool) -> None:
    torch.manual_seed(0)
    P, Q = 5, 4
    ours, ref = _pair(kind, P, Q)
    ours, ref = ours.double(), ref.double()
    ei = torch.from_numpy(g["index"])
    w = torch.from_numpy(g["weight"]) if weighted and not kind.startswith("gat") else None
    x = torch.randn(g["N"], P, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_ref = ours(x1, ei, w), _ref_forward(ref, kind, x2, ei, w)
    torch.testing.assert_close(y_ours, y_ref)
    grad = torch.randn_like(y_ref)
    y_ours.backward(grad)
    y_ref.backward(grad)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ours.bias.grad, (ref.lin.bias if kind == "sg" else ref.bias).grad)
    if kind.startswith("gat"):
        torch.testing.assert_close(ours.weight.grad, ref.lin.weight.grad.T)
        torch.testing.assert_close(ours.att_src.grad, ref.att_src.grad[0])
    elif kind in ("gcn", "gcn-improved", "sg"):
        torch.testing.assert_close(ours.weight.grad[0], ref.lin.weight.grad.T)
    else:
        torch.testing.assert_close(ours.weight.grad, torch.stack([lin.weight.grad.T for lin in ref.lins]))


@pytest.mark.parametrize("decomposition", [{}, {"num_bases": 2}, {"num_blocks": 2}])
def test_rgcn_equals_pyg(decomposition: dict[str, int]) -> None:
    torch.manual_seed(0)
    N, P, Q, R = 12, 4, 6, 3
    ei = torch.randint(0, N - 2, (2, 40))
    et = torch.randint(0, R, (40,))
    ref = pyg.RGCNConv(P, Q, R, **decomposition).double()
    ours = snn.RGCNConv(P, Q, R, **decomposition).double()
    ours.weight.data, ours.root.data, ours.bias.data = (t.data.clone() for t in (ref.weight, ref.root, ref.bias))
    if ours.comp is not None:
        ours.comp.data = ref.comp.data.clone()
    x = torch.randn(N, P, dtype=torch.float64)
    y_ours, y_ref = ours(x, ei, et), ref(x, ei, et)
    torch.testing.assert_close(y_ours, y_ref)
    y_ours.sum().backward()
    y_ref.sum().backward()
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad)
    torch.testing.assert_close(ours.root.grad, ref.root.grad)


@pytest.mark.parametrize("kind", ["gcn", "tag", "cheb", "sg", "gat"])
@given(g=graphs(max_nodes=9), seed=st.integers(0, 2**31))
def test_relabelling_nodes_permutes_outputs(kind: str, g: dict[str, Any], seed: int) -> None:
    torch.manual_seed(0)
    ours, _ = _pair(kind, 3, 2)
    ours = ours.double().eval()
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(g["N"]))
    ei = torch.from_numpy(g["index"])
    x = torch.randn(g["N"], 3, dtype=torch.float64)
    y = ours(x, ei)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(g["N"])
    y_perm = ours(x[perm], inverse[ei])  # node perm[i] becomes node i
    torch.testing.assert_close(y_perm, y[perm])


@pytest.mark.parametrize("kind", ["gcn", "tag", "cheb", "gat"])
def test_gradcheck_layers(kind: str) -> None:
    torch.manual_seed(0)
    ours, _ = _pair(kind, 3, 2)
    ours = ours.double()
    ei = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]])
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)  # node 4 is isolated
    params = [p for p in ours.parameters()]

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        for p, v in zip(params, ps, strict=True):
            p.data = v.detach()
        return ours(x, ei)

    assert torch.autograd.gradcheck(lambda x: ours(x, ei), (x,))
    weight = torch.rand(5, dtype=torch.float64, requires_grad=True) + 0.5
    if kind != "gat":
        assert torch.autograd.gradcheck(lambda w: ours(x.detach(), ei, w), (weight,))
    del f


def test_prebuilt_basis_is_used_as_is() -> None:
    torch.manual_seed(0)
    layer = snn.GCNConv(4, 3)
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x = torch.randn(3, 4)
    torch.testing.assert_close(layer(x, gcn_basis(ei, 3, like=x)), layer(x, ei))


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_gat_forward_with_reused_values_equals_conv_of_its_attention_basis(concat: bool, seed: int) -> None:
    """The forward (its ``segment`` order reusing xW) equals ``conv`` of its attention basis, with gradients."""
    g = torch.Generator().manual_seed(seed)
    N, E, heads = 3 + 4 * seed, 5 + 12 * seed, 1 + seed % 3
    torch.manual_seed(seed)
    layer = snn.GATConv(5, 3, heads=heads, concat=concat, bias=False).double()
    x = torch.randn(N, 5, dtype=torch.float64, generator=g, requires_grad=True)
    ei = torch.randint(0, N, (2, E), generator=g)
    ei[:, -1] = torch.tensor([N - 2, N - 2])  # an existing self-loop (dropped, then re-added)
    params = [x, *layer.parameters()]
    fused = layer(x, ei)
    basis, _ = layer.attention(x, ei)
    engine = conv(basis, x, layer.theta())
    torch.testing.assert_close(fused, engine)
    probe = torch.randn(fused.shape, dtype=torch.float64, generator=g)
    for a, b in zip(
        torch.autograd.grad((fused * probe).sum(), params),
        torch.autograd.grad((engine * probe).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


@given(g=graphs(), K=st.integers(1, 4), backend=st.sampled_from(["numpy", "torch"]))
def test_edge_basis_every_order_equals_the_dense_einsum(g: dict[str, Any], K: int, backend: str) -> None:
    from structconv import EdgeBasis

    rng = g["rng"]
    E = g["index"].shape[1]
    weights = rng.normal(size=(E, K))
    cv = torch.from_numpy if backend == "torch" else (lambda a: a)
    basis = EdgeBasis(cv(g["index"][0]), cv(g["index"][1]), cv(weights), (g["N"], g["N"]))
    dense = np.zeros((K, g["N"], g["N"]))
    for k in range(K):
        np.add.at(dense[k], (g["index"][0], g["index"][1]), weights[:, k])
    np.testing.assert_allclose(np.asarray(basis.to_dense()), dense)
    x, theta = rng.normal(size=(2, g["N"], 3)), rng.normal(size=(K, 3, 2))
    for order in ("ax", "xtheta", "atheta", "auto"):
        y = conv(basis, cv(x), cv(theta), order=order)
        np.testing.assert_allclose(np.asarray(y), np.einsum("kmn,bmp,kpq->bnq", dense, x, theta), atol=1e-10)
    np.testing.assert_allclose(np.asarray(basis.T.to_dense()), dense.transpose(0, 2, 1))


def test_reused_basis_switches_to_csr_and_keeps_exact_gradients() -> None:
    torch.manual_seed(0)
    layer = snn.GCNConv(3, 2).double()
    ei = torch.randint(0, 7, (2, 20))
    x = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    basis = gcn_basis(ei, 7, like=x)
    first = layer(x, basis)  # gather-scatter
    second = layer(x, basis)  # CSR, with the cached transpose in backward
    torch.testing.assert_close(first, second)
    assert torch.autograd.gradcheck(lambda v: layer(v, basis), (x,))
    g1 = torch.autograd.grad(first.sum(), x)[0]
    g2 = torch.autograd.grad(layer(x, basis).sum(), x)[0]
    torch.testing.assert_close(g1, g2)


def test_review_regressions() -> None:
    # GCNConv(normalize=False) adds no self-loops by default, as PyG.
    torch.manual_seed(0)
    ref = pyg.GCNConv(4, 2, normalize=False)
    ours = snn.GCNConv(4, 2, normalize=False)
    ours.weight.data = ref.lin.weight.data.T[None].clone()
    ours.bias.data = ref.bias.data.clone()
    x = torch.randn(3, 4)
    ei = torch.tensor([[0, 1, 1], [1, 0, 2]])
    torch.testing.assert_close(ours(x, ei), ref(x, ei))
    # A first read under no_grad keeps the values connected to autograd.
    w = torch.rand(4, dtype=torch.float64, requires_grad=True)
    basis = graph_basis(torch.tensor([[1, 0, 1, 2], [0, 1, 2, 1]]), "powers", K=2, edge_weight=w)
    xd, th = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, 2, dtype=torch.float64)
    with torch.no_grad():
        conv(basis, xd, th, order="materialized")
    assert conv(basis, xd, th).requires_grad
    # An integer torch sparse adjacency is a matrix graph with integer weights.
    dense = torch.tensor([[0, 2, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_allclose(
        gcn_basis(dense.to_sparse()).to_dense().numpy(), gcn_basis(dense.double().numpy()).to_dense(), rtol=1e-6
    )
    # GAT: the third argument is PyG's edge_attr; without edge_dim it is refused, not misread as weights.
    gat = snn.GATConv(4, 2, add_self_loops=False)
    with pytest.raises(ValueError, match=r"edge_attr .* needs edge_dim"):
        gat(x, ei, torch.tensor([1.0, 0.0, 1.0]))


def test_gat_refuses_complex_edge_features() -> None:
    """A complex edge_attr would lose its imaginary part in the cast to the layer's dtype."""
    layer = snn.GATConv(4, 2, edge_dim=1)
    x, ei = torch.randn(3, 4), torch.tensor([[0, 1, 2], [1, 2, 0]])
    attr = torch.tensor([[1 + 5j], [2], [3]], dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"GATConv: edge_attr must hold real numbers, got dtype torch\.complex64"):
        layer(x, ei, attr)


@pytest.mark.parametrize("kind", ["powers", "chebyshev", "diffusion"])
def test_a_huge_order_is_held_lazily_and_one_beyond_int64_is_refused(kind: str) -> None:
    """K=10**10 costs nothing until applied (its degrees are a range); members int64 cannot number name K."""
    ei = np.array([[0, 1], [1, 0]])
    members = {"powers": 10**10 + 1, "chebyshev": 10**10, "diffusion": 2 * 10**10 + 1}[kind]
    assert graph_basis(ei, kind, K=10**10).shape == (members, 2, 2)
    with pytest.raises(ValueError, match=r"K=18446744073709551616 gives .* more entries than int64 can number"):
        graph_basis(ei, kind, K=2**64)


@pytest.mark.parametrize("num_nodes", [True, 1.0])
def test_a_matrix_graph_refuses_a_node_count_that_is_not_an_integer(num_nodes: object) -> None:
    """As an edge_index does: True and 1.0 equal a 1 x 1 matrix's size but are not counts."""
    with pytest.raises(ValueError, match=r"num_nodes must be a positive integer, got"):
        graph_basis(scipy.sparse.csr_array(np.ones((1, 1))), "diffusion", num_nodes=num_nodes)


@given(
    edges=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2)), min_size=1, max_size=8),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_edges_already_read_are_placed_whole_like_like(edges: list[tuple[int, int]], dtype: torch.dtype) -> None:
    """Edges read on NumPy and placed like a torch array move every array (not the weights alone), bipartite kept."""
    index = np.array(edges).T
    read = as_edges(index, 5, np.linspace(0.5, 1.0, len(edges)), num_targets=3)
    placed = as_edges(read, like=torch.zeros(1, dtype=dtype), num_targets=3)
    assert all(isinstance(a, torch.Tensor) for a in (placed.src, placed.dst, placed.weight))
    assert placed.src.dtype == placed.dst.dtype == torch.int64 and placed.weight.dtype == dtype
    assert (placed.num_nodes, placed.num_targets) == (5, 3)
    np.testing.assert_allclose(placed.to_basis().to_dense().numpy(), read.to_basis().to_dense(), rtol=1e-6)
    assert as_edges(read, like=np.zeros(1)) is read and as_edges(placed, like=torch.zeros(1, dtype=dtype)) is placed
    with pytest.raises(ValueError, match="graph is Edges already read, 3 targets; got num_targets=4"):
        as_edges(read, num_targets=4)
