"""``structconv.nn`` graph layers against PyTorch Geometric's, case by case.

Each test is one row of ``docs/peers/graph.rst``: an option or call form taken from PyG's own
tests (``test/nn/conv/test_{gcn,tag,sg,cheb,rgcn,gat}_conv.py``), run on the installed PyG layer
and on ours loaded with its parameters.  *equal*: outputs and the gradients of the inputs and of
every parameter agree (float64 and float32 tight; bfloat16 autocast loose); *refused*: our layer
raises a ``ValueError``/``TypeError`` naming the argument (PyG raises too, or ignores the
argument, which the note says); *n.a.*: a PyG-internal feature or an input PyG itself rejects
(what we do instead is tested).  Directed weighted multigraphs with self-loops are drawn by
Hypothesis.  The fragment is generated from :data:`CASES`::

    .venv/bin/python tests/peers/test_pyg_graph.py > docs/peers/graph.rst
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.sparse
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from peer_table import EQUAL, NA, REFUSED, PeerTable, case_name

from structconv import nn as snn
from structconv.nn.pyg_state import pyg_state_dict
from structconv.testing import Link, compare_to_peer

pyg_nn = pytest.importorskip("torch_geometric.nn")
import torch_geometric  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor  # noqa: E402

warnings.filterwarnings("ignore", message=".*[Ss]parse CSR.*")

TOL = {torch.float64: (1e-7, 1e-9), torch.float32: (1e-4, 1e-5)}
DTYPES = [torch.float64, torch.float32]
FEW = settings(max_examples=6, deadline=None)


INTRO = (
    "Each row is an option or call form from PyTorch Geometric {version}'s own tests of the layer, run "
    "on PyG's layer and on ours loaded with its parameters (tests/peers/test_pyg_graph.py).  *equal*: "
    "outputs and the gradients of the inputs and of every parameter agree, in float64 (rtol 1e-7) and "
    "float32 (rtol 1e-4), on directed weighted multigraphs with self-loops drawn by Hypothesis where "
    "the row allows; bfloat16 autocast within 8 % of the largest value.  *refused*: our layer raises a "
    "ValueError or TypeError naming the argument (the note says what PyG does).  *n.a.*: PyG-internal "
    "machinery or an input PyG itself rejects; the note says what we do, which is tested.  A sparse "
    "adjacency is PyG's adj_t (row = target) in every layer."
)

TABLE = PeerTable(
    "graph",
    "test_pyg_graph",
    "Graph layers against PyTorch Geometric 2.8",
    INTRO,
    ("layer", "option / call form", "result", "note"),
    (12, 40, 10, 38),
)


def case(layer: str, status: str, form: str, note: str = "") -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a test as one row of the fragment."""
    return TABLE.case(layer, form, status, note)


# --- graphs ------------------------------------------------------------------------------------------
@st.composite
def digraphs(draw: Any, max_nodes: int = 7) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A directed weighted multigraph with self-loops and an isolated last node: (edge_index, weight, N)."""
    N = draw(st.integers(2, max_nodes))
    E = draw(st.integers(1, 3 * N))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    index = torch.from_numpy(rng.integers(0, N - 1, size=(2, E)))
    return index, torch.from_numpy(rng.uniform(0.1, 2.0, size=E)), N


def adj_t(index: torch.Tensor, weight: torch.Tensor | None, N: int, layout: str = "coo") -> torch.Tensor:
    """PyG's ``adj_t`` (row = target) of a graph, as ``to_torch_csc_tensor(...).t()`` in PyG's tests."""
    if layout == "csr":
        return to_torch_csc_tensor(index, weight, size=(N, N)).t()
    return to_torch_coo_tensor(index.flip(0), weight, size=(N, N))


FIXED = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])  # PyG's test graph


# --- building both layers -----------------------------------------------------------------------------
def links(kind: str, ours: Any, ref: Any) -> list[Link]:
    """Each of our parameters as a function of PyG's (:class:`structconv.testing.Link`): for values and gradients."""
    T0: Callable[..., torch.Tensor] = lambda w: w.T[None]  # noqa: E731
    same: Callable[..., torch.Tensor] = lambda w: w  # noqa: E731
    stack: Callable[..., torch.Tensor] = lambda *ws: torch.stack([w.T for w in ws])  # noqa: E731
    out: list[tuple[Any, ...]] = []
    if kind == "gcn":
        out = [(ours.weight, [ref.lin.weight], T0)]
    elif kind == "sg":
        out = [(ours.weight, [ref.lin.weight], T0), (ours.bias, [ref.lin.bias], same)]
    elif kind in ("tag", "cheb"):
        out = [(ours.weight, [lin.weight for lin in ref.lins], stack)]
    elif kind == "rgcn":
        out = [(ours.weight, [ref.weight], same)]
        out += [(getattr(ours, n), [getattr(ref, n)], same) for n in ("comp", "root") if getattr(ref, n) is not None]
    elif kind == "gat":
        src = ref.lin if ref.lin is not None else ref.lin_src
        out = [(ours.weight, [src.weight], lambda w: w.T)]
        out += [(ours.att_src, [ref.att_src], lambda a: a[0]), (ours.att_dst, [ref.att_dst], lambda a: a[0])]
        if ref.lin_dst is not None:
            out.append((ours.weight_dst, [ref.lin_dst.weight], lambda w: w.T))
        if ref.lin_edge is not None:
            out += [
                (ours.weight_edge, [ref.lin_edge.weight], lambda w: w.T),
                (ours.att_edge, [ref.att_edge], lambda a: a[0]),
            ]
        if ref.res is not None:
            out.append((ours.res, [ref.res.weight], lambda w: w.T))
    if kind != "sg" and getattr(ref, "bias", None) is not None:
        out.append((ours.bias, [ref.bias], same))
    return [Link(*link) for link in out]


CLASSES = {
    "gcn": ("GCNConv", "GCNConv"),
    "tag": ("TAGConv", "TAGConv"),
    "sg": ("SGConv", "SGConv"),
    "cheb": ("ChebConv", "ChebConv"),
    "rgcn": ("RGCNConv", "RGCNConv"),
    "gat": ("GATConv", "GATConv"),
}


def by_name(klass: type, args: tuple[Any, ...]) -> dict[str, Any]:
    """PyG's positional arguments by their names in its signature (ours takes them by position too: test_signatures)."""
    names = [name for name in inspect.signature(klass.__init__).parameters if name != "self"]
    return dict(zip(names, args, strict=False))


