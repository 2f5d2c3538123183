"""``conv`` and ``explain``: every representation, order, dtype, layout, backend and device, and one defect at a time.

A case draws sizes, a representation of the basis, a backend, a dtype, a parameter kind
(full, :class:`~structconv.Separable`, :class:`~structconv.LowRank`), a layout per operand and
an order (``"auto"``, one of the triangle's, or one that :func:`~structconv.explain` lists for
these operands, the basis' own orders included), then at most one defect.  Without a defect the
answer must equal the dense einsum (and, for float64 torch input that requires grad, so must
``x.grad``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from . import refs
from .arrays import FLOATS, LAYOUTS, NON_FLOATS, conv_reference, make, read
from .classify import compare
from .spec import EITHER, ERROR, VALID, Trial

REPS = (
    "array",
    "dense",
    "sparse",
    "from_dense",
    "torch_sparse",
    "concat",
    "composed",
    "select",
    "batched",
    "batched_sparse",
    "grid",
    "gcn",
    "attention",
)
DEFECTS = (
    None,
    None,
    None,
    "meta_all",
    "x_rank",
    "theta_rank",
    "basis_rank",
    "M",
    "K",
    "P",
    "batch",
    "empty",
    "dtype_mix",
    "dtype_bad",
    "backend_mix",
    "device_mix",
    "nonfinite",
    "order_bad",
    "not_array",
    "sparse_x",
)
BAD_ORDERS: tuple[Any, ...] = ("AX", "", " ax", "x theta", "sdpa", "native", "ax+full", None, 3, ["ax"], "auto\x00")
BASIS_NAMES = ("basis", "values", "indices", "shape", "parts", "first", "second", "like", "bilinear", "graph")
THETA_NAMES = ("theta", "channel", "basis_coef", "value", "out")


@st.composite
def conv_params(draw: Any) -> dict[str, Any]:
    size = st.integers(1, 5)
    return {
        "sizes": [draw(size) for _ in "KMNPQB"],
        "rep": draw(st.sampled_from(REPS)),
        "backend": draw(st.sampled_from(("numpy", "torch"))),
        "dtype": draw(st.sampled_from(FLOATS)),
        "theta_kind": draw(st.sampled_from(("full", "full", "separable", "lowrank"))),
        "x2d": draw(st.booleans()),
        "layouts": [draw(st.sampled_from(("contiguous",) * 3 + LAYOUTS)) for _ in range(3)],
        "order": draw(st.sampled_from(("auto", "auto", "pick", "pick", "ax", "xtheta", "atheta"))),
        "pick": draw(st.integers(0, 7)),
        "density": draw(st.sampled_from((0.0, 0.3, 0.7, 1.0))),
        "seed": draw(st.integers(0, 2**31)),
        "defect": draw(st.sampled_from(DEFECTS)),
        "operand": draw(st.sampled_from(("x", "theta", "basis"))),
        "other_dtype": draw(st.sampled_from(NON_FLOATS + FLOATS)),
        "rank": draw(st.sampled_from((0, 1, 2, 4, 5))),
        "bad_value": draw(st.sampled_from(("nan", "inf", "-inf"))),
        "bad_order": draw(st.sampled_from(range(len(BAD_ORDERS)))),
        "not_array": draw(st.sampled_from(("list", "none", "str", "int", "tuple"))),
    }


ENTRIES = {"conv": (conv_params(), 1600), "explain": (conv_params(), 250)}


def _not_array(kind: str, values: np.ndarray) -> Any:
    return {"list": values.tolist(), "none": None, "str": "x", "int": 3, "tuple": tuple(values.ravel())}[kind]


class _Operands:
    """The drawn operands before the defect: dense values (float64), and how each is made."""

    def __init__(self, p: dict[str, Any]) -> None:
        K, M, N, P, Q, B = p["sizes"]
        self.p = p
        self.rng = np.random.default_rng(p["seed"])
        self.rep = p["rep"]
        self.backend = "torch" if p["rep"] == "torch_sparse" else p["backend"]
        self.dtype = "float32" if (self.backend == "numpy" and p["dtype"] == "bfloat16") else p["dtype"]
        if self.rep == "grid":
            self.grid = (M, N)
            self.kernel = (min(2, M), min(3, N))
            K, M, N = self.kernel[0] * self.kernel[1], M * N, M * N  # padded "same": N = M
        if self.rep in ("gcn",):
            K, N = 1, M
        if self.rep == "attention":
            N = M
        if self.rep in ("concat", "select") and K < 2:
            K = 2
        self.K, self.M, self.N, self.P, self.Q, self.B = K, M, N, P, Q, B
        self.batched = self.rep in ("batched", "batched_sparse", "attention")
        if self.batched:  # a 2-D x is a batch of one, which a per-instance basis of B > 1 refuses
            self.p = p = {**p, "x2d": False}
        self.x = self.rng.uniform(-1, 1, (B, M, P))
        self.theta_parts = self._theta_parts()
        self.devices = {"x": "cpu", "theta": "cpu", "basis": "cpu"}
        self.backends = {"x": self.backend, "theta": self.backend, "basis": self.backend}
        self.dtypes = {"x": self.dtype, "theta": self.dtype, "basis": self.dtype}
        shape = (B, K, M, N) if self.batched else (K, M, N)
        self.A = self.rng.normal(size=shape) * (self.rng.random(shape) < p["density"])

    def _theta_parts(self) -> list[np.ndarray]:
        kind, K, P, Q = self.p["theta_kind"], self.K, self.P, self.Q
        if kind == "separable":
            return [self.rng.uniform(-1, 1, (2, K)), self.rng.uniform(-1, 1, (2, P, Q))]
        if kind == "lowrank":
            return [self.rng.uniform(-1, 1, (K, P, 2)), self.rng.uniform(-1, 1, (K, Q, 2))]
        return [self.rng.uniform(-1, 1, (K, P, Q))]


def _placed(ops: _Operands, name: str, values: np.ndarray, layout: str) -> Any:
    return make(values, ops.backends[name], ops.dtypes[name], layout, ops.devices[name])


def _theta(ops: _Operands) -> tuple[Any, Any, np.ndarray]:
    """The parameter as passed, a builder for it (the factor classes check their input), and its full value."""
    from structconv import LowRank, Separable

    layout = ops.p["layouts"][1]
    parts = [_placed(ops, "theta", v, layout) for v in ops.theta_parts]
    values = [read(a) if hasattr(a, "shape") and ops.devices["theta"] != "meta" else None for a in parts]
    kind = ops.p["theta_kind"]
    if kind == "full":
        return parts[0], None, values[0] if values[0] is not None else ops.theta_parts[0]
    full = (
        np.einsum("hk,hpq->kpq", *ops.theta_parts)
        if kind == "separable"
        else np.einsum("kpd,kqd->kpq", *ops.theta_parts)
    )
    if values[0] is not None:
        full = np.einsum("hk,hpq->kpq", *values) if kind == "separable" else np.einsum("kpd,kqd->kpq", *values)
    factory = Separable if kind == "separable" else LowRank
    return None, (lambda: factory(*parts)), full


def _basis(ops: _Operands) -> tuple[Any, np.ndarray | None]:
    """A builder of the basis (package calls only) and its dense float64 value (``None`` on meta)."""
    import structconv as sc

    rep, layout = ops.rep, ops.p["layouts"][2]
    meta = ops.devices["basis"] == "meta"
    if rep == "grid":
        like = _placed(ops, "basis", np.zeros(1), "contiguous")
        before, after = refs.same_padding(ops.kernel)
        dense = refs.grid_dense(ops.grid, refs.window(ops.kernel, (1, 1)), (1, 1), before, after)
        return (lambda: sc.grid_basis(ops.grid, ops.kernel, padding="same", like=like)), dense
    if rep == "gcn":
        src = ops.rng.integers(0, ops.M, 2 * ops.M)
        dst = ops.rng.integers(0, ops.M, 2 * ops.M)
        keep = src != dst  # repeated self-loops are summed or not, as the backend's scatter goes
        src, dst = src[keep], dst[keep]
        weight = ops.rng.uniform(0.5, 2.0, src.size)
        edge_index = np.stack([src, dst])
        if ops.backends["basis"] == "torch":
            import torch

            edge_index = torch.from_numpy(edge_index).to(ops.devices["basis"])
        w = _placed(ops, "basis", weight, layout)
        dense = refs.gcn_dense(src, dst, read(w) if not meta else weight, ops.M)
        return (lambda: sc.gcn_basis(edge_index, num_nodes=ops.M, edge_weight=w)), dense
    if rep == "attention":
        xa = _placed(ops, "basis", 0.5 * ops.rng.uniform(-1, 1, (ops.B, ops.M, 3)), layout)
        bil = _placed(ops, "basis", 0.5 * ops.rng.normal(size=(ops.K, 3, 3)), "contiguous")
        mech = sc.BiAffine(bilinear=bil) if not meta else None
        dense = None if meta else refs.softmax_columns(refs.bilinear_scores(read(xa), read(xa), read(bil)), None)
        if meta:
            return (lambda: sc.attention_basis(xa, mechanism=sc.BiAffine(bilinear=bil))), None
        return (lambda: sc.attention_basis(xa, mechanism=mech)), dense
    arr = _placed(ops, "basis", ops.A, layout)
    dense = None if meta else read(arr)
    if rep in ("array", "batched"):
        return (lambda: arr), dense
    if rep == "dense":
        return (lambda: sc.DenseBasis(arr)), dense
    if rep in ("from_dense",):
        return (lambda: sc.SparseBasis.from_dense(arr)), dense
    if rep == "torch_sparse":
        # torch has no meta kernel for to_sparse: a meta sparse tensor is made on the CPU, then moved
        cpu = make(ops.A, "torch", ops.dtypes["basis"], layout) if meta else arr
        sparse = cpu.to_sparse() if hasattr(cpu, "to_sparse") else cpu
        sparse = sparse.to("meta") if meta else sparse
        return (lambda: sparse), dense
    if rep == "concat":
        return (lambda: sc.concat([sc.DenseBasis(arr[:1]), sc.SparseBasis.from_dense(arr[1:])])), dense
    if rep == "composed":
        eye = _placed(ops, "basis", np.eye(ops.N)[None], "contiguous")
        return (lambda: sc.ComposedBasis(sc.DenseBasis(arr), sc.SparseBasis.from_dense(eye))), dense
    if rep in ("sparse", "batched_sparse"):
        index = np.stack(np.nonzero(ops.A))
        vals = _placed(ops, "basis", ops.A[tuple(index)], layout)
        dense = None if meta else np.zeros(ops.A.shape)
        if dense is not None:
            dense[tuple(index)] = read(vals)
        if ops.backends["basis"] == "torch":
            import torch

            index = torch.from_numpy(index).to(ops.devices["basis"])
        shape = ops.A.shape
        return (lambda: sc.SparseBasis(index, vals, shape)), dense
    # select: the members in reverse from a basis that holds them reversed
    flipped = _placed(ops, "basis", ops.A[::-1].copy(), layout)
    dense = None if meta else read(flipped)[::-1]
    members = list(range(ops.K))[::-1]
    return (lambda: sc.ConcatBasis([sc.SparseBasis.from_dense(flipped)]).select(members)), dense


def _defect(ops: _Operands) -> tuple[str, tuple[str, ...], str]:
    """Apply the drawn defect to how the operands are made; return ``(expect, names, words)``."""
    p, name, d = ops.p, ops.p["operand"], ops.p["defect"]
    names = {"x": ("x",), "theta": THETA_NAMES, "basis": BASIS_NAMES}[name]
    placement_free = ops.rep in ("grid",) and name == "basis"
    if d is None:
        return VALID, (), "valid"
    if d == "meta_all":
        ops.backends = dict.fromkeys(ops.backends, "torch")
        ops.devices = dict.fromkeys(ops.devices, "meta")
        # meta tensors hold no values: a right shape, or a clear refusal (values cannot be checked)
        return EITHER, ("basis", "device", "meta", "x", "theta", "values"), "every operand on the meta device"
    if d in ("dtype_mix", "dtype_bad", "backend_mix", "device_mix") and placement_free:
        return VALID, (), f"{d} on a placement-free grid basis (it follows x)"
    if d == "dtype_mix":
        other = next(f for f in ("float32", "float64", "float16") if f != ops.dtype)
        ops.dtypes[name] = other
        return ERROR, names, f"{name} in {other}, the others in {ops.dtype}"
    if d == "dtype_bad":
        ops.dtypes[name] = p["other_dtype"]
        if p["other_dtype"] in FLOATS:
            return (VALID, (), "valid") if p["other_dtype"] == ops.dtype else (ERROR, names, f"{name} mixed dtype")
        return ERROR, names, f"{name} of dtype {p['other_dtype']}"
    if d == "backend_mix":
        if ops.rep == "torch_sparse" and name == "basis":
            return VALID, (), "valid"
        ops.backends[name] = "numpy" if ops.backends[name] == "torch" else "torch"
        if ops.dtypes[name] == "bfloat16" and ops.backends[name] == "numpy":
            ops.dtypes[name] = "float32"
        return ERROR, names, f"{name} on {ops.backends[name]}, the others on {ops.backend}"
    if d == "device_mix":
        ops.backends[name] = "torch"
        ops.devices[name] = "meta"
        return ERROR, names + ("device",), f"{name} on the meta device, the others on cpu"
    return EITHER, names, d


def trial(entry: str, p: dict[str, Any]) -> Trial:
    import structconv as sc

    ops = _Operands(p)
    p = ops.p
    expect, names, words = _defect(ops)
    d, name = p["defect"], p["operand"]
    x_values = ops.x[0] if p["x2d"] else ops.x
    order: Any = p["order"]
    nan_input = False
    # defects that change the values or shapes drawn above
    if d == "nonfinite":
        bad = float(p["bad_value"])
        if name == "basis" and ops.rep in ("grid",):
            name = "x"
        if name == "x":
            x_values = x_values.copy()
            x_values.flat[0] = bad
            expect, names, nan_input = EITHER, ("x",), True
        elif name == "theta":
            ops.theta_parts[0].flat[0] = bad
            expect, names, nan_input = EITHER, THETA_NAMES, True
        else:
            ops.A.flat[0] = bad
            expect, names = ERROR, BASIS_NAMES
            if ops.rep in ("gcn", "attention"):
                expect = EITHER  # the weights come from other arrays: the defect goes to those
        words = f"{p['bad_value']} in {name}"
    elif d in ("M", "K", "P", "batch", "empty", "x_rank", "theta_rank", "basis_rank"):
        expect, names, words = _shape_defect(ops, d, name)
        x_values = ops.x[0] if ops.p["x2d"] else ops.x
    elif d == "order_bad":
        order = BAD_ORDERS[p["bad_order"]]
        factored = order == "ax+full" and p["theta_kind"] != "full"  # valid for a factorised parameter
        expect, names, words = (EITHER if factored else ERROR), ("order",), f"order={order!r}"
    x = make(x_values, ops.backends["x"], ops.dtypes["x"], p["layouts"][0], ops.devices["x"])
    if d == "not_array" and name == "x":
        x, expect, names, words = _not_array(p["not_array"], x_values), ERROR, ("x",), f"x as {p['not_array']}"
    if d == "sparse_x" and ops.devices["x"] == "cpu" and not (isinstance(x, np.ndarray) and x.dtype == np.float16):
        if isinstance(x, np.ndarray) and x_values.ndim == 3:
            x_values = x_values[0]
            x = make(x_values, ops.backends["x"], ops.dtypes["x"], p["layouts"][0])
        x, expect, names, words = _sparse_x(x), EITHER, ("x",), "x as a sparse matrix"
    theta, make_theta, theta_full = _theta(ops)
    if d == "not_array" and name == "theta":
        theta, make_theta = _not_array(p["not_array"], theta_full), None
        expect, names, words = ERROR, THETA_NAMES, f"theta as {p['not_array']}"
    build_basis, dense = _basis(ops)
    if d == "not_array" and name == "basis":
        junk = _not_array(p["not_array"], ops.A)
        build_basis, expect, names, words = (lambda: junk), ERROR, BASIS_NAMES, f"basis as {p['not_array']}"
    if order in ("ax", "xtheta", "atheta") and expect in (VALID, EITHER):
        expect, names = EITHER, (*names, "order")  # not every representation runs every order of the triangle

    def call() -> Any:
        a = build_basis()
        t = make_theta() if make_theta is not None else theta
        chosen = order
        if order == "pick":
            plan = sc.explain(a, x, t)
            chosen = plan.candidates[p["pick"] % len(plan.candidates)].order
        if entry == "explain":
            return sc.explain(a, x, t, order=chosen)
        return sc.conv(a, x, t, order=chosen)

    def check(y: Any) -> str | None:
        if entry == "explain":
            return _check_plan(y, ops)
        meta = ops.devices["x"] == "meta"
        xv = x_values if meta else read(x)
        ref_A = dense if dense is not None else np.zeros(ops.A.shape)
        ref, bound, terms = conv_reference(ref_A, xv, theta_full)
        device = "meta" if meta else "cpu"
        problem = compare(y, ref, bound, ops.dtypes["x"], ops.backends["x"], terms, device, nan_input)
        if problem is None and getattr(x, "requires_grad", False) and ops.dtypes["x"] == "float64":
            problem = _check_grad(y, x, ref_A, theta_full)
        return problem

    describe = (
        f"{entry}({ops.rep} basis {ops.A.shape if ops.rep not in ('grid',) else (ops.K, ops.M, ops.N)}, "
        f"x {x_values.shape}, theta {p['theta_kind']} K={ops.K} P={ops.P} Q={ops.Q}; {ops.backend} {ops.dtype}, "
        f"layouts x/theta/basis={'/'.join(p['layouts'])}, order={order!r}); {words}"
    )
    return Trial(describe, call, expect, names, check)


def _shape_defect(ops: _Operands, d: str, name: str) -> tuple[str, tuple[str, ...], str]:
    """Change a size so that the operands disagree, or an operand has the wrong rank or an empty axis."""
    K, M, P = ops.K, ops.M, ops.P
    if d == "M":
        ops.x = ops.rng.uniform(-1, 1, (ops.B, M + 1, P))
        return ERROR, ("x", "M"), f"x has M={M + 1}, the basis M={M}"
    if d == "P":
        ops.x = ops.rng.uniform(-1, 1, (ops.B, M, P + 1))
        return ERROR, ("theta", "x", "P"), f"x has P={P + 1}, theta P={P}"
    if d == "K":
        ops.K = K + 1
        ops.theta_parts = ops._theta_parts()
        ops.K = K
        return ERROR, ("theta", "K"), f"theta has K={K + 1}, the basis K={K}"
    if d == "batch":
        if not ops.batched:
            return VALID, (), "valid"
        ops.x = ops.rng.uniform(-1, 1, (ops.B + 1, M, P))
        ops.p = {**ops.p, "x2d": False}
        return ERROR, ("batch",), f"x has batch {ops.B + 1}, the basis {ops.B}"
    if d == "empty":
        if name == "x":
            ops.x = np.zeros((0, M, P))
            ops.p = {**ops.p, "x2d": False}
        elif name == "theta":
            ops.Q = 0
            ops.theta_parts = ops._theta_parts()
        elif ops.rep in ("array", "dense", "batched", "from_dense"):
            ops.A = ops.A[..., :0]
        else:
            return VALID, (), "valid"
        return EITHER, {"x": ("x",), "theta": THETA_NAMES, "basis": BASIS_NAMES}[name], f"{name} has an empty axis"
    rank = ops.p["rank"]
    if d == "x_rank":
        ops.x = ops.rng.uniform(-1, 1, (2,) * rank)
        ops.p = {**ops.p, "x2d": False}
        return (ERROR if rank not in (2, 3) else EITHER), ("x",), f"x of rank {rank}"
    if d == "theta_rank" and ops.p["theta_kind"] == "full":
        ops.theta_parts = [np.asarray(ops.rng.uniform(-1, 1, (K,) + (P,) * max(rank - 1, 0))[(0,) * (rank == 0)])]
        return ERROR, THETA_NAMES, f"theta of rank {rank}"
    if d == "basis_rank" and ops.rep in ("array", "dense", "from_dense"):
        if rank in (3, 4):
            return VALID, (), "valid"
        ops.A = ops.rng.normal(size=(2,) * rank)
        return ERROR, BASIS_NAMES, f"basis of rank {rank}"
    return VALID, (), "valid"


def _sparse_x(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        import scipy.sparse

        return scipy.sparse.csr_array(x)
    return x.detach().to_sparse()


def _check_plan(plan: Any, ops: _Operands) -> str | None:
    orders = [c.order for c in plan.candidates]
    if plan.chosen not in orders:
        return f"plan.chosen={plan.chosen!r} is not among its candidates {orders}"
    want = {"K": ops.K, "M": ops.M, "N": ops.N, "P": ops.P, "Q": ops.Q}
    got = {k: plan.sizes.get(k) for k in want}
    return None if got == want else f"plan.sizes {got} differ from the operands' {want}"


def _check_grad(y: Any, x: Any, A: np.ndarray, theta: np.ndarray) -> str | None:
    """``x.grad`` of ``y.sum()`` against :math:`\\sum_{k,n,q} A_{kmn}\\Theta_{kpq}`."""
    y.sum().backward()
    eq = "bkmn,kpq->bmp" if A.ndim == 4 else "kmn,kpq->mp"
    want = np.einsum(eq, A, theta)
    want = np.broadcast_to(want, tuple(x.shape)) if want.ndim < x.ndim else want
    if x.grad is None:
        return "x requires grad but got no gradient"
    got = x.grad.detach().double().numpy()
    bound = np.einsum(eq, np.abs(A), np.abs(theta))
    bound = np.broadcast_to(bound, got.shape) if bound.ndim < got.ndim else bound
    err = np.abs(got - want)
    if np.any(err > 1e-12 * (A.size + theta.size) * (bound + 1)):
        return f"x.grad is wrong by up to {float(err.max()):.3g}"
    return None
