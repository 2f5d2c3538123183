"""Basis constructors: ``SparseBasis`` (and ``from_dense``, ``from_torch``, ``from_scipy``), ``DenseBasis``,
``as_basis``, ``concat``, and the factorised parameters ``Separable`` and ``LowRank``.

A case draws a small basis (coordinates with duplicates and any order, one of several index and
value dtypes, COO/CSR/CSC sparse inputs, several memory layouts) and at most one defect: a
coordinate out of range or negative, float or bool indices, a wrong shape (zero, negative,
non-integer, too few or many axes, or huge: ``2**40`` entries, held lazily), NaN values, values
of another dtype or device.  A valid basis must have the documented shape and its dense form
(and, when small, its ``conv``) must equal the reference built from the coordinates.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from .arrays import conv_reference, make, read
from .classify import compare
from .spec import EITHER, ERROR, HUGE, VALID, Expectation, Trial

VALUE_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "bool", "complex128")
INDEX_DTYPES = ("int64", "int32", "int16", "uint8", "float64", "bool")
SCIPY_FORMATS = ("coo", "csr", "csc", "dok", "lil", "dense")


@st.composite
def sparse_params(draw: Any) -> dict[str, Any]:
    return {
        "shape": [draw(st.integers(1, 4)) for _ in range(draw(st.sampled_from((3, 3, 4))))],
        "nnz": draw(st.integers(0, 12)),
        "seed": draw(st.integers(0, 2**31)),
        "backend": draw(st.sampled_from(("numpy", "torch"))),
        "index_backend": draw(st.sampled_from(("same", "same", "numpy", "torch", "list"))),
        "value_dtype": draw(st.sampled_from(VALUE_DTYPES[:4] * 3 + VALUE_DTYPES)),
        "index_dtype": draw(st.sampled_from(INDEX_DTYPES[:2] * 4 + INDEX_DTYPES)),
        "layout": draw(st.sampled_from(("contiguous", "contiguous", "strided", "transposed", "grad", "broadcast"))),
        "torch_format": draw(st.sampled_from(("coo", "coo_uncoalesced", "csr", "csc", "dense", "hybrid"))),
        "scipy_format": draw(st.sampled_from(SCIPY_FORMATS)),
        "defect": draw(
            st.sampled_from(
                (None, None, None, "out_of_range", "negative", "index_shape", "values_shape", "shape", "nan", "meta")
                + ("values_list", "mismatch", "empty_list", "complex_scipy", "not_scipy", "huge")
            )
        ),
        "bad_shape": draw(
            st.sampled_from([[0, 2, 2], [-1, 2, 2], [2.5, 2, 2], [2, 2], [1, 2, 2, 2, 2], ["3", 2, 2], [None, 2, 2]])
        ),
        "huge": draw(st.sampled_from(list(HUGE))),
    }


@st.composite
def factor_params(draw: Any) -> dict[str, Any]:
    return {
        "sizes": [draw(st.integers(1, 4)) for _ in range(4)],
        "seed": draw(st.integers(0, 2**31)),
        "backend": draw(st.sampled_from(("numpy", "torch"))),
        "dtype": draw(st.sampled_from(("float64", "float32", "float16", "bfloat16", "int64", "complex64"))),
        "defect": draw(st.sampled_from((None, None, "rank", "mismatch", "dtype_mix", "backend_mix", "empty", "list"))),
        "which": draw(st.integers(0, 1)),
    }


ENTRIES = {
    "SparseBasis": (sparse_params(), 350),
    "SparseBasis.from_dense": (sparse_params(), 150),
    "SparseBasis.from_torch": (sparse_params(), 150),
    "SparseBasis.from_scipy": (sparse_params(), 150),
    "DenseBasis": (sparse_params(), 120),
    "as_basis": (sparse_params(), 100),
    "concat": (sparse_params(), 120),
    "Separable": (factor_params(), 100),
    "LowRank": (factor_params(), 100),
}


def _coords(p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    rng = np.random.default_rng(p["seed"])
    shape = tuple(p["shape"])
    index = np.stack([rng.integers(0, s, p["nnz"]) for s in shape]) if p["nnz"] else np.zeros((len(shape), 0), int)
    return index, rng.uniform(-1, 1, p["nnz"]), shape


def _dense_of(index: np.ndarray, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    dense = np.zeros(shape)
    np.add.at(dense, tuple(index), values)
    return dense


def _check_basis(basis: Any, dense: np.ndarray, dtype: str, backend: str, device: str = "cpu") -> str | None:
    """Shape, dense form and ``conv`` of a valid basis against the reference."""
    import structconv as sc

    if tuple(basis.shape) != dense.shape:
        return f"basis has shape {tuple(basis.shape)}, expected {dense.shape}"
    problem = compare(basis.to_dense(), dense, np.abs(dense), dtype, backend, 1, device)
    if problem is not None or device == "meta" or (backend, dtype) == ("numpy", "float16"):
        return problem  # conv of a NumPy float16 basis is the conv cases' to check
    rng = np.random.default_rng(0)
    B = dense.shape[0] if dense.ndim == 4 else 2
    x = make(rng.uniform(-1, 1, (B, dense.shape[-2], 2)), backend, dtype)
    theta = make(rng.uniform(-1, 1, (dense.shape[-3], 2, 3)), backend, dtype)
    ref, bound, terms = conv_reference(dense, read(x), read(theta))
    problem = compare(sc.conv(basis, x, theta), ref, bound, dtype, backend, terms)
    return None if problem is None else f"conv: {problem}"


def trial(entry: str, p: dict[str, Any]) -> Trial:
    if entry in ("Separable", "LowRank"):
        return _factor_trial(entry, p)
    import structconv as sc

    index, raw_values, shape = _coords(p)
    backend, e = p["backend"], Expectation()
    vdtype = p["value_dtype"]
    if backend == "numpy" and vdtype == "bfloat16":
        vdtype = "float32"
    if vdtype not in ("float64", "float32", "float16", "bfloat16") and entry != "SparseBasis.from_scipy":
        e.add(ERROR, ("values", "basis", "array", "dtype", "tensor"), f"values of {vdtype}")
    values = make(raw_values, backend, vdtype, p["layout"] if entry == "SparseBasis" else "contiguous")
    ref_values = read(values) if vdtype != "complex128" else raw_values
    ref_dense = _dense_of(index, ref_values, shape)
    d = p["defect"]
    device = "cpu"
    if d == "meta" and backend == "torch":
        values, device = values.to("meta"), "meta"
        e.add(EITHER, ("values", "device", "basis", "tensor"), "on the meta device")
    if entry == "SparseBasis":
        return _constructor_trial(p, index, values, shape, ref_dense, vdtype, device, e)
    dense = make(ref_dense, backend, vdtype, p["layout"], device)
    if device == "cpu":
        ref_dense = read(dense) if vdtype != "complex128" else ref_dense
    if d == "nan" and ref_dense.any() and entry != "SparseBasis.from_torch":
        dense = make(np.where(ref_dense == 0, ref_dense, np.nan), backend, vdtype, "contiguous", device)
        e.add(ERROR, ("basis", "values", "array", "tensor", "matrices"), "NaN entries")
    if entry == "SparseBasis.from_dense":
        arg = dense.tolist() if d == "values_list" else dense
        if d == "values_list":
            e.add(EITHER, ("array", "basis"), "a nested list")
            backend, vdtype = "numpy", "float64"  # what numpy.asarray reads of Python floats, as documented
        if d == "shape":
            arg = make(np.ones([s if isinstance(s, int) and s > 0 else 2 for s in p["bad_shape"]][:5]), backend, vdtype)
            ref_dense = np.ones(arg.shape)  # sizes an array cannot have became 2: of rank 3, it is a valid basis
            if arg.ndim not in (3, 4):
                e.add(ERROR, ("array", "basis", "shape", "indices"), f"an array of rank {arg.ndim}")
        return Trial(
            f"SparseBasis.from_dense({_desc(arg)}); {e.described}",
            lambda: sc.SparseBasis.from_dense(arg),
            e.expect,
            tuple(e.names),
            lambda b: _check_basis(b, ref_dense, vdtype, backend, device),
        )
    if entry == "DenseBasis":
        arg = dense
        if d == "shape":
            arg = make(np.ones([s if isinstance(s, int) and s > 0 else 2 for s in p["bad_shape"]]), backend, vdtype)
            ref_dense = np.ones(arg.shape)  # sizes an array cannot have became 2: of rank 3, it is a valid basis
            if arg.ndim not in (3, 4):
                e.add(ERROR, ("basis", "array"), f"an array of rank {arg.ndim}")
        if d == "values_list":
            arg = dense.tolist() if hasattr(dense, "tolist") else dense
            e.add(ERROR, ("basis", "array"), "a nested list")
        if d == "meta":
            e.add(EITHER, ("basis",), "meta")
        return Trial(
            f"DenseBasis({_desc(arg)}); {e.described}",
            lambda: sc.DenseBasis(arg),
            e.expect,
            tuple(e.names),
            lambda b: _check_basis(b, ref_dense, vdtype, backend, device),
        )
    if entry == "SparseBasis.from_torch":
        return _torch_trial(p, ref_dense, vdtype, e)
    if entry == "SparseBasis.from_scipy":
        return _scipy_trial(p, ref_dense, e)
    if entry == "as_basis":
        return _as_basis_trial(p, dense, ref_dense, vdtype, device, e)
    return _concat_trial(p, dense, ref_dense, vdtype, device, e)


def _desc(a: Any) -> str:
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        kind = "tensor" if type(a).__module__.startswith("torch") else type(a).__name__
        return f"{kind}{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')}"
    return f"{type(a).__name__} {str(a)[:60]}"


def _constructor_trial(
    p: dict[str, Any],
    index: np.ndarray,
    values: Any,
    shape: tuple[int, ...],
    dense: np.ndarray,
    vdtype: str,
    device: str,
    e: Expectation,
) -> Trial:
    import structconv as sc

    d = p["defect"]
    idx: Any = index
    if p["index_dtype"] in ("float64", "bool"):
        e.add(EITHER if index.size == 0 else ERROR, ("indices",), f"indices of {p['index_dtype']}")
        idx = index.astype(p["index_dtype"])
    elif p["index_dtype"] in ("uint8", "int16") and max(shape) > 2**7:
        idx = index
    else:
        idx = index.astype(p["index_dtype"])
    ib = p["index_backend"] if p["index_backend"] != "same" else p["backend"]
    if ib == "torch":
        import torch

        idx = torch.from_numpy(np.ascontiguousarray(idx))
    elif ib == "list":
        idx = idx.tolist()
    arg_shape: Any = shape
    if d == "out_of_range" and index.size:
        idx = _edit(idx, (1, 0), shape[1])
        e.add(ERROR, ("indices",), "a coordinate equal to its size")
    elif d == "negative" and index.size:
        idx = _edit(idx, (0, 0), -1)
        e.add(ERROR, ("indices",), "a negative coordinate")
    elif d == "index_shape":
        idx = np.asarray(index)[:-1]
        e.add(ERROR, ("indices",), "indices with one row too few")
    elif d == "values_shape":
        values = values.reshape(-1, 1)
        e.add(ERROR, ("values",), "values of shape (nnz, 1)")
    elif d == "shape":
        arg_shape = p["bad_shape"]
        e.add(ERROR, ("shape", "indices"), f"shape={arg_shape!r}")
    elif d == "huge":
        arg_shape = shape[:-2] + (p["huge"], p["huge"])
        e.add(EITHER, ("shape",), f"shape={arg_shape!r} (held lazily)")
    elif d == "nan" and index.size:
        values = make(
            np.full(index.shape[1], np.nan), "torch" if not isinstance(values, np.ndarray) else "numpy", "float64"
        )
        e.add(ERROR, ("values",), "NaN values")
    elif d == "values_list":
        values = values.tolist() if hasattr(values, "tolist") and device != "meta" else values
        e.add(ERROR, ("values",), "values as a list")

    def check(basis: Any) -> str | None:
        if e.expect != VALID:
            return None if tuple(basis.shape) == tuple(int(s) for s in arg_shape) else f"shape {basis.shape}"
        return _check_basis(basis, dense, vdtype, p["backend"], device)

    describe = f"SparseBasis(indices {_desc(idx)}, values {_desc(values)}, shape={arg_shape!r}); {e.described}"
    return Trial(describe, lambda: sc.SparseBasis(idx, values, arg_shape), e.expect, tuple(e.names), check)


def _edit(idx: Any, at: tuple[int, int], value: int) -> Any:
    if isinstance(idx, list):
        idx = [list(r) for r in idx]
        idx[at[0]][at[1]] = value
        return idx
    idx = idx.clone() if hasattr(idx, "clone") else idx.copy()
    if str(idx.dtype).removeprefix("torch.").startswith("u") and value < 0:
        return idx.astype(np.int64) if isinstance(idx, np.ndarray) else idx.long()
    idx[at] = value
    return idx


def _torch_trial(p: dict[str, Any], dense: np.ndarray, vdtype: str, e: Expectation) -> Trial:
    import torch

    import structconv as sc

    dtype = vdtype
    t = make(dense, "torch", dtype)
    if p["defect"] == "nan" and dense.any():
        t = make(np.where(dense == 0, 0.0, np.nan), "torch", dtype)
        e.add(ERROR if dtype in ("float64", "float32", "float16", "bfloat16") else EITHER, ("tensor", "values"), "NaN")
    fmt = p["torch_format"]
    tensor: Any
    if fmt == "coo":
        tensor = t.to_sparse()
    elif fmt == "coo_uncoalesced":
        coo = t.to_sparse()
        values = coo.values()
        tensor = torch.sparse_coo_tensor(
            torch.cat([coo.indices()] * 2, 1), torch.cat([values, values - values]), t.shape
        )
    elif fmt in ("csr", "csc"):
        flat = t.reshape(-1, t.shape[-1])
        tensor = flat.to_sparse_csr() if fmt == "csr" else flat.to_sparse_csc()
        e.add(EITHER, ("tensor", "basis", "shape"), f"a 2-D {fmt} tensor (no K axis)")
        dense = dense.reshape(-1, dense.shape[-1])
    elif fmt == "hybrid":
        tensor = t.to_sparse(sparse_dim=t.ndim - 1)
        e.add(EITHER, ("tensor", "values"), "a hybrid sparse tensor (dense last axis)")
    else:
        tensor = t
        e.add(EITHER, ("tensor",), "a strided (dense) tensor")
    if p["defect"] == "meta":
        tensor = tensor.to("meta") if fmt in ("coo", "dense") else tensor
    if p["defect"] == "values_list":
        tensor = dense
        e.add(ERROR, ("tensor",), "a NumPy array")

    def check(basis: Any) -> str | None:
        return _check_basis(
            basis, dense, dtype, "torch", "meta" if p["defect"] == "meta" and fmt in ("coo", "dense") else "cpu"
        )

    return Trial(
        f"SparseBasis.from_torch({fmt} {_desc(tensor)}); {e.described}",
        lambda: sc.SparseBasis.from_torch(tensor),
        e.expect,
        tuple(e.names),
        check,
    )


def _scipy_trial(p: dict[str, Any], dense: np.ndarray, e: Expectation) -> Trial:
    import scipy.sparse

    import structconv as sc

    dense3 = dense if dense.ndim == 3 else dense[0]
    fmt = p["scipy_format"]
    vdtype = p["value_dtype"]
    scipy_dtype = {"float16": "float32", "bfloat16": "float32"}.get(vdtype, vdtype)
    values = dense3.astype(scipy_dtype) if scipy_dtype != "complex128" else dense3 + 0.5j * dense3
    mats: list[Any] = [np.asarray(m) if fmt == "dense" else getattr(scipy.sparse, f"{fmt}_array")(m) for m in values]
    ref = np.asarray(values.real if np.iscomplexobj(values) else values, dtype=np.float64)
    if fmt == "dense":
        e.add(EITHER, ("matrices",), "NumPy arrays instead of scipy.sparse matrices")
    d = p["defect"]
    if d == "empty_list":
        mats = []
        e.add(ERROR, ("matrices",), "no matrices")
    elif d == "mismatch" and mats:
        mats.append(scipy.sparse.csr_array(np.ones((dense3.shape[1] + 1, dense3.shape[2]))))
        e.add(ERROR, ("matrices",), "matrices of different shapes")
    elif d == "complex_scipy" or scipy_dtype == "complex128":
        mats = [scipy.sparse.csr_array(m + 0.5j * m) for m in dense3]
        e.add(ERROR, ("matrices", "values"), "complex matrices")
    elif d == "not_scipy":
        mats = [(m.toarray() if hasattr(m, "toarray") else m).tolist() for m in mats]
        e.add(EITHER, ("matrices",), "nested lists")
    elif d == "nan" and np.count_nonzero(dense3):
        mats = [scipy.sparse.csr_array(np.where(m == 0, 0, np.nan)) for m in dense3]
        e.add(ERROR, ("matrices", "values"), "NaN entries")
    elif scipy_dtype in ("int64", "bool"):
        ref = np.asarray(values, dtype=np.float64)

    def check(basis: Any) -> str | None:
        return _check_basis(basis, ref, "float64", "numpy")

    return Trial(
        f"SparseBasis.from_scipy([{len(mats)} x {fmt} {scipy_dtype} {dense3.shape[1:]}]); {e.described}",
        lambda: sc.SparseBasis.from_scipy(mats),
        e.expect,
        tuple(e.names),
        check,
    )


def _as_basis_trial(p: dict[str, Any], dense: Any, ref: np.ndarray, vdtype: str, device: str, e: Expectation) -> Trial:
    import structconv as sc

    arg: Any = dense
    d = p["defect"]
    if d == "values_list":
        arg = ref.tolist()
        e.add(ERROR, ("basis", "a"), "a nested list")
    elif d == "not_scipy":
        import scipy.sparse

        arg = scipy.sparse.csr_array(ref.reshape(-1, ref.shape[-1]))
        e.add(ERROR, ("basis",), "a scipy.sparse matrix")
    elif d == "shape":
        arg = make(np.ones((2, 2)), p["backend"], vdtype)
        e.add(ERROR, ("basis",), "an array of rank 2")
    elif p["backend"] == "torch" and p["torch_format"] == "coo" and device == "cpu":
        arg = dense.to_sparse()
    return Trial(
        f"as_basis({_desc(arg)}); {e.described}",
        lambda: sc.as_basis(arg),
        e.expect,
        tuple(e.names),
        lambda b: _check_basis(b, ref, vdtype, p["backend"], device),
    )


def _concat_trial(p: dict[str, Any], dense: Any, ref: np.ndarray, vdtype: str, device: str, e: Expectation) -> Trial:
    import structconv as sc

    d = p["defect"]
    second = dense[..., :1, :, :] if dense.ndim == 3 else dense[:, :1]
    parts: list[Any] = [dense, second]
    ref_all = np.concatenate([ref, ref[..., :1, :, :] if ref.ndim == 3 else ref[:, :1]], axis=-3)
    if d == "mismatch":
        parts.append(make(np.ones((1, ref.shape[-2] + 1, ref.shape[-1])), p["backend"], vdtype))
        e.add(ERROR, ("bases", "basis", "parts", "shape", "M"), "parts of different M")
    elif d == "empty_list":
        parts = []
        e.add(ERROR, ("bases",), "no bases")
    elif d == "not_scipy":
        other = "numpy" if p["backend"] == "torch" else "torch"
        parts.append(make(np.ones((1,) + ref.shape[-2:]), other, "float32" if vdtype == "bfloat16" else vdtype))
        e.add(ERROR, ("bases", "basis", "parts", "backend"), "parts on two backends")
    elif d == "values_list":
        parts.append([[1.0]])
        e.add(ERROR, ("bases", "basis"), "a list among the parts")
    elif d == "huge" and ref.ndim == 3:
        # a sparse part among dense ones; from_dense refuses values that are not floating (concat's to refuse)
        sparse = device == "cpu" and vdtype in ("float64", "float32", "float16", "bfloat16")
        parts = [sc.SparseBasis.from_dense(dense) if sparse else dense, second]
    return Trial(
        f"concat([{', '.join(_desc(x) for x in parts)}]); {e.described}",
        lambda: sc.concat(parts),
        e.expect,
        tuple(e.names),
        lambda b: _check_basis(b, ref_all, vdtype, p["backend"], device),
    )


def _factor_trial(entry: str, p: dict[str, Any]) -> Trial:
    import structconv as sc

    K, P, Q, R = p["sizes"]
    rng = np.random.default_rng(p["seed"])
    backend, dtype, e = p["backend"], p["dtype"], Expectation()
    if backend == "numpy" and dtype == "bfloat16":
        dtype = "float32"
    shapes = [(R, K), (R, P, Q)] if entry == "Separable" else [(K, P, R), (K, Q, R)]
    names = ("basis_coef", "channel") if entry == "Separable" else ("value", "out")
    values = [rng.uniform(-1, 1, s) for s in shapes]
    dtypes, backends = [dtype, dtype], [backend, backend]
    if dtype in ("int64", "complex64"):
        e.add(ERROR, names, f"factors of {dtype}")
    d, w = p["defect"], p["which"]
    if d == "rank":
        values[w] = values[w][0]
        e.add(ERROR, (names[w],), f"{names[w]} one axis short")
    elif d == "mismatch":
        values[w] = rng.uniform(-1, 1, (shapes[w][0] + 1, *shapes[w][1:]))
        e.add(ERROR, names, "factors that disagree on the shared size")
    elif d == "dtype_mix":
        dtypes[w] = "float32" if dtype != "float32" else "float64"
        e.add(ERROR, names, "factors of two dtypes")
    elif d == "backend_mix":
        backends[w] = "numpy" if backend == "torch" else "torch"
        dtypes[w] = "float32" if dtypes[w] == "bfloat16" and backends[w] == "numpy" else dtypes[w]
        e.add(ERROR, names, "factors on two backends")
    elif d == "empty":
        values[w] = values[w][..., :0]
        e.add(ERROR, (names[w],), f"{names[w]} with an empty axis")
    args = [make(v, b, t) for v, b, t in zip(values, backends, dtypes, strict=True)]
    if d == "list":
        args[w] = values[w].tolist()
        e.add(ERROR, (names[w],), f"{names[w]} as a list")
    factory = sc.Separable if entry == "Separable" else sc.LowRank
    full = np.einsum("hk,hpq->kpq", *map(read, args)) if entry == "Separable" and e.expect == VALID else None
    if entry == "LowRank" and e.expect == VALID:
        full = np.einsum("kpd,kqd->kpq", *map(read, args))

    def check(theta: Any) -> str | None:
        if tuple(theta.shape) != (K, P, Q):
            return f"shape {theta.shape}, expected {(K, P, Q)}"
        assert full is not None
        return compare(theta.full(), full, np.abs(full) * R, dtype, backend, R)

    return Trial(
        f"{entry}({', '.join(_desc(a) for a in args)}); {e.described}",
        lambda: factory(*args),
        e.expect,
        tuple(e.names),
        check,
    )
