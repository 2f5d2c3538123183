"""Attention: ``attention_basis`` (with ``conv`` through it, every order) and ``masked_softmax``; masks above all.

A case draws batch, sizes, heads, a mechanism (a bilinear one, scaled dot-product key and query
projections with or without biases, a bilinear one plus an offset), a backend and dtype, self-
or cross-attention, a mask (boolean or additive, of every broadcastable shape, fully masked
columns, on another backend or device, of integers, holding NaN, ``+inf`` or ``-1e9``, with
extra leading axes, non-contiguous), a LeakyReLU slope and ``normalize``, and at most one
defect of the inputs or the mechanism.  A valid basis must equal the column-wise softmax of the
naive scores, and ``conv`` through it the dense einsum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from . import refs
from .arrays import FLOATS, conv_reference, make, read
from .classify import compare
from .spec import EITHER, ERROR, VALID, Expectation, Trial

MECHANISMS = ("bilinear", "keyquery", "keyquery_bias", "bilinear_offset")
MASKS = (
    "none", "none", "bool_mn", "bool_mn", "bool_n", "bool_bkmn", "bool_1kmn", "bool_b1mn", "additive", "additive",
    "additive_other_dtype", "int01", "int_zero", "uint8", "minus_1e9", "nan", "plus_inf", "other_backend", "meta",
    "all_false", "column_false", "expanded", "transposed", "five_d", "wrong_shape", "list", "grad",
)  # fmt: skip
MECH_NAMES = ("mechanism", "bilinear", "key", "query", "key_bias", "query_bias", "offset", "x", "z")


@st.composite
def attention_params(draw: Any) -> dict[str, Any]:
    return {
        "sizes": [draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))]
        + [draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))],
        "seed": draw(st.integers(0, 2**31)),
        "mechanism": draw(st.sampled_from(MECHANISMS)),
        "backend": draw(st.sampled_from(("numpy", "torch", "torch"))),
        "dtype": draw(st.sampled_from(FLOATS)),
        "cross": draw(st.booleans()),
        "x2d": draw(st.booleans()),
        "mask": draw(st.sampled_from(MASKS)),
        "leaky": draw(st.sampled_from((None, None, 0.2, -1.0, 0.0, "nan", "0.2"))),
        "normalize": draw(st.sampled_from((True, True, False))),
        "order": draw(st.sampled_from(("auto", "pick", "pick", "sdpa"))),
        "pick": draw(st.integers(0, 5)),
        "defect": draw(
            st.sampled_from(
                (None, None, None, "x_width", "z_width", "z_batch", "x_rank", "x_int", "dtype_mix", "no_mechanism")
                + ("not_mechanism", "bilinear_rank", "key_without_query", "d_mismatch", "key_bias_shape", "x_nan")
                + ("scale_np64",)
            )
        ),
    }


@st.composite
def softmax_params(draw: Any) -> dict[str, Any]:
    return {
        "shape": [draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4)))],
        "seed": draw(st.integers(0, 2**31)),
        "backend": draw(st.sampled_from(("numpy", "torch"))),
        "dtype": draw(st.sampled_from((*FLOATS, "int64"))),
        "mask": draw(st.sampled_from(MASKS)),
        "scores": draw(st.sampled_from(("plain", "plain", "large", "neg_inf", "nan", "pos_inf"))),
    }


ENTRIES = {"attention_basis": (attention_params(), 700), "masked_softmax": (softmax_params(), 250)}


def _mask(
    kind: str, B: int, K: int, M: int, N: int, rng: np.random.Generator, backend: str, dtype: str
) -> tuple[Any, np.ndarray | None, str, tuple[str, ...], str]:
    """``(mask, allowed (B, K, M, N) or None, expect, names, words)`` for a mask kind."""
    allowed = rng.random((B, K, M, N)) < 0.7
    full = (B, K, M, N)
    fdtype = "float32" if backend == "numpy" and dtype == "bfloat16" else dtype

    def as_bool(a: np.ndarray, be: str = backend, device: str = "cpu") -> Any:
        if be == "numpy":
            return a.copy()
        import torch

        return torch.from_numpy(a.copy()).to(device)

    names = ("mask",)
    if kind == "none":
        return None, None, VALID, (), "no mask"
    if kind.startswith("bool_"):
        shape = {"bool_mn": (M, N), "bool_n": (N,), "bool_bkmn": full, "bool_1kmn": (1, K, M, N)}.get(
            kind, (B, 1, M, N)
        )
        a = allowed[tuple(slice(0, s) for s in (1,) * (4 - len(shape)) + shape)].reshape(shape)
        # a 1-D mask broadcasts, but the documented shapes have 2 to 4 axes
        expect = EITHER if len(shape) == 1 else VALID
        return as_bool(a), np.broadcast_to(a, full), expect, names, f"bool mask {shape}"
    mn = allowed[0, 0]
    if kind in ("additive", "additive_other_dtype", "grad"):
        other = "float32" if fdtype != "float32" else "float64"
        m = make(
            np.where(mn, 0.0, -np.inf),
            backend,
            other if kind == "additive_other_dtype" else fdtype,
            "grad" if kind == "grad" else "contiguous",
        )
        expect = EITHER if kind == "additive_other_dtype" else VALID
        return m, np.broadcast_to(mn, full), expect, names, f"additive mask ({kind})"
    if kind in ("int01", "uint8"):
        m = make(mn.astype(float), backend, "uint8" if kind == "uint8" else "int64")
        if kind == "uint8":
            m = make(mn.astype(float) / 3, backend, "uint8")
        return m, None, EITHER, names, f"{kind} mask"
    if kind == "int_zero":
        return make(np.zeros((M, N)), backend, "int64"), np.ones(full, bool), EITHER, names, "an all-zero int mask"
    if kind in ("minus_1e9", "nan", "plus_inf"):
        value = {"minus_1e9": -1e9, "nan": np.nan, "plus_inf": np.inf}[kind]
        m = make(np.where(mn, 0.0, value), backend, "float32" if fdtype == "float16" else fdtype)
        if mn.all():
            return m, np.broadcast_to(mn, full), VALID, names, f"a mask that could hold {value} (holds only 0)"
        return m, None, ERROR, names, f"a mask holding {value}"
    if kind == "other_backend":
        other = "numpy" if backend == "torch" else "torch"
        return as_bool(mn, other), np.broadcast_to(mn, full), EITHER, names, f"a {other} bool mask"
    if kind == "meta":
        if backend == "numpy":
            return as_bool(mn), np.broadcast_to(mn, full), VALID, (), "bool mask"
        return as_bool(mn, "torch", "meta"), None, ERROR, names + ("device",), "a mask on meta"
    if kind == "all_false":
        a = np.zeros(full, bool)
        return as_bool(a), a, VALID, (), "every entry masked"
    if kind == "column_false":
        a = allowed.copy()
        a[..., 0] = False
        return as_bool(a), a, VALID, (), "column 0 fully masked"
    if kind == "expanded":
        if backend == "numpy":
            return np.broadcast_to(mn, full), np.broadcast_to(mn, full), VALID, (), "a broadcast view"
        import torch

        return torch.from_numpy(mn.copy()).expand(full), np.broadcast_to(mn, full), VALID, (), "an expanded mask"
    if kind == "transposed":
        t = as_bool(np.ascontiguousarray(mn.T))
        return t.T, np.broadcast_to(mn, full), VALID, (), "a transposed (non-contiguous) mask"
    if kind == "five_d":
        a = mn.reshape(1, 1, 1, M, N)
        return as_bool(a), np.broadcast_to(mn, full), EITHER, names, "a 5-D mask (1, 1, 1, M, N)"
    if kind == "wrong_shape":
        a = np.ones((M + 1, N + 1), bool)
        return as_bool(a), None, ERROR, names, f"a mask of shape {(M + 1, N + 1)}"
    return mn.tolist(), None, ERROR, names, "a mask as a list"


def _leaky(value: Any, e: Expectation) -> Any:
    if value == "nan":
        e.add(EITHER, ("leaky_relu",), "leaky_relu=nan")
        return float("nan")
    if isinstance(value, str):
        e.add(ERROR, ("leaky_relu",), f"leaky_relu={value!r}")
    return value


def trial(entry: str, p: dict[str, Any]) -> Trial:
    if entry == "masked_softmax":
        return _softmax_trial(p)
    import structconv as sc

    B, M, N, P, Pz, K = p["sizes"]
    rng = np.random.default_rng(p["seed"])
    backend = p["backend"]
    dtype = "float32" if backend == "numpy" and p["dtype"] == "bfloat16" else p["dtype"]
    e = Expectation()
    if not p["cross"]:
        N, Pz = M, P
    if p["x2d"]:
        B = 1
    xv = 0.5 * rng.uniform(-1, 1, (B, M, P))
    zv = 0.5 * rng.uniform(-1, 1, (B, N, Pz)) if p["cross"] else xv
    D = 2
    terms = {
        "bilinear": 0.5 * rng.normal(size=(K, P, Pz)),
        "key": 0.5 * rng.normal(size=(K, P, D)),
        "query": 0.5 * rng.normal(size=(K, Pz, D)),
        "key_bias": 0.5 * rng.normal(size=(K, D)),
        "query_bias": 0.5 * rng.normal(size=(K, D)),
        "offset": rng.normal(size=K),
    }
    kinds = {
        "bilinear": ("bilinear",),
        "keyquery": ("key", "query"),
        "keyquery_bias": ("key", "query", "key_bias", "query_bias"),
        "bilinear_offset": ("bilinear", "offset"),
    }[p["mechanism"]]
    mech_dtype = dtype
    d = p["defect"]
    if d == "x_width":
        xv = 0.5 * rng.uniform(-1, 1, (B, M, P + 1))
        zv = xv if not p["cross"] else zv
        e.add(ERROR, ("x", "z"), "x one channel wider than the mechanism")
    elif d == "z_width" and p["cross"]:
        zv = 0.5 * rng.uniform(-1, 1, (B, N, Pz + 1))
        e.add(ERROR, ("z",), "z one channel wider than the mechanism")
    elif d == "z_batch" and p["cross"]:
        zv = 0.5 * rng.uniform(-1, 1, (B + 1, N, Pz))
        e.add(ERROR, ("z", "batch"), "z of another batch than x")
    elif d == "x_nan":
        xv = xv.copy()
        xv[0, 0, 0] = np.nan
        e.add(EITHER, ("x",), "NaN in x")
    elif d == "dtype_mix":
        mech_dtype = "float64" if dtype != "float64" else "float32"
        e.add(ERROR, MECH_NAMES, f"mechanism in {mech_dtype}, x in {dtype}")
    x = make(xv[0] if p["x2d"] else xv, backend, dtype)
    z = make(zv[0] if p["x2d"] and zv.shape[0] == 1 else zv, backend, dtype) if p["cross"] else None
    if d == "x_rank":
        x = make(xv[None], backend, dtype)
        e.add(ERROR, ("x",), "x of rank 4")
    elif d == "x_int":
        x = make(xv, backend, "int64")
        e.add(ERROR, ("x",), "x of integers")
    arrays = {k: make(terms[k], backend, mech_dtype) for k in kinds}
    if d == "bilinear_rank" and "bilinear" in arrays:
        arrays["bilinear"] = arrays["bilinear"][0]
        e.add(ERROR, ("bilinear", "K", "heads"), "bilinear of rank 2")
    elif d == "key_without_query" and "query" in arrays:
        del arrays["query"]
        arrays.pop("query_bias", None)
        e.add(ERROR, ("key", "query"), "key without query")
    elif d == "d_mismatch" and "query" in arrays:
        arrays["query"] = make(0.5 * rng.normal(size=(K, Pz, D + 1)), backend, mech_dtype)
        e.add(ERROR, ("key", "query"), "key and query of different D")
    elif d == "key_bias_shape" and "key_bias" in arrays:
        arrays["key_bias"] = make(np.zeros((K, D + 1)), backend, mech_dtype)
        e.add(ERROR, ("key_bias",), "key_bias of the wrong width")
    scale: Any = float(1 / np.sqrt(D)) if "key" in kinds else 1.0
    if d == "scale_np64":  # a NumPy scalar is a float too, but NumPy promotes with it
        scale = np.float64(scale) if backend == "numpy" else scale
        e.add(VALID, (), "scale a numpy.float64")
    mask, allowed, m_expect, m_names, m_words = _mask(p["mask"], B, K, M, N, rng, backend, dtype)
    e.add(m_expect, m_names, m_words)
    leaky = _leaky(p["leaky"], e)
    normalize = p["normalize"]
    mechanism_kind = "mechanism"
    if d == "no_mechanism":
        mechanism_kind = "none"
        e.add(ERROR, ("mechanism",), "no mechanism")
    elif d == "not_mechanism":
        mechanism_kind = "array"
        e.add(ERROR, ("mechanism",), "an array as the mechanism")
    value = make(rng.uniform(-1, 1, (B, M, 2)), backend, dtype)
    theta = make(rng.uniform(-1, 1, (K, 2, 3)), backend, dtype)
    order = p["order"]
    if order == "sdpa":
        e.add(EITHER, ("order",), "order='sdpa'")

    def call() -> Any:
        if mechanism_kind == "none":
            mech = None
        elif mechanism_kind == "array":
            mech = arrays[kinds[0]]
        else:
            mech = sc.BiAffine(**arrays, scale=scale) if scale != 1.0 else sc.BiAffine(**arrays)
        basis = sc.attention_basis(x, z, mechanism=mech, mask=mask, leaky_relu=leaky, normalize=normalize)
        chosen = order
        if order in ("pick", "auto"):
            plan = sc.explain(basis, value, theta)
            chosen = plan.chosen if order == "auto" else plan.candidates[p["pick"] % len(plan.candidates)].order
        return basis, sc.conv(basis, value, theta, order=chosen), chosen

    def check(answer: tuple[Any, Any, str]) -> str | None:
        basis, y, ran = answer
        scores = _scores(read(x), read(z) if z is not None else read(x), terms, kinds, float(scale))
        if leaky is not None:
            scores = np.where(scores >= 0, scores, scores * leaky)
        ok = allowed if allowed is not None else np.ones(scores.shape, bool)
        if p["mask"] in ("int01", "uint8", "int_zero"):
            ok = np.broadcast_to(read(mask) == 0, scores.shape)  # read as additive: 0 allows
        weights = refs.softmax_columns(scores, ok) if normalize else np.where(ok, scores, 0.0)
        problem = compare(basis.to_dense(), weights, np.abs(weights) + 1, dtype, backend, 4 * P * Pz + 8)
        if problem is not None:
            return f"basis: {problem}"
        ref, bound, n = conv_reference(weights, read(value), read(theta))
        # NaN in x: torch's fused kernel (order 'sdpa') adds the mask to the scores, so a masked NaN
        # score stays NaN where the reference drops the entry (torch's own sdpa gives the same).
        # Every other order must keep the reference's finite entries finite.
        nan_input = d == "x_nan" and ran == "sdpa"
        problem = compare(y, ref, bound + np.abs(ref) + 1, dtype, backend, n * (4 * P * Pz + 8), nan_input=nan_input)
        return None if problem is None else f"conv: {problem}"

    z_shape = None if z is None else tuple(z.shape)
    describe = (
        f"attention_basis(x {tuple(x.shape)}, z {z_shape}, {p['mechanism']} K={K}, {backend} {dtype}, "
        f"leaky_relu={p['leaky']!r}, normalize={normalize}) then conv(order={order!r}); {e.described}"
    )
    return Trial(describe, call, e.expect, tuple(e.names), check)


def _scores(
    x: np.ndarray, z: np.ndarray, terms: dict[str, np.ndarray], kinds: tuple[str, ...], scale: float
) -> np.ndarray:
    x3 = x if x.ndim == 3 else x[None]
    z3 = z if z.ndim == 3 else z[None]
    if "bilinear" in kinds:
        s = refs.bilinear_scores(x3, z3, terms["bilinear"])
    else:
        keys = np.einsum("bmp,kpd->bkmd", x3, terms["key"])
        queries = np.einsum("bnp,kpd->bknd", z3, terms["query"])
        if "key_bias" in kinds:
            keys = keys + terms["key_bias"][None, :, None, :]
            queries = queries + terms["query_bias"][None, :, None, :]
        s = scale * np.einsum("bkmd,bknd->bkmn", keys, queries)
    if "offset" in kinds:
        s = s + terms["offset"][None, :, None, None]
    return s


def _softmax_trial(p: dict[str, Any]) -> Trial:
    import structconv as sc

    shape = tuple(p["shape"])
    rng = np.random.default_rng(p["seed"])
    backend, e = p["backend"], Expectation()
    dtype = "float32" if backend == "numpy" and p["dtype"] == "bfloat16" else p["dtype"]
    values = rng.normal(size=shape) * (30.0 if p["scores"] == "large" else 1.0)
    special = {"neg_inf": -np.inf, "nan": np.nan, "pos_inf": np.inf}.get(p["scores"])
    if special is not None:
        values.flat[0] = special
        e.add(EITHER if p["scores"] != "neg_inf" else VALID, ("scores",), f"{special} in the scores")
    if len(shape) < 2:
        e.add(ERROR, ("scores",), "scores of rank 1")
    if dtype == "int64":
        e.add(ERROR, ("scores",), "integer scores")
    scores = make(values, backend, dtype)
    M, N = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[0])
    lead = shape[:-2] if len(shape) >= 2 else ()
    B, K = (int(np.prod(lead[:-1])) if len(lead) > 1 else 1), (lead[-1] if lead else 1)
    mask, allowed, m_expect, m_names, m_words = _mask(p["mask"], B, K, M, N, rng, backend, dtype)
    if allowed is not None and mask is not None and hasattr(mask, "ndim") and mask.ndim == 4 and len(shape) != 4:
        mask, allowed, m_words = mask[0, 0], allowed[0, 0], m_words + " (as (M, N))"
    e.add(m_expect, m_names, m_words)

    def check(w: Any) -> str | None:
        if p["mask"] in ("int01", "uint8", "int_zero"):
            ok = np.broadcast_to(read(mask) == 0, shape)
        else:
            ok = (
                np.broadcast_to(
                    allowed.reshape(allowed.shape[-len(shape) :] if allowed.ndim > len(shape) else allowed.shape), shape
                )
                if allowed is not None
                else None
            )
        ref = refs.softmax_columns(read(scores), ok)
        return compare(w, ref, np.ones(shape), dtype, backend, 2 * M + 8, nan_input=special is not None)

    return Trial(
        f"masked_softmax(scores {shape} {backend} {dtype} ({p['scores']}), mask); {e.described}",
        lambda: sc.masked_softmax(scores, mask),
        e.expect,
        tuple(e.names),
        check,
    )