def pair(kind: str, dtype: torch.dtype, *args: Any, seed: int = 0, **kwargs: Any) -> tuple[Any, Any, list[Link]]:
    """PyG's layer with every parameter drawn (biases non-zero) and ours loaded from it."""
    torch.manual_seed(seed)
    ref = getattr(pyg_nn, CLASSES[kind][1])(*args, **kwargs).to(dtype)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.5)
    ours = getattr(snn, CLASSES[kind][0])(**by_name(getattr(pyg_nn, CLASSES[kind][1]), args), **kwargs).to(dtype)
    pairs = links(kind, ours, ref)
    assert {id(link.ours) for link in pairs} == {id(p) for p in ours.parameters()}, "every parameter is linked"
    with torch.no_grad():
        for link in pairs:
            link.ours.copy_(link.fn(*link.peer))
    return ours, ref, pairs


def close(a: torch.Tensor | None, b: torch.Tensor | None, dtype: torch.dtype, what: str) -> None:
    if a is None or b is None:  # a gradient that one side never formed is zero
        if a is None and b is None:
            return
        a, b = (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)
    rtol, atol = TOL.get(dtype, (0.0, 8e-2))
    scale = max(1.0, float(b.detach().abs().max())) if b.numel() else 1.0
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale, msg=lambda m: f"{what}: {m}")


def compare(
    ours: Any, ref: Any, pairs: list[Link], args: tuple[Any, ...], dtype: torch.dtype, **kwargs: Any
) -> tuple[Any, Any]:
    """Run both on copies of ``args`` (float tensors require grad); outputs and all gradients must agree.

    :func:`structconv.testing.compare_to_peer` with our parameters linked to PyG's (``pairs``);
    the absolute tolerance is relative to the larger of 1 and the tensor's largest value.
    """
    rtol, atol = TOL.get(dtype, (0.0, 8e-2))
    return compare_to_peer(
        ours, ref, *args, kwargs=kwargs, parameters_from=pairs, rtol=rtol, atol=atol, floor=1.0, name=case_name()
    )


def typed(index: torch.Tensor, weight: torch.Tensor, N: int, P: int, dtype: torch.dtype) -> tuple[Any, ...]:
    torch.manual_seed(1)
    return torch.randn(N, P, dtype=dtype), index, weight.to(dtype)


