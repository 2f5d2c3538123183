r"""Relative-position attention on grids (Cordonnier et al. §3–4, their Eq. 5).

On a grid of ``M`` positions the score of a relative-position head depends on the offset
:math:`\delta = \mathrm{pos}(m) - \mathrm{pos}(n)` from the output (query) :math:`n` to the
input (key) :math:`m`, and, for the content terms, on the query's features.  With content it is
the four terms of Eq. 5,

.. math::

    a_{mn} = \underbrace{q_n\cdot k_m}_{\text{content}}
           + \underbrace{q_n\cdot\hat W r_\delta}_{\text{query-position}}
           + \underbrace{u\cdot k_m}_{\text{key bias}}
           + \underbrace{v\cdot\hat W r_\delta}_{\text{position}} ,

(:class:`RelativeAttention`), and without content only the last term is left: a function of
:math:`\delta` alone, so the softmax of a head is the same for every image and every output up
to the grid border, i.e. a renormalised convolution.  Three such heads are provided:

* :class:`QuadraticPosition`: :math:`-\alpha_h\lVert\delta - \Delta_h\rVert^2`, the quadratic
  encoding :math:`r_\delta = (\lVert\delta\rVert^2, \delta)` of Lemma 2 (``D_p = d + 1``);
* :class:`GaussianPosition`: :math:`-\tfrac12\lVert S_h(\delta - \Delta_h)\rVert^2`, a
  non-isotropic Gaussian with :math:`\Sigma_h^{-1} = S_h^\top S_h` positive semi-definite by
  construction;
* :class:`LearnedPosition`: :math:`t_h\cdot r_\delta` with learned per-axis tables,
  :math:`r_\delta = (r^{(1)}_{\delta_1}, \dots, r^{(d)}_{\delta_d})` (:math:`\hat W^\top v`
  collapses to one vector :math:`t_h` per head).

A position-only mechanism scores the ``O`` distinct offsets once (:meth:`~PositionalMechanism.offset_scores`)
and :meth:`~PositionalMechanism.basis` returns the heads as one ``(K, M, N)`` basis shared by the
batch: dense, or as renormalised, truncated weighted shift bases when that is cheaper.
On a ``"zero"`` grid offsets range over :math:`-(s-1)\dots s-1` per axis; on a ``"periodic"``
one over the torus, each difference wrapped to its shortest representative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import Array, as_index, einsum, is_floating, namespace, native, of, shape_str, to_numpy
from ..backend.checks import check_array
from ..bases.attention import masked_softmax
from ..bases.base import Basis
from ..bases.dense import DenseBasis
from ..bases.grid import GridBasis, _grid
from ..bases.kronecker import KroneckerBasis
from ..bases.window import AxisBands, Window, block_size
from .attention import Mechanism
from .relative import (
    RelativeAttention,
    RelativeOffsets,
    _axis_sum,
    _check_tables,
    _split,
    check_host_memory,
    relative_offsets,
    table_on,
)

__all__ = [
    "GaussianPosition",
    "LearnedPosition",
    "PositionalMechanism",
    "QuadraticPosition",
    "RelativeAttention",
    "RelativeOffsets",
    "positional_basis",
    "relative_offsets",
]

#: Log-range of a head's weights beyond which :meth:`PositionalMechanism.basis` stays dense
#: (the shift form holds the weights relative to one shift, which must not under- or overflow).
_LOG_RANGE = 60.0

#: A tap of the shift form (a depthwise convolution) is a memory-bound read of the activations
#: while a dense entry is a GEMM flop: a tap is costed as 16 dense entries (benchmarks/bench_positional.py,
#: Gaussian heads), so the shift form is chosen only below that.
_SHIFT_COST = 16


def _detached(a: Array) -> np.ndarray:
    xp = namespace(a)
    return to_numpy(xp.astype(a, xp.float64))


#: Sides up to which no window is built: the exact per-axis factors then cost no more than the
#: narrowest band (a block of 16 outputs reads at least 18 inputs), so the heads' widths and centres
#: are not read back from a GPU for nothing.
WINDOW_MIN_SIDE = 32


class PositionalMechanism(Mechanism):
    """A mechanism whose scores depend on the offset between key and query alone (no content)."""

    grid: tuple[int, ...]
    boundary: str

    @property
    def positional(self) -> bool:
        return True

    @property
    def relative(self) -> RelativeOffsets:
        """The offsets of this mechanism's grid."""
        return relative_offsets(self.grid, self.boundary)

    def offset_scores(self) -> Array:
        """Scores ``(K, O)``, one per head and offset of :attr:`relative`."""
        raise NotImplementedError

    def axis_scores(self) -> list[Array] | None:
        """Per-axis scores ``(K, L_i)`` whose sum is :meth:`offset_scores`, or ``None`` if not separable."""
        return None

    def kronecker(
        self, threshold: float | None = None, *, padding: tuple[int, ...] | None = None, banded: bool = True
    ) -> KroneckerBasis | None:
        """The heads as exact per-axis softmax factors, if separable.

        The result is a :class:`~structconv.bases.kronecker.KroneckerBasis`.  When the score is
        a sum of per-axis terms its exponential is a product, and so is the set of grid positions:
        the column-wise softmax over the grid is the Kronecker product of the per-axis softmaxes.
        With a ``threshold``, heads that are local (:meth:`window`) carry banded factors too,
        for the engine's ``"window"`` order.

        Parameters
        ----------
        threshold
            The L1 error per column the window may have (``None``: no window).
        padding
            Tokens on each side of each axis that are keys only (zero features, see
            :class:`~structconv.nn.PositionalAttention`): the basis is that of the inner grid
            (``"zero"`` boundary only).
        banded
            Whether to look for a window at all (``False``: no parameter is read back).
        """
        per_axis = self.axis_scores()
        if per_axis is None:
            return None
        pads = _pads(padding, self.grid, self.boundary)
        # Per axis an int64 index and a factor of at most 8 bytes an entry.
        check_host_memory(self.grid, "its per-axis softmaxes", 16 * self.heads * sum([s * s for s in self.grid]))
        factors = []
        for size, scores, p in zip(self.grid, per_axis, pads, strict=True):
            index = table_on(relative_offsets((size,), self.boundary), "axis_index0", scores)
            factor = masked_softmax(scores[:, index])
            factors.append(factor[:, p : size - p, p : size - p] if p else factor)
        window = None if threshold is None or not banded else self.window(threshold, padding=pads)
        return KroneckerBasis.of_weights(factors, window=window)  # softmaxes of finite scores: no host read

    def window(
        self, threshold: float, *, padding: tuple[int, ...] | None = None, min_side: int = WINDOW_MIN_SIDE
    ) -> Window | None:
        """Banded per-axis factors within ``threshold`` of the exact heads, or ``None`` (here: never local)."""
        return None

    #: Whether every head's score is a concave function of the offset (the Gaussian encodings).
    concave: bool = False

    def _weakest_best(self, flat: np.ndarray) -> np.ndarray:
        """Per head, :math:`\\min_n \\max_m a_{hmn}` from the offset scores ``flat`` (``(K, O)``).

        A column of a ``"zero"`` grid sees the offsets of a box, and the best score over a
        translated box is a quasi-concave function of the translation when the score is concave,
        so its minimum lies at a corner of the grid: only the :math:`2^d` corner columns are read
        (not the ``(K, M, N)`` scores, 9 GB at 64x64 tokens).  On a periodic grid every column
        sees every offset.
        """
        rel = self.relative
        if rel.boundary == "periodic":
            return np.asarray(flat.max(axis=1))
        columns = _corner_columns(self.grid) if self.concave else np.arange(rel.positions)
        return np.asarray(flat[:, rel.column_index(columns)].max(axis=1).min(axis=1))

    def dense_scores(self) -> Array:
        """Scores ``(K, M, N)`` of every pair: per axis where separable, else :meth:`offset_scores` gathered.

        A sum of per-axis terms is gathered per axis, ``(K, S_i, S_i)`` from the ``(K, L_i)``
        scores of the axis, and the axes are broadcast against each other into the pairs: no
        ``(K, O)`` table of offsets, no gather of :math:`KMN` entries (whose backward is a
        scatter-add of as many), only the final sum is :math:`KMN`.
        """
        per_axis = self.axis_scores()
        if per_axis is None:
            return self.relative.gather(self.offset_scores())
        check_host_memory(self.grid, "its dense scores", 8.0 * self.heads * self.relative.positions**2)
        d, K, total = len(self.grid), self.heads, None
        for i, (size, scores) in enumerate(zip(self.grid, per_axis, strict=True)):
            index = table_on(relative_offsets((size,), self.boundary), "axis_index0", scores)  # (m_i, n_i)
            term = scores[:, index].reshape([K] + [size if j in (i, d + i) else 1 for j in range(2 * d)])
            total = term if total is None else total + term
        assert total is not None
        M = self.relative.positions
        return total.reshape(K, M, M)

    def scores(self, x: Array, z: Array) -> Array:
        M = self.relative.positions
        if int(x.shape[1]) != M or int(z.shape[1]) != M:
            raise ValueError(
                f"a positional mechanism on the grid {self.grid} needs {M} "
                f"positions, got x with {int(x.shape[1])} and z with {int(z.shape[1])}"
            )
        return self.dense_scores()[None]

    def basis(
        self,
        threshold: float | None = None,
        *,
        representation: str = "auto",
        padding: tuple[int, ...] | None = None,
        banded: bool = True,
    ) -> Basis:
        r"""The heads as one ``(K, M, N)`` basis, shared by the batch.

        ``threshold=None`` gives the exact column-wise softmax (a Kronecker basis for separable
        heads, see below; a dense basis otherwise).  With a
        ``threshold`` in ``(0, 1)``, head :math:`h` keeps the offsets whose score is at least
        :math:`\min_n \max_m a_{hmn} + \ln(\mathrm{threshold})` and runs as one renormalised
        weighted :class:`~structconv.GridBasis` (a Gaussian shift kernel); every dropped weight is then
        below ``threshold`` times the largest weight of its own column, so each column moves by
        at most ``threshold`` times the number of dropped offsets (relative L1).  The shift form
        is used only when its taps number fewer than 1/16 of the dense entries (a tap is a pass
        over the activations, a dense entry a GEMM flop) and the weights' range fits the dtype;
        otherwise the dense softmax is returned.  Gradients flow to the
        mechanism's parameters either way (the kept set itself is not differentiated).
        ``representation="shifts"`` insists on the shift form, ``"dense"`` on the dense softmax.
        ``padding`` tokens on each side of each axis are keys only (zero features): the basis is
        then that of the grid within them (``"zero"`` boundary only).

        Heads whose scores are a sum of per-axis terms (:class:`QuadraticPosition`,
        :class:`LearnedPosition`) are returned as the Kronecker product of per-axis softmaxes
        (:meth:`kronecker`) by ``"auto"`` and ``"kronecker"``, exact; with a ``threshold``, local
        heads (quadratic, on a grid with a side above :data:`WINDOW_MIN_SIDE`, unless
        ``banded=False``) also carry a window, which the engine's ``"window"`` order runs within
        L1 ``threshold`` per column of the exact heads when it is cheaper (:meth:`QuadraticPosition.window`): its
        per-axis passes cost :math:`2/\sqrt M` of the dense aggregation on a square grid, and the
        engine runs them as plain GEMMs (benchmarks/bench_positional.py times them).
        """
        form = representation
        if form not in ("auto", "shifts", "dense", "kronecker"):
            raise ValueError(f"representation must be 'auto', 'kronecker', 'shifts' or 'dense', got {form!r}")
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must lie in (0, 1) or be None, got {threshold!r}")
        if form in ("kronecker", "auto"):
            separable = self.kronecker(threshold, padding=padding, banded=banded)
            if separable is not None:
                return separable
            if form == "kronecker":
                raise ValueError(
                    f"{type(self).__name__} heads are not separable by axis; use representation='shifts' or 'dense'"
                )
        pads = _pads(padding, self.grid, self.boundary)
        return inner_positions(self._unseparated(threshold, form), self.grid, pads)

    def _unseparated(self, threshold: float | None, form: str) -> Basis:
        """:meth:`basis` over every token, dense or as shifts."""
        scores = self.offset_scores()
        rel = self.relative
        if threshold is None and form == "shifts":
            raise ValueError("the shift form needs a threshold in (0, 1)")
        if threshold is None or form == "dense":
            return DenseBasis.of_weights(masked_softmax(rel.gather(scores)))
        flat = _detached(scores)
        floor = self._weakest_best(flat)
        keep = flat >= (floor + math.log(threshold))[:, None]
        K, M = int(scores.shape[0]), rel.positions
        too_wide = bool((flat.max(axis=1) - floor > _LOG_RANGE).any())
        if too_wide and form == "shifts":
            raise ValueError(
                f"a head's weights span more than e^{_LOG_RANGE:g} across columns; the shift form would "
                "under- or overflow (use the dense form)"
            )
        if too_wide or (form == "auto" and _SHIFT_COST * int(keep.sum()) >= K * M):
            return DenseBasis.of_weights(masked_softmax(rel.gather(scores)))
        from ..bases.composite import ConcatBasis

        lib = namespace(scores)
        heads = []
        for h in range(K):
            chosen = np.flatnonzero(keep[h])
            weights = lib.exp(scores[h, as_index(chosen, scores)] - float(floor[h]))[None]
            heads.append(
                GridBasis(
                    self.grid, self.grid, rel.offsets[chosen], boundary=self.boundary, weights=weights, normalize=True
                )
            )
        return ConcatBasis(heads)


