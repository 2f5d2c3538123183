"""Grid builders: ``grid_basis``, ``avg_pool_basis``, ``shift_matrix`` and ``apply_shifts``.

A case draws a valid configuration (1 to 3 dimensions, small grids), then perhaps replaces one
argument by a bad value: zero, negative, non-integer, a string, ``None``, a bool, a wrong
length, a huge size (``10**10``, ``2**40``), a malformed padding or offsets.  A valid basis must
have the documented shape and, when small, equal the naive dense reference (torch's kernel
placement; torch's ``avg_pool`` for pooling); a huge one must be built lazily or refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from . import refs
from .arrays import make, read
from .classify import compare
from .spec import EITHER, ERROR, HUGE, VALID, Expectation, Trial

SMALL = 200_000
"""Largest ``K * M * N`` whose dense form a valid case checks."""


def _bad() -> st.SearchStrategy[Any]:
    return st.sampled_from(
        [0, -1, 2.5, 3.0, "3", None, True, [], [3, 0], [2, 2, 2, 2], [[1, 1]], {"np": "float"}, {"np": "int"}]
        + list(HUGE)
    )


@st.composite
def grid_params(draw: Any) -> dict[str, Any]:
    d = draw(st.integers(1, 3))
    grid = [draw(st.integers(1, 6 if d < 3 else 4)) for _ in range(d)]
    return {
        "grid": grid,
        "kernel": [draw(st.integers(1, 3)) for _ in range(d)],
        "stride": [draw(st.integers(1, 3)) for _ in range(d)],
        "dilation": [draw(st.integers(1, 2)) for _ in range(d)],
        "padding": draw(st.sampled_from(["int", "tuple", "pairs", "same", "valid", "zero"])),
        "pad": [draw(st.integers(0, 2)) for _ in range(2 * d)],
        "offsets": draw(st.booleans()),
        "boundary": draw(st.sampled_from(["zero", "periodic"])),
        "like": draw(st.sampled_from(["none", "numpy-float32", "torch-float64", "torch-float32", "torch-bfloat16"])),
        "spelling": draw(st.sampled_from(["list", "tuple", "int", "numpy", "torch"])),
        "defect": draw(st.sampled_from([None, None, "grid", "kernel", "stride", "dilation", "padding", "offsets"])),
        "extra": draw(st.sampled_from([None, "boundary", "like", "same_stride", "both", "duplicate", "too_big"])),
        "bad": draw(_bad()),
        "bad_boundary": draw(st.sampled_from(["reflect", "ZERO", "circular", "", None, 0])),
        "bad_like": draw(st.sampled_from(["list", "int", "bool", "complex", "meta", "float16"])),
        "seed": draw(st.integers(0, 2**31)),
    }


@st.composite
def pool_params(draw: Any) -> dict[str, Any]:
    p = draw(grid_params())
    p["count_include_pad"] = draw(st.booleans())
    p["ceil_mode"] = draw(st.booleans())
    p["stride_none"] = draw(st.booleans())
    return p


@st.composite
def shift_params(draw: Any) -> dict[str, Any]:
    d = draw(st.integers(1, 3))
    return {
        "grid": [draw(st.integers(1, 5 if d < 3 else 3)) for _ in range(d)],
        "d": [draw(st.integers(-3, 3)) for _ in range(d)],
        "boundary": draw(st.sampled_from(["zero", "periodic"])),
        "defect": draw(st.sampled_from([None, None, "d", "grid", "boundary"])),
        "bad": draw(_bad()),
        "like": draw(st.sampled_from(["none", "torch-float32", "numpy-float32"])),
    }


@st.composite
def apply_params(draw: Any) -> dict[str, Any]:
    p = draw(grid_params())
    p.update(defect=None, extra=None)
    p["x"] = draw(st.sampled_from(["ok", "ok", "M", "rank", "int", "backend", "dtype", "meta", "list", "basis"]))
    p["method"] = draw(st.sampled_from(["auto", "shift", "native", "NATIVE", "fft", None]))
    p["channels"] = draw(st.integers(1, 3))
    return p


ENTRIES = {
    "grid_basis": (grid_params(), 600),
    "avg_pool_basis": (pool_params(), 300),
    "shift_matrix": (shift_params(), 150),
    "apply_shifts": (apply_params(), 250),
}


def _spell(values: list[int], spelling: str, repeat: bool = True) -> Any:
    """A valid size argument in one of the accepted spellings (an int stands for every dimension if ``repeat``)."""
    if spelling == "int" and len(set(values)) == 1 and (repeat or len(values) == 1):
        return values[0]
    if spelling == "tuple":
        return tuple(values)
    if spelling == "numpy":
        return np.asarray(values, dtype=np.int64)
    if spelling == "torch":
        import torch

        return torch.tensor(values)
    return list(values)


def _bad_value(bad: Any) -> Any:
    if isinstance(bad, dict):
        return np.asarray([3.0]) if bad["np"] == "float" else np.int64(-2)
    return bad


def _like(spec: str) -> Any:
    if spec == "none":
        return None
    backend, dtype = spec.split("-")
    return make(np.zeros(2), backend, dtype)


def _bad_like(kind: str) -> Any:
    import torch

    return {
        "list": [1.0],
        "int": np.zeros(2, dtype=np.int64),
        "bool": torch.zeros(2, dtype=torch.bool),
        "complex": np.zeros(2, dtype=np.complex128),
        "meta": torch.zeros(2, device="meta"),
        "float16": np.zeros(2, dtype=np.float16),
    }[kind]


def _like_dtype(like: Any) -> tuple[str, str, str]:
    if like is None:
        return "numpy", "float64", "cpu"
    if isinstance(like, np.ndarray):
        return "numpy", str(like.dtype), "cpu"
    return "torch", str(like.dtype).removeprefix("torch."), str(like.device)


def _padding(p: dict[str, Any], d: int) -> tuple[Any, list[int], list[int]]:
    """The padding argument and the padding before and after that it means (``same`` resolved later)."""
    pad = p["pad"]
    kind = p["padding"]
    if kind == "same":
        return "same", [], []
    if kind == "valid":
        return "valid", [0] * d, [0] * d
    if kind == "zero":
        return 0, [0] * d, [0] * d
    if kind == "int":
        return pad[0], [pad[0]] * d, [pad[0]] * d
    if kind == "tuple":
        return tuple(pad[:d]), pad[:d], pad[:d]
    return [(pad[i], pad[d + i]) for i in range(d)], pad[:d], pad[d:]


def _dense_check(basis: Any, shape: tuple[int, ...], dense: np.ndarray | None, like: Any) -> str | None:
    if tuple(basis.shape) != shape:
        return f"basis has shape {tuple(basis.shape)}, expected {shape}"
    if dense is None or int(np.prod(shape)) > SMALL:
        return None
    backend, dtype, device = _like_dtype(like)
    return compare(basis.to_dense(), dense, np.abs(dense), dtype, backend, 1, device)


def trial(entry: str, p: dict[str, Any]) -> Trial:
    if entry == "shift_matrix":
        return _shift_trial(p)
    if entry == "apply_shifts":
        return _apply_trial(p)
    return _grid_trial(entry, p)


def _grid_trial(entry: str, p: dict[str, Any]) -> Trial:
    import structconv as sc

    d = len(p["grid"])
    grid, kernel, stride, dilation = p["grid"], p["kernel"], p["stride"], p["dilation"]
    pool = entry == "avg_pool_basis"
    if pool:
        dilation = [1] * d
        half = [min(v, k // 2) for v, k in zip(p["pad"][:d], kernel, strict=True)]
        if p["padding"] == "int":  # one value for every dimension: at most half the smallest kernel
            half[0] = min(half[0], min(kernel) // 2)
        p = {**p, "offsets": False, "pad": half + half}  # torch pads symmetrically
        if p["padding"] in ("same", "valid"):
            p["padding"] = "tuple"
    padding, before, after = _padding(p, d)
    taps = refs.window(kernel, dilation)
    offsets = None
    if p["offsets"]:
        rng = np.random.default_rng(p["seed"])
        taps = taps[rng.permutation(len(taps))[: max(1, len(taps) - 1)]] if len(taps) > 1 else taps
        offsets = taps - rng.integers(-2, 3, d)  # shifted: the builder places them in their bounding window
        taps = taps - taps.min(0)
    extent = taps.max(0) + 1
    if padding == "same":
        before, after = refs.same_padding(extent)
    kwargs: dict[str, Any] = {"stride": _spell(stride, p["spelling"]), "padding": padding, "boundary": p["boundary"]}
    if offsets is not None:
        kwargs["offsets"] = offsets.tolist()
    else:
        kwargs["kernel"] = _spell(kernel, p["spelling"])
        if not pool:
            kwargs["dilation"] = _spell(dilation, p["spelling"])
    if pool:
        kwargs.update(count_include_pad=p["count_include_pad"], ceil_mode=p["ceil_mode"])
        if p["stride_none"]:
            kwargs["stride"], stride = None, kernel
    like = _like(p["like"])
    kwargs["like"] = like
    e = Expectation()
    valid_geometry = all(g + b + a >= x for g, b, a, x in zip(grid, before, after, extent, strict=True))
    if pool and p["ceil_mode"]:  # torch's rule: a window may run past the end if it starts inside
        valid_geometry = all(
            _ceil_outputs(g, k, s, b, a) >= 1 for g, k, s, b, a in zip(grid, kernel, stride, before, after, strict=True)
        )
    # a bad value for a geometric argument may make a bad geometry good (a huge padding): either then
    touched = p["defect"] is not None or p["extra"] in ("too_big", "same_stride", "both")
    if padding == "same" and any(s != 1 for s in stride):
        e.add(EITHER if touched else ERROR, ("padding", "stride", "same"), "padding='same' with a stride")
    elif not valid_geometry:
        names = ("kernel", "dilation", "offsets", "padding", "grid", "stride")
        e.add(EITHER if touched else ERROR, names, "kernel larger than the grid")
    grid_arg: Any = _spell(grid, p["spelling"], repeat=False)
    defect, bad = p["defect"], _bad_value(p["bad"])
    if defect == "offsets" and not pool:
        kwargs.pop("kernel", None), kwargs.pop("dilation", None)
        malformed: list[Any] = [[], [[0.5] * d], [[0] * d, [0] * d], [[0] * (d + 1)], [[0] * d, [bad] * d]]
        kwargs["offsets"] = malformed[p["seed"] % len(malformed)]
        e.add(EITHER, ("offsets", "kernel"), f"offsets={kwargs['offsets']!r}")
    elif defect == "grid":
        grid_arg = bad
        e.add(EITHER, ("grid", "kernel", "stride", "padding", "dilation", "offsets"), f"grid={bad!r}")
    elif defect in ("kernel", "stride", "dilation", "padding") and not (pool and defect == "dilation"):
        key = defect if defect in kwargs else "kernel"
        kwargs[key] = bad
        e.add(EITHER, (key, "offsets") if key == "kernel" else (key,), f"{key}={bad!r}")
    extra = p["extra"]
    if extra == "boundary":
        kwargs["boundary"] = p["bad_boundary"]
        e.add(ERROR, ("boundary",), f"boundary={p['bad_boundary']!r}")
    elif extra == "like":
        kwargs["like"] = like = _bad_like(p["bad_like"])
        e.add(EITHER if p["bad_like"] in ("meta", "float16") else ERROR, ("like",), f"like {p['bad_like']}")
    elif extra == "both" and not pool:
        kwargs["kernel"] = _spell(kernel, p["spelling"])
        if offsets is not None or defect == "offsets":
            e.add(ERROR, ("offsets", "kernel"), "kernel and offsets both given")
    elif extra == "same_stride" and not pool:
        kwargs["padding"], kwargs["stride"] = "same", 2
        e.add(ERROR, ("padding", "stride", "same"), "padding='same' with stride 2")
    elif extra == "too_big":
        kwargs["padding"] = 0
        if "kernel" in kwargs:
            kwargs["kernel"] = [g + 1 for g in grid]
        else:
            kwargs["offsets"] = [[0] * d, list(grid)]
        kwargs.pop("dilation", None)
        too_big = EITHER if pool and p["ceil_mode"] else ERROR  # torch's ceil mode lets a window overhang
        e.add(too_big, ("kernel", "offsets", "padding", "grid"), "kernel larger than the grid")
    periodic = kwargs.get("boundary") == "periodic"
    if e.expect == VALID and periodic and pool and (any(before + after) or p["ceil_mode"]):
        e.add(EITHER, ("boundary", "padding", "ceil_mode"), "periodic pooling with padding or ceil_mode")
    expect, names, words = e.expect, tuple(e.names), e.described
    builder = sc.avg_pool_basis if pool else sc.grid_basis

    def call() -> Any:
        return builder(grid_arg, **kwargs)

    def check(basis: Any) -> str | None:
        if expect != VALID:
            return _lazy_check(basis)
        if pool:
            dense = _pool_dense(grid, kernel, stride, before, after, p["count_include_pad"], p["ceil_mode"])
        else:
            dense = refs.grid_dense(grid, taps, stride, before, after, periodic)
        shape = (1 if pool else len(taps), int(np.prod(grid)), int(dense.shape[-1]))
        return _dense_check(basis, shape, dense, like)

    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "like")
    describe = f"{entry}({grid_arg!r}, {shown}, like={p['bad_like'] if extra == 'like' else p['like']}); {words}"
    return Trial(describe, call, expect, names, check)


def _ceil_outputs(size: int, kernel: int, stride: int, before: int, after: int) -> int:
    n = -(-(size + before + after - kernel) // stride) + 1
    return n - 1 if (n - 1) * stride >= size + before else n


def _lazy_check(basis: Any) -> str | None:
    """An accepted unusual input must still give a basis of consistent, positive sizes."""
    shape = tuple(int(s) for s in basis.shape)
    if len(shape) != 3 or min(shape) <= 0:
        return f"accepted, but the basis has shape {shape}"
    return None


def _pool_dense(
    grid: list[int],
    kernel: list[int],
    stride: list[int],
    before: list[int],
    after: list[int],
    count_include_pad: bool,
    ceil_mode: bool,
) -> np.ndarray:
    """torch's ``avg_pool{d}d`` of each unit input: row ``m`` of the dense basis (symmetric padding only)."""
    import torch
    from torch.nn import functional as F  # noqa: N812

    d = len(grid)
    if before != after:
        # torch pads symmetrically: asymmetric padding is read as explicit zero padding first
        unit = torch.eye(int(np.prod(grid)), dtype=torch.float64).reshape(1, -1, *grid)
        pads = [v for i in reversed(range(d)) for v in (before[i], after[i])]
        if not count_include_pad:
            return _pool_uncounted(grid, kernel, stride, before, after, ceil_mode)
        unit = F.pad(unit, pads)
        pool = getattr(F, f"avg_pool{d}d")
        out = pool(unit, kernel, stride, 0, ceil_mode, True)
        return out.reshape(out.shape[1], -1).numpy()[None]
    if d == 3 and any(g < k for g, k in zip(grid, kernel, strict=True)):
        # torch's avg_pool3d alone refuses an input smaller than the kernel, padding or not
        return _pool_separable(grid, kernel, stride, before, count_include_pad, ceil_mode)
    unit = torch.eye(int(np.prod(grid)), dtype=torch.float64).reshape(1, -1, *grid)
    pool = getattr(F, f"avg_pool{d}d")
    out = pool(unit, kernel, stride, before, ceil_mode, count_include_pad)
    return out.reshape(out.shape[1], -1).numpy()[None]


