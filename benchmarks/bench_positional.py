r"""Position-only attention through structconv against every peer that computes the same function.

The layer is ``structconv.nn.PositionalAttention((s, s), 400, 9, encoding=..., head_dim=...)``
(float32, CPU, the layer's default ``threshold``) on grids of 16x16, 32x32 and 64x64 tokens
(batch 4, 2 and 1), for the paper's head width D_h = D_out (``head_dim=None``: Theta is
(H, E, E), each head averages the raw input, then one linear map) and D_h = 44 (``head_dim=44``:
Theta_h = V_h O_h^T), in two passes: forward + backward (loss = sum of the output, gradients to
x and every parameter) and inference (forward under ``torch.no_grad()``).  Encodings: quadratic,
gaussian and learned, all position-only; plus training rows with the paper's attention dropout
(p = 0.1, one mask per step shared by the batch, the layer's ``dropout_shared=None``).

The peers are written here from the layer's parameters alone (none goes through structconv's
engine); each one's output is checked against the layer's before it is timed:

``paper dense``
    The paper's computation: the relative encoding of every (query, key) pair, ONE (H, N, M)
    softmax per layer with no batch axis, the value einsum per image and the output map (for
    the dropout rows, one mask per step on the (H, N, M) probabilities, shared by the batch).
``sdpa``
    ``F.scaled_dot_product_attention`` with the (H, N, M) scores as a float ``attn_mask`` and
    queries and keys of zeros, values x (D_out) or x V_h (44), then the output map.
``sdpa qk``
    The same without a mask: a position-only score is, up to a term of the query alone (which
    the softmax over keys ignores), a dot product of positional queries and keys (Lemma 2 of
    Cordonnier et al.): 3 wide for the Gaussians, 2s wide (a row of each axis' score table
    against a one-hot key) for the learned encoding.  Absolute positions enter the dot product,
    so float32 rounding grows with the grid (see the tolerance notes of the table).
``flex``
    ``flex_attention`` compiled by ``torch.compile`` (inductor's C++ kernel on the CPU) with a
    ``score_mod`` that computes the score from (h, q_idx, kv_idx) in the kernel.  Forward only:
    torch 2.13 refuses its backward on the CPU (the message is recorded in every fwd+bwd row).
``natten``
    NATTEN's 2-D neighbourhood attention with the kernel covering the whole grid (which is full
    attention: NATTEN then runs its own attention path, Flex underneath) on the positional
    queries and keys of ``sdpa qk``.  NATTEN >= 0.20 has no relative positional bias, so this is
    the only way it computes the function.  On the CPU it runs Flex uncompiled (it compiles Flex
    only for a CUDA device of compute capability >= 7.0), which materialises the scores; it takes
    widths that are powers of two from 8 to 512 and equal for queries, keys and values, so all
    three are zero-padded (44 -> 64, 400 -> 512); it refuses float64.  Forward only, as Flex.
    NATTEN is not a dependency: it is imported from the environment or from ``--natten-site`` (by
    default the scratch venv ``/tmp/natten_venv``, made by
    ``python -m venv /tmp/natten_venv && /tmp/natten_venv/bin/pip install torch==2.13.0 natten``;
    its pure-Python wheel then runs on this environment's torch).

Yardsticks (not the same function): ``conv 3x3`` (``F.conv2d`` E -> E, padding 1, same grid and
batch: the layer the attention is meant to replace) and ``gemm`` (``torch.mm`` of (B M, H E) x
(H E, E), the machine's GEMM rate at that row's size, forward).

Every row reports the median time of each variant over ``--repeats`` interleaved runs, the ratio
of structconv to the fastest peer, to the 3x3 conv, of inference to forward + backward, the
layer's FLOPs (dense-equivalent, see :func:`layer_flops`) and the achieved rate, each peer's
relative error, the basis structconv used and the order ``structconv.explain`` picks, and the
peak memory of one call of each variant (growth of the process' peak RSS, approximate).
Targets: structconv <= 0.8x the fastest peer; <= 1.6x the 3x3 conv with D_h = D_out and <= 0.8x
with D_h = 44; inference <= 0.5x forward + backward.

Every variant runs with subnormal numbers flushed to zero on every thread
(:func:`benchmarks.harness.fp_environment`), as an expert user of the peers sets a CPU up: the
dense peers' softmax tails would otherwise slow their products about tenfold.  ``--no-flush``
keeps them, for the figures without it (the record's name then ends in ``_unflushed``).

    python -m benchmarks.bench_positional                        # the full table: about 40 min on 2 quiet cores
    python -m benchmarks.bench_positional --other-sides 16 32 64  # gaussian and learned at 64x64 too: about 40 min more
    python -m benchmarks.bench_positional --quick                # 16x16, batch 1, 1 repeat: a smoke run (~2 min)
    python -m benchmarks.bench_positional --sides 32 --batch 1 --encodings quadratic --skip natten

Most of the time goes to the dense peers at 64x64 (10 to 25 s per forward + backward there),
and to compiling Flex (10 to 30 s per shape and encoding, inference rows only).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import glob
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

import structconv
from benchmarks.harness import Report, Row, add_flush_option, fp_environment, interleaved_times, progress, publish
from structconv.nn import PositionalAttention

WIDTH, HEADS, SMALL_HEAD = 400, 9, 44
BATCH = {16: 4, 32: 2, 64: 1}
ENCODINGS = ("quadratic", "gaussian", "learned")
DROPOUT = 0.1
FLEX_QK = 8  # width of flex's (zero) queries and keys: the content term must vanish, any width will do
PEERS = ("paper dense", "sdpa", "sdpa qk", "flex", "natten")
YARDSTICKS = ("conv 3x3", "gemm")
VARIANTS = ("structconv", *PEERS, *YARDSTICKS)
GOAL_PEER, GOAL_INFERENCE = 0.8, 0.5
GOAL_CONV = {"D_out": 1.6, str(SMALL_HEAD): 0.8}
TOL, LOOSE_TOL = 1e-5, 1e-4
_NATTEN_SITES = "/tmp/natten_venv/lib/python3*/site-packages"


# ---------------------------------------------------------------------------------------------
# The function, from the layer's parameters alone
# ---------------------------------------------------------------------------------------------


def _side(layer: PositionalAttention) -> int:
    rows, cols = layer.grid
    if rows != cols or layer.content is not None or layer.boundary != "zero":
        raise ValueError("the peers cover square grids, position-only heads and the 'zero' boundary")
    return rows


def grid_offsets(side: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column offsets pos(m) - pos(n), each (N, M) with query n first, positions row-major."""
    idx = torch.arange(side * side, device=like.device)
    r, c = idx // side, idx % side
    return (r[None, :] - r[:, None]).to(like.dtype), (c[None, :] - c[:, None]).to(like.dtype)


