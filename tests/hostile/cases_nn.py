"""The torch layers of ``structconv.nn``: constructor arguments and ``forward`` inputs.

A case draws a valid layer (channels, kernel, stride, padding, groups, padding mode; a graph;
heads) in one of four dtypes, and either a bad constructor argument or a bad input: wrong
channels, rank or dtype, integers, complex numbers, a meta tensor beside CPU parameters, NaN,
an empty batch, a nested list; or a valid unusual one: non-contiguous or channels-last memory,
``requires_grad`` (then the gradient is compared too), everything on ``meta``.  The reference
is the peer loaded with the same parameters (``torch.nn.Conv{1,2,3}d``, ``AvgPool{1,2,3}d``,
``MultiheadAttention``), or the dense einsum over the reference graph basis (GCN, SGC, TAG,
Chebyshev); for GAT, R-GCN and positional attention the shape and dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from . import refs
from .arrays import conv_reference, read
from .classify import compare
from .spec import EITHER, ERROR, VALID, Expectation, Trial

GRID = ("GridConv1d", "GridConv2d", "GridConv3d")
POOL = ("AvgPool1d", "AvgPool2d", "AvgPool3d")
GRAPH = ("GCNConv", "SGConv", "TAGConv", "ChebConv", "GATConv", "RGCNConv")
LAYERS = (*GRID, *POOL, "StructConv", *GRAPH, "MultiHeadSelfAttention", "PositionalAttention")
INPUT_DEFECTS = (None, None, None, "channels", "rank_low", "rank_high", "int", "dtype_mismatch", "complex")
INPUT_DEFECTS += ("meta_input", "meta_all", "noncontig", "empty_batch", "nan", "grad", "grad", "list", "zero_size")
INPUT_NAMES = ("x", "input", "query", "channels", "in_channels", "embed_dim", "dtype", "device")
CTOR_ARGS = {
    "grid": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode"),
    "pool": ("kernel_size", "stride", "padding", "divisor_override"),
    "struct": ("basis", "in_channels", "out_channels", "order"),
    "graph": ("in_channels", "out_channels", "K", "heads", "num_relations"),
    "mha": ("embed_dim", "num_heads", "dropout", "kdim"),
    "positional": ("grid", "embed_dim", "num_heads", "encoding"),
}
BAD = [0, -1, 2.5, "3", None, True, 10**10, "bogus", (2, 2, 2, 2)]


def _kind(name: str) -> str:
    if name in GRID:
        return "grid"
    if name in POOL:
        return "pool"
    if name in GRAPH:
        return "graph"
    return {"StructConv": "struct", "MultiHeadSelfAttention": "mha", "PositionalAttention": "positional"}[name]


@st.composite
def layer_params(draw: Any, name: str) -> dict[str, Any]:
    kind = _kind(name)
    return {
        "layer": name,
        "seed": draw(st.integers(0, 2**31)),
        "B": draw(st.integers(1, 2)),
        "cin": draw(st.integers(1, 4)),
        "cout": draw(st.integers(1, 4)),
        "sizes": [draw(st.integers(2, 6)) for _ in range(3)],
        "kernel": draw(st.integers(1, 3)),
        "stride": draw(st.integers(1, 2)),
        "padding": draw(st.sampled_from((0, 1, "same"))),
        "dilation": draw(st.integers(1, 2)),
        "groups": draw(st.sampled_from((1, 1, 2))),
        "bias": draw(st.booleans()),
        "mode": draw(st.sampled_from(("zeros", "zeros", "circular", "reflect", "replicate"))),
        "flag": draw(st.booleans()),
        "flag2": draw(st.booleans()),
        "K": draw(st.integers(1, 3)),
        "E": draw(st.integers(0, 10)),
        "dtype": draw(st.sampled_from(("float32", "float32", "float64", "float16", "bfloat16"))),
        "input": draw(st.sampled_from(INPUT_DEFECTS)),
        "ctor": draw(st.sampled_from((None, None, None, *CTOR_ARGS[kind]))),
        "bad": draw(st.sampled_from(BAD)),
        "mask": draw(st.sampled_from(("none", "none", "bool", "float", "padding", "both", "bad_shape", "int"))),
    }


ENTRIES = {
    f"nn.{name}": (layer_params(name), {"grid": 80, "pool": 50, "graph": 60, "mha": 100}.get(_kind(name), 60))
    for name in LAYERS
}


class _Case:
    """A layer, its peer (or reference), and the input, as drawn."""

    def __init__(self, p: dict[str, Any]) -> None:
        import torch

        self.p, self.name, self.kind = p, p["layer"], _kind(p["layer"])
        self.dtype = getattr(torch, p["dtype"])
        self.rng = np.random.default_rng(p["seed"])
        torch.manual_seed(p["seed"] % 2**31)
        self.kwargs: dict[str, Any] = {}
        self.args: list[Any] = []
        self.extra: dict[str, Any] = {}  # forward's other arguments
        self.e = Expectation()


def _grid_layer(c: _Case) -> None:
    p, d = c.p, int(c.name[-2])
    g = p["groups"] if p["cin"] % p["groups"] == 0 and p["cout"] % p["groups"] == 0 else 1
    padding = p["padding"] if not (p["padding"] == "same" and p["stride"] != 1) else 1
    c.args = [p["cin"], p["cout"], p["kernel"]]
    c.kwargs = dict(stride=p["stride"], padding=padding, dilation=p["dilation"], groups=g, bias=p["bias"])
    c.kwargs["padding_mode"] = p["mode"]
    c.sizes = [max(s, p["kernel"] * p["dilation"] + 1) for s in p["sizes"][:d]]
    c.shape = (p["B"], p["cin"], *c.sizes)


def _pool_layer(c: _Case) -> None:
    p, d = c.p, int(c.name[-2])
    k = max(p["kernel"], 1)
    c.args = [k]
    c.kwargs = dict(stride=p["stride"], padding=min(int(p["padding"] == 1), k // 2), ceil_mode=p["flag"])
    c.kwargs["count_include_pad"] = p["flag2"]
    c.sizes = [max(s, k) for s in p["sizes"][:d]]
    c.shape = (p["B"], p["cin"], *c.sizes)


def _graph(c: _Case) -> tuple[np.ndarray, np.ndarray, int]:
    N = c.p["sizes"][0]
    src, dst = c.rng.integers(0, N, c.p["E"]), c.rng.integers(0, N, c.p["E"])
    keep = src != dst  # repeated self-loops keep one weight: which one is unspecified
    return src[keep], dst[keep], N


def build(c: _Case) -> None:
    """Fill in the constructor arguments, the input shape and forward's other arguments."""
    import torch

    p = c.p
    if c.kind == "grid":
        _grid_layer(c)
    elif c.kind == "pool":
        _pool_layer(c)
    elif c.kind == "struct":
        M, N, K = p["sizes"][0], p["sizes"][1], p["K"]
        c.basis = torch.from_numpy(c.rng.normal(size=(K, M, N)) * (c.rng.random((K, M, N)) < 0.6))
        c.args, c.kwargs = [c.basis, p["cin"], p["cout"]], {"bias": p["bias"]}
        c.shape = (p["B"], M, p["cin"])
    elif c.kind == "graph":
        src, dst, N = _graph(c)
        c.src, c.dst, c.N = src, dst, N
        c.extra["edge_index"] = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
        c.args = [p["cin"], p["cout"]]
        if c.name in ("SGConv", "TAGConv"):
            c.kwargs["K"] = p["K"]
        if c.name == "ChebConv":
            c.args.append(p["K"])
            c.kwargs["normalization"] = "sym" if p["flag"] else "rw"
        if c.name == "GCNConv":
            c.kwargs.update(improved=p["flag"], normalize=p["flag2"])
        if c.name == "GATConv":
            c.kwargs["heads"] = p["K"]
        if c.name == "RGCNConv":
            c.args.append(p["K"])
            c.extra["edge_type"] = torch.from_numpy(c.rng.integers(0, p["K"], src.size))
        c.weighted = c.name in ("GCNConv", "SGConv", "TAGConv", "ChebConv") and p["flag2"] and src.size > 0
        if c.weighted:
            c.extra["edge_weight"] = torch.from_numpy(c.rng.uniform(0.5, 2.0, src.size))
        c.shape = (N, p["cin"])
    elif c.kind == "mha":
        heads = p["K"]
        E = heads * p["cin"]
        c.args, c.kwargs = [E, heads], {"bias": p["bias"], "batch_first": p["flag"]}
        L = p["sizes"][0]
        c.shape = (p["B"], L, E) if p["flag"] else (L, p["B"], E)
        c.L = L
    else:
        grid = (p["sizes"][0] % 3 + 2, p["sizes"][1] % 3 + 2)
        heads = p["K"]
        enc = ("quadratic", "gaussian", "learned")[p["seed"] % 3]
        c.args, c.kwargs = [grid, heads * 2, heads], {"encoding": enc}
        c.shape = (p["B"], grid[0] * grid[1], heads * 2)