def window_radius(
    alpha: np.ndarray, dims: int, threshold: float, *, limit: int
) -> tuple[np.ndarray | None, np.ndarray]:
    r"""Per head, the least :math:`R \ge 1` with :math:`2d\,\varepsilon(\alpha, R) \le` ``threshold``, and the bound.

    :math:`\varepsilon` is that of :meth:`QuadraticPosition.window`, computed in the log domain
    (one-hot heads have :math:`\alpha` of :math:`10^4` and more).

    Returns
    -------
    tuple
        ``(radius, bound)``, ``(K,)`` each; ``radius`` is ``None`` if a head needs more than ``limit``.
    """
    R = np.arange(1, limit + 1, dtype=np.float64)[None, :]
    a = np.asarray(alpha, dtype=np.float64)[:, None]
    log_bound = math.log(4 * dims) + a / 4 - a * R * R - np.log1p(-np.exp(-a * (2 * R + 1)))
    ok = log_bound <= math.log(threshold)
    if not ok.any(axis=1).all():
        return None, np.full(len(alpha), np.inf)
    first = ok.argmax(axis=1)
    return (first + 1).astype(np.int64), np.exp(log_bound[np.arange(len(alpha)), first])


def _pads(padding: tuple[int, ...] | None, tokens: tuple[int, ...], boundary: str) -> tuple[int, ...]:
    """``padding`` checked against the grid of ``tokens`` it lies within (``None``: none)."""
    if padding is None:
        return (0,) * len(tokens)
    if boundary == "periodic" and any([int(p) for p in padding]):
        raise ValueError(f"padding={padding} adds zero tokens beyond the grid, and a periodic grid has no beyond")
    # Lists, not generators: torch.compile traces a layer's forward through here.
    pads = tuple([int(p) for p in padding])
    if len(pads) != len(tokens) or any([p < 0 or 2 * p >= s for p, s in zip(pads, tokens, strict=True)]):
        raise ValueError(f"padding must give each axis of the grid {tokens} fewer than half its tokens, got {padding}")
    return pads


