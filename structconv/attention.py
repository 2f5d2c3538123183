r"""Attention mechanisms and attention bases (Andreoli §3, Def. 4–6).

An attention mechanism of type :math:`\langle M, P, N, P'\rangle` maps a main input
:math:`x` (``(M, P)``) and an auxiliary input :math:`z` (``(N, P')``) to an :math:`M\times N`
score matrix; an *attention convolution* uses one mechanism per basis member,
:math:`A_k = a(x, z;\Xi_k)`, so :math:`y = \sum_k a(x, z; \Xi_k)^\top x\,\Theta_k` (Eq. 10).
Self-attention takes :math:`z = x`.

The bi-affine mechanism (Def. 6, Eq. 11) is

.. math:: a(x, z; \Xi)_{mn} = x_m^\top\Lambda z_n + \lambda\cdot x_m + \lambda'\cdot z_n + \xi ,

the Transformer keeps a low-rank bilinear term :math:`\Lambda = \Lambda^{(\mathrm{key})}
\Lambda^{(\mathrm{query})\top}` (Eq. 12), and GAT keeps only the linear terms.  Scores are
then optionally passed through a LeakyReLU, masked in the log domain by a prior graph
(:math:`-\infty` off the graph) and normalised column-wise by a softmax, so that column
:math:`n` (output entry :math:`n`) holds weights over the inputs :math:`m` that sum to one.
A column with no allowed entry is all zeros (it attends to nothing), never ``NaN``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._backend import Array, einsum, is_torch, namespace, shape_str, zeros
from ._checks import check_array
from .basis import Basis
from .dense import DenseBasis


@dataclass(frozen=True)
class BiAffine:
    r"""A bi-affine mechanism with ``K`` heads (Def. 6), every term optional.

    Parameters
    ----------
    bilinear
        :math:`\Lambda`, shape ``(K, P, P')``.
    key, query
        A low-rank :math:`\Lambda_k = \Lambda_k^{(\mathrm{key})}\Lambda_k^{(\mathrm{query})\top}`,
        shapes ``(K, P, D)`` and ``(K, P', D)`` (Eq. 12); exclusive with ``bilinear``.
    linear, linear_aux
        :math:`\lambda` (``(K, P)``) and :math:`\lambda'` (``(K, P')``).
    offset
        :math:`\xi`, shape ``(K,)``.
    scale
        A factor applied to the scores (the Transformer's :math:`1/\sqrt D`).
    """

    bilinear: Array | None = None
    key: Array | None = None
    query: Array | None = None
    linear: Array | None = None
    linear_aux: Array | None = None
    offset: Array | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.bilinear is not None and (self.key is not None or self.query is not None):
            raise ValueError("give bilinear (a full Λ) or key and query (a low-rank Λ), not both")
        if (self.key is None) != (self.query is None):
            raise ValueError("key and query go together (Λ = key query^T)")
        present = [a for a in (self.bilinear, self.key, self.linear, self.linear_aux, self.offset) if a is not None]
        if not present:
            raise ValueError("a bi-affine mechanism needs at least one term")
        heads = {int(a.shape[0]) for a in present}
        if len(heads) != 1:
            raise ValueError(f"every term must have the same number of heads K, got {sorted(heads)}")
        if self.key is not None and self.query is not None:
            check_array(self.key, "key", (3,), ("(K, P, D)",))
            check_array(self.query, "query", (3,), ("(K, P', D)",))
            if int(self.key.shape[2]) != int(self.query.shape[2]):
                raise ValueError(
                    f"key and query must share D, got {shape_str(tuple(self.key.shape))} and "
                    f"{shape_str(tuple(self.query.shape))}"
                )

    @property
    def heads(self) -> int:
        """The number of heads ``K``."""
        for a in (self.bilinear, self.key, self.linear, self.linear_aux, self.offset):
            if a is not None:
                return int(a.shape[0])
        raise AssertionError("unreachable: __post_init__ requires a term")

    def _widths(self) -> tuple[int | None, int | None]:
        p = self.bilinear.shape[1] if self.bilinear is not None else None
        p = self.key.shape[1] if self.key is not None else p
        p = self.linear.shape[1] if self.linear is not None and p is None else p
        q = self.bilinear.shape[2] if self.bilinear is not None else None
        q = self.query.shape[1] if self.query is not None else q
        q = self.linear_aux.shape[1] if self.linear_aux is not None and q is None else q
        return (None if p is None else int(p)), (None if q is None else int(q))

    def scores(self, x: Array, z: Array) -> Array:
        """Scores of shape ``(B, K, M, N)`` for ``x`` (``(B, M, P)``) and ``z`` (``(B, N, P')``)."""
        p, q = self._widths()
        if p is not None and int(x.shape[-1]) != p:
            raise ValueError(f"x has width P={int(x.shape[-1])} but the mechanism expects P={p}")
        if q is not None and int(z.shape[-1]) != q:
            raise ValueError(f"z has width P'={int(z.shape[-1])} but the mechanism expects P'={q}")
        B, M, N, K = int(x.shape[0]), int(x.shape[1]), int(z.shape[1]), self.heads
        total = zeros((B, K, M, N), like=x)
        if self.bilinear is not None:
            total = total + einsum("bmp,kpr,bnr->bkmn", x, self.bilinear, z)
        if self.key is not None and self.query is not None:
            keys = einsum("bmp,kpd->bkmd", x, self.key)
            queries = einsum("bnr,krd->bknd", z, self.query)
            total = total + keys @ (queries.transpose(-1, -2) if is_torch(queries) else queries.swapaxes(-1, -2))
        if self.linear is not None:
            total = total + einsum("bmp,kp->bkm", x, self.linear)[..., None]
        if self.linear_aux is not None:
            total = total + einsum("bnr,kr->bkn", z, self.linear_aux)[:, :, None, :]
        if self.offset is not None:
            total = total + self.offset.reshape(1, K, 1, 1)
        return total * self.scale if self.scale != 1.0 else total


def _allowed(mask: Array, lib: Any) -> Array:
    """A boolean mask (``True`` = allowed) from a boolean or additive ``{-inf, 0}`` mask."""
    if str(mask.dtype).endswith("bool"):
        return mask
    finite = lib.isfinite(mask)
    if bool((mask[finite] != 0).any()) or bool((mask[~finite] > 0).any()):
        raise ValueError("mask must be boolean (True = allowed) or hold only -inf and 0")
    return finite


def masked_softmax(scores: Array, mask: Array | None = None) -> Array:
    r"""Column-wise softmax over :math:`m` (axis ``-2``) with log-domain masking.

    ``mask`` broadcasts to ``scores``: booleans (``True`` = allowed) or additive values in
    :math:`\{-\infty, 0\}`.  Columns with no allowed entry give zeros.
    """
    lib = namespace(scores)
    torch_side = is_torch(scores)
    if mask is not None:
        allowed = _allowed(mask, lib)
        scores = scores.masked_fill(~allowed, float("-inf")) if torch_side else lib.where(allowed, scores, -lib.inf)
    if torch_side:
        peak = scores.amax(-2, keepdim=True).detach()
        peak = peak.masked_fill(~lib.isfinite(peak), 0.0)  # an empty column: exp(-inf) = 0 below
        exp = (scores - peak).exp()
        return exp / exp.sum(-2, keepdim=True).clamp_min(1e-300)
    peak = scores.max(-2, keepdims=True)
    peak = lib.where(lib.isfinite(peak), peak, 0.0)
    exp = lib.exp(scores - peak)
    total = exp.sum(-2, keepdims=True)
    return exp / lib.where(total > 0, total, 1.0)


def attention_basis(
    x: Array,
    z: Array | None = None,
    mechanism: BiAffine | None = None,
    mask: Array | None = None,
    leaky_relu: float | None = None,
    normalize: bool = True,
) -> DenseBasis:
    r"""The attention basis :math:`A_k = \mathrm{softmax}_m(\mathrm{mask}(a(x, z; \Xi_k)))`, shape ``(B, K, M, N)``.

    Parameters
    ----------
    x
        Main input ``(B, M, P)`` or ``(M, P)``.
    z
        Auxiliary input ``(B, N, P')``; ``None`` for self-attention (:math:`z = x`).
    mechanism
        A :class:`BiAffine` mechanism (its heads are the members).
    mask
        Boolean (``True`` = may attend) or additive :math:`\{-\infty, 0\}`, broadcastable to
        ``(B, K, M, N)`` (e.g. ``(M, N)`` for a graph or a causal order).
    leaky_relu
        Negative slope of a LeakyReLU applied to the scores before masking (GAT), or ``None``.
    normalize
        Column-wise softmax (default); ``False`` keeps the masked scores (masked entries 0).

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import BiAffine, attention_basis
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 3))
    >>> A = attention_basis(x, mechanism=BiAffine(bilinear=np.ones((4, 3, 3))))
    >>> A.shape, bool(np.allclose(A.to_dense().sum(2), 1.0))
    ((2, 4, 5, 5), True)
    """
    if mechanism is None:
        raise ValueError("mechanism is required (e.g. structconv.BiAffine)")
    check_array(x, "x", (2, 3), ("(B, M, P)", "(M, P)"))
    x3 = x[None] if x.ndim == 2 else x
    z3 = x3 if z is None else (z[None] if z.ndim == 2 else z)
    if z is not None:
        check_array(z, "z", (2, 3), ("(B, N, P')", "(N, P')"))
        if int(z3.shape[0]) != int(x3.shape[0]):
            raise ValueError(f"x has batch {int(x3.shape[0])} but z has batch {int(z3.shape[0])}")
    scores = mechanism.scores(x3, z3)
    if leaky_relu is not None:
        lib = namespace(scores)
        scores = lib.where(scores >= 0, scores, scores * leaky_relu)
    if mask is not None:
        try:
            namespace(scores).broadcast_shapes(tuple(mask.shape), tuple(scores.shape))
        except (RuntimeError, ValueError) as err:
            raise ValueError(
                f"mask of shape {shape_str(tuple(mask.shape))} does not broadcast to the scores "
                f"{shape_str(tuple(scores.shape))} (B, K, M, N)"
            ) from err
    if normalize:
        weights = masked_softmax(scores, mask)
    elif mask is not None:
        allowed = _allowed(mask, namespace(scores))
        weights = (
            scores.masked_fill(~allowed, 0.0) if is_torch(scores) else namespace(scores).where(allowed, scores, 0.0)
        )
    else:
        weights = scores
    return DenseBasis(weights)


# --- relative-position attention on grids ------------------------------------------------------------
def _relative_offsets(grid: tuple[int, ...], periodic: bool) -> Any:
    """``(M, N, d)`` offsets :math:`\\delta_{mn} = \\mathrm{pos}(m) - \\mathrm{pos}(n)` (NumPy, row-major positions)."""
    import numpy as np

    pos = np.stack(np.meshgrid(*[np.arange(s) for s in grid], indexing="ij"), -1).reshape(-1, len(grid))
    delta = pos[:, None, :] - pos[None, :, :]
    if periodic:  # the representative of each offset closest to 0 on the torus
        size = np.asarray(grid)
        delta = (delta + size // 2) % size - size // 2
    return delta


def quadratic_scores(grid: Any, centres: Array, alpha: Array, boundary: str = "zero") -> Array:
    r"""Scores :math:`-\alpha_h\lVert\delta_{mn} - \Delta_h\rVert^2` of the quadratic encoding (Lemma 2), ``(H, M, N)``.

    With :math:`r_\delta = (\lVert\delta\rVert^2, \delta)` and
    :math:`v_h = -\alpha_h(1, -2\Delta_h)`, :math:`v_h\cdot r_\delta = -\alpha_h\lVert\delta - \Delta_h\rVert^2 +
    \alpha_h\lVert\Delta_h\rVert^2`; the last term is constant in :math:`m` and cancels in the
    column-wise softmax, so the scores are taken without it.  :math:`\delta_{mn}` is the position of
    input (key) :math:`m` minus that of output (query) :math:`n`, and on a ``"periodic"`` grid the
    difference :math:`\delta - \Delta_h` is wrapped to its shortest representative.
    """
    import numpy as np

    from .grid import BOUNDARIES, _grid

    g = _grid(grid)
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")
    if centres.ndim != 2 or int(centres.shape[1]) != len(g):
        raise ValueError(f"centres must have shape (H, {len(g)}), got {shape_str(tuple(centres.shape))}")
    if tuple(alpha.shape) != (int(centres.shape[0]),):
        raise ValueError(
            f"alpha must have shape (H,) = ({int(centres.shape[0])},), got {shape_str(tuple(alpha.shape))}"
        )
    if bool((alpha <= 0).any()):
        raise ValueError("alpha must be positive (it is the inverse width of each head's Gaussian)")
    delta = _relative_offsets(g, periodic=False).astype(np.float64)
    lib = namespace(centres)
    delta_t = lib.as_tensor(delta, dtype=centres.dtype, device=centres.device) if is_torch(centres) else delta
    diff = delta_t[None] - centres[:, None, None, :]  # (H, M, N, d)
    if boundary == "periodic":
        size = lib.as_tensor(g, dtype=centres.dtype, device=centres.device) if is_torch(centres) else np.asarray(g)
        diff = (
            lib.remainder(diff + size // 2, size) - size // 2
            if is_torch(centres)
            else (diff + size // 2) % size - size // 2
        )
    return -alpha[:, None, None] * (diff * diff).sum(-1)


def positional_basis(
    grid: Any,
    centres: Array,
    alpha: Array | None = None,
    boundary: str = "zero",
) -> DenseBasis:
    r"""Position-only attention heads with the quadratic encoding, shared by the batch: ``(H, M, N)``.

    ``alpha=None`` is the hard limit :math:`\alpha\to\infty`: head :math:`h` is one-hot on the input
    at offset :math:`\Delta_h` from each output, i.e. exactly the shift matrix of that offset (a
    ``"zero"`` grid leaves the columns whose target falls off the grid empty, which is zero
    padding; a ``"periodic"`` grid wraps).  With a finite :math:`\alpha` each column is the softmax
    of :func:`quadratic_scores` over the grid.
    """
    if alpha is None:
        import numpy as np

        from .grid import GridBasis, _grid

        g = _grid(grid)
        offsets = np.asarray(centres.detach().cpu().numpy() if is_torch(centres) else centres)
        if not np.allclose(offsets, np.round(offsets)):
            raise ValueError("hard attention (alpha=None) needs integer centres (the offsets it attends to)")
        like = centres if is_torch(centres) and centres.is_floating_point() else None
        shifts = GridBasis(g, g, np.round(offsets).astype(np.int64), 1, boundary, like=like)
        return DenseBasis(shifts.to_dense())
    return DenseBasis(masked_softmax(quadratic_scores(grid, centres, alpha, boundary)))


def positional_shift_basis(
    grid: Any,
    centres: Array,
    alpha: Array,
    boundary: str = "zero",
    threshold: float = 1e-12,
) -> Basis:
    r"""Soft quadratic heads run as renormalised, truncated Gaussian shift bases (DESIGN.md §3).

    A position-only head's unnormalised weight :math:`e^{-\alpha_h\lVert\delta - \Delta_h\rVert^2}`
    depends on the offset :math:`\delta` alone, so the head is a one-member
    :class:`~structconv.GridBasis` with those tap weights, each column renormalised over the taps
    that fall on the grid: the softmax of :func:`positional_basis` without its :math:`M\times N`
    score matrix.  Taps whose weight is below ``threshold`` times the largest are dropped (a box
    of radius :math:`\lceil\sqrt{\ln(1/\mathrm{threshold})/\alpha_h}\rceil` around
    :math:`\Delta_h`), which moves every weight by at most about ``threshold`` times the number of
    dropped taps.  Gradients flow to ``centres`` and ``alpha``.  Returns the heads as one basis
    (a :class:`~structconv.ConcatBasis` of ``H`` grid bases).
    """
    import math

    import numpy as np

    from .composite import ConcatBasis
    from .grid import GridBasis, _grid

    g = _grid(grid)
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must lie in (0, 1), got {threshold!r}")
    if centres.ndim != 2 or int(centres.shape[1]) != len(g) or tuple(alpha.shape) != (int(centres.shape[0]),):
        raise ValueError(
            f"centres must have shape (H, {len(g)}) and alpha (H,), got {shape_str(tuple(centres.shape))} "
            f"and {shape_str(tuple(alpha.shape))}"
        )
    heads = []
    lib = namespace(centres)
    for h in range(int(centres.shape[0])):
        a = float(alpha[h].detach() if is_torch(alpha) else alpha[h])  # the radius is not differentiated
        if a <= 0:
            raise ValueError("alpha must be positive (it is the inverse width of each head's Gaussian)")
        radius = math.ceil(math.sqrt(math.log(1.0 / threshold) / a))
        centre = np.asarray(centres[h].detach().cpu().numpy() if is_torch(centres) else centres[h], dtype=np.float64)
        lo = np.floor(centre).astype(np.int64) - radius
        hi = np.ceil(centre).astype(np.int64) + radius
        if boundary == "periodic":  # no more taps than the torus has pixels: each pixel read once
            span = np.asarray(g)
            width = np.minimum(hi - lo + 1, span)
            lo = np.round(centre).astype(np.int64) - width // 2
            hi = lo + width - 1
        else:
            size = np.asarray(g)
            lo, hi = np.maximum(lo, -(size - 1)), np.minimum(hi, size - 1)
        axes = [np.arange(a0, b0 + 1) for a0, b0 in zip(lo, hi, strict=True)]
        offsets = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(g))
        if is_torch(centres):
            taps = lib.as_tensor(offsets, dtype=centres.dtype, device=centres.device)
        else:
            taps = offsets.astype(centres.dtype)
        diff = taps - centres[h]
        weights = lib.exp(-alpha[h] * (diff * diff).sum(-1))[None]
        heads.append(GridBasis(g, g, offsets, 1, boundary, weights=weights, normalize=True))
    return ConcatBasis(heads)