def _ctor_defect(c: _Case) -> None:
    arg, bad = c.p["ctor"], c.p["bad"]
    if arg is None:
        return
    positional = {
        "grid": CTOR_ARGS["grid"][:3],
        "pool": ("kernel_size",),
        "struct": ("basis", "in_channels", "out_channels"),
    }
    positional.update(
        graph=("in_channels", "out_channels"),
        mha=("embed_dim", "num_heads"),
        positional=("grid", "embed_dim", "num_heads"),
    )
    names = positional[c.kind]
    given = bad
    if arg == "basis":
        bad = c.basis.numpy() if bad in (0, None) else (c.basis[0] if bad == -1 else bad)
    if arg in names and names.index(arg) < len(c.args):
        c.args[names.index(arg)] = bad
    elif (arg, c.name) in (("K", "ChebConv"), ("num_relations", "RGCNConv")):
        c.args[2] = bad
    elif (
        (arg == "K" and c.name not in ("SGConv", "TAGConv"))
        or (arg == "heads" and c.name != "GATConv")
        or (arg == "encoding" and c.name != "PositionalAttention")
        or (arg == "num_relations" and c.name != "RGCNConv")
    ):
        return  # the drawn argument is not this layer's
    else:
        c.kwargs[arg] = bad
    # a huge size is refused or runs out of memory; a zero padding and a 4-D grid are legal, and so are
    # torch's defaults kdim=None and dropout=0
    bad = given
    huge = bad == 10**10 and arg in ("in_channels", "out_channels", "embed_dim", "kdim", "num_heads", "stride")
    expect = EITHER if huge else ERROR
    if (arg == "padding" and bad == 0) or (arg == "grid" and isinstance(bad, tuple)):
        expect = VALID if arg == "padding" else EITHER
    if (arg == "kdim" and bad is None) or (arg == "dropout" and bad == 0 and not isinstance(bad, bool)):
        expect = VALID
    if arg == "divisor_override" and bad in (None, 10**10, -1) and not isinstance(bad, bool):
        expect = VALID  # torch's default, and divisors it takes (any integer but 0; 10**10: tiny averages)
    names = (arg, "kernel", "grid") if arg in ("padding", "dilation", "kernel_size") else (arg,)
    if c.name == "RGCNConv" and arg == "num_relations":
        names = ("num_relations",)
    c.e.add(expect, names, f"{arg}={bad!r}")