def inner_positions(basis: Basis, tokens: tuple[int, ...], padding: tuple[int, ...]) -> Basis:
    """``basis`` over the grid ``tokens`` restricted to the positions ``padding`` away from its borders.

    As keys and as queries: the tokens beyond have zero features (they add nothing to a sum)
    and are no outputs.  Their weights stay in each column's softmax, so a head normalises over
    them as over any key.
    """
    if not any(padding):
        return basis
    spans = [slice(p, s - p) for s, p in zip(tokens, padding, strict=True)]
    if isinstance(basis, KroneckerBasis):  # the inner tokens are a product set: restrict every factor
        if basis.window is not None:
            raise ValueError("a windowed basis bands its outputs: build it with padding rather than restrict it")
        return KroneckerBasis.of_weights([f[:, span, span] for f, span in zip(basis.factors, spans, strict=True)])
    weights = basis.to_dense()
    flat = np.arange(math.prod(tokens)).reshape(tokens)[tuple(spans)].reshape(-1)
    index = as_index(flat, weights)
    return DenseBasis.of_weights(weights[..., index, :][..., index])


def _corner_columns(grid: tuple[int, ...]) -> np.ndarray:
    """The flat indices of the :math:`2^d` corners of ``grid``."""
    corners = np.stack(np.meshgrid(*[np.unique([0, s - 1]) for s in grid], indexing="ij"), -1).reshape(-1, len(grid))
    return np.asarray(np.ravel_multi_index(tuple(corners.T), grid))


