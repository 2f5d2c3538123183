"""Naive dense references of the structures, written from their definitions (float64 NumPy).

Each returns the dense basis ``(K, M, N)`` (or ``(B, K, M, N)``) whose einsum with ``x`` and
``theta`` is the answer; the conventions are the documented ones (torch's kernel placement for
grids, PyTorch Geometric's ``gcn_norm``, in-degrees at the target, a column-wise softmax).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


# --- grids ------------------------------------------------------------------------------------------
def window(kernel: Sequence[int], dilation: Sequence[int]) -> np.ndarray:
    """The kernel's tap offsets ``(K, d)`` in row-major order, dilated."""
    taps = list(itertools.product(*(range(k) for k in kernel)))
    return np.asarray(taps, dtype=np.int64).reshape(len(taps), len(kernel)) * np.asarray(dilation)


def same_padding(extent: Sequence[int]) -> tuple[list[int], list[int]]:
    """torch's ``padding="same"``: the odd entry after."""
    before = [(e - 1) // 2 for e in extent]
    return before, [e - 1 - b for e, b in zip(extent, before, strict=True)]


def grid_dense(
    grid: Sequence[int],
    taps: np.ndarray,
    stride: Sequence[int],
    before: Sequence[int],
    after: Sequence[int],
    periodic: bool = False,
) -> np.ndarray:
    """Member ``k`` reads input ``n * stride - before + taps[k]`` into output ``n`` (wrapped if periodic)."""
    g = np.asarray(grid)
    extent = taps.max(0) + 1
    out = tuple(
        int((s + b + a - e) // st + 1) for s, b, a, e, st in zip(grid, before, after, extent, stride, strict=True)
    )
    A = np.zeros((len(taps), int(np.prod(grid)), int(np.prod(out))))
    for k, tap in enumerate(taps):
        for n, pos in enumerate(itertools.product(*(range(o) for o in out))):
            src = np.asarray(pos) * np.asarray(stride) - np.asarray(before) + tap
            if periodic:
                src = src % g
            elif np.any(src < 0) or np.any(src >= g):
                continue
            A[k, int(np.ravel_multi_index(tuple(src), tuple(grid))), n] = 1.0
    return A


def shift_dense(grid: Sequence[int], d: Sequence[int], periodic: bool) -> np.ndarray:
    """Def. 1: ``A[m, n] = 1`` iff position ``n`` minus position ``m`` is ``d`` (modulo the grid if periodic)."""
    positions = list(itertools.product(*(range(s) for s in grid)))
    A = np.zeros((1, len(positions), len(positions)))
    for m, pm in enumerate(positions):
        for n, pn in enumerate(positions):
            diff = np.asarray(pn) - np.asarray(pm)
            if periodic:
                hit = np.all((diff - np.asarray(d)) % np.asarray(grid) == 0)
            else:
                hit = np.array_equal(diff, np.asarray(d))
            A[0, m, n] = float(hit)
    return A


# --- graphs -----------------------------------------------------------------------------------------
def adjacency(src: np.ndarray, dst: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
    """``A[m, n]``: the summed weights of the edges ``m -> n``."""
    A = np.zeros((n, n))
    np.add.at(A, (src, dst), weight)
    return A


def _inv(deg: np.ndarray, power: float) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(deg > 0, np.abs(deg) ** -power, 0.0)


def gcn_dense(
    src: np.ndarray, dst: np.ndarray, weight: np.ndarray, n: int, improved: bool = False, loops: bool = True
) -> np.ndarray:
    """PyG's ``gcn_norm``: a loop on every node (an existing one keeps its weight), in-degrees at the target."""
    A = adjacency(src, dst, weight, n)
    if loops:
        diag = np.full(n, 2.0 if improved else 1.0)
        is_loop = src == dst
        diag[src[is_loop]] = weight[is_loop]
        A[np.arange(n), np.arange(n)] = diag
    dinv = _inv(A.sum(0), 0.5)
    return (dinv[:, None] * A * dinv[None, :])[None]


def powers_dense(A: np.ndarray, K: int, normalize: bool) -> np.ndarray:
    """``S^0 .. S^K`` with ``S = D^{-1/2} A D^{-1/2}`` (in-degrees, no added loops), or ``A`` itself."""
    S = A
    if normalize:
        dinv = _inv(A.sum(0), 0.5)
        S = dinv[:, None] * A * dinv[None, :]
    return np.stack([np.linalg.matrix_power(S, k) for k in range(K + 1)])


def laplacian_dense(A: np.ndarray, normalization: str) -> np.ndarray:
    """``I - D^{-1/2} A D^{-1/2}`` (sym) or ``I - D^{-1} A`` (rw), loops dropped, out-degrees."""
    A = A.copy()
    np.fill_diagonal(A, 0.0)
    deg = A.sum(1)
    if normalization == "sym":
        d = _inv(deg, 0.5)
        off = d[:, None] * A * d[None, :]
    else:
        off = _inv(deg, 1.0)[:, None] * A
    return np.eye(len(A)) - off


def chebyshev_dense(A: np.ndarray, K: int, normalization: str, lambda_max: float) -> np.ndarray:
    """``T_0 .. T_{K-1}`` of the scaled Laplacian ``2 L / lambda_max - I``."""
    L = 2.0 * laplacian_dense(A, normalization) / lambda_max - np.eye(len(A))
    members = [np.eye(len(A)), L]
    while len(members) < K:
        members.append(2.0 * L @ members[-1] - members[-2])
    return np.stack(members[:K])


def diffusion_dense(A: np.ndarray, K: int) -> np.ndarray:
    """``I``, forward ``(D_out^{-1} A)^T`` powers and backward ``A D_in^{-1}`` powers (members as gathered)."""
    forward = (_inv(A.sum(1), 1.0)[:, None] * A).T
    backward = A * _inv(A.sum(0), 1.0)[None, :]
    f = [np.linalg.matrix_power(forward, k) for k in range(K + 1)]
    b = [np.linalg.matrix_power(backward, k) for k in range(1, K + 1)]
    return np.stack(f + b)


def relational_dense(
    src: np.ndarray, dst: np.ndarray, weight: np.ndarray, etype: np.ndarray, n: int, R: int
) -> np.ndarray:
    """One member per relation: each edge's weight over the number of its target's in-edges of that relation."""
    out = np.zeros((R, n, n))
    for r in range(R):
        sel = etype == r
        count = np.bincount(dst[sel], minlength=n).astype(float)
        np.add.at(out[r], (src[sel], dst[sel]), weight[sel] / np.where(count > 0, count, 1.0)[dst[sel]])
    return out


# --- attention --------------------------------------------------------------------------------------
def softmax_columns(scores: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """Softmax over axis ``-2`` of the allowed entries; a column without one is zero."""
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    peak = scores.max(-2, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(scores - peak)
    total = e.sum(-2, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def bilinear_scores(x: np.ndarray, z: np.ndarray, bilinear: np.ndarray) -> np.ndarray:
    """``s[b, k, m, n] = x[b, m] . bilinear[k] . z[b, n]``."""
    return np.einsum("bmp,kpr,bnr->bkmn", x, bilinear, z)


def projection_scores(x: np.ndarray, z: np.ndarray, key: np.ndarray, query: np.ndarray, scale: float) -> np.ndarray:
    """``s[b, k, m, n] = scale (x[b, m] key[k]) . (z[b, n] query[k])``."""
    return scale * np.einsum("bmp,kpd,bnr,krd->bkmn", x, key, z, query)