def _input(c: _Case) -> Any:
    """The input tensor, after the drawn input defect."""
    import torch

    p, d = c.p, c.p["input"]
    values = c.rng.uniform(-1, 1, c.shape)
    dtype = c.dtype
    if d == "nan":
        values.flat[0] = np.nan
        c.e.add(VALID, (), "NaN in the input")
    if d == "empty_batch":
        values = values[:0] if c.kind != "mha" else values[:, :0] if not p["flag"] else values[:0]
        c.e.add(EITHER, INPUT_NAMES, "an empty batch")
    elif d == "zero_size":
        values = values[..., :0, :] if c.kind in ("struct", "graph", "positional") else values[..., :0]
        c.e.add(EITHER, INPUT_NAMES + ("edge_index",), "a zero-size axis")
    elif d == "channels":
        axis = 1 if c.kind in ("grid", "pool") else -1
        if c.kind == "pool":
            return _input_tensor(values, dtype)  # pooling takes any number of channels
        shape = list(values.shape)
        shape[axis] += 1
        values = c.rng.uniform(-1, 1, shape)
        c.e.add(ERROR, INPUT_NAMES, "one channel too many")
    elif d == "rank_low":
        values = values[0]
        # torch's unbatched forms: its Conv, AvgPool and MultiheadAttention take them, compared with the peer's answer
        expect = VALID if c.kind in ("grid", "pool") else EITHER if c.kind == "mha" else ERROR
        if c.kind == "mha" and (p["mask"] == "none" or (p["mask"] in ("bool", "float") and values.shape[0] == c.L)):
            expect = VALID  # (L, E), with an attn_mask (L, L) if any
        c.e.add(expect, INPUT_NAMES, "the batch axis dropped")
    elif d == "rank_high":
        values = values[None]
        # a graph layer takes a static batch (B, N, P)
        expect = {"graph": VALID if c.name not in ("GATConv", "RGCNConv") else EITHER, "positional": EITHER}
        c.e.add(expect.get(c.kind, ERROR), INPUT_NAMES, "an extra leading axis")
    elif d == "list":
        c.e.add(ERROR, INPUT_NAMES, "a nested list")
        return values.tolist()
    x = _input_tensor(values, dtype)
    if d == "int":
        x = torch.from_numpy(np.round(values * 3).astype(np.int64))
        c.e.add(ERROR, INPUT_NAMES, "an integer input")
    elif d == "complex":
        x = torch.from_numpy(values + 0.5j * values)
        c.e.add(ERROR, INPUT_NAMES, "a complex input")
    elif d == "dtype_mismatch":
        x = x.to(torch.float64 if dtype != torch.float64 else torch.float32)
        # pooling has no parameters: it runs in the input's dtype
        c.e.add(VALID if c.kind == "pool" else ERROR, INPUT_NAMES, f"input in {x.dtype}, layer in {dtype}")
    elif d == "meta_input":
        x = x.to("meta")
        # torch's own Conv and AvgPool accept a meta input beside CPU weights (the output is meta)
        c.e.add(EITHER if c.kind in ("grid", "pool") else ERROR, INPUT_NAMES, "input on meta, layer on cpu")
    elif d == "noncontig" and x.ndim >= 2:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        if c.kind in ("grid", "pool") and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        c.e.add(VALID, (), "non-contiguous input")
    elif d == "grad" and x.is_floating_point():
        x = x.detach().requires_grad_(True)
        c.e.add(VALID, (), "input requires grad")
    return x