def _check_centres(centres: Array, d: int, name: str = "centres") -> int:
    check_array(centres, name, (2,), (f"(K, {d})",))
    if int(centres.shape[1]) != d:
        raise ValueError(f"{name} must have shape (K, {d}) for a {d}-D grid, got {shape_str(tuple(centres.shape))}")
    return int(centres.shape[0])


def _wrapped_difference(rel: RelativeOffsets, centres: Array) -> Array:
    """:math:`\\delta_o - \\Delta_h` for every head and offset, ``(K, O, d)``, wrapped on a torus.

    Each component is brought to its nearest representative, in :math:`[-s/2, s/2)` for a side
    :math:`s` (half a side, not :math:`\\lfloor s/2\\rfloor`: on odd sides a non-integer
    difference of :math:`\\lfloor s/2\\rfloor + 0.7` is nearer through the border).
    """
    diff = table_on(rel, "offsets", centres)[None] - centres[:, None, :]
    if rel.boundary == "periodic":
        size = of(centres).asarray(np.asarray(rel.grid, dtype=np.float64), centres)
        return (diff + size / 2) % size - size / 2  # a Python-style remainder on both backends
    return diff


@dataclass(frozen=True, eq=False)
class QuadraticPosition(PositionalMechanism):
    r"""Isotropic Gaussian heads: :math:`a_{hmn} = -\alpha_h\lVert\delta_{mn} - \Delta_h\rVert^2` (Lemma 2).

    This is :math:`v_h\cdot r_\delta` for :math:`r_\delta = (\lVert\delta\rVert^2, \delta)` and
    :math:`v_h = -\alpha_h(1, -2\Delta_h)` without the constant :math:`-\alpha_h\lVert\Delta_h\rVert^2`,
    which the column-wise softmax ignores (and which would cost float precision).

    Parameters
    ----------
    grid
        The grid sizes.
    centres
        :math:`\Delta_h`, shape ``(K, d)``: the offset each head attends to.
    alpha
        :math:`\alpha_h > 0`, shape ``(K,)``: inverse widths.
    boundary
        ``"zero"`` or ``"periodic"``.
    positive
        ``True`` when ``alpha`` is positive by construction (e.g. an exponential), which skips
        checking its values.
    """

    grid: tuple[int, ...]
    centres: Array
    alpha: Array
    boundary: str = "zero"
    positive: bool = field(default=False, repr=False, kw_only=True)
    concave = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _grid(self.grid))
        K = _check_centres(self.centres, len(self.grid))
        if tuple(self.alpha.shape) != (K,):
            raise ValueError(f"alpha must have shape (K,) = ({K},), got {shape_str(tuple(self.alpha.shape))}")
        # positive=True: the caller guarantees it (alpha = exp(log alpha)), so no GPU value is read back here
        if not self.positive and bool((self.alpha <= 0).any()):
            raise ValueError("alpha must be positive (it is the inverse width of each head's Gaussian)")
        relative_offsets(self.grid, self.boundary)

    @property
    def heads(self) -> int:
        return int(self.centres.shape[0])

    def offset_scores(self) -> Array:
        diff = _wrapped_difference(self.relative, self.centres)
        return -self.alpha[:, None] * (diff * diff).sum(-1)

    def axis_scores(self) -> list[Array]:
        out = []
        for i, size in enumerate(self.grid):
            diff = _wrapped_difference(relative_offsets((size,), self.boundary), self.centres[:, i : i + 1])
            out.append(-self.alpha[:, None] * diff[..., 0] ** 2)
        return out

    def window(
        self, threshold: float, *, padding: tuple[int, ...] | None = None, min_side: int = WINDOW_MIN_SIDE
    ) -> Window | None:
        r"""Each head truncated to a window of radius :math:`R_h` per axis, within L1 ``threshold`` of its softmax.

        Along an axis a head's weights for query :math:`n` are
        :math:`p(m) \propto e^{-\alpha(m - t)^2}`, :math:`t = n + \Delta`, over the keys
        :math:`m` of the axis (with ``padding``, the zero tokens too).  The window keeps the
        offsets :math:`\delta = m - n` in :math:`[\lceil\min(\Delta, 0)\rceil - R,
        \lfloor\max(\Delta, 0)\rfloor + R]` and renormalises over them.  Whether :math:`t` lies
        among the keys or beyond them, every dropped key is farther from :math:`t` than
        :math:`R` plus its rank among the dropped keys on its side, while the nearest key is
        within :math:`\tfrac12` of :math:`t` (or is the nearest border, which a dropped key
        beyond the window only moves away from); so the dropped mass is at most

        .. math:: \varepsilon(\alpha, R) = 2\,e^{\alpha/4}\sum_{j\ge0} e^{-\alpha(R + j)^2}
                  \le \frac{2\,e^{\alpha/4 - \alpha R^2}}{1 - e^{-\alpha(2R + 1)}} .

        Renormalising moves a column by twice the dropped mass in L1, and a product over
        :math:`d` axes by at most the sum of its factors' moves, so a column of the windowed
        head is within :math:`2d\,\varepsilon(\alpha_h, R_h)` of the exact one in L1 and each
        output :math:`y_n` within that times :math:`\sum_h \max_m\lVert x_m\Theta_h\rVert_\infty`.
        :math:`R_h \ge 1` is the least radius meeting ``threshold``.

        The radius is read from the current :math:`\alpha_h` and :math:`\Delta_h` (one read of
        :math:`K(d + 1)` numbers from a GPU); the window's weights stay differentiable.

        Parameters
        ----------
        threshold
            The largest L1 distance of a column from the exact softmax, in ``(0, 1)``.
        padding
            As for :meth:`kronecker`.
        min_side
            Build no window unless an axis has more positions (:data:`WINDOW_MIN_SIDE`: the
            exact factors then cost no more than the narrowest band, and nothing is read).

        Returns
        -------
        Window or None
            ``None`` on grids up to ``min_side``, when a radius would need more than the grid's
            largest side, or when a periodic window would hold a whole axis.
        """
        if not 0.0 < threshold < 1.0:  # NaN fails too
            raise ValueError(f"threshold must lie in (0, 1), got {threshold!r}")
        pads = _pads(padding, self.grid, self.boundary)
        inner = [s - 2 * p for s, p in zip(self.grid, pads, strict=True)]
        if max(inner) <= min_side:
            return None
        alpha = _detached(self.alpha)
        centres = _detached(self.centres)
        radius, bound = window_radius(alpha, len(self.grid), threshold, limit=max(self.grid))
        if radius is None:
            return None
        axes = []
        for i, (tokens, size, p) in enumerate(zip(self.grid, inner, pads, strict=True)):
            bands = self._axis_bands(i, tokens, size, p, centres[:, i], radius)
            if bands is None:
                return None
            axes.append(bands)
        return Window(tuple(axes), radius, bound, float(threshold))

    def _axis_bands(
        self, i: int, tokens: int, size: int, pad: int, centre: np.ndarray, radius: np.ndarray
    ) -> AxisBands | None:
        """Axis ``i``'s blocks: ``size`` queries, keys ``pad`` beyond them on each side (or wrapped)."""
        periodic = self.boundary == "periodic"
        if periodic:
            centre = (centre + tokens / 2) % tokens - tokens / 2
            lows, highs = np.ceil(centre - radius), np.floor(centre + radius)
            if int((highs - lows).max()) + 1 >= tokens:
                return None  # the window would hold the whole torus
        else:
            reach = size - 1 + pad  # the farthest key
            lows = np.maximum(np.ceil(np.minimum(centre, 0.0)) - radius, -reach)
            highs = np.minimum(np.floor(np.maximum(centre, 0.0)) + radius, reach)
        low, width = int(lows.min()), int(highs.max() - lows.min()) + 1
        b = block_size(width, size)
        nb, span = -(-size // b), b + width - 1
        delta = low + np.arange(span)[None, :] - np.arange(b)[:, None]  # (b, span): the offset of each entry
        own = (delta >= lows[:, None, None]) & (delta <= highs[:, None, None])  # (K, b, span)
        keys = (np.arange(nb) * b)[:, None] + low + np.arange(span)[None, :]  # (nb, span)
        outputs = (np.arange(nb) * b)[:, None] + np.arange(b)[None, :]  # (nb, b)
        real = np.ones_like(keys, dtype=bool) if periodic else (keys >= -pad) & (keys <= size - 1 + pad)
        allowed = own[:, None] & real[None, :, None, :] & (outputs < size)[None, :, :, None]  # (K, nb, b, span)
        scores = self.axis_scores()[i]  # (K, L) over the tokens' offsets of this axis
        ids = relative_offsets((tokens,), self.boundary).axis_ids[0][np.clip(delta + tokens - 1, 0, 2 * tokens - 2)]
        band = scores[:, as_index(ids, scores)]  # (K, b, span)
        lib = native(band)
        band = lib.broadcast_to(band[:, None], (self.heads, nb, b, span))
        mask = of(band).asarray(allowed, band, "bool")
        weights = masked_softmax(band.swapaxes(-1, -2), mask.swapaxes(-1, -2)).swapaxes(-1, -2)
        return AxisBands(weights, size, low, width, periodic)


@dataclass(frozen=True, eq=False)
class GaussianPosition(PositionalMechanism):
    r"""Non-isotropic Gaussian heads: :math:`-\tfrac12 (\delta - \Delta_h)^\top\Sigma_h^{-1}(\delta - \Delta_h)`.

    :math:`\Sigma_h^{-1} = S_h^\top S_h` with ``inv_sqrt_cov`` :math:`= S_h` (``(K, d, d)``,
    unconstrained), so the precision is positive semi-definite for every value of the
    parameter.  :math:`S_h = \sqrt{2\alpha_h}\,I` recovers :class:`QuadraticPosition`.  In 2-D
    the precision is the paper's :math:`\begin{pmatrix} a & b\\ b & c\end{pmatrix}`.

    Parameters
    ----------
    grid
        The grid's sizes :math:`(s_1, \dots, s_d)`.
    centres
        :math:`\Delta_h`, ``(K, d)``: each head's preferred offset.
    inv_sqrt_cov
        :math:`S_h`, ``(K, d, d)``.
    boundary
        ``"zero"`` (offsets within the grid) or ``"periodic"`` (wrapped offsets).
    """

    grid: tuple[int, ...]
    centres: Array
    inv_sqrt_cov: Array
    boundary: str = "zero"
    concave = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _grid(self.grid))
        d = len(self.grid)
        K = _check_centres(self.centres, d)
        if tuple(self.inv_sqrt_cov.shape) != (K, d, d):
            raise ValueError(
                f"inv_sqrt_cov must have shape (K, d, d) = ({K}, {d}, {d}), "
                f"got {shape_str(tuple(self.inv_sqrt_cov.shape))}"
            )
        relative_offsets(self.grid, self.boundary)

    @property
    def heads(self) -> int:
        return int(self.centres.shape[0])

    def precision(self) -> Array:
        r""":math:`\Sigma_h^{-1} = S_h^\top S_h`, ``(K, d, d)``."""
        return einsum("kij,kil->kjl", self.inv_sqrt_cov, self.inv_sqrt_cov)

    def offset_scores(self) -> Array:
        diff = _wrapped_difference(self.relative, self.centres)
        proj = einsum("kij,koj->koi", self.inv_sqrt_cov, diff)
        return -0.5 * (proj * proj).sum(-1)