def _pool_separable(
    grid: list[int], kernel: list[int], stride: list[int], pad: list[int], count_include_pad: bool, ceil_mode: bool
) -> np.ndarray:
    """torch's box pooling one dimension at a time (its window and divisor are products over dimensions)."""
    import torch
    from torch.nn import functional as F  # noqa: N812

    M = int(np.prod(grid))
    t = torch.eye(M, dtype=torch.float64).reshape(M, *grid)
    for i in range(len(grid)):
        t = t.movedim(1 + i, -1)
        rows = t.shape[:-1]
        out = F.avg_pool2d(
            t.reshape(-1, 1, 1, t.shape[-1]), (1, kernel[i]), (1, stride[i]), (0, pad[i]), ceil_mode, count_include_pad
        )
        t = out.reshape(*rows, out.shape[-1]).movedim(-1, 1 + i)
    return t.reshape(M, -1).numpy()[None]


def _pool_uncounted(
    grid: list[int], kernel: list[int], stride: list[int], before: list[int], after: list[int], ceil_mode: bool
) -> np.ndarray:
    """Average over the in-grid entries of each window, from the definition (asymmetric padding)."""
    taps = refs.window(kernel, [1] * len(grid))
    A = refs.grid_dense(grid, taps, stride, before, after).sum(0)
    counts = A.sum(0)
    return (A / np.where(counts > 0, counts, 1.0))[None]