def _input_tensor(values: np.ndarray, dtype: Any) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(values)).to(dtype)


def trial(entry: str, p: dict[str, Any]) -> Trial:
    import structconv.nn as snn

    c = _Case(p)
    build(c)
    _ctor_defect(c)
    x = _input(c)
    meta_all = p["input"] == "meta_all"
    if meta_all:
        c.e.add(VALID, (), "layer and input on meta")
    if c.name == "AvgPool3d" and p["dtype"] == "float16":
        c.e.add(EITHER, INPUT_NAMES, "float16 (torch's CPU avg_pool3d has no float16 kernel)")
    cls = getattr(snn, c.name)
    mask_kwargs = _mha_masks(c) if c.kind == "mha" else {}
    dtype = c.dtype

    def call() -> Any:
        layer = cls(*c.args, **c.kwargs)
        if c.kind != "pool":
            layer = layer.to(dtype)
        inp = x
        if meta_all:
            layer, inp = layer.to("meta"), x.to("meta")
        layer.eval()
        if c.kind == "mha":
            return layer, layer(inp, inp, inp, **mask_kwargs)
        if c.kind == "graph":
            extra = dict(c.extra)
            if meta_all:
                # The graph's structure (edge_index, and RGCN's edge_type, whose range is checked) stays
                # on the host, as it would in a shape-only run; features go to meta.
                extra = {k: v if k in ("edge_index", "edge_type") else v.to("meta") for k, v in extra.items()}
            return layer, layer(inp, extra.pop("edge_index"), *extra.values())
        return layer, layer(inp)

    def check(answer: tuple[Any, Any]) -> str | None:
        layer, y = answer
        return _check(c, layer, x, y, meta_all, mask_kwargs)

    args = ", ".join([*(_short(a) for a in c.args), *(f"{k}={_short(v)}" for k, v in c.kwargs.items())])
    describe = f"{c.name}({args}).to({p['dtype']})(input {_short(x)}{_extra_desc(c, mask_kwargs)}); {c.e.described}"
    return Trial(describe, call, c.e.expect, tuple(c.e.names), check)