@dataclass(frozen=True, eq=False)
class LearnedPosition(PositionalMechanism):
    r"""Learned relative embeddings, position only: :math:`a_{hmn} = t_h\cdot r_{\delta_{mn}}`.

    :math:`r_\delta` concatenates one row per axis, :math:`r^{(i)}_{\delta_i}` from ``tables[i]``
    (``(L_i, D_i)``: a row table and a column table in 2-D), so :math:`D_p = \sum_i D_i`; the
    paper's :math:`v^\top\hat W r_\delta` is this with :math:`t_h = \hat W^\top v_h` (``weight``,
    ``(K, D_p)``).  The score is a sum of per-axis terms, computed per axis.

    Parameters
    ----------
    grid
        The grid's sizes :math:`(s_1, \dots, s_d)`.
    tables
        One ``(L_i, D_i)`` table per axis: a row per relative offset along that axis.
    weight
        :math:`t_h`, ``(K, D_p)`` with :math:`D_p = \sum_i D_i`.
    boundary
        ``"zero"`` (offsets within the grid) or ``"periodic"`` (wrapped offsets).
    """

    grid: tuple[int, ...]
    tables: tuple[Array, ...]
    weight: Array
    boundary: str = "zero"

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _grid(self.grid))
        object.__setattr__(self, "tables", tuple(self.tables))
        widths = _check_tables(self.tables, relative_offsets(self.grid, self.boundary))
        check_array(self.weight, "weight", (2,), ("(K, D_p)",))
        if int(self.weight.shape[1]) != sum(widths):
            raise ValueError(
                f"weight must have shape (K, D_p) with D_p = {sum(widths)} (the tables' widths {widths}), "
                f"got {shape_str(tuple(self.weight.shape))}"
            )

    @property
    def heads(self) -> int:
        return int(self.weight.shape[0])

    def axis_scores(self) -> list[Array]:
        widths = tuple(int(t.shape[1]) for t in self.tables)
        parts = _split(self.weight, widths, 1)
        return [w @ t.T for w, t in zip(parts, self.tables, strict=True)]

    def offset_scores(self) -> Array:
        return _axis_sum(self.axis_scores(), self.relative.lengths)


