"""Graph builders: ``gcn_basis`` and ``graph_basis`` (every kind), on every graph form.

A case draws a small random graph (an ``edge_index`` of several integer dtypes, a dense, scipy
or torch sparse adjacency), weights, a ``like``, a kind with its options, and at most one
defect: negative or out-of-range node ids, a float or bool ``edge_index``, a wrong shape, a bad
``num_nodes`` (zero, negative, 2.5, ``2**40``), weights of the wrong length, NaN, negative or on
another device, a non-square adjacency, a bad ``K``, ``kind``, ``normalization``,
``lambda_max`` or ``edge_type``.  A valid basis must equal the dense reference of
:mod:`.refs` (PyTorch Geometric's conventions) in the dtype and on the backend the documented
rule gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from . import refs
from .arrays import make, read
from .classify import compare
from .spec import EITHER, ERROR, HUGE, VALID, Expectation, Trial

KINDS = ("adjacency", "gcn", "powers", "chebyshev", "diffusion", "relational")
FORMS = ("edge_index", "edge_index", "edge_index32", "torch_index", "torch_index32", "dense", "torch_dense")
FORMS += ("scipy_coo", "scipy_csr", "scipy_csc", "torch_coo", "torch_csr")
DEFECTS = (None, None, None, "negative_id", "out_of_range", "float_index", "bool_index", "shape_3xE", "shape_Ex2")
DEFECTS += ("num_nodes", "weight_shape", "weight_nan", "weight_negative", "weight_int", "weight_meta")
DEFECTS += ("weight_with_matrix", "nonsquare", "no_edges", "K", "kind", "normalization", "lambda_max", "edge_type")
DEFECTS += ("num_nodes_small", "noncontiguous", "loops")
GRAPH_NAMES = ("edge_index", "graph", "adjacency")


@st.composite
def graph_params(draw: Any) -> dict[str, Any]:
    return {
        "N": draw(st.integers(1, 6)),
        "E": draw(st.integers(0, 10)),
        "seed": draw(st.integers(0, 2**31)),
        "form": draw(st.sampled_from(FORMS)),
        "weighted": draw(st.booleans()),
        "weight_dtype": draw(st.sampled_from(("float64", "float32", "float16", "bfloat16"))),
        "weight_backend": draw(st.sampled_from(("same", "same", "numpy", "torch"))),
        "num_nodes": draw(st.sampled_from(("none", "given", "given"))),
        "like": draw(st.sampled_from(("none", "none", "numpy-float32", "torch-float64", "torch-float32"))),
        "kind": draw(st.sampled_from(KINDS)),
        "K": draw(st.integers(1, 3)),
        "normalization": draw(st.sampled_from(("sym", "rw", "none"))),
        "lambda_max": draw(st.sampled_from(("none", "2.0", "auto", "1.5"))),
        "R": draw(st.integers(1, 3)),
        "improved": draw(st.booleans()),
        "add_self_loops": draw(st.sampled_from((None, True, False))),
        "normalize": draw(st.booleans()),
        "defect": draw(st.sampled_from(DEFECTS)),
        "bad": draw(st.sampled_from([0, -1, 2.5, "3", None, True, float("nan"), float("inf"), *HUGE])),
    }


ENTRIES = {"gcn_basis": (graph_params(), 400), "graph_basis": (graph_params(), 600)}


class _Graph:
    """The drawn graph: edges (without repeated self-loops), weights, and how the call receives them."""

    def __init__(self, p: dict[str, Any]) -> None:
        rng = np.random.default_rng(p["seed"])
        self.N, self.p = p["N"], p
        src, dst = rng.integers(0, self.N, p["E"]), rng.integers(0, self.N, p["E"])
        # repeated self-loops on one node: the builder keeps one weight, which one is unspecified
        seen: set[int] = set()
        keep = [not (s == d and (s in seen or seen.add(int(s)))) for s, d in zip(src, dst, strict=True)]
        self.src, self.dst = src[keep], dst[keep]
        self.weight = rng.uniform(0.5, 2.0, self.src.size)
        self.etype = rng.integers(0, p["R"], self.src.size)


def _index(g: _Graph, form: str) -> Any:
    index = np.stack([g.src, g.dst]).astype(np.int64)
    if form == "edge_index32":
        return index.astype(np.int32)
    if form.startswith("torch_index"):
        import torch

        return torch.from_numpy(index).to(torch.int32 if form.endswith("32") else torch.int64)
    return index


def _matrix(g: _Graph, form: str, dtype: str) -> Any:
    A = refs.adjacency(g.src, g.dst, g.weight if g.p["weighted"] else np.ones(g.src.size), g.N)
    if form == "dense":
        return make(A, "numpy", "float32" if dtype == "bfloat16" else dtype)
    if form.startswith("scipy"):
        import scipy.sparse

        return getattr(scipy.sparse, f"{form[6:]}_array")(
            A.astype("float32" if dtype in ("float16", "bfloat16") else dtype)
        )
    t = make(A, "torch", dtype)
    return t if form == "torch_dense" else (t.to_sparse() if form == "torch_coo" else t.to_sparse_csr())


def _expected_placement(arrays: list[Any], index: Any) -> tuple[str, str]:
    """Backend and dtype of the weights by the documented rule.

    torch if any array is; the dtype of the first floating one of ``arrays`` (``like``, the
    weights) on that backend, else the backend's default float.
    """

    def is_torch(a: Any) -> bool:
        return type(a).__module__.startswith("torch")

    present = [a for a in arrays if a is not None and hasattr(a, "dtype")]
    torch_in = any(is_torch(a) for a in present) or (index is not None and is_torch(index))
    backend = "torch" if torch_in else "numpy"
    mine = [a for a in present if is_torch(a) == torch_in]
    if mine and "float" in str(mine[0].dtype):
        return backend, str(mine[0].dtype).removeprefix("torch.")
    return backend, "float32" if torch_in else "float64"


def trial(entry: str, p: dict[str, Any]) -> Trial:
    import structconv as sc

    g = _Graph(p)
    form, e = p["form"], Expectation()
    matrix = not form.startswith(("edge_index", "torch_index"))
    weight_backend = p["weight_backend"]
    if weight_backend == "same":
        weight_backend = "torch" if form.startswith("torch") else "numpy"
    wdtype = "float32" if (weight_backend == "numpy" and p["weight_dtype"] == "bfloat16") else p["weight_dtype"]
    like = None if p["like"] == "none" else make(np.zeros(1), *p["like"].split("-"))
    weight = make(g.weight, weight_backend, wdtype) if (p["weighted"] and not matrix) else None
    ref_weight = read(weight) if weight is not None else (g.weight if p["weighted"] else np.ones(g.src.size))
    graph: Any = _matrix(g, form, p["weight_dtype"]) if matrix else _index(g, form)
    num_nodes: Any = g.N if p["num_nodes"] == "given" else None
    if not matrix and num_nodes is None and (g.src.size == 0 or max(g.src.max(), g.dst.max()) < g.N - 1):
        num_nodes = g.N  # trailing isolated nodes need num_nodes (documented)
    kwargs: dict[str, Any] = {"num_nodes": num_nodes, "edge_weight": weight, "like": like}
    kind = p["kind"] if entry == "graph_basis" else "gcn"
    if entry == "graph_basis":
        kwargs.update(kind=kind, K=p["K"])
        if kind == "powers":
            kwargs["normalization"] = "none" if p["normalization"] == "none" else "sym"
        if kind == "chebyshev":
            kwargs["normalization"] = "rw" if p["normalization"] == "rw" else "sym"
            kwargs["lambda_max"] = {"none": None, "2.0": 2.0, "auto": "auto", "1.5": 1.5}[p["lambda_max"]]
        if kind == "relational":
            kwargs["edge_type"] = _like_index(g.etype, graph, matrix)
            kwargs["num_relations"] = p["R"]
    else:
        kwargs.update(improved=p["improved"], add_self_loops=p["add_self_loops"], normalize=p["normalize"])
    if kind == "relational" and matrix:
        e.add(EITHER, ("edge_type", "graph"), "a relational basis of a matrix graph (edge_type per stored entry)")
    weights_positive = True
    graph = _defect(p, g, graph, kwargs, matrix, e)
    if kwargs.pop("negative", False):
        weights_positive = False
    arrays = [kwargs.get("like"), kwargs.get("edge_weight")]
    if matrix:
        arrays.append(graph if hasattr(graph, "dtype") and "float" in str(graph.dtype) else None)
    exp_backend, exp_dtype = _expected_placement(arrays, None if matrix else graph)
    if not weights_positive:
        ref_weight = -g.weight
        needs = kind in ("gcn", "diffusion", "chebyshev") or (kind == "powers" and kwargs["normalization"] == "sym")
        if entry == "gcn_basis" and not p["normalize"]:
            needs = False
        e.add(ERROR if needs else VALID, ("edge_weight", "weights", "edge weights", "graph"), "negative weights")

    def call() -> Any:
        if entry == "gcn_basis":
            return sc.gcn_basis(graph, **kwargs)
        return sc.graph_basis(graph, **kwargs)

    if matrix:  # the reference reads the matrix as passed (its dtype rounds the weights)
        A = graph.toarray() if hasattr(graph, "toarray") else read(graph.to_dense() if _torch_sparse(graph) else graph)
        g.src, g.dst = np.nonzero(A)
        ref_weight = np.asarray(A, dtype=np.float64)[g.src, g.dst]
        g.p = p = {**p, "weighted": True}

    def check(basis: Any) -> str | None:
        if e.expect != VALID:
            shape = tuple(int(s) for s in basis.shape)
            return None if len(shape) == 3 and min(shape) > 0 else f"accepted, but the basis has shape {shape}"
        dense = _reference(entry, kind, p, g, ref_weight, kwargs)
        # entries are sums of O(1) terms that may cancel (2 L / lambda - I): the bound is |entry| + 1
        return compare(basis.to_dense(), dense, np.abs(dense) + 1, exp_dtype, exp_backend, g.N * (p["K"] + 1))

    describe = (
        f"{entry}({form} N={g.N} E={g.src.size}, "
        + ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items() if v is not None)
        + f"); {e.described}"
    )
    return Trial(describe, call, e.expect, tuple(e.names), check)


def _short(v: Any) -> str:
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        kind = "tensor" if type(v).__module__.startswith("torch") else "array"
        return f"{kind}{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
    return repr(v)


def _like_index(values: np.ndarray, graph: Any, matrix: bool) -> Any:
    if matrix or isinstance(graph, np.ndarray):
        return values.astype(np.int64)
    import torch

    return torch.from_numpy(values.astype(np.int64))


def _defect(p: dict[str, Any], g: _Graph, graph: Any, kwargs: dict[str, Any], matrix: bool, e: Expectation) -> Any:
    """Apply the drawn defect (to ``kwargs`` in place); return the graph argument."""
    d, bad = p["defect"], p["bad"]
    edge_form = not matrix
    if d == "negative_id" and edge_form and g.src.size:
        graph = graph.clone() if hasattr(graph, "clone") else graph.copy()
        graph[0, 0] = -1
        e.add(ERROR, GRAPH_NAMES, "a negative node id")
    elif d == "out_of_range" and edge_form and g.src.size:
        kwargs["num_nodes"] = g.N
        graph = graph.clone() if hasattr(graph, "clone") else graph.copy()
        graph[1, 0] = g.N
        e.add(ERROR, GRAPH_NAMES + ("num_nodes",), "node id N with num_nodes=N")
    elif d in ("float_index", "bool_index") and edge_form:
        graph = graph.double() if d == "float_index" and hasattr(graph, "double") else graph
        graph = graph.astype(np.float64) if d == "float_index" and isinstance(graph, np.ndarray) else graph
        graph = (graph > 0) if d == "bool_index" else graph
        # a float (2, 2) array is a valid dense adjacency: only other shapes must be refused
        e.add(EITHER, GRAPH_NAMES, f"edge_index of {'floats' if d == 'float_index' else 'bools'}")
    elif d == "shape_3xE" and edge_form:
        graph = graph[[0, 1, 0]] if hasattr(graph, "shape") else graph
        e.add(ERROR, GRAPH_NAMES, "edge_index of shape (3, E)")
    elif d == "shape_Ex2" and edge_form:
        graph = graph.T
        e.add(EITHER, GRAPH_NAMES + ("num_nodes",), "edge_index transposed to (E, 2)")
    elif d == "num_nodes":
        kwargs["num_nodes"] = bad
        ok = isinstance(bad, int) and not isinstance(bad, bool) and bad >= g.N
        e.add(EITHER if ok else ERROR, ("num_nodes",), f"num_nodes={bad!r}")
    elif d == "num_nodes_small" and edge_form and g.src.size and max(g.src.max(), g.dst.max()) > 0:
        kwargs["num_nodes"] = int(max(g.src.max(), g.dst.max()))
        e.add(ERROR, GRAPH_NAMES + ("num_nodes",), "num_nodes smaller than the largest node id + 1")
    elif d == "weight_shape" and edge_form:
        kwargs["edge_weight"] = make(np.ones(g.src.size + 1), "numpy", "float64")
        e.add(ERROR, ("edge_weight",), "edge_weight of E+1 entries")
    elif d == "weight_nan" and edge_form and g.src.size:
        w = g.weight.copy()
        w[0] = float("nan") if not isinstance(bad, float) or bad == bad else bad
        kwargs["edge_weight"] = make(w, "numpy", "float64")
        e.add(ERROR, ("edge_weight", "weights"), "a NaN or infinite edge weight")
    elif d == "weight_negative" and edge_form and g.src.size:
        kwargs["edge_weight"] = make(-g.weight, "numpy", "float64")
        kwargs["negative"] = True  # read (and removed) by the caller
    elif d == "weight_int" and edge_form:
        kwargs["edge_weight"] = np.ones(g.src.size, dtype=np.int64)
        e.add(EITHER, ("edge_weight",), "integer edge_weight")
    elif d == "weight_meta" and edge_form:
        import torch

        kwargs["edge_weight"] = torch.ones(g.src.size, device="meta")
        e.add(EITHER, ("edge_weight", "device"), "edge_weight on meta, the graph on cpu")
    elif d == "weight_with_matrix" and matrix:
        kwargs["edge_weight"] = np.ones(3)
        e.add(ERROR, ("edge_weight",), "edge_weight with a matrix graph")
    elif d == "nonsquare" and matrix and not hasattr(graph, "tocoo"):
        graph = graph[:, :-1] if g.N > 1 and not _torch_sparse(graph) else graph
        if g.N > 1 and not _torch_sparse(graph):
            e.add(ERROR, GRAPH_NAMES, "a non-square adjacency")
    elif d == "no_edges" and edge_form:
        graph = graph[:, :0]
        kwargs["num_nodes"] = None
        e.add(ERROR, ("num_nodes",), "no edges and no num_nodes")
    elif d == "K" and "K" in kwargs:
        kwargs["K"] = bad
        used = kwargs["kind"] in ("powers", "diffusion", "chebyshev")  # the other kinds ignore K
        e.add(ERROR if used and bad not in HUGE else EITHER, ("K",), f"K={bad!r}")
    elif d == "kind" and "kind" in kwargs:
        kwargs["kind"] = {0: "GCN", -1: "laplacian"}.get(bad, "cheb") if not isinstance(bad, str) else bad
        e.add(ERROR, ("kind",), f"kind={kwargs['kind']!r}")
    elif d == "normalization" and "kind" in kwargs and kwargs["kind"] in ("powers", "chebyshev"):
        kwargs["normalization"] = "Sym" if bad != 0 else None
        e.add(ERROR, ("normalization",), f"normalization={kwargs['normalization']!r}")
    elif d == "lambda_max" and kwargs.get("kind") == "chebyshev":
        kwargs["lambda_max"] = bad
        ok = bad is None or (isinstance(bad, int | float) and not isinstance(bad, bool) and 0 < bad < float("inf"))
        e.add(VALID if ok else ERROR, ("lambda_max",), f"lambda_max={bad!r}")
    elif d == "edge_type" and kwargs.get("kind") == "relational" and g.src.size:
        et = kwargs["edge_type"]
        et = et.clone() if hasattr(et, "clone") else et.copy()
        et[0] = p["R"] if bad != -1 else -1
        kwargs["edge_type"] = et
        e.add(ERROR, ("edge_type", "num_relations"), "edge_type outside [0, num_relations)")
    elif d == "noncontiguous" and edge_form:
        wide = graph.repeat_interleave(2, 1) if hasattr(graph, "repeat_interleave") else np.repeat(graph, 2, 1)
        graph = wide[:, ::2]
        e.add(VALID, (), "a non-contiguous edge_index")
    elif d == "loops" and edge_form and g.N:
        graph = _concat(graph, np.array([[0, 0], [0, 0]]))
        if kwargs.get("edge_type") is not None:  # one relation per edge: the two loops get relation 0
            kwargs["edge_type"] = _concat(kwargs["edge_type"][None], np.zeros((1, 2), dtype=np.int64))[0]
        kwargs["edge_weight"] = None
        kwargs["num_nodes"] = g.N
        e.add(EITHER, GRAPH_NAMES, "two self-loops on one node")
    return graph


def _torch_sparse(a: Any) -> bool:
    return hasattr(a, "layout") and str(a.layout) != "torch.strided"


def _concat(graph: Any, extra: np.ndarray) -> Any:
    if isinstance(graph, np.ndarray):
        return np.concatenate([graph, extra.astype(graph.dtype)], 1)
    import torch

    return torch.cat([graph, torch.from_numpy(extra).to(graph.dtype)], 1)


def _reference(
    entry: str, kind: str, p: dict[str, Any], g: _Graph, weight: np.ndarray, kwargs: dict[str, Any]
) -> np.ndarray:
    """The dense basis of a valid case (the documented conventions, float64)."""
    n = int(kwargs["num_nodes"]) if isinstance(kwargs.get("num_nodes"), int) else g.N
    if not p["weighted"] and kwargs.get("edge_weight") is None:
        weight = np.ones(g.src.size)
    src, dst = g.src, g.dst
    A = refs.adjacency(src, dst, weight, n)
    if entry == "gcn_basis":
        # The one GCN rule (PyG's gcn_norm): a matrix gets A + fI; an edge_index a loop where it has
        # none, of weight 2 under improved only when edge_weight is given (PyG's fill).
        loops = p["normalize"] if p["add_self_loops"] is None else bool(p["add_self_loops"])
        matrix = not p["form"].startswith(("edge_index", "torch_index"))
        given = kwargs.get("edge_weight") is not None
        fill = 2.0 if p["improved"] and (matrix or given) else 1.0
        if loops and matrix:
            A[np.arange(n), np.arange(n)] += fill
        elif loops:
            diag = np.full(n, fill)
            is_loop = src == dst
            diag[src[is_loop]] = weight[is_loop]
            A[np.arange(n), np.arange(n)] = diag
        if not p["normalize"]:
            return A[None]
        dinv = refs._inv(A.sum(0), 0.5)
        return (dinv[:, None] * A * dinv[None, :])[None]
    K = int(kwargs["K"])
    if kind == "adjacency":
        return A[None]
    if kind == "gcn":
        return refs.gcn_dense(src, dst, weight, n)
    if kind == "powers":
        return refs.powers_dense(A, K, kwargs["normalization"] == "sym")
    if kind == "diffusion":
        return refs.diffusion_dense(A, K)
    if kind == "chebyshev":
        lam = kwargs["lambda_max"]
        if lam is None:
            lam = 2.0
        elif lam == "auto":
            lam = float(np.linalg.eigvals(refs.laplacian_dense(A, kwargs["normalization"])).real.max())
        return refs.chebyshev_dense(A, K, kwargs["normalization"], float(lam))
    return refs.relational_dense(src, dst, weight, g.etype, n, p["R"])