def _short(v: Any) -> str:
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"tensor{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" + (
            " meta" if str(getattr(v, "device", "cpu")) == "meta" else ""
        )
    if isinstance(v, list):
        return f"list(len {len(v)})"
    return repr(v)


def _extra_desc(c: _Case, masks: dict[str, Any]) -> str:
    parts = [f"{k}={_short(v)}" for k, v in {**c.extra, **masks}.items()]
    return (", " + ", ".join(parts)) if parts else ""


def _mha_masks(c: _Case) -> dict[str, Any]:
    import torch

    kind = c.p["mask"]
    L, B = c.L, c.p["B"]
    allowed = torch.from_numpy(c.rng.random((L, L)) < 0.2)  # True = may NOT attend, torch's convention
    out: dict[str, Any] = {}
    if kind in ("bool", "both"):
        out["attn_mask"] = allowed
    if kind == "float":
        out["attn_mask"] = torch.zeros(L, L, dtype=c.dtype).masked_fill(allowed, float("-inf"))
    if kind in ("padding", "both"):
        out["key_padding_mask"] = torch.from_numpy(c.rng.random((B, L)) < 0.2)
    if kind == "bad_shape":
        out["attn_mask"] = torch.zeros(L + 1, L, dtype=torch.bool)
        c.e.add(ERROR, ("attn_mask",), "attn_mask of shape (L + 1, L)")
    if kind == "int":
        out["attn_mask"] = allowed.long()
        c.e.add(EITHER, ("attn_mask",), "an integer attn_mask")
    return out


def _check(c: _Case, layer: Any, x: Any, y: Any, meta_all: bool, masks: dict[str, Any]) -> str | None:
    import torch

    dtype = str(x.dtype if c.kind == "pool" else c.dtype).removeprefix("torch.")
    if c.kind == "mha":
        y = y[0]  # the output; the averaged weights are torch's, compared through the output
    if meta_all:
        return None if str(y.device) == "meta" else f"output on {y.device}, expected meta"
    if c.e.expect != VALID:
        return None if isinstance(y, torch.Tensor) else f"output is a {type(y).__name__}"
    if c.kind in ("graph", "positional") and c.name in ("GATConv", "RGCNConv", "PositionalAttention"):
        want = tuple(x.shape[:-1]) + (c.p["cout"] * (c.p["K"] if c.name == "GATConv" else 1),)
        if c.name == "PositionalAttention":
            want = tuple(x.shape)
        if tuple(y.shape) != want:
            return f"output has shape {tuple(y.shape)}, expected {want}"
        if str(y.dtype).removeprefix("torch.") != dtype:
            return f"output has dtype {y.dtype}, expected {dtype}"
        return None if torch.isfinite(y.detach().float()).all() or c.p["input"] == "nan" else "non-finite output"
    ref, bound, terms = _reference(c, layer, x, masks)
    nan = c.p["input"] == "nan" or c.kind == "mha"
    problem = compare(y, ref, bound, dtype, "torch", terms, nan_input=nan)
    if problem is None and x.requires_grad and dtype == "float64":
        problem = _check_grad(c, layer, x, y, masks)
    return problem