def axis_tables(layer: PositionalAttention) -> list[torch.Tensor]:
    """Learned encoding: per axis, the score of every head at every offset, (H, 2s - 1), offset -(s-1) first."""
    tables = layer.encoding.tables
    widths = [int(t.shape[1]) for t in tables]
    parts = torch.split(layer.encoding.weight, widths, dim=1)
    return [w @ t.T for w, t in zip(parts, tables, strict=True)]


def position_scores(layer: PositionalAttention, like: torch.Tensor) -> torch.Tensor:
    """The heads' scores (H, N, M), query n and key m, as the paper's code builds them (every pair).

    The Gaussians score a relative encoding of each pair against one vector per head (for the
    quadratic encoding r = (|d|^2, d_r, d_c) and v_h = -alpha_h (1, -2 Delta_h), Lemma 2; for
    the non-isotropic one the five monomials of d up to degree 2), dropping a constant per head
    that the softmax ignores.  The learned encoding gathers each axis' table by the offset.
    """
    side = _side(layer)
    dr, dc = grid_offsets(side, like)
    if layer.encoding.name == "learned":
        t_row, t_col = axis_tables(layer)
        return t_row[:, (dr + side - 1).long()] + t_col[:, (dc + side - 1).long()]
    if layer.encoding.name == "quadratic":
        alpha, centres = layer.encoding.alpha(), layer.encoding.centres
        r = torch.stack([dr * dr + dc * dc, dr, dc], -1)
        v = -alpha[:, None] * torch.cat([torch.ones_like(alpha)[:, None], -2 * centres], 1)
    else:
        S, centres = layer.encoding.inv_sqrt_cov, layer.encoding.centres
        P = S.transpose(1, 2) @ S  # the precision S^T S
        Pc = (P @ centres[:, :, None])[..., 0]
        r = torch.stack([dr * dr, dr * dc, dc * dc, dr, dc], -1)
        v = -0.5 * torch.stack([P[:, 0, 0], 2 * P[:, 0, 1], P[:, 1, 1], -2 * Pc[:, 0], -2 * Pc[:, 1]], 1)
    return torch.einsum("hc,nmc->hnm", v.to(like.dtype), r)


