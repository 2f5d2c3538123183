r"""Relative-position heads on grids (Cordonnier et al. §3): scores of the offset alone, and the heads' basis.

One function per encoding gives the scores of the offset :math:`\delta = \mathrm{pos}(m) - \mathrm{pos}(n)`
as a :class:`PositionScores` mechanism (per axis where separable); :meth:`PositionScores.basis` builds the heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import Array, as_index, einsum, namespace, of, shape_str, to_numpy
from ..backend.checks import check_array
from ..bases.base import Basis
from ..bases.dense import DenseBasis
from ..bases.grid import _grid
from ..bases.kronecker import KroneckerBasis
from ..bases.scores import masked_softmax
from .attention import Mechanism
from .relative import (
    RelativeOffsets,
    _axis_sum,
    _check_tables,
    _split,
    check_host_memory,
    check_positions,
    relative_offsets,
    table_on,
)
from .shift_heads import shift_heads

__all__ = [
    "PositionScores",
    "RelativeOffsets",
    "gaussian_scores",
    "learned_scores",
    "quadratic_scores",
    "relative_offsets",
]


def _detached(a: Array) -> np.ndarray:
    """``a`` as float64 on the host, a copy outside autograd (cast on its backend: bf16 has no NumPy dtype)."""
    xp = namespace(a)
    return to_numpy(xp.astype(a, xp.float64))


@dataclass(frozen=True, eq=False)
class PositionScores(Mechanism):
    r"""Scores of ``K`` heads that depend on the offset :math:`\delta_{mn}` between key and query alone.

    Parameters
    ----------
    grid
        The grid's sizes :math:`(S_1, \dots, S_d)`.
    boundary
        ``"zero"`` (offsets within the grid) or ``"periodic"`` (offsets wrapped around it).
    per_axis
        ``(K, L_i)`` per axis (:attr:`RelativeOffsets.lengths`), whose sum over the axes is the
        score of an offset: the heads are then separable.
    per_offset
        ``(K, O)``, one score per offset of :attr:`RelativeOffsets.offsets`; exactly one of the two.
    concave
        Whether every head's score is concave in the offset (Gaussians): the shift form then reads corners only.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import quadratic_scores
    >>> heads = quadratic_scores((4, 5), np.zeros((2, 2)), np.ones(2)).basis()
    >>> heads, bool(np.allclose(heads.to_dense().sum(1), 1.0))  # doctest: +ELLIPSIS
    (KroneckerBasis(K=2, (4, 4) ⊗ (5, 5), backend=numpy, dtype=float64), True)
    """

    grid: tuple[int, ...]
    boundary: str = "zero"
    per_axis: tuple[Array, ...] | None = None
    per_offset: Array | None = None
    concave: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _grid(self.grid))
        rel = relative_offsets(self.grid, self.boundary)
        if (self.per_axis is None) == (self.per_offset is None):
            raise ValueError("give exactly one of per_axis and per_offset")
        if self.per_axis is not None:
            object.__setattr__(self, "per_axis", tuple(self.per_axis))
            assert self.per_axis is not None
            if len(self.per_axis) != len(self.grid):
                raise ValueError(
                    f"per_axis must hold one (K, L_i) array per axis of the grid {self.grid}, got {len(self.per_axis)}"
                )
            wanted = [(self.heads, n) for n in rel.lengths]
            got = [tuple([int(v) for v in a.shape]) for a in self.per_axis]  # lists: traced by torch.compile
            if got != wanted:
                raise ValueError(f"per_axis must be (K, L_i) per axis of the grid {self.grid}: {wanted}, got {got}")
        else:
            assert self.per_offset is not None
            check_array(self.per_offset, "per_offset", (2,), ("(K, O)",))
            if int(self.per_offset.shape[1]) != math.prod(rel.lengths):
                raise ValueError(
                    f"per_offset must be (K, O) with O = {math.prod(rel.lengths)} offsets of the grid {self.grid}, "
                    f"got {shape_str(tuple(self.per_offset.shape))}"
                )

    @property
    def heads(self) -> int:
        first = self.per_offset if self.per_axis is None else self.per_axis[0]
        assert first is not None
        return int(first.shape[0])

    @property
    def positional(self) -> bool:
        return True

    @property
    def relative(self) -> RelativeOffsets:
        """The offsets of this grid."""
        return relative_offsets(self.grid, self.boundary)

    def offset_scores(self) -> Array:
        """Scores ``(K, O)``, one per head and offset of :attr:`relative`."""
        if self.per_axis is None:
            assert self.per_offset is not None
            return self.per_offset
        return _axis_sum(self.per_axis, self.relative.lengths)

    def dense_scores(self) -> Array:
        """Scores ``(K, M, N)`` of every pair: per axis where separable (no gather of :math:`KMN` entries)."""
        if self.per_axis is None:
            return self.relative.gather(self.offset_scores())
        check_host_memory(self.grid, "its dense scores", 8.0 * self.heads * self.relative.positions**2)
        d, K, total = len(self.grid), self.heads, None
        for i, (size, scores) in enumerate(zip(self.grid, self.per_axis, strict=True)):
            index = table_on(relative_offsets((size,), self.boundary), "axis_index0", scores)  # (m_i, n_i)
            term = scores[:, index].reshape([K] + [size if j in (i, d + i) else 1 for j in range(2 * d)])
            total = term if total is None else total + term
        assert total is not None
        M = self.relative.positions
        return total.reshape(K, M, M)

    def scores(self, x: Array, z: Array) -> Array:
        check_positions(self.relative, x, z, "a positional mechanism")
        return self.dense_scores()[None]

    def basis(self, threshold: float | None = None, *, representation: str = "auto") -> Basis:
        r"""The heads, the column-wise softmax of the scores, as one ``(K, M, N)`` basis shared by the batch.

        Separable heads are the Kronecker product of their per-axis softmaxes (exact); others a
        dense softmax or, with a ``threshold``, shift bases where that is worth it
        (:mod:`~structconv.structures.shift_heads`).  Gradients flow to the scores either way.

        Parameters
        ----------
        threshold
            The truncation of non-separable heads to shifts, in ``(0, 1)``, or ``None`` (exact).
        representation
            ``"auto"``, ``"kronecker"``, ``"shifts"`` or ``"dense"``.
        """
        form = representation
        if form not in ("auto", "shifts", "dense", "kronecker"):
            raise ValueError(f"representation must be 'auto', 'kronecker', 'shifts' or 'dense', got {form!r}")
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must lie in (0, 1) or be None, got {threshold!r}")
        if self.per_axis is not None and form in ("kronecker", "auto"):
            # Per axis an int64 index and a factor of at most 8 bytes an entry.
            check_host_memory(self.grid, "its per-axis softmaxes", 16 * self.heads * sum([s * s for s in self.grid]))
            factors = []
            for size, scores in zip(self.grid, self.per_axis, strict=True):
                index = table_on(relative_offsets((size,), self.boundary), "axis_index0", scores)  # (m_i, n_i)
                factors.append(masked_softmax(scores[:, index]))
            return KroneckerBasis.of_weights(factors)  # softmaxes of finite scores: no host read
        if form == "kronecker":
            raise ValueError("these heads are not separable by axis; use representation='shifts' or 'dense'")
        if threshold is None and form == "shifts":
            raise ValueError("the shift form needs a threshold in (0, 1)")
        scores = self.offset_scores()
        shifted = None
        if threshold is not None and form != "dense":
            shifted = shift_heads(scores, self.relative, threshold, concave=self.concave, forced=form == "shifts")
        return DenseBasis.of_weights(masked_softmax(self.relative.gather(scores))) if shifted is None else shifted


def quadratic_scores(
    grid: Any, centres: Array, alpha: Array, boundary: str = "zero", *, positive: bool = False
) -> PositionScores:
    r"""Isotropic Gaussian heads, :math:`a_{hmn} = -\alpha_h\lVert\delta_{mn} - \Delta_h\rVert^2` (Lemma 2), per axis.

    Parameters
    ----------
    grid, boundary
        The grid's sizes, and ``"zero"`` or ``"periodic"``.
    centres, alpha
        :math:`\Delta_h`, ``(K, d)``, and :math:`\alpha_h > 0`, ``(K,)``.
    positive
        ``True`` when ``alpha`` is positive by construction: its values are not read back (from a GPU).
    """
    g = _grid(grid)
    K = _check_centres(centres, len(g))
    if tuple(alpha.shape) != (K,):
        raise ValueError(f"alpha must have shape (K,) = ({K},), got {shape_str(tuple(alpha.shape))}")
    if not positive and bool((alpha <= 0).any()):
        raise ValueError("alpha must be positive (it is the inverse width of each head's Gaussian)")
    per_axis = []
    for i, size in enumerate(g):
        diff = _wrapped_difference(relative_offsets((size,), boundary), centres[:, i : i + 1])
        per_axis.append(-alpha[:, None] * diff[..., 0] ** 2)
    return PositionScores(g, boundary, per_axis=tuple(per_axis), concave=True)


def gaussian_scores(grid: Any, centres: Array, inv_sqrt_cov: Array, boundary: str = "zero") -> PositionScores:
    r"""Non-isotropic Gaussian heads, :math:`a_{hmn} = -\tfrac12\lVert S_h(\delta_{mn} - \Delta_h)\rVert^2`, per offset.

    ``grid``, ``centres`` and ``boundary`` as for :func:`quadratic_scores`; ``inv_sqrt_cov`` is
    :math:`S_h`, ``(K, d, d)`` (the precision :math:`S_h^\top S_h` is positive semi-definite for
    any value; :math:`S_h = \sqrt{2\alpha_h}\,I` gives the quadratic heads).
    """
    g = _grid(grid)
    d = len(g)
    K = _check_centres(centres, d)
    if tuple(inv_sqrt_cov.shape) != (K, d, d):
        raise ValueError(
            f"inv_sqrt_cov must have shape (K, d, d) = ({K}, {d}, {d}), got {shape_str(tuple(inv_sqrt_cov.shape))}"
        )
    diff = _wrapped_difference(relative_offsets(g, boundary), centres)
    proj = einsum("kij,koj->koi", inv_sqrt_cov, diff)
    return PositionScores(g, boundary, per_offset=-0.5 * (proj * proj).sum(-1), concave=True)


def learned_scores(grid: Any, tables: Sequence[Array], weight: Array, boundary: str = "zero") -> PositionScores:
    r"""Learned relative embeddings, :math:`a_{hmn} = t_h\cdot r_{\delta_{mn}}`, per axis.

    :math:`r_\delta` concatenates one row per axis, :math:`r^{(i)}_{\delta_i}` from ``tables[i]``
    (``(L_i, D_i)``, a row per offset along that axis), and ``weight`` is :math:`t_h`, ``(K, D_p)``
    with :math:`D_p = \sum_i D_i` (the paper's :math:`v^\top\hat W r_\delta` with
    :math:`t_h = \hat W^\top v_h`); ``grid`` and ``boundary`` as for :func:`quadratic_scores`.
    """
    g = _grid(grid)
    tables = tuple(tables)
    widths = _check_tables(tables, relative_offsets(g, boundary))
    check_array(weight, "weight", (2,), ("(K, D_p)",))
    if int(weight.shape[1]) != sum(widths):
        raise ValueError(
            f"weight must have shape (K, D_p) with D_p = {sum(widths)} (the tables' widths {widths}), "
            f"got {shape_str(tuple(weight.shape))}"
        )
    parts = _split(weight, widths)
    return PositionScores(g, boundary, per_axis=tuple(w @ t.T for w, t in zip(parts, tables, strict=True)))


def inner_positions(basis: Basis, tokens: tuple[int, ...], padding: tuple[int, ...]) -> Basis:
    """``basis`` over the grid ``tokens`` restricted to the positions ``padding`` away from its borders.

    The tokens beyond are keys of zero features and no outputs; they stay in each column's softmax.
    A ``"periodic"`` grid has no tokens beyond it: that is the caller's to refuse.
    """
    pads = [int(p) for p in padding]  # lists, not generators: torch.compile traces the layer through here
    if len(pads) != len(tokens) or any([p < 0 or 2 * p >= s for p, s in zip(pads, tokens, strict=False)]):
        raise ValueError(f"padding must give each axis of the grid {tokens} fewer than half its tokens, got {padding}")
    if not any(pads):
        return basis
    spans = [slice(p, s - p) for s, p in zip(tokens, pads, strict=True)]
    if isinstance(basis, KroneckerBasis):  # the inner tokens are a product set: restrict every factor
        return KroneckerBasis.of_weights([f[:, span, span] for f, span in zip(basis.factors, spans, strict=True)])
    weights = basis.to_dense()
    flat = np.arange(math.prod(tokens)).reshape(tokens)[tuple(spans)].reshape(-1)
    index = as_index(flat, weights)
    return DenseBasis.of_weights(weights[..., index, :][..., index])


def _check_centres(centres: Array, d: int) -> int:
    check_array(centres, "centres", (2,), (f"(K, {d})",))
    if int(centres.shape[1]) != d:
        raise ValueError(f"centres must have shape (K, {d}) for a {d}-D grid, got {shape_str(tuple(centres.shape))}")
    return int(centres.shape[0])


def _wrapped_difference(rel: RelativeOffsets, centres: Array) -> Array:
    """:math:`\\delta_o - \\Delta_h`, ``(K, O, d)``; on a torus the representative in :math:`[-s/2, s/2)`."""
    diff = table_on(rel, "offsets", centres)[None] - centres[:, None, :]
    if rel.boundary == "periodic":
        size = of(centres).asarray(np.asarray(rel.grid, dtype=np.float64), centres)
        return (diff + size / 2) % size - size / 2  # a Python-style remainder on both backends
    return diff