def _reference(c: _Case, layer: Any, x: Any, masks: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """The peer's answer in float64 on the layer's (rounded) parameters, its absolute bound, and the sum length."""
    import torch

    xd = x.detach().double()
    if c.kind in ("grid", "pool", "mha"):
        peer = _peer(c, layer)
        with torch.no_grad():
            if c.kind == "mha":
                out = peer(xd, xd, xd, **{k: (v.double() if v.is_floating_point() else v) for k, v in masks.items()})[0]
                absolute = out.abs() + 1
                terms = 4 * c.shape[-1] * c.L
            else:
                out = peer(xd)
                absolute = _abs_peer(c, peer, xd) if c.kind == "grid" else out.abs()
                terms = c.p["cin"] * c.p["kernel"] ** (int(c.name[-2]) + 1) + 4
        return out.numpy(), absolute.numpy(), terms
    theta = read(layer.weight)
    bias = read(layer.bias) if getattr(layer, "bias", None) is not None else 0.0
    dense = _graph_dense(c) if c.kind == "graph" else read(c.basis)
    ref, bound, terms = conv_reference(dense, read(x), theta)
    return ref + bias, bound + np.abs(bias), terms * (c.p["K"] + 1) * max(c.N if c.kind == "graph" else 1, 1)


def _peer(c: _Case, layer: Any) -> Any:
    import torch

    d = int(c.name[-2]) if c.kind in ("grid", "pool") else 0
    if c.kind == "grid":
        peer = getattr(torch.nn, f"Conv{d}d")(*c.args, **c.kwargs).double()
    elif c.kind == "pool" and d == 1 and c.kwargs.get("divisor_override") is not None:
        peer = _avg_pool1d_divisor(*c.args, **c.kwargs)  # torch's AvgPool1d has no divisor_override
    elif c.kind == "pool":
        kwargs = {k: v for k, v in c.kwargs.items() if d != 1 or k != "divisor_override"}  # None here
        peer = getattr(torch.nn, f"AvgPool{d}d")(*c.args, **kwargs)
    else:
        peer = torch.nn.MultiheadAttention(*c.args, **c.kwargs).double()
    if c.kind != "pool":
        peer.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    return peer.eval()


def _avg_pool1d_divisor(
    kernel_size: int, stride: int, padding: int, ceil_mode: bool, count_include_pad: bool, divisor_override: int
) -> Any:
    """torch's ``AvgPool2d`` over a ``(1, L)`` grid: ``AvgPool1d`` with a ``divisor_override``."""
    import torch

    pool = torch.nn.AvgPool2d(
        (1, kernel_size), (1, stride), (0, padding), ceil_mode, count_include_pad, divisor_override
    )
    return torch.nn.Sequential(torch.nn.Unflatten(-1, (1, -1)), pool, torch.nn.Flatten(-2))


def _abs_peer(c: _Case, peer: Any, x: Any) -> Any:
    """The convolution of ``|x|`` with ``|weight|`` (no bias): the rounding bound's scale."""
    import torch

    with torch.no_grad():
        absolute = type(peer)(*c.args, **{**c.kwargs, "bias": False}).double()
        absolute.weight.copy_(peer.weight.abs())
        out = absolute(x.abs())
        return out + (peer.bias.abs().reshape(-1, *[1] * (out.ndim - 2)) if peer.bias is not None else 0)


def _graph_dense(c: _Case) -> np.ndarray:
    """The layer's graph basis from :mod:`.refs` (PyG's conventions, as the layers document)."""
    p, src, dst, N = c.p, c.src, c.dst, c.N
    weighted = "edge_weight" in c.extra
    w = read(c.extra["edge_weight"]) if weighted else np.ones(src.size)
    if c.name == "GCNConv":
        if not p["flag2"]:
            return refs.adjacency(src, dst, w, N)[None]
        # PyG fills the added loops with 2 under improved only when the graph has weights
        return refs.gcn_dense(src, dst, w, N, improved=p["flag"] and weighted)
    if c.name == "SGConv":
        S = refs.gcn_dense(src, dst, w, N)[0]
        return np.linalg.matrix_power(S, p["K"])[None]
    A = refs.adjacency(src, dst, w, N)
    if c.name == "TAGConv":
        return refs.powers_dense(A, p["K"], True)
    return refs.chebyshev_dense(A, p["K"], c.kwargs["normalization"], 2.0)


def _check_grad(c: _Case, layer: Any, x: Any, y: Any, masks: dict[str, Any]) -> str | None:
    import torch

    g = torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, tuple(y.shape)))
    (y * g).sum().backward()
    got = x.grad
    if c.kind in ("grid", "pool", "mha"):
        xd = x.detach().double().requires_grad_(True)
        peer = _peer(c, layer)
        out = peer(xd, xd, xd, **masks)[0] if c.kind == "mha" else peer(xd)
        (out * g).sum().backward()
        want = xd.grad.numpy()
    else:
        dense = _graph_dense(c) if c.kind == "graph" else read(c.basis)
        gn = g.numpy()
        want = np.einsum("kmn,bnq,kpq->bmp" if x.ndim == 3 else "kmn,nq,kpq->mp", dense, gn, read(layer.weight))
    if got is None:
        return "input requires grad but got no gradient"
    err = float(np.max(np.abs(got.numpy() - want), initial=0.0))
    scale = float(np.max(np.abs(want), initial=0.0)) + 1
    return None if err <= 1e-9 * scale else f"input gradient off by {err:.3g}"