def positional_qk(layer: PositionalAttention, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (H, N, r) and keys (H, M, r) whose dot products are the scores up to a term of the query.

    Gaussians: with u_m = S_h p_m and w_n = S_h (p_n + Delta_h) (positions centred on the grid,
    which keeps the products small), -|u_m - w_n|^2 / 2 = u_m . w_n - |u_m|^2 / 2 - |w_n|^2 / 2,
    so q_n = (w_n, 1) and k_m = (u_m, -|u_m|^2 / 2).  The quadratic heads are S_h = sqrt(2 alpha_h) I.
    Learned: q_n holds the row of each axis' table that query n sees, k_m one-hot of its coordinates.
    """
    side = _side(layer)
    idx = torch.arange(side * side, device=like.device)
    r, c = idx // side, idx % side
    if layer.encoding.name == "learned":
        t_row, t_col = axis_tables(layer)
        coord = torch.arange(side, device=like.device)
        seen_row = t_row[:, coord[None, :] - r[:, None] + side - 1]  # (H, N, s): the row offsets query n sees
        seen_col = t_col[:, coord[None, :] - c[:, None] + side - 1]
        q = torch.cat([seen_row, seen_col], -1)
        k = torch.cat([F.one_hot(r, side), F.one_hot(c, side)], -1).to(q.dtype)
        return q, k.expand(q.shape[0], -1, -1)
    pos = torch.stack([r, c], -1).to(like.dtype) - (side - 1) / 2
    if layer.encoding.name == "quadratic":
        scale = (2 * layer.encoding.alpha()).sqrt()
        S = scale[:, None, None] * torch.eye(2, dtype=like.dtype, device=like.device)
    else:
        S = layer.encoding.inv_sqrt_cov
    S = S.to(like.dtype)
    u = torch.einsum("hij,mj->hmi", S, pos)
    w = torch.einsum("hij,hnj->hni", S, pos[None] + layer.encoding.centres[:, None, :].to(like.dtype))
    q = torch.cat([w, torch.ones_like(w[..., :1])], -1)
    k = torch.cat([u, -0.5 * (u * u).sum(-1, keepdim=True)], -1)
    return q, k


def head_values(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    """What each head averages, (B, H, M, W): x itself (D_h = D_out, a view) or x V_h (D_h = 44)."""
    if layer.head_dim is None:
        B, M, E = x.shape
        return x[:, None].expand(B, layer.num_heads, M, E)
    return torch.einsum("bme,hed->bhmd", x, layer.value)


def output_map(layer: PositionalAttention, heads: torch.Tensor) -> torch.Tensor:
    """(B, H, N, W) head outputs -> (B, N, E): one linear map of the concatenated heads, plus the bias."""
    B, H, N, W = heads.shape
    flat = heads.permute(0, 2, 1, 3).reshape(B, N, H * W)
    weight = (
        layer.weight.reshape(H * W, -1) if layer.head_dim is None else layer.out.permute(0, 2, 1).reshape(H * W, -1)
    )
    y = flat @ weight
    return y if layer.bias is None else y + layer.bias


# ---------------------------------------------------------------------------------------------
# The peers
# ---------------------------------------------------------------------------------------------


def paper_dense(layer: PositionalAttention, x: torch.Tensor, key_major_mask: bool = False) -> torch.Tensor:
    """One (H, N, M) softmax for the whole batch, the value einsum per image, the output map.

    In training with ``attention_dropout`` one mask is drawn per call on the (H, N, M)
    probabilities and shared by the batch.  ``key_major_mask`` draws its random numbers in
    (H, M, N) memory order instead, the order structconv draws its own in, so that a seeded
    call reproduces structconv's mask exactly (for the check; the distribution is the same).
    """
    probs = torch.softmax(position_scores(layer, x), dim=-1)
    if layer.training and layer.attention_dropout > 0:
        p = layer.attention_dropout
        if key_major_mask:
            probs = F.dropout(probs.transpose(1, 2).contiguous(), p, training=True).transpose(1, 2)
        else:
            probs = F.dropout(probs, p, training=True)
    B, M, E = x.shape
    H = layer.num_heads
    if layer.head_dim is None:  # the paper's D_h = D_out: each head averages the raw input
        per_head = torch.einsum("hnm,bme->bnhe", probs, x).reshape(B, M, H * E)
        y = per_head @ layer.weight.reshape(H * E, E)
    else:
        values = torch.einsum("bme,hed->bhmd", x, layer.value)
        per_head = torch.einsum("hnm,bhmd->bnhd", probs, values).reshape(B, M, -1)
        y = per_head @ layer.out.permute(0, 2, 1).reshape(-1, E)
    return y if layer.bias is None else y + layer.bias


def _paper_dense_key_major(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    return paper_dense(layer, x, key_major_mask=True)


def sdpa_masked(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    """SDPA with the scores as a float mask and zero queries and keys (no content term)."""
    v = head_values(layer, x)
    qk = v.new_zeros(1, 1, 1, 1).expand(v.shape[0], v.shape[1], v.shape[2], 1)
    heads = F.scaled_dot_product_attention(qk, qk, v, attn_mask=position_scores(layer, x))
    return output_map(layer, heads)


def sdpa_qk(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    """SDPA with the positional queries and keys of :func:`positional_qk`, no mask."""
    v = head_values(layer, x)
    q, k = positional_qk(layer, x)
    B = v.shape[0]
    q, k = q[None].expand(B, -1, -1, -1), k[None].expand(B, -1, -1, -1)
    return output_map(layer, F.scaled_dot_product_attention(q, k, v, scale=1.0))


def _flex_attend(v: torch.Tensor, params: tuple[torch.Tensor, ...], side: int, encoding: str) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    B, H, M, _ = v.shape
    q = v.new_zeros(B, H, M, FLEX_QK)
    a, b = params

    def score_mod(score: Any, batch: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        dr = kv_idx // side - q_idx // side
        dc = kv_idx % side - q_idx % side
        if encoding == "learned":  # a = row table, b = column table, (H, 2s - 1)
            return score + a[h, dr + side - 1] + b[h, dc + side - 1]
        er = dr.to(score.dtype) - b[h, 0]
        ec = dc.to(score.dtype) - b[h, 1]
        if encoding == "quadratic":  # a = alpha (H,), b = centres (H, 2)
            return score - a[h] * (er * er + ec * ec)
        ur = a[h, 0, 0] * er + a[h, 0, 1] * ec  # a = S (H, 2, 2)
        uc = a[h, 1, 0] * er + a[h, 1, 1] * ec
        return score - 0.5 * (ur * ur + uc * uc)

    out: torch.Tensor = flex_attention(q, q, v, score_mod=score_mod)
    return out


_FLEX_COMPILED: list[Callable[..., torch.Tensor]] = []


def flex_peer(layer: PositionalAttention, x: torch.Tensor, compiled: bool = True) -> torch.Tensor:
    """Flex attention with the positional score computed in the kernel from (h, q_idx, kv_idx).

    The parameters enter as tensors read by the ``score_mod`` (alpha and the centres, S and the
    centres, or the learned encoding's two (H, 2s - 1) axis tables), so no (N, M) table is built.
    ``compiled=False`` runs Flex's eager reference (it materialises the scores: for checks only).
    """
    side = _side(layer)
    encoding = layer.encoding.name
    if encoding == "learned":
        params = tuple(axis_tables(layer))
    elif encoding == "quadratic":
        params = (layer.encoding.alpha(), layer.encoding.centres)
    else:
        params = (layer.encoding.inv_sqrt_cov, layer.encoding.centres)
    params = tuple(p.to(x.dtype) for p in params)
    v = head_values(layer, x).contiguous()
    if not compiled:
        return output_map(layer, _flex_attend(v, params, side, encoding))
    if not _FLEX_COMPILED:
        _FLEX_COMPILED.append(torch.compile(_flex_attend, dynamic=False))
    return output_map(layer, _FLEX_COMPILED[0](v, params, side, encoding))


@dataclass(frozen=True)
class Natten:
    """NATTEN as a peer: its module, and whether it may compile Flex here."""

    module: Any
    compiled: bool

    def __call__(self, layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
        return natten_peer(self.module, layer, x, self.compiled)


def load_natten(site: str | None = _NATTEN_SITES) -> tuple[Natten | None, str]:
    """NATTEN as a peer (or ``None``) and a note on where it came from, how it runs, or why it is missing.

    It is looked up in this environment first, then in the ``site`` directory (a glob), put at
    the end of ``sys.path`` for the import only, so that this environment's torch is the one used.
    """
    try:
        import natten  # type: ignore[import-not-found]
    except ImportError as first:
        found = sorted(glob.glob(site)) if site else []
        if not found:
            return None, f"natten is not installed here ({first}) and no site {site!r} holds it"
        sys.path.append(found[-1])
        try:
            import natten  # type: ignore[import-not-found]
        except ImportError as err:
            return None, f"natten could not be imported from {found[-1]}: {err}"
        finally:  # natten finds its own submodules through its package path; nothing else should come from there
            sys.path.remove(found[-1])
    note = f"natten {natten.__version__} from {Path(natten.__file__).parent}"
    natten.allow_flex_compile()  # NATTEN refuses to compile Flex unless told to (its backward stays refused)
    try:  # NATTEN compiles Flex only for a CUDA device of compute capability >= 7.0: ask it
        from natten.backends.configs.checks import can_run_flex_attention

        probe = torch.zeros(1, 4, 1, 8)
        compiled = bool(can_run_flex_attention(probe, probe, probe, torch_compile=True, raise_error=True))
    except Exception as err:
        compiled = False
        note += (
            f"; its compiled Flex path refuses the CPU ({_short(err)}: NATTEN compiles only for a CUDA device of "
            "compute capability >= 7.0), so it runs Flex eagerly (unfused)"
        )
    return Natten(natten, compiled), note


def natten_peer(natten: Any, layer: PositionalAttention, x: torch.Tensor, compiled: bool) -> torch.Tensor:
    """NATTEN ``na2d`` with the kernel covering the grid, on the positional queries and keys of :func:`positional_qk`.

    NATTEN's Flex path wants queries, keys and values of one width, a power of two from 8 to
    512 (``natten.backends.configs.checks``), so all three are zero-padded to the next power of
    two (44 -> 64, 400 -> 512) and the output is cut back: zero columns change no score and no
    kept output.
    """
    side = _side(layer)
    v = head_values(layer, x)
    B, H, M, W = v.shape
    q, k = positional_qk(layer, x)
    width = max(8, 1 << (max(W, q.shape[-1]) - 1).bit_length())
    q, k, v = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))

    def heads_last(t: torch.Tensor) -> torch.Tensor:  # (B or 1, H, M, width) -> (B, s, s, H, width)
        return t.expand(B, -1, -1, -1).permute(0, 2, 1, 3).reshape(B, side, side, H, width)

    out = natten.functional.na2d(
        heads_last(q[None]),
        heads_last(k[None]),
        heads_last(v),
        kernel_size=(side, side),
        scale=1.0,
        attention_kwargs={"torch_compile": compiled},
    )
    return output_map(layer, out.reshape(B, M, H, width)[..., :W].permute(0, 2, 1, 3))


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def layer_flops(encoding: str, side: int, B: int, E: int, H: int, head_dim: int | None) -> dict[str, float]:
    """Forward FLOPs of the layer as a dense computation (a multiply-add is 2 FLOPs).

    With N = M = s^2 tokens, O = (2s - 1)^2 offsets and W = E (D_h = D_out) or D_h:

    * scores, once per layer: quadratic 6 H O (two differences, two squares, a sum, the scale);
      gaussian 12 H O (two differences, a 2x2 product, two squares, a sum, the scale); learned
      2 H D_p (2s - 1) + H O (the per-axis tables, then one sum per offset);
    * softmax, once per layer: 4 H N M (shift, exp, sum, divide);
    * aggregation: 2 B H N M W;
    * channel maps: 2 B N H E^2 (D_h = D_out), 2 B M E H D_h + 2 B N H D_h E (D_h = 44); bias B N E.

    Forward + backward is counted as 3 times the forward (the backward of a product is two
    products of its size).  structconv's Kronecker and shift bases do fewer FLOPs than this, so
    the rate they achieve against it is a dense-equivalent rate.
    """
    N = M = side * side
    n_off = (2 * side - 1) ** 2
    W = E if head_dim is None else head_dim
    learned = 2 * H * E * (2 * side - 1) + H * n_off  # D_p = E, the layer's default
    scores = {"quadratic": 6 * H * n_off, "gaussian": 12 * H * n_off, "learned": learned}[encoding]
    maps = 2 * B * N * H * E * E if head_dim is None else 2 * B * M * E * H * head_dim + 2 * B * N * H * head_dim * E
    parts = {"scores": scores, "softmax": 4 * H * N * M, "aggregation": 2 * B * H * N * M * W, "maps": maps}
    parts["bias"] = B * N * E
    parts["total"] = sum(parts.values())
    return {k: float(v) for k, v in parts.items()}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


# glibc's mallopt parameters, and the thresholds its dynamic policy settles at for large blocks.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_STEADY_MMAP, _STEADY_TRIM = 32 * 2**20, 64 * 2**20


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def steady_allocator() -> bool:
    """Fix glibc's large-block thresholds where its dynamic policy ends up (32 MiB mmap, 64 MiB trim).

    :func:`peak_memory_mib` lowers them for one call and then comes back here; fixing them for the
    whole run keeps every timed call under the same allocator policy.  ``False`` off glibc.
    """
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _STEADY_MMAP) and libc.mallopt(_M_TRIM_THRESHOLD, _STEADY_TRIM))


def peak_memory_mib(fn: Callable[[], Any]) -> float | None:
    """Growth of the process' peak RSS during one call of ``fn``, MiB (Linux with glibc; else ``None``).

    During the call every block above 64 KiB is mapped from the system and unmapped when freed,
    so the resident size follows the live tensors instead of what the allocator cached from
    earlier calls; the peak is reset through ``/proc/self/clear_refs`` just before.  Small blocks
    may still reuse cached memory, so this is a close lower bound.
    """
    libc = _libc()
    if libc is None:
        return None
    try:
        gc.collect()
        libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
        libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
        fn()
        return (_status_kib("VmHWM") - base) / 1024
    except OSError:
        return None
    finally:
        steady_allocator()


def _step(fn: Callable[[], torch.Tensor], backward: bool, leaves: Sequence[torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        if not backward:
            with torch.no_grad():
                fn()
            return
        fn().sum().backward()
        for t in leaves:
            t.grad = None

    return run


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|."""
    return float((got.detach() - ref.detach()).abs().max()) / float(ref.detach().abs().max())


def _short(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:400]


def _seeded(fn: Callable[[], torch.Tensor], seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.no_grad():
        return fn()


def _checked(
    name: str,
    peer: Callable[[PositionalAttention, torch.Tensor], torch.Tensor],
    layer: PositionalAttention,
    x: torch.Tensor,
    reference: torch.Tensor,
    seed: int,
) -> tuple[float, float, str]:
    """The peer's relative error in float32, the tolerance it is held to, and a note.

    1e-5 first.  A peer that misses it is run again with the layer in float64: when that agrees
    to 1e-9 the float32 miss is rounding, and the peer is held to 1e-4 instead.  A peer that
    refuses float64 (NATTEN) is held to 1e-4 against the float64 layer itself.
    """
    err = relative_error(_seeded(lambda: peer(layer, x), seed), reference)
    if err <= TOL:
        return err, TOL, ""
    wide = copy.deepcopy(layer).double()
    ref64 = _seeded(lambda: wide(x.double()), seed)
    note = f"{name}: float32 error {err:.1e} > {TOL:g}"
    try:
        err64 = relative_error(_seeded(lambda: peer(wide, x.double()), seed), ref64)
    except Exception as exc:
        exact = relative_error(_seeded(lambda: peer(layer, x), seed).double(), ref64)
        note += f"; it refuses float64 ({type(exc).__name__}); against the float64 layer {exact:.1e}"
        if exact <= LOOSE_TOL and err <= LOOSE_TOL:
            return err, LOOSE_TOL, note + f" (held to {LOOSE_TOL:g})"
        raise AssertionError(note + " - beyond 1e-4; not timed") from exc
    note += f"; float64 {err64:.1e}"
    if err64 <= 1e-9 and err <= LOOSE_TOL:
        return err, LOOSE_TOL, note + f" (float32 rounding: held to {LOOSE_TOL:g})"
    raise AssertionError(note + " - not the same function, or rounding beyond 1e-4; not timed")


def measure_row(
    encoding: str,
    side: int,
    B: int,
    head_dim: int | None,
    backward: bool,
    dropout: float,
    repeats: int,
    skip: Sequence[str],
    natten: Natten | None,
    memory: bool,
) -> Row:
    """Time every variant of one case (interleaved), after checking each peer against structconv."""
    torch._dynamo.reset()  # each row compiles its own shapes; old graphs only cost memory
    torch.manual_seed(0)
    E, H, M = WIDTH, HEADS, side * side
    layer = PositionalAttention((side, side), E, H, encoding=encoding, head_dim=head_dim, attention_dropout=dropout)
    layer.train(dropout > 0)
    x = torch.randn(B, M, E, requires_grad=backward)
    image = torch.randn(B, E, side, side, requires_grad=backward)
    kernel = (torch.randn(E, E, 3, 3) / math.sqrt(9 * E)).requires_grad_(backward)
    lhs, rhs = torch.randn(B * M, H * E), torch.randn(H * E, E)
    notes: list[str] = []
    errors: dict[str, float] = {}
    tolerances: dict[str, float] = {}
    failed: dict[str, str] = {}

    peers: dict[str, Callable[[PositionalAttention, torch.Tensor], torch.Tensor]] = {
        "paper dense": paper_dense,
        "sdpa": sdpa_masked,
        "sdpa qk": sdpa_qk,
        "flex": flex_peer,
    }
    if natten is not None:
        peers["natten"] = natten
    if dropout > 0:  # only the dense peer holds the probabilities to drop; the kernels draw no mask, or one per image
        for name in [n for n in peers if n != "paper dense"]:
            failed[name] = "no dropout of one (H, N, M) mask shared by the batch (SDPA's dropout_p is per image)"
            del peers[name]
    for name in [n for n in peers if n in skip]:
        failed[name] = "skipped (--skip)"
        del peers[name]

    seed = 1234
    reference = _seeded(lambda: layer(x), seed)
    variants: dict[str, Callable[[], torch.Tensor]] = {"structconv": lambda: layer(x)}
    for name, peer in peers.items():
        start = time.perf_counter()
        if backward and name in ("flex", "natten"):  # torch 2.13 has no Flex backward on the CPU: ask first
            try:
                peer(layer, x).sum().backward()
            except Exception as exc:
                failed[name] = "backward: " + _short(exc)
                continue
        # With dropout the check draws the dense peer's mask in structconv's order (same seed, same mask).
        check_peer = _paper_dense_key_major if dropout > 0 and name == "paper dense" else peer
        try:
            err, tol, note = _checked(name, check_peer, layer, x, reference, seed)
        except Exception as exc:  # a peer that fails is recorded, not fatal: the others still run
            failed[name] = _short(exc)
            continue
        errors[name], tolerances[name] = err, tol
        if note:
            notes.append(note)
        if name in ("flex", "natten"):
            notes.append(f"{name}: set up (compiled where allowed) and checked in {time.perf_counter() - start:.0f} s")
        variants[name] = lambda peer=peer: peer(layer, x)  # type: ignore[misc]
    variants["conv 3x3"] = lambda: F.conv2d(image, kernel, padding=1)
    leaves = [x, image, kernel, *layer.parameters()]
    runs = {n: _step(f, backward, leaves) for n, f in variants.items()}
    runs["gemm"] = _step(lambda: torch.mm(lhs, rhs), False, [])
    times = interleaved_times(runs, repeats=repeats, warmup=1)
    peak = {n: peak_memory_mib(f) for n, f in runs.items()} if memory else {}

    dh = "D_out" if head_dim is None else str(head_dim)
    mode = "fwd+bwd" if backward else "inference"
    present = [p for p in PEERS if p in times]
    fastest = min(present, key=lambda p: times[p]) if present else None
    flops = layer_flops(encoding, side, B, E, H, head_dim)
    work = flops["total"] * (3 if backward else 1)
    x_plan = x.detach()
    basis = layer.dropped(layer.basis(), B)
    extra: dict[str, Any] = {
        "errors": errors,
        "tolerances": tolerances,
        "not_timed": failed,
        "notes": notes,
        "fastest_peer": fastest,
        "ratio_to_peer": times["structconv"] / times[fastest] if fastest else None,
        "ratio_to_conv3x3": times["structconv"] / times["conv 3x3"],
        "flops": flops,
        "flops_pass": work,
        "gflops": work / times["structconv"] / 1e9,
        "gemm_gflops": 2.0 * B * M * H * E * E / times["gemm"] / 1e9,
        "conv3x3_flops": 2.0 * B * M * 9 * E * E * (3 if backward else 1),
        "flop_ratio_to_conv3x3": flops["total"] / (2.0 * B * M * 9 * E * E),
        "basis": type(layer.basis()).__name__,
        "basis_used": type(basis).__name__,  # differs with dropout: the dropped heads are dense
        "order": structconv.explain(basis, x_plan, layer.theta()).chosen,
        "peak_mib": peak,
    }
    params = {"encoding": encoding, "side": side, "tokens": M, "B": B, "E": E, "heads": H, "head_dim": dh}
    params |= {"pass": mode, "dropout": dropout}
    case = f"{encoding} {side}x{side} D_h={dh} B={B} {mode}" + (f" drop={dropout:g}" if dropout else "")
    return Row(case, params, times, fastest or "conv 3x3", extra)


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def _key(r: Row) -> tuple[Any, ...]:
    p = r.params
    return (p["encoding"], p["side"], p["head_dim"], p["dropout"])


def add_inference_ratios(rows: list[Row]) -> None:
    """Give every inference row structconv's inference / forward + backward time of the same case."""
    fb = {_key(r): r for r in rows if r.params["pass"] == "fwd+bwd"}
    for r in rows:
        other = fb.get(_key(r))
        if r.params["pass"] == "inference" and other is not None:
            r.extra["inference_over_fwdbwd"] = r.times["structconv"] / other.times["structconv"]
            shared = [v for v in r.times if v in other.times and v != "gemm"]  # the GEMM is timed forward only
            r.extra["inference_over_fwdbwd_all"] = {v: r.times[v] / other.times[v] for v in shared}


def verdicts(r: Row) -> dict[str, bool | None]:
    """PASS (True) / MISS (False) / not measured (None) for each target."""
    peer = r.extra.get("ratio_to_peer")
    inf = r.extra.get("inference_over_fwdbwd")
    return {
        "peer": None if peer is None else peer <= GOAL_PEER,
        "conv": r.extra["ratio_to_conv3x3"] <= GOAL_CONV[r.params["head_dim"]],
        "inference": None if inf is None else inf <= GOAL_INFERENCE,
    }


def _mark(v: bool | None) -> str:
    return "-" if v is None else ("PASS" if v else "MISS")


def table(rows: list[Row], header: list[str]) -> str:
    """The times, the ratios against the targets, the errors and what could not be timed."""
    shown = [v for v in VARIANTS if any(v in r.times for r in rows)]
    width = max([len(r.case) for r in rows] + [20]) + 2
    out = [*header, "", "median ms of interleaved runs (- : not timed, see below)"]
    out.append(f"{'case':<{width}}" + "".join(f"{v:>12}" for v in shown))
    for r in rows:
        cells = "".join(f"{1e3 * r.times[v]:>12.2f}" if v in r.times else f"{'-':>12}" for v in shown)
        out.append(f"{r.case:<{width}}{cells}")
    out += ["", f"targets: /peer <= {GOAL_PEER} (fastest peer of the same function), /conv <= 1.6 (D_out) or 0.8 (44),"]
    out.append(f"inf/fb <= {GOAL_INFERENCE} (structconv inference / its fwd+bwd); F/conv = layer FLOPs / conv FLOPs;")
    out.append("GFLOP per pass (fwd+bwd = 3x fwd) and GFLOP/s dense-equivalent (layer_flops); gemm = torch.mm GFLOP/s")
    head = f"{'case':<{width}}{'fastest peer':>13}{'/peer':>7}{'/conv':>7}{'F/conv':>7}{'inf/fb':>7}{'GFLOP':>8}"
    out.append(head + f"{'GFLOP/s':>9}{'gemm':>7}  {'basis (> after dropout)':<26}{'order':<8}targets (peer conv inf)")
    for r in rows:
        e, v = r.extra, verdicts(r)
        peer = "-" if e["ratio_to_peer"] is None else f"{e['ratio_to_peer']:.2f}"
        inf = e.get("inference_over_fwdbwd")
        line = f"{r.case:<{width}}{e['fastest_peer'] or '-':>13}{peer:>7}{e['ratio_to_conv3x3']:>7.2f}"
        line += f"{e['flop_ratio_to_conv3x3']:>7.2f}"
        line += f"{'-' if inf is None else f'{inf:.2f}':>7}{e['flops_pass'] / 1e9:>8.2f}{e['gflops']:>9.1f}"
        basis = e["basis"] if e["basis"] == e["basis_used"] else f"{e['basis']}>{e['basis_used']}"
        line += f"{e['gemm_gflops']:>7.0f}  {basis:<26}{e['order']:<8}"
        out.append(line + " ".join(_mark(v[k]) for k in ("peer", "conv", "inference")))
    out += ["", "max relative error of each peer against structconv (float32; tolerance 1e-5 unless noted)"]
    for r in rows:
        errs = ", ".join(f"{n} {err:.1e}" for n, err in r.extra["errors"].items())
        out.append(f"{r.case:<{width}}{errs}")
    if any(r.extra["peak_mib"] for r in rows):
        out += ["", "peak memory of one call, MiB (growth of the peak RSS; approximate)"]
        out.append(f"{'case':<{width}}" + "".join(f"{v:>12}" for v in shown))
        for r in rows:
            pk = r.extra["peak_mib"]
            cells = "".join(f"{pk[v]:>12.0f}" if pk.get(v) is not None else f"{'-':>12}" for v in shown)
            out.append(f"{r.case:<{width}}{cells}")
    reasons: dict[str, tuple[list[str], list[str]]] = {}  # why -> (peers, cases)
    for r in rows:
        whys = [(name, why) for name, why in r.extra["not_timed"].items()]
        whys += [("", note) for note in r.extra["notes"] if "and checked in" not in note]
        for name, why in whys:
            names, cases = reasons.setdefault(why, ([], []))
            if name and name not in names:
                names.append(name)
            if r.case not in cases:
                cases.append(r.case)
    if reasons:
        out += ["", "not timed, and notes"]
        for why, (names, cases) in reasons.items():
            out.append(f"- {', '.join(names) + ': ' if names else ''}{why}")
            out.append(f"    ({len(cases)} rows: {', '.join(cases[:2])}{', ...' if len(cases) > 2 else ''})")
    return "\n".join(out)


def dropout_lines(rows: list[Row]) -> list[str]:
    """One line per dropout row: what training with the shared mask costs each side, in time and memory."""
    lines = []
    for r in rows:
        if not r.params["dropout"]:
            continue
        parts = []
        for v in ("structconv", "paper dense"):
            if v in r.times:
                peak = r.extra["peak_mib"].get(v)
                parts.append(f"{v} {1e3 * r.times[v]:.0f} ms" + ("" if peak is None else f" (peak +{peak:.0f} MiB)"))
        lines.append(f"{r.case}: " + ", ".join(parts))
    return lines


STYLE = {
    "structconv": ("tab:red", "o", "-"),
    "paper dense": ("tab:blue", "s", "-"),
    "sdpa": ("tab:orange", "^", "-"),
    "sdpa qk": ("tab:brown", "v", "-"),
    "flex": ("tab:purple", "D", "-"),
    "natten": ("tab:pink", "P", "-"),
    "conv 3x3": ("tab:gray", "x", "--"),
    "gemm": ("black", ".", ":"),
}


def plot(rows: list[Row], path: Path) -> None:
    """Time against tokens (log-log) for every variant: one panel per encoding, head width and pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    encodings = [e for e in ENCODINGS if any(r.params["encoding"] == e for r in rows)]
    # Two panels a row (the passes), one row per encoding and head width: readable at a page's width.
    panels = [(enc, dh) for enc in encodings for dh in ("D_out", str(SMALL_HEAD))]
    columns = ("fwd+bwd", "inference")
    fig, axes = plt.subplots(len(panels), 2, figsize=(9.0, 2.9 * len(panels)), squeeze=False)
    handles: dict[str, Any] = {}
    for i, (enc, dh) in enumerate(panels):
        for j, mode in enumerate(columns):
            ax = axes[i][j]
            for dropout in (0.0, DROPOUT):
                chosen = [
                    r
                    for r in rows
                    if r.params["encoding"] == enc
                    and r.params["head_dim"] == dh
                    and r.params["pass"] == mode
                    and r.params["dropout"] == dropout
                ]
                chosen.sort(key=lambda r: r.params["tokens"])
                for v in VARIANTS:
                    pts = [(r.params["tokens"], 1e3 * r.times[v]) for r in chosen if v in r.times]
                    if not pts or (dropout and v not in ("structconv", "paper dense")):
                        continue
                    colour, marker, style = STYLE[v]
                    label = v if not dropout else f"{v}, dropout {DROPOUT:g}"
                    (line,) = ax.plot(
                        *zip(*pts, strict=True),
                        color=colour,
                        marker=marker,
                        linestyle=":" if dropout else style,
                        alpha=0.6 if dropout else 1.0,
                        label=label,
                    )
                    handles.setdefault(label, line)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.tick_params(axis="y", labelsize=7)
            ticks = sorted({r.params["tokens"] for r in rows})
            ax.set_xticks(ticks, [f"{t}\n({math.isqrt(t)}x{math.isqrt(t)})" for t in ticks], fontsize=7)
            ax.minorticks_off()
            ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
            ax.set_title(f"{enc}, D_h = {dh}, {mode}", fontsize=9)
            ax.grid(True, which="major", linewidth=0.3)
            if i == len(panels) - 1:
                ax.set_xlabel("tokens", fontsize=8)
            if j == 0:
                ax.set_ylabel("ms (median, log)", fontsize=8)
    order = sorted(handles, key=lambda label: ("dropout" in label, VARIANTS.index(label.split(",")[0])))
    height = 2.9 * len(panels)  # inches: the title and the legend take the top 0.9
    title = "PositionalAttention (9 heads, width 400, float32, CPU) against peers of the same function"
    fig.suptitle(title, y=1 - 0.05 / height, va="top", fontsize=10)
    legend_top = 1 - 0.3 / height
    fig.legend([handles[k] for k in order], order, loc="upper center", bbox_to_anchor=(0.5, legend_top), ncol=4,
               fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.9 / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def jobs(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """Every case to measure, in order, as (label, keyword arguments of measure_row)."""
    out = []

    def add(encoding: str, side: int, head_dim: int | None, backward: bool, dropout: float) -> None:
        B = args.batch or BATCH.get(side, 1)
        kw = {"encoding": encoding, "side": side, "B": B, "head_dim": head_dim, "backward": backward}
        kw["dropout"] = dropout
        label = f"{encoding} {side} D_h={head_dim or 'D_out'} {'fwd+bwd' if backward else 'inference'}"
        out.append((label + (" dropout" if dropout else ""), kw))

    for encoding in args.encodings:
        sides = args.sides if encoding == "quadratic" else [s for s in args.sides if s in args.other_sides]
        for side in sides:
            for head_dim in (None, SMALL_HEAD):
                for backward in (True, False):
                    add(encoding, side, head_dim, backward, 0.0)
    if "quadratic" in args.encodings and not args.no_dropout:
        for side in args.sides:
            for head_dim in (None, SMALL_HEAD):
                add("quadratic", side, head_dim, True, DROPOUT)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", type=int, nargs="+", default=[16, 32, 64], help="grid sides (default 16 32 64)")
    parser.add_argument(
        "--other-sides",
        type=int,
        nargs="+",
        default=[16, 32],
        help="of --sides, those also run for the gaussian and learned encodings (default 16 32)",
    )
    parser.add_argument("--encodings", nargs="+", default=list(ENCODINGS), choices=ENCODINGS)
    parser.add_argument("--batch", type=int, default=None, help="one batch for every side (default 4, 2, 1)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip", nargs="*", default=[], choices=PEERS, help="peers not to run")
    parser.add_argument("--no-dropout", action="store_true", help="leave out the attention-dropout rows")
    parser.add_argument("--no-memory", action="store_true", help="do not measure the peak memory")
    parser.add_argument("--natten-site", default=_NATTEN_SITES, help="where to find natten if not installed here")
    parser.add_argument("--quick", action="store_true", help="16x16, batch 1, 1 repeat: a smoke run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default="positional_cpu", help="the results' file name")
    parser.add_argument(
        "--replot", type=Path, default=None, help="draw a record's figure again (its JSON); run nothing"
    )
    add_flush_option(parser)
    args = parser.parse_args(argv)
    if args.replot is not None:
        record = json.loads(args.replot.read_text())
        plot([Row(**row) for row in record["rows"]], args.replot.with_suffix(".png"))
        return 0
    fp = fp_environment(not args.no_flush)
    if args.quick:
        args.sides, args.batch, args.repeats = [16], args.batch or 1, 1

    if not args.no_memory:
        steady_allocator()
    torch._dynamo.config.recompile_limit = 64  # one compile per shape and encoding, and NATTEN's besides
    natten, natten_note = load_natten(args.natten_site) if "natten" not in args.skip else (None, "skipped")
    todo = jobs(args)
    report = Report(args.name + fp.suffix)
    started = time.perf_counter()
    for i, (label, kw) in enumerate(todo, start=1):
        progress(i, len(todo), label)
        try:
            row = measure_row(
                **kw,
                repeats=args.repeats,
                skip=args.skip,
                natten=natten,
                memory=not args.no_memory,
            )
        except (RuntimeError, MemoryError) as err:  # e.g. out of memory at 64x64: record and go on
            print(f"\n{label}: {_short(err)}", file=sys.stderr)
            report.summary.setdefault("failed_rows", {})[label] = _short(err)
            continue
        report.rows.append(row)
    add_inference_ratios(report.rows)
    elapsed = time.perf_counter() - started
    marks = [verdicts(r) for r in report.rows]
    report.summary |= {
        "natten": natten_note,
        "flex_qk_width": FLEX_QK,
        "repeats": args.repeats,
        "seconds": elapsed,
        "threads": torch.get_num_threads(),
        "pass": {k: sum(1 for m in marks if m[k]) for k in ("peer", "conv", "inference")},
        "miss": {k: sum(1 for m in marks if m[k] is False) for k in ("peer", "conv", "inference")},
    }
    header = [
        f"PositionalAttention ({HEADS} heads, width {WIDTH}, float32, CPU, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}); {args.repeats} interleaved repeats; {elapsed / 60:.1f} min",
        f"NATTEN: {natten_note}",
        "natten: queries, keys and values zero-padded to a power-of-two width (44 -> 64, 400 -> 512), as NATTEN "
        "requires; flex: zero queries and keys of width " + f"{FLEX_QK}, values unpadded (44 and 400 accepted)",
    ]
    for label, why in report.summary.get("failed_rows", {}).items():
        header.append(f"row failed: {label}: {why}")
    header += dropout_lines(report.rows)
    passes, misses = report.summary["pass"], report.summary["miss"]
    header.append("PASS/MISS counts: " + ", ".join(f"{k} {passes[k]}/{passes[k] + misses[k]}" for k in passes))
    publish(report, args.out, table(report.rows, header), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