def _shift_trial(p: dict[str, Any]) -> Trial:
    import structconv as sc

    grid, shift, boundary = p["grid"], p["d"], p["boundary"]
    grid_arg: Any = tuple(grid)
    d_arg: Any = tuple(shift) if len(shift) > 1 else shift[0]
    like = _like(p["like"])
    expect, names, words = VALID, (), "valid"
    bad = _bad_value(p["bad"])
    if p["defect"] == "d":
        d_arg, expect, names, words = bad, EITHER, ("d",), f"d={bad!r}"
    elif p["defect"] == "grid":
        grid_arg, expect, names, words = bad, EITHER, ("grid", "d"), f"grid={bad!r}"
    elif p["defect"] == "boundary":
        boundary, expect, names, words = "reflect", ERROR, ("boundary",), "boundary='reflect'"

    def call() -> Any:
        return sc.shift_matrix(grid_arg, d_arg, boundary=boundary, like=like)

    def check(basis: Any) -> str | None:
        if expect != VALID:
            return _lazy_check(basis)
        size = int(np.prod(grid))
        return _dense_check(basis, (1, size, size), refs.shift_dense(grid, shift, boundary == "periodic"), like)

    return Trial(f"shift_matrix({grid_arg!r}, {d_arg!r}, boundary={boundary!r}); {words}", call, expect, names, check)