def positional_basis(
    grid: Any,
    centres: Array,
    alpha: Array | None = None,
    boundary: str = "zero",
) -> DenseBasis:
    r"""Quadratic-encoding heads as a dense ``(H, M, N)`` basis; ``alpha=None`` is the hard limit.

    Hard heads (:math:`\alpha\to\infty`) are one-hot on the input at offset :math:`\Delta_h` from
    each output, i.e. exactly the shift matrix of that offset (a ``"zero"`` grid leaves the
    columns whose target falls off the grid empty, which is zero padding; a ``"periodic"`` grid
    wraps), so ``centres`` must be integers.  With a finite ``alpha`` each column is the softmax
    of :class:`QuadraticPosition` over the grid.
    """
    if alpha is not None:
        basis = QuadraticPosition(grid, centres, alpha, boundary).basis(representation="dense")
        assert isinstance(basis, DenseBasis)
        return basis
    g = _grid(grid)
    _check_centres(centres, len(g))
    offsets = _detached(centres)
    if not np.allclose(offsets, np.round(offsets)):
        raise ValueError("hard attention (alpha=None) needs integer centres (the offsets it attends to)")
    like = centres if is_floating(centres) else None
    shifts = GridBasis(g, g, np.round(offsets).astype(np.int64), boundary=boundary, like=like)
    return DenseBasis(shifts.to_dense())
