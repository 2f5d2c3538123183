r"""Position-only heads truncated to shift bases: the form of non-separable heads on large grids.

A head keeps the offsets scored at least :math:`\min_n \max_m a_{hmn} + \ln(\mathrm{threshold})`
(every column keeps its best key), as one renormalised weighted :class:`~structconv.GridBasis`:
a depthwise convolution per head instead of a dense ``(M, N)`` softmax.
:meth:`~structconv.PositionScores.basis` takes it with a ``threshold`` where its cost says so (the
layer's default; ``threshold=None`` leaves it out), and checks the arguments;
``docs/attention.rst`` gives the measurements (``benchmarks/bench_gaussian_forms.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import Array, as_index, namespace, to_numpy
from ..bases.composite import ConcatBasis
from ..bases.grid import GridBasis
from .relative import RelativeOffsets, check_host_memory

#: Log-range of a head's weights beyond which the shift form is refused (it holds the weights
#: relative to one shift, which must not under- or overflow).
_LOG_RANGE = 60.0

#: A tap (a memory-bound read of the activations) is costed as this many dense entries (GEMM
#: flops); benchmarks/bench_positional.py measures the ratio.
_SHIFT_COST = 40


def shift_heads(
    scores: Array, rel: RelativeOffsets, threshold: float, *, concave: bool, forced: bool
) -> ConcatBasis | None:
    """The heads of offset ``scores`` ``(K, O)`` as one weighted shift basis per head; ``None`` where dense is better.

    Unless ``forced``, the shift form is taken when its taps number under 1/40 of the dense
    entries and its weights' range fits the dtype; ``forced`` raises for the latter instead.
    ``concave``: every head's score is concave in the offset (Gaussians).
    """
    xp = namespace(scores)
    flat = to_numpy(xp.astype(scores, xp.float64))  # a host copy outside autograd (bf16 has no NumPy dtype)
    floor = _weakest_best(flat, rel, concave)
    keep = flat >= (floor + math.log(threshold))[:, None]
    K, M = int(scores.shape[0]), rel.positions
    too_wide = bool((flat.max(axis=1) - floor > _LOG_RANGE).any())
    if too_wide and forced:
        raise ValueError(
            f"a head's weights span more than e^{_LOG_RANGE:g} across columns; the shift form would "
            "under- or overflow (use the dense form)"
        )
    if too_wide or (not forced and _SHIFT_COST * int(keep.sum()) >= K * M):
        return None
    members = []
    for h in range(K):
        chosen = np.flatnonzero(keep[h])
        weights = xp.exp(scores[h, as_index(chosen, scores)] - float(floor[h]))[None]
        offsets = rel.offsets[chosen]
        members.append(GridBasis(rel.grid, rel.grid, offsets, boundary=rel.boundary, weights=weights, normalize=True))
    return ConcatBasis(members)


def _weakest_best(flat: np.ndarray, rel: RelativeOffsets, concave: bool) -> np.ndarray:
    """Per head, :math:`\\min_n \\max_m a_{hmn}` from the offset scores ``flat`` (``(K, O)``).

    The best score over a column's box of offsets is quasi-concave in the column when the score
    is concave, so only the :math:`2^d` corner columns are read; a torus' columns see all offsets.
    """
    if rel.boundary == "periodic":
        return np.asarray(flat.max(axis=1))
    if concave:
        corners = np.stack(np.meshgrid(*[np.unique([0, s - 1]) for s in rel.grid], indexing="ij"), -1)
        columns = np.ravel_multi_index(tuple(corners.reshape(-1, len(rel.grid)).T), rel.grid)
    else:
        columns = np.arange(rel.positions)
    return np.asarray(flat[:, _column_ids(rel, np.asarray(columns))].max(axis=1).min(axis=1))


def _column_ids(rel: RelativeOffsets, columns: np.ndarray) -> np.ndarray:
    r"""``(M, len(columns))``: the offset id of :math:`\mathrm{pos}(m) - \mathrm{pos}(n)`, ``n`` in ``columns``."""
    check_host_memory(rel.grid, "the offset ids of these columns", 8.0 * rel.positions * len(columns))
    coords = np.unravel_index(np.asarray(columns, dtype=np.int64), rel.grid)
    ids = np.zeros((1, len(columns)), dtype=np.int64)
    for i, size in enumerate(rel.grid):
        along = rel.axis_ids[i][np.arange(size)[:, None] - coords[i][None, :] + size - 1]  # (S_i, C)
        shape = [1] * len(rel.grid) + [len(columns)]
        shape[i] = size
        ids = ids * rel.lengths[i] + along.reshape(shape)
    return ids.reshape(rel.positions, len(columns))