def _apply_trial(p: dict[str, Any]) -> Trial:
    import structconv as sc

    d = len(p["grid"])
    grid, kernel = p["grid"], [min(k, g) for k, g in zip(p["kernel"], p["grid"], strict=True)]
    like = _like(p["like"])
    backend, dtype, _ = _like_dtype(like)
    M = int(np.prod(grid))
    rng = np.random.default_rng(p["seed"])
    values = rng.uniform(-1, 1, (2, M, p["channels"]))
    kind, method = p["x"], p["method"]
    expect, names, words = VALID, (), "valid"
    x_backend, x_dtype, x_device = backend, dtype, "cpu"
    if kind == "M":
        values, expect, names, words = values[:, : M - 1] if M > 1 else values[:, :0], ERROR, ("x",), "x of M-1 entries"
    elif kind == "rank":
        values, expect, names, words = values[0], ERROR, ("x",), "x of rank 2"
    elif kind == "int":
        x_dtype, expect, names, words = "int64", ERROR, ("x",), "x of integers"
    elif kind == "backend":
        x_backend = "numpy" if backend == "torch" else "torch"
        x_dtype = "float32" if dtype == "bfloat16" else dtype
        expect, names, words = EITHER, ("x", "like"), f"x on {x_backend}, the basis built like {backend}"
    elif kind == "dtype":
        x_dtype = "float32" if dtype != "float32" else "float64"
        expect, names, words = EITHER, ("x", "like"), f"x in {x_dtype}, the basis built like {dtype}"
    elif kind == "meta":
        x_backend, x_device, expect, names, words = "torch", "meta", EITHER, ("x", "device", "like"), "x on meta"
    if method not in ("auto", "shift", "native"):
        expect, names, words = ERROR, ("order",), f"order={method!r}"
    elif method == "native":
        names = (*names, "order")
        expect = EITHER if backend != "torch" or x_backend != "torch" else expect
    x = make(values, x_backend, x_dtype, "contiguous", x_device) if kind != "list" else values.tolist()
    # with a bad order too, a refusal may name either defect
    bad_order = ("order",) if method not in ("auto", "shift", "native") else ()
    also = f"{words}; " if bad_order else ""
    if kind == "list":
        expect, names, words = ERROR, ("x", *bad_order), f"{also}x as a list"
    basis_arg: Any = None
    if kind == "basis":
        expect, names, words = ERROR, ("basis", *bad_order), f"{also}basis a dense array, not a GridBasis"
        basis_arg = make(np.ones((1, M, M)), backend, dtype)

    def call() -> Any:
        basis = basis_arg if basis_arg is not None else sc.grid_basis(tuple(grid), tuple(kernel), like=like)
        return sc.apply_shifts(basis, x, order=method)

    def check(y: Any) -> str | None:
        taps = refs.window(kernel, [1] * d)
        A = refs.grid_dense(grid, taps, [1] * d, [0] * d, [0] * d)
        xv = values if x_device == "meta" else read(x)
        ref = np.einsum("kmn,bmc->bknc", A, xv)
        return compare(y, ref, np.abs(ref), x_dtype, x_backend, int(A.shape[1]), x_device)

    describe = (
        f"apply_shifts(grid_basis({tuple(grid)}, {tuple(kernel)}, like={p['like']}), x, order={method!r}); {words}"
    )
    return Trial(describe, call, expect, names, check)