# --- GCNConv ------------------------------------------------------------------------------------------
@case("GCNConv", EQUAL, "``conv(x, edge_index)``, ``conv(x, edge_index, edge_weight)``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs(), weighted=st.booleans())
def test_gcn_edge_index(dtype: torch.dtype, g: Any, weighted: bool) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("gcn", dtype, 3, 4)
    x, ei, w = typed(index, weight, N, 3, dtype)
    compare(ours, ref, links_, (x, ei, w) if weighted else (x, ei), dtype)


@case(
    "GCNConv",
    EQUAL,
    "``conv(x, adj.t())``, torch.sparse COO/CSR ``adj_t``, weighted, directed, with self-loops",
    "row = target, as PyG; loops: :math:`A + I` (summed with existing loops), as PyG's gcn_norm on COO input "
    "(PyG's CSR path disagrees with its own COO path on graphs with loops or repeated entries; CSR is "
    "compared on coalesced graphs without loops)",
)
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs())
def test_gcn_sparse_adj_t(layout: str, dtype: torch.dtype, g: Any) -> None:
    index, weight, N = g
    if layout == "csr":  # PyG's CSR path is only consistent with COO on coalesced input without loops
        keep = index[0] != index[1]
        index, weight = index[:, keep], weight[keep]
        key = torch.unique(index[0] * N + index[1])
        index, weight = torch.stack([key // N, key % N]), weight[: key.numel()]
    ours, ref, links_ = pair("gcn", dtype, 3, 4)
    x, _, w = typed(index, weight, N, 3, dtype)
    compare(ours, ref, links_, (x, adj_t(index, w, N, layout)), dtype)


@case("GCNConv", EQUAL, "PyG's ``test_gcn_conv``: ``adj1.t()``/``adj2.t()`` equal to the edge_index calls")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gcn_pyg_case(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, value = torch.randn(4, 16, dtype=dtype), torch.rand(6, dtype=dtype)
    ours, ref, links_ = pair("gcn", dtype, 16, 32)
    out1 = compare(ours, ref, links_, (x, FIXED), dtype)[0]
    out2 = compare(ours, ref, links_, (x, FIXED, value), dtype)[0]
    close(ours(x, to_torch_csc_tensor(FIXED, size=(4, 4)).t()), out1, dtype, "adj1.t()")
    close(ours(x, to_torch_csc_tensor(FIXED, value, size=(4, 4)).t()), out2, dtype, "adj2.t()")


@case("GCNConv", EQUAL, "``improved=True`` with and without ``edge_weight``, and on a sparse ``adj_t``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs(), form=st.sampled_from(["plain", "weighted", "sparse"]))
def test_gcn_improved(dtype: torch.dtype, g: Any, form: str) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("gcn", dtype, 3, 4, improved=True)
    x, ei, w = typed(index, weight, N, 3, dtype)
    args = {"plain": (x, ei), "weighted": (x, ei, w), "sparse": (x, adj_t(ei, w, N))}[form]
    compare(ours, ref, links_, args, dtype)


@case("GCNConv", EQUAL, "``normalize=False`` (with ``add_self_loops`` False or default)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs(), sparse=st.booleans())
def test_gcn_unnormalized(dtype: torch.dtype, g: Any, sparse: bool) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("gcn", dtype, 3, 4, normalize=False, add_self_loops=False)
    x, ei, w = typed(index, weight, N, 3, dtype)
    compare(ours, ref, links_, (x, adj_t(ei, w, N)) if sparse else (x, ei, w), dtype)


@case("GCNConv", REFUSED, "``GCNConv(normalize=False, add_self_loops=True)``", "both raise ValueError")
def test_gcn_loops_without_normalize() -> None:
    with pytest.raises(ValueError, match="does not support adding self-loops"):
        pyg_nn.GCNConv(16, 32, normalize=False, add_self_loops=True)
    with pytest.raises(ValueError, match="add_self_loops=True needs normalize=True"):
        snn.GCNConv(16, 32, normalize=False, add_self_loops=True)


@case("GCNConv", EQUAL, "sparse node features ``x`` (``test_gcn_conv_with_sparse_input_feature``)", "densified")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gcn_sparse_x(dtype: torch.dtype) -> None:
    x = torch.sparse_coo_tensor(torch.tensor([[0, 0], [0, 1]]), torch.tensor([1.0, 1.0], dtype=dtype), (4, 16))
    ours, ref, _ = pair("gcn", dtype, 16, 32)
    close(ours(x, FIXED), ref(x, FIXED), dtype, "output")


@case("GCNConv", EQUAL, "static graph: ``x`` of shape ``(B, N, F)`` (``test_static_gcn_conv``)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs(), weighted=st.booleans())
def test_gcn_static(dtype: torch.dtype, g: Any, weighted: bool) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("gcn", dtype, 3, 4)
    x = torch.randn(2, N, 3, dtype=dtype)
    compare(ours, ref, links_, (x, index, weight.to(dtype)) if weighted else (x, index), dtype)


@case("GCNConv", EQUAL, "``flow='target_to_source'`` (``test_gcn_conv_flow``)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs())
def test_gcn_flow(dtype: torch.dtype, g: Any) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("gcn", dtype, 3, 4, flow="target_to_source")
    x, ei, w = typed(index, weight, N, 3, dtype)
    compare(ours, ref, links_, (x, ei, w), dtype)


@case("GCNConv", REFUSED, "``flow='target_to_source'`` with a sparse adjacency", "both raise ValueError")
def test_gcn_flow_sparse() -> None:
    ours, ref, _ = pair("gcn", torch.float32, 3, 4, flow="target_to_source")
    x, adj = torch.randn(4, 3), adj_t(FIXED, None, 4)
    with pytest.raises(ValueError, match="target_to_source"):
        ref(x, adj)
    with pytest.raises(ValueError, match="flow='target_to_source' needs an edge_index"):
        ours(x, adj)


@case("GCNConv", EQUAL, "a graph with zero nodes")
def test_gcn_empty() -> None:
    ours, ref, _ = pair("gcn", torch.float32, 3, 4)
    x, ei = torch.randn(0, 3), torch.empty(2, 0, dtype=torch.long)
    assert ours(x, ei).shape == ref(x, ei).shape == (0, 4)


@case("GCNConv", EQUAL, "PyG's ``EdgeIndex`` as ``edge_index``")
def test_gcn_edge_index_class() -> None:
    ours, ref, _ = pair("gcn", torch.float64, 3, 4)
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    ei = torch_geometric.EdgeIndex(FIXED, sparse_size=(4, 4))
    close(ours(x, ei, w), ref(x, FIXED, w), torch.float64, "output")


@case(
    "GCNConv", EQUAL, "``cached=True``", "the first graph's basis reused; a graph of another size refused (PyG reuses)"
)
def test_gcn_cached() -> None:
    ours, ref, _ = pair("gcn", torch.float64, 3, 4, cached=True)
    x = torch.randn(4, 3, dtype=torch.float64)
    close(ours(x, FIXED), ref(x, FIXED), torch.float64, "first call")
    close(ours(2 * x, FIXED), ref(2 * x, FIXED), torch.float64, "cached call")
    with pytest.raises(ValueError, match="GCNConv: cached=True keeps the first graph's basis"):
        ours(x, FIXED[:, :-1])


@case("GCNConv", NA, "torch.sparse CSC ``adj_t``", "PyG raises NotImplementedError; ours reads it like COO (tested)")
def test_gcn_csc() -> None:
    ours, ref, _ = pair("gcn", torch.float64, 3, 4)
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    csc = adj_t(FIXED, w, 4).to_sparse_csc()
    with pytest.raises(NotImplementedError):
        ref(x, csc)
    close(ours(x, csc), ref(x, FIXED, w), torch.float64, "output")


@case("GCNConv", NA, "``scipy.sparse`` ``adj_t``", "PyG does not accept it; ours reads it as ``adj_t`` (tested)")
def test_gcn_scipy() -> None:
    ours, ref, _ = pair("gcn", torch.float64, 3, 4)
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    sp = scipy.sparse.coo_matrix((w.numpy(), (FIXED[1].numpy(), FIXED[0].numpy())), shape=(4, 4))
    close(ours(x, sp), ref(x, FIXED, w), torch.float64, "output")


# --- bfloat16 autocast, float64, all layers -------------------------------------------------------------
_CASE_ARGS: dict[str, tuple[Any, ...]] = {
    "gcn": (6, 4),
    "tag": (6, 4),
    "sg": (6, 4),
    "cheb": (6, 4, 3),
    "gat": (6, 4),
    "rgcn": (6, 4, 2),
}


def _autocast_case(kind: str) -> tuple[Any, Any, tuple[Any, ...]]:
    x, w = torch.randn(4, 6), torch.rand(6) + 0.5
    ours, ref, _ = pair(kind, torch.float32, *_CASE_ARGS[kind])
    if kind == "rgcn":
        return ours, ref, (x, FIXED, torch.tensor([0, 1, 0, 1, 1, 0]))
    if kind == "gat":
        return ours, ref, (x, FIXED)
    return ours, ref, (x, FIXED, w)


@case("all", EQUAL, "``torch.autocast('cpu', dtype=torch.bfloat16)``", "loose tolerance; sparse products in float32")
@pytest.mark.parametrize("kind", list(CLASSES))
def test_autocast_bfloat16(kind: str) -> None:
    ours, ref, args = _autocast_case(kind)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y1, y2 = ours(*args), ref(*args)
    close(y1.float(), y2.float(), torch.bfloat16, "output")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ours(*args)
    y.float().sum().backward()  # outside autocast, as torch recommends
    outside = [p.grad.clone() for p in ours.parameters()]
    ours.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours(*args).float().sum().backward()  # inside too: the sparse backward must not ask for a bf16 product
    for g_in, g_out in zip((p.grad for p in ours.parameters()), outside, strict=True):
        close(g_in.float(), g_out.float(), torch.bfloat16, "gradient")


@case(
    "all",
    REFUSED,
    "``x`` in another dtype than the parameters (no autocast)",
    "PyG raises torch's RuntimeError; ours a TypeError naming the layer, x and both dtypes",
)
@pytest.mark.parametrize(("kind", "bipartite"), [(k, False) for k in CLASSES] + [("gat", True), ("rgcn", True)])
def test_dtype_mismatch(kind: str, bipartite: bool) -> None:
    ours, ref, args = _autocast_case(kind)
    if bipartite:
        ch: Any = (6, 6)
        ours, ref, _ = pair(kind, torch.float32, ch, 4, *((2,) if kind == "rgcn" else ()))
        x = args[0]
        args = ((x, x.double()), *args[1:])
        name = "x\\[1\\]"
    else:
        args = (args[0].double(), *args[1:])
        name = "x"
    with pytest.raises(RuntimeError):
        ref(*args)
    with pytest.raises(TypeError, match=rf"{CLASSES[kind][0]}: {name} has dtype torch.float64 .* torch.float32"):
        ours(*args)


@case("all", NA, "bfloat16 parameters and inputs", "PyG raises NotImplementedError on sparse bf16 products")
def test_bfloat16_parameters() -> None:
    ours, ref, _ = pair("gcn", torch.bfloat16, 6, 4)
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError):
        ref(x, adj_t(FIXED, None, 4).to(torch.bfloat16))
    close(ours(x, FIXED).float(), ref(x, FIXED).float(), torch.bfloat16, "output")


# --- TAGConv ------------------------------------------------------------------------------------------
@case("TAGConv", EQUAL, "``conv(x, edge_index[, edge_weight])`` and ``conv(x, adj.t())`` (COO, CSR)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs(), form=st.sampled_from(["plain", "weighted", "sparse"]), K=st.integers(1, 3))
def test_tag(dtype: torch.dtype, g: Any, form: str, K: int) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("tag", dtype, 3, 4, K=K)
    x, ei, w = typed(index, weight, N, 3, dtype)
    args = {"plain": (x, ei), "weighted": (x, ei, w), "sparse": (x, adj_t(ei, w, N))}[form]
    compare(ours, ref, links_, args, dtype)


@case("TAGConv", EQUAL, "PyG's ``test_tag_conv`` (CSR ``adj.t()``), ``normalize=False``")
@pytest.mark.parametrize("normalize", [True, False])
def test_tag_pyg_case(normalize: bool) -> None:
    dtype = torch.float64
    x, value = torch.randn(4, 16, dtype=dtype), torch.rand(6, dtype=dtype)
    ours, ref, links_ = pair("tag", dtype, 16, 32, normalize=normalize)
    out2 = compare(ours, ref, links_, (x, FIXED, value), dtype)[0]
    close(ours(x, to_torch_csc_tensor(FIXED, value, size=(4, 4)).t()), out2, dtype, "adj2.t()")


@case("TAGConv", EQUAL, "static graph ``x`` ``(B, N, F)``, ``flow='target_to_source'``")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["static", "flow"])
def test_tag_static_flow(dtype: torch.dtype, form: str) -> None:
    kw = {"flow": "target_to_source"} if form == "flow" else {}
    ours, ref, links_ = pair("tag", dtype, 3, 4, **kw)
    x = torch.randn(*((2,) if form == "static" else ()), 4, 3, dtype=dtype)
    compare(ours, ref, links_, (x, FIXED, torch.rand(6, dtype=dtype)), dtype)


@case("TAGConv", EQUAL, "a graph with zero nodes")
def test_tag_empty() -> None:
    ours, ref, _ = pair("tag", torch.float32, 3, 4)
    x, ei = torch.randn(0, 3), torch.empty(2, 0, dtype=torch.long)
    assert ours(x, ei).shape == ref(x, ei).shape == (0, 4)


# --- SGConv -------------------------------------------------------------------------------------------
@case("SGConv", EQUAL, "``SGConv(K)``: edge_index, edge_weight, sparse ``adj_t`` with self-loops")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(g=digraphs(), form=st.sampled_from(["plain", "weighted", "sparse"]), K=st.integers(1, 3))
def test_sg(dtype: torch.dtype, g: Any, form: str, K: int) -> None:
    index, weight, N = g
    ours, ref, links_ = pair("sg", dtype, 3, 4, K=K)
    x, ei, w = typed(index, weight, N, 3, dtype)
    args = {"plain": (x, ei), "weighted": (x, ei, w), "sparse": (x, adj_t(ei, w, N))}[form]
    compare(ours, ref, links_, args, dtype)


@case("SGConv", EQUAL, "PyG's ``test_sg_conv`` (``K=10``, CSR ``adj.t()``), ``add_self_loops=False``")
@pytest.mark.parametrize("loops", [True, False])
def test_sg_pyg_case(loops: bool) -> None:
    dtype = torch.float64
    x, value = torch.randn(4, 16, dtype=dtype), torch.rand(6, dtype=dtype)
    ours, ref, links_ = pair("sg", dtype, 16, 32, K=10, add_self_loops=loops)
    out2 = compare(ours, ref, links_, (x, FIXED, value), dtype)[0]
    close(ours(x, to_torch_csc_tensor(FIXED, value, size=(4, 4)).t()), out2, dtype, "adj2.t()")


@case("SGConv", EQUAL, "``cached=True``", "the basis cached, not PyG's features: a new ``x`` is used (PyG ignores it)")
def test_sg_cached() -> None:
    ours, ref, _ = pair("sg", torch.float64, 3, 4, 2, cached=True)
    x = torch.randn(4, 3, dtype=torch.float64)
    close(ours(x, FIXED), ref(x, FIXED), torch.float64, "first call")
    close(ours(x, FIXED), ref(x, FIXED), torch.float64, "cached call")
    close(ours(2 * x, FIXED), 2 * ref(x, FIXED) - ref.lin.bias, torch.float64, "a new x")
    with pytest.raises(ValueError, match="SGConv: cached=True keeps the first graph's basis"):
        ours(x, FIXED[:, :-1])


@pytest.mark.parametrize("dtype", [*DTYPES, torch.bfloat16])
def test_sg_cached_propagation(dtype: torch.dtype) -> None:
    """The propagated features are kept for the same unchanged ``x``: equal to PyG's on every call, and gradients."""
    ours, ref, _ = pair("sg", dtype, 3, 4, 2, cached=True)
    plain, _, _ = pair("sg", dtype, 3, 4, 2)
    x = torch.randn(4, 3, dtype=dtype)
    for call in range(3):
        close(ours(x, FIXED), ref(x, FIXED), dtype, f"call {call}")
        (grads := torch.autograd.grad(ours(x, FIXED).square().sum(), list(ours.parameters())))
        expected = torch.autograd.grad(plain(x, FIXED).square().sum(), list(plain.parameters()))
        for got, want in zip(grads, expected, strict=True):
            close(got, want, dtype, "parameter gradient")
    kept = ours._propagated
    assert kept is not None and kept[0] is x, "the propagation of x is kept"
    propagations = []
    contract = ours.contract
    ours.contract = lambda *a, **k: propagations.append(1) or contract(*a, **k)  # type: ignore[method-assign]
    close(ours(x, FIXED), ref(x, FIXED), dtype, "a kept propagation")
    assert not propagations, "the same x is not propagated again"
    x.mul_(2)  # changed in place: propagated again (PyG would keep its old features)
    close(ours(x, FIXED), plain(x, FIXED), dtype, "x changed in place")
    x.data = torch.randn(4, 3, dtype=dtype)  # new storage, the version counter untouched
    close(ours(x, FIXED), plain(x, FIXED), dtype, "x given new data")
    assert len(propagations) == 2
    with torch.inference_mode():  # inference tensors track no version: nothing kept for them
        xi = torch.randn(4, 3, dtype=dtype)
        close(ours(xi, FIXED), plain(xi, FIXED), dtype, "under inference mode")
        close(ours(x, FIXED), plain(x, FIXED), dtype, "a normal x under inference mode")
    y = ours(x, FIXED)  # training after a validation pass under inference mode
    y.sum().backward()
    close(ours(x.to_sparse(), FIXED), plain(x, FIXED), dtype, "a sparse x, as the uncached layer takes it")
    xb = torch.randn(2, 4, 3, dtype=dtype)  # batched
    close(ours(xb, FIXED), plain(xb, FIXED), dtype, "batched x")
    xg = torch.randn(4, 3, dtype=dtype, requires_grad=True)  # needs a gradient: nothing kept for it
    (ga,) = torch.autograd.grad(ours(xg, FIXED).sum(), xg)
    (gb,) = torch.autograd.grad(plain(xg, FIXED).sum(), xg)
    close(ga, gb, dtype, "input gradient")
    assert ours._propagated is not None and ours._propagated[0] is xb
    ours.reset_parameters()
    assert ours._propagated is None
    with pytest.raises(TypeError, match="SGConv: x has dtype"):
        ours(x.float() if dtype != torch.float32 else x.double(), FIXED)


# --- ChebConv -----------------------------------------------------------------------------------------
@case("ChebConv", EQUAL, "``normalization`` ``'sym'``, ``'rw'``, ``None``; ``lambda_max`` default, in ``forward``")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalization", ["sym", "rw", None])
@FEW
@given(g=digraphs(), weighted=st.booleans(), lam=st.sampled_from([None, 3.0]), K=st.integers(1, 3))
def test_cheb(dtype: torch.dtype, normalization: str | None, g: Any, weighted: bool, lam: Any, K: int) -> None:
    index, weight, N = g
    if normalization is None:  # D - A of a graph without edges is 0, and so PyG's default lambda_max
        index, weight = torch.cat([index, torch.tensor([[0], [1]])], 1), torch.cat([weight, weight[:1]])
    ours, ref, links_ = pair("cheb", dtype, 3, 4, K, normalization=normalization)
    x, ei, w = typed(index, weight, N, 3, dtype)
    compare(ours, ref, links_, (x, ei, w if weighted else None), dtype, lambda_max=lam)


@case(
    "ChebConv",
    EQUAL,
    "``normalization='rw'`` without ``lambda_max``",
    "PyG 2.8 does not raise: it uses :math:`2\\max L = 2`, as we do",
)
def test_cheb_rw_default() -> None:
    ours, ref, links_ = pair("cheb", torch.float64, 3, 4, 3, normalization="rw")
    compare(ours, ref, links_, (torch.randn(4, 3, dtype=torch.float64), FIXED), torch.float64)


@case("ChebConv", EQUAL, "``conv(x, edge_index, edge_weight, batch[, lambda_max])``, one λ per graph")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_lambda", [False, True])
def test_cheb_batch(dtype: torch.dtype, with_lambda: bool) -> None:
    ours, ref, links_ = pair("cheb", dtype, 16, 32, 3)
    ei = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
    x, w, batch = torch.randn(4, 16, dtype=dtype), torch.rand(4, dtype=dtype), torch.tensor([0, 0, 1, 1])
    lam = torch.tensor([2.0, 3.0], dtype=dtype) if with_lambda else None
    compare(ours, ref, links_, (x, ei, w, batch, lam), dtype)


@case("ChebConv", EQUAL, "``test_cheb_conv_batch``: a ``Batch`` of graphs equals the graphs apart")
def test_cheb_data_batch() -> None:
    ours, ref, links_ = pair("cheb", torch.float32, 8, 16, 2)
    e1, e2 = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]), torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    d1 = Data(x=torch.randn(4, 8), edge_index=e1, edge_weight=torch.rand(6))
    d2 = Data(x=torch.randn(3, 8), edge_index=e2, edge_weight=torch.rand(4))
    b = Batch.from_data_list([d1, d2])
    out = compare(ours, ref, links_, (b.x, b.edge_index, b.edge_weight, b.batch), torch.float32)[0]
    close(out[:4], ours(d1.x, e1, d1.edge_weight), torch.float32, "first graph")


@case("ChebConv", REFUSED, "several ``lambda_max`` without ``batch``", "ValueError names lambda_max and batch")
def test_cheb_lambda_without_batch() -> None:
    ours, ref, _ = pair("cheb", torch.float32, 3, 4, 2)
    x, lam = torch.randn(4, 3), torch.tensor([2.0, 3.0])
    with pytest.raises(RuntimeError):
        ref(x, FIXED, None, None, lam)
    with pytest.raises(ValueError, match=r"lambda_max .* needs batch"):
        ours(x, FIXED, None, None, lam)


# --- RGCNConv -----------------------------------------------------------------------------------------
RG_EI = torch.tensor([[0, 1, 1, 2, 2, 3], [0, 0, 1, 0, 1, 1]])
RG_ET = torch.tensor([0, 1, 1, 0, 0, 1])
CONFS = [(None, None), (2, None), (None, 2)]


@case("RGCNConv", EQUAL, "``aggr`` ``'mean'``, ``'sum'``, ``'add'``, ``'max'`` × bases / blocks, ``x`` features")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aggr", ["mean", "sum", "add", "max"])
@pytest.mark.parametrize("conf", CONFS)
@FEW
@given(g=digraphs(), seed=st.integers(0, 100))
def test_rgcn(dtype: torch.dtype, aggr: str, conf: Any, g: Any, seed: int) -> None:
    index, _, N = g
    ours, ref, links_ = pair("rgcn", dtype, 4, 6, 3, *conf, aggr=aggr)
    etype = torch.from_numpy(np.random.default_rng(seed).integers(0, 3, size=index.shape[1]))
    compare(ours, ref, links_, (torch.randn(N, 4, dtype=dtype), index, etype), dtype)


@case("RGCNConv", EQUAL, "featureless ``x=None`` or a node index vector (``test_rgcn_conv_basic``)")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@pytest.mark.parametrize("conf", CONFS[:2])
@pytest.mark.parametrize("form", ["none", "index"])
def test_rgcn_featureless(dtype: torch.dtype, aggr: str, conf: Any, form: str) -> None:
    ours, ref, links_ = pair("rgcn", dtype, 4, 32, 2, *conf, aggr=aggr)
    x = None if form == "none" else torch.tensor([3, 1, 0, 2])
    compare(ours, ref, links_, (x, RG_EI, RG_ET), dtype)


@case("RGCNConv", EQUAL, "bipartite ``(x_src, x_dst)`` and ``(None, idx)`` with ``in_channels=(4, 16)``")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aggr", ["mean", "sum", "max"])
@pytest.mark.parametrize("conf", CONFS)
@pytest.mark.parametrize("form", ["features", "none-index", "index-index"])
def test_rgcn_bipartite(dtype: torch.dtype, aggr: str, conf: Any, form: str) -> None:
    if conf[1] is not None and form != "features":
        pytest.skip("block decomposition is refused for featureless input (its own row)")
    ours, ref, links_ = pair("rgcn", dtype, (4, 16), 32, 2, *conf, aggr=aggr)
    x = {
        "features": (torch.randn(4, 4, dtype=dtype), torch.randn(2, 16, dtype=dtype)),
        "none-index": (None, torch.arange(2)),
        "index-index": (torch.arange(4), torch.arange(2)),
    }[form]
    compare(ours, ref, links_, (x, RG_EI, RG_ET), dtype)


@case("RGCNConv", REFUSED, "``num_blocks`` with featureless input", "both raise ValueError")
def test_rgcn_blocks_featureless() -> None:
    ours, ref, _ = pair("rgcn", torch.float32, 4, 32, 2, None, 2)
    with pytest.raises(ValueError, match="Block-diagonal"):
        ref(torch.arange(4), RG_EI, RG_ET)
    with pytest.raises(ValueError, match="num_blocks needs floating node features"):
        ours(torch.arange(4), RG_EI, RG_ET)


@case(
    "RGCNConv", NA, "``SparseTensor`` ``adj_t`` carrying ``edge_type``; ``FastRGCNConv``", "torch_sparse not installed"
)
def test_rgcn_sparse_tensor() -> None:
    assert not torch_geometric.typing.WITH_TORCH_SPARSE
    ours, _, _ = pair("rgcn", torch.float32, 4, 32, 2)
    with pytest.raises(ValueError, match="edge_index must be an edge_index"):
        ours(torch.randn(4, 4), adj_t(RG_EI, None, 4), RG_ET)


# --- GATConv ------------------------------------------------------------------------------------------
@case("GATConv", EQUAL, "``heads``, ``concat``, ``add_self_loops``, ``residual``; edge_index and ``adj.t()``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(
    g=digraphs(),
    heads=st.integers(1, 3),
    concat=st.booleans(),
    loops=st.booleans(),
    residual=st.booleans(),
    sparse=st.booleans(),
)
def test_gat(dtype: torch.dtype, g: Any, heads: int, concat: bool, loops: bool, residual: bool, sparse: bool) -> None:
    index, _, N = g
    kw = {"heads": heads, "concat": concat, "add_self_loops": loops, "residual": residual}
    ours, ref, links_ = pair("gat", dtype, 3, 4, **kw)
    x = torch.randn(N, 3, dtype=dtype)
    if sparse:
        index = torch.unique(index[0] * N + index[1])  # a sparse adj_t has one entry per pair
        index = torch.stack([index // N, index % N])
    compare(ours, ref, links_, (x, adj_t(index, None, N) if sparse else index), dtype)


@case("GATConv", EQUAL, "PyG's ``test_gat_conv``: ``size=(4, 4)``, CSR ``adj1.t()``, ``residual``")
@pytest.mark.parametrize("residual", [False, True])
def test_gat_pyg_case(residual: bool) -> None:
    dtype = torch.float64
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    ours, ref, links_ = pair("gat", dtype, 8, 32, heads=2, residual=residual)
    x = torch.randn(4, 8, dtype=dtype)
    out = compare(ours, ref, links_, (x, ei), dtype)[0]
    close(ours(x, ei, size=(4, 4)), out, dtype, "size=(4, 4)")
    close(ours(x, to_torch_csc_tensor(ei, size=(4, 4)).t()), out, dtype, "adj1.t()")


def stored_csr(index: torch.Tensor, N: int) -> torch.Tensor:
    """A CSR ``adj_t`` holding every edge as its own entry, repeats and unsorted columns kept, as given."""
    order = torch.sort(index[1], stable=True).indices
    crow = torch.zeros(N + 1, dtype=torch.long)
    crow[1:] = torch.bincount(index[1], minlength=N).cumsum(0)
    return torch.sparse_csr_tensor(crow, index[0, order], torch.ones(index.shape[1], dtype=torch.float64), (N, N))


def same_sparse(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> None:
    """The same layout, shape, entries in the same order and the same values."""
    assert ours.layout == theirs.layout and ours.shape == theirs.shape
    if theirs.layout == torch.sparse_coo:
        assert ours.is_coalesced() and theirs.is_coalesced()
        assert torch.equal(ours.indices(), theirs.indices())
    else:
        assert torch.equal(ours.crow_indices(), theirs.crow_indices())
        assert torch.equal(ours.col_indices(), theirs.col_indices())
    close(ours.values(), theirs.values(), dtype, "attention adj_t values")


@case(
    "GATConv",
    EQUAL,
    "``return_attention_weights=True``: edge_index, torch.sparse COO/CSR ``adj_t``, ``add_self_loops`` on/off",
    "the same layout, entry order (CSR repeats kept) and weights as PyG",
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["edge_index", "coo", "csr"])
@FEW
@given(g=digraphs(), heads=st.integers(1, 3), loops=st.booleans())
def test_gat_attention_weights(dtype: torch.dtype, form: str, g: Any, heads: int, loops: bool) -> None:
    index, _, N = g
    graph = {
        "edge_index": index,
        "coo": adj_t(index, None, N).coalesce(),  # PyG refuses an uncoalesced COO without loops
        "csr": stored_csr(index, N),
    }[form]
    ours, ref, links_ = pair("gat", dtype, 3, 4, heads=heads, add_self_loops=loops)
    x = torch.randn(N, 3, dtype=dtype)
    r1, r2 = compare(ours, ref, links_, (x, graph), dtype, return_attention_weights=True)
    (g1, a1), (g2, a2) = r1[1], r2[1]
    close(a1, a2, dtype, "attention weights")
    if form == "edge_index":
        assert torch.equal(g1, g2)
    else:
        same_sparse(g1, g2, dtype)


@case("GATConv", EQUAL, "PyG's ``test_gat_conv``: ``return_attention_weights`` on CSR ``adj1.t()``")
def test_gat_attention_weights_pyg_case() -> None:
    dtype = torch.float64
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    ours, ref, links_ = pair("gat", dtype, 8, 32, heads=2)
    graph = to_torch_csc_tensor(ei, size=(4, 4)).t()
    r1, r2 = compare(ours, ref, links_, (torch.randn(4, 8, dtype=dtype), graph), dtype, return_attention_weights=True)
    assert r1[1][0]._nnz() == r2[1][0]._nnz() == 7
    same_sparse(r1[1][0], r2[1][0], dtype)
    close(r1[1][1], r2[1][1], dtype, "attention weights")


@case(
    "GATConv",
    NA,
    "``return_attention_weights`` with a CSC ``adj_t``",
    "PyG raises ValueError; ours gives CSC back, its weights in CSC's entry order (tested)",
)
@pytest.mark.parametrize("loops", [False, True])
def test_gat_attention_weights_csc(loops: bool) -> None:
    ours, ref, _ = pair("gat", torch.float64, 3, 4, heads=2, add_self_loops=loops)
    x, csc = torch.randn(4, 3, dtype=torch.float64), adj_t(FIXED, None, 4).to_sparse_csc()
    with pytest.raises(ValueError, match="layout"):
        ref(x, csc, return_attention_weights=True)
    y, (adj, alpha) = ours(x, csc, return_attention_weights=True)
    y_coo, (adj_coo, _) = ours(x, csc.to_sparse_coo(), return_attention_weights=True)
    close(y, y_coo, torch.float64, "output")
    assert adj.layout == torch.sparse_csc
    close(adj.to_dense(), adj_coo.to_dense(), torch.float64, "attention adj_t")
    close(adj.values(), alpha, torch.float64, "entry order")


@case(
    "GATConv",
    EQUAL,
    "``in_channels=(P, P)`` with one tensor as sources and targets: ``x``, ``(x, x)`` (``to_hetero``), "
    "``(x, x.clone())``",
    "targets transformed by ``weight_dst`` (PyG's ``lin_dst``) in each",
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["x", "pair", "pair-clone"])
@FEW
@given(g=digraphs(), heads=st.integers(1, 3), concat=st.booleans(), loops=st.booleans(), residual=st.booleans())
def test_gat_pair_channels_one_tensor(
    dtype: torch.dtype, form: str, g: Any, heads: int, concat: bool, loops: bool, residual: bool
) -> None:
    index, _, N = g
    kw = {"heads": heads, "concat": concat, "add_self_loops": loops, "residual": residual}
    ours, ref, links_ = pair("gat", dtype, (3, 3), 4, **kw)
    x = torch.randn(N, 3, dtype=dtype)
    compare(ours, ref, links_, ({"x": x, "pair": (x, x), "pair-clone": (x, x.clone())}[form], index), dtype)


@case(
    "GATConv",
    REFUSED,
    "one ``x`` with ``in_channels=(P_src, P_dst)``, :math:`P_{src} \\ne P_{dst}`",
    "PyG raises torch's shape error; ours ValueError naming in_channels",
)
def test_gat_pair_channels_one_tensor_mismatch() -> None:
    ours, ref, _ = pair("gat", torch.float64, (3, 5), 4)
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        ref(x, FIXED)
    with pytest.raises(ValueError, match=r"in_channels\[0\] == in_channels\[1\]"):
        ours(x, FIXED)


@case(
    "GATConv", EQUAL, "bipartite ``(x_src, x_dst)`` / ``(x_src, None)``, ``in_channels=(8, 16)``, ``size``, ``adj_t``"
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("form", ["pair", "pair-size", "pair-adj", "none-size", "none-adj"])
def test_gat_bipartite(dtype: torch.dtype, residual: bool, form: str) -> None:
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    ours, ref, links_ = pair("gat", dtype, (8, 16), 32, heads=2, residual=residual)
    x1, x2 = torch.randn(4, 8, dtype=dtype), torch.randn(2, 16, dtype=dtype)
    adj = to_torch_csc_tensor(ei, size=(4, 2)).t()
    args, kw = {
        "pair": (((x1, x2), ei), {}),
        "pair-size": (((x1, x2), ei), {"size": (4, 2)}),
        "pair-adj": (((x1, x2), adj), {}),
        "none-size": (((x1, None), ei), {"size": (4, 2)}),
        "none-adj": (((x1, None), adj), {}),
    }[form]
    compare(ours, ref, links_, args, dtype, **kw)


@case("GATConv", EQUAL, "``edge_dim`` with ``edge_attr`` ``(E,)`` or ``(E, F)``, ``fill_value`` number or reduction")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("edge_dim", [1, 4])
@pytest.mark.parametrize("fill", [0.5, "mean", "add", "max", "min"])
@FEW
@given(g=digraphs(), loops=st.booleans())
def test_gat_edge_attr(dtype: torch.dtype, edge_dim: int, fill: Any, g: Any, loops: bool) -> None:
    index, _, N = g
    ours, ref, links_ = pair("gat", dtype, 3, 4, heads=2, edge_dim=edge_dim, fill_value=fill, add_self_loops=loops)
    E = index.shape[1]
    attr = torch.randn(E, dtype=dtype) if edge_dim == 1 else torch.randn(E, edge_dim, dtype=dtype)
    compare(ours, ref, links_, (torch.randn(N, 3, dtype=dtype), index, attr), dtype)


@case(
    "GATConv",
    REFUSED,
    "a third argument (``edge_attr``) without ``edge_dim``",
    "PyG ignores it silently; ours raises ValueError naming edge_attr and edge_dim",
)
def test_gat_edge_attr_without_edge_dim() -> None:
    ours, ref, _ = pair("gat", torch.float64, 3, 4)
    x, w = torch.randn(4, 3, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    torch.testing.assert_close(ref(x, FIXED, w), ref(x, FIXED))  # PyG drops it
    with pytest.raises(ValueError, match=r"edge_attr .* needs edge_dim"):
        ours(x, FIXED, w)


@case("GATConv", REFUSED, "``edge_attr`` with a sparse adjacency", "PyG raises NotImplementedError (SparseTensor)")
def test_gat_edge_attr_sparse() -> None:
    ours, _, _ = pair("gat", torch.float64, 3, 4, edge_dim=1)
    with pytest.raises(ValueError, match="edge_attr goes with an edge_index"):
        ours(torch.randn(4, 3, dtype=torch.float64), adj_t(FIXED, None, 4), torch.rand(6, dtype=torch.float64))


@case("GATConv", EQUAL, "a graph with zero nodes (``test_gat_conv_empty_edge_index``)")
def test_gat_empty() -> None:
    ours, ref, _ = pair("gat", torch.float32, 8, 32, heads=2)
    x, ei = torch.randn(0, 8), torch.empty(2, 0, dtype=torch.long)
    assert ours(x, ei).shape == ref(x, ei).shape == (0, 64)


@case("GATConv", REFUSED, "static graph ``x`` ``(B, N, F)``", "PyG asserts; ours raises ValueError naming x")
def test_gat_static() -> None:
    ours, ref, _ = pair("gat", torch.float32, 3, 4)
    x = torch.randn(2, 4, 3)
    with pytest.raises(AssertionError):
        ref(x, FIXED)
    with pytest.raises(ValueError, match="x must be node features of shape"):
        ours(x, FIXED)


@case("GATConv", EQUAL, "``dropout`` in eval mode", "training-mode dropout draws differ (not comparable)")
def test_gat_dropout_eval() -> None:
    ours, ref, links_ = pair("gat", torch.float64, 3, 4, heads=2, dropout=0.5)
    ours.eval(), ref.eval()
    compare(ours, ref, links_, (torch.randn(4, 3, dtype=torch.float64), FIXED), torch.float64)


# --- checkpoints ---------------------------------------------------------------------------------------
@case(
    "all",
    EQUAL,
    "PyG's ``state_dict`` in ``load_state_dict`` (strict), and back (``pyg_state_dict``)",
    "keys translated (transposes, stacks, reshapes); nested models and training in tests/test_pyg_checkpoints.py",
)
@pytest.mark.parametrize("kind", list(CLASSES))
def test_state_dict_both_ways(kind: str) -> None:
    ours, ref, args = _autocast_case(kind)
    fresh = type(ours)(*_CASE_ARGS[kind])
    fresh.load_state_dict(ref.state_dict())
    close(fresh(*args), ref(*args), torch.float32, "output")
    back = pyg_state_dict(fresh)
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ref.state_dict().items())


# --- compiled and traced -------------------------------------------------------------------------------
@case(
    "all",
    EQUAL,
    "``torch.compile(layer, fullgraph=True)``, the first call compiled",
    "one graph, PyG's too; the compiled output and input gradient equal PyG's eager ones (aot_eager here, "
    "Inductor in tests/test_fullgraph.py)",
)
@pytest.mark.parametrize("kind", list(CLASSES))
def test_compiled_fullgraph(kind: str) -> None:
    ours, ref, args = _autocast_case(kind)
    x = args[0].clone().requires_grad_()
    x_ref = args[0].clone().requires_grad_()
    torch._dynamo.reset()
    y = torch.compile(ours, backend="aot_eager", fullgraph=True, dynamic=False)(x, *args[1:])
    y_ref = ref(x_ref, *args[1:])
    close(y, y_ref, torch.float32, "output")
    weight = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
    (g,) = torch.autograd.grad((y * weight).sum(), x)
    (g_ref,) = torch.autograd.grad((y_ref * weight).sum(), x_ref)
    close(g, g_ref, torch.float32, "input gradient")


@case(
    "all",
    EQUAL,
    "``torch.jit.trace`` (TensorBoard's ``add_graph``)",
    "the traced module equals the layer on the traced input; one TracerWarning says the trace froze the "
    "basis built for that graph",
)
@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
@pytest.mark.parametrize("kind", list(CLASSES))
def test_jit_trace_records_the_layer(kind: str) -> None:
    ours, _, args = _autocast_case(kind)
    with pytest.warns(torch.jit.TracerWarning, match=r"records this call's operators .* torch.compile\(layer\)"):
        traced = torch.jit.trace(ours, args, check_trace=False)
    torch.testing.assert_close(traced(*args), ours(*args))


# --- PyG internals -------------------------------------------------------------------------------------
@case(
    "all",
    NA,
    "``torch.jit.script``, ``decomposed_layers``, message hooks, ``explain``, ``SparseTensor``",
    "PyG-internal machinery; torch_sparse is not installed",
)
def test_pyg_internals() -> None:
    assert not hasattr(snn.GCNConv(3, 4), "propagate")


# --- the fragment --------------------------------------------------------------------------------------


def render() -> str:
    """``docs/peers/graph.rst``: one row per case, and the counts."""
    return TABLE.render(torch_geometric.__version__)


def test_fragment_is_current() -> None:
    assert TABLE.fragment.read_text() == render(), "regenerate: .venv/bin/python tests/peers/test_pyg_graph.py"


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
@pytest.mark.parametrize("name", ["GCNConv", "SGConv", "TAGConv", "ChebConv", "GATConv", "SAGEConv"])
def test_a_traced_model_equals_pyg_s_traced_model(name: str) -> None:
    """``torch.jit.trace`` (what TensorBoard's ``add_graph`` runs) of a two-layer model, ours against PyG's."""
    args = {"ChebConv": (4, 3, 2)}.get(name, (4, 3))

    class Two(torch.nn.Module):
        def __init__(self, module: Any) -> None:
            super().__init__()
            self.first, self.second = getattr(module, name)(*args), getattr(module, name)(3, 2, *args[2:])

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.second(self.first(x, edge_index).relu(), edge_index)

    torch.manual_seed(0)
    ours = Two(snn).double()
    torch.manual_seed(0)
    theirs = Two(pyg_nn).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4, 5, 0], [1, 0, 2, 3, 4, 5, 0, 3]])
    traced_ours = torch.jit.trace(ours, (x, edge_index), check_trace=False)
    traced_theirs = torch.jit.trace(theirs, (x, edge_index), check_trace=False)
    torch.testing.assert_close(traced_ours(x, edge_index), traced_theirs(x, edge_index))


if __name__ == "__main__":
    sys.stdout.write(render())
