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

from dataclasses import dataclass, field, fields
from typing import Any

from ..backend import Array, dtype_name, einsum, find, namespace, of, shape_str, zeros
from ..backend.checks import check_array, check_same_placement, flag
from ..bases.attention import AttentionBasis, Projections, check_scores_memory
from ..bases.scores import check_placement, finite_real
from .masks import MASK_SHAPES, check_mask, masked_softmax

__all__ = [
    "AttentionBasis",
    "BiAffine",
    "Combined",
    "Mechanism",
    "ScoreBias",
    "attention_basis",
    "content_and_position",
    "masked_softmax",
]


class Mechanism:
    r"""An attention mechanism with ``K`` heads: :math:`(x, z) \mapsto` scores ``(B, K, M, N)``.

    Mechanisms add and multiply entry-wise (``a + b``, ``a * b``): the scores of a sum are the
    sums of the scores, head by head, which is how content and position terms combine (Eq. 5 of
    Cordonnier et al.).  Scores may have a leading batch of 1 when they do not depend on the
    content (position-only mechanisms); they broadcast over the batch.
    """

    @property
    def heads(self) -> int:
        """The number of heads ``K``."""
        raise NotImplementedError

    def scores(self, x: Array, z: Array) -> Array:
        r"""The scores :math:`a(x_b, z_b; \Xi_k)_{mn}` of every head.

        Parameters
        ----------
        x
            The main input, ``(B, M, P)``.
        z
            The auxiliary input, ``(B, N, P')`` (``x`` again for self-attention).

        Returns
        -------
        Array
            ``(B, K, M, N)``, or ``(1, K, M, N)`` for scores that do not depend on the content.
        """
        raise NotImplementedError

    @property
    def positional(self) -> bool:
        """Whether the scores ignore the content of ``x`` and ``z`` (then one basis serves the batch)."""
        return False

    def arrays(self) -> dict[str, Array]:
        """The mechanism's arrays by argument name, which must share ``x``'s backend, device and dtype."""
        return {}

    def __add__(self, other: Mechanism) -> Mechanism:
        return Combined(self, other, op="sum")

    def __mul__(self, other: Mechanism) -> Mechanism:
        return Combined(self, other, op="product")


@dataclass(frozen=True, eq=False)
class Combined(Mechanism):
    """The entry-wise sum or product of two mechanisms with the same number of heads.

    Built by ``left + right`` and ``left * right``.

    Parameters
    ----------
    left, right
        The two mechanisms (:class:`Mechanism`), with the same number of heads.
    op
        ``"sum"`` or ``"product"``.
    """

    left: Mechanism
    right: Mechanism
    op: str = field(default="sum", kw_only=True)

    def __post_init__(self) -> None:
        for name, part in (("left", self.left), ("right", self.right)):
            if not isinstance(part, Mechanism):
                raise TypeError(f"{name} must be a structconv Mechanism, got {type(part).__name__}")
        if self.op not in ("sum", "product"):
            raise ValueError(f"op must be 'sum' or 'product', got {self.op!r}")
        if self.left.heads != self.right.heads:
            raise ValueError(
                f"mechanisms combine head by head: the {self.op} of {self.left.heads} and "
                f"{self.right.heads} heads is undefined"
            )

    @property
    def heads(self) -> int:
        return self.left.heads

    @property
    def positional(self) -> bool:
        return self.left.positional and self.right.positional

    def arrays(self) -> dict[str, Array]:
        named = self.left.arrays()
        for name, a in self.right.arrays().items():
            named[f"{name} (of the right operand)" if name in named else name] = a
        return named

    def scores(self, x: Array, z: Array) -> Array:
        a, b = self.left.scores(x, z), self.right.scores(x, z)
        return a + b if self.op == "sum" else a * b


@dataclass(frozen=True, eq=False, kw_only=True)
class BiAffine(Mechanism):
    r"""A bi-affine mechanism with ``K`` heads (Def. 6), every term optional.

    Every argument is a keyword (no term comes first).

    Parameters
    ----------
    bilinear
        :math:`\Lambda`, shape ``(K, P, P')``.
    key, query
        A low-rank :math:`\Lambda_k = \Lambda_k^{(\mathrm{key})}\Lambda_k^{(\mathrm{query})\top}`,
        shapes ``(K, P, D)`` and ``(K, P', D)`` (Eq. 12); exclusive with ``bilinear``.
    key_bias, query_bias
        ``(K, D)`` biases of the key and query projections (the Transformer's affine
        projections): :math:`(x_m W^k + b^k)\cdot(z_n W^q + b^q)` adds the linear terms
        :math:`\lambda = W^k b^q`, :math:`\lambda' = W^q b^k` and the offset :math:`b^k\cdot b^q`.
    linear, linear_aux
        :math:`\lambda` (``(K, P)``) and :math:`\lambda'` (``(K, P')``).
    offset
        :math:`\xi`, shape ``(K,)``.
    scale
        A factor applied to the scores (the Transformer's :math:`1/\sqrt D`), a finite real number
        (a NumPy scalar is taken as a Python ``float``, so it never promotes the scores' dtype).

    Every term shares one backend, dtype and device (nothing is converted silently).
    """

    bilinear: Array | None = None
    key: Array | None = None
    query: Array | None = None
    key_bias: Array | None = None
    query_bias: Array | None = None
    linear: Array | None = None
    linear_aux: Array | None = None
    offset: Array | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.bilinear is not None and (self.key is not None or self.query is not None):
            raise ValueError("give bilinear (a full Λ) or key and query (a low-rank Λ), not both")
        if (self.key is None) != (self.query is None):
            raise ValueError("key and query go together (Λ = key query^T)")
        if self.key is None and (self.key_bias is not None or self.query_bias is not None):
            raise ValueError("key_bias and query_bias belong to the key and query projections; give key and query")
        present = [a for a in (self.bilinear, self.key, self.linear, self.linear_aux, self.offset) if a is not None]
        if not present:
            raise ValueError("a bi-affine mechanism needs at least one term")
        heads = {int(a.shape[0]) for a in present}
        if len(heads) != 1:
            raise ValueError(f"every term must have the same number of heads K, got {sorted(heads)}")
        if self.bilinear is not None:
            check_array(self.bilinear, "bilinear", (3,), ("(K, P, P')",))
        if self.key is not None and self.query is not None:
            check_array(self.key, "key", (3,), ("(K, P, D)",))
            check_array(self.query, "query", (3,), ("(K, P', D)",))
            if int(self.key.shape[2]) != int(self.query.shape[2]):
                raise ValueError(
                    f"key and query must share D, got {shape_str(tuple(self.key.shape))} and "
                    f"{shape_str(tuple(self.query.shape))}"
                )
            want = (int(self.key.shape[0]), int(self.key.shape[2]))
            for name, b in (("key_bias", self.key_bias), ("query_bias", self.query_bias)):
                if b is not None and tuple(b.shape) != want:
                    raise ValueError(f"{name} must have shape (K, D) = {want}, got {shape_str(tuple(b.shape))}")
        for name, lin, dim in (("linear", self.linear, "P"), ("linear_aux", self.linear_aux, "P'")):
            if lin is not None:
                check_array(lin, name, (2,), (f"(K, {dim})",))
        if self.offset is not None:
            check_array(self.offset, "offset", (1,), ("(K,)",))
        check_same_placement(self.arrays())
        object.__setattr__(self, "scale", finite_real(self.scale, "scale", "e.g. 1/sqrt(D)"))

    def arrays(self) -> dict[str, Array]:
        named = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "scale"}
        return {name: a for name, a in named.items() if a is not None}

    @property
    def heads(self) -> int:
        for a in (self.bilinear, self.key, self.linear, self.linear_aux, self.offset):
            if a is not None:
                return int(a.shape[0])
        raise AssertionError("unreachable: __post_init__ requires a term")

    @property
    def transformer(self) -> bool:
        """Whether only the (affine) key and query projections are present: scaled dot-product attention."""
        return self.key is not None and all(
            a is None for a in (self.bilinear, self.linear, self.linear_aux, self.offset)
        )

    def _widths(self) -> tuple[int | None, int | None]:
        p = self.bilinear.shape[1] if self.bilinear is not None else None
        p = self.key.shape[1] if self.key is not None else p
        p = self.linear.shape[1] if self.linear is not None and p is None else p
        q = self.bilinear.shape[2] if self.bilinear is not None else None
        q = self.query.shape[1] if self.query is not None else q
        q = self.linear_aux.shape[1] if self.linear_aux is not None and q is None else q
        return (None if p is None else int(p)), (None if q is None else int(q))

    def check_inputs(self, x: Array, z: Array) -> None:
        """Raise a ``ValueError`` naming ``x`` or ``z`` if its width does not match the mechanism.

        Parameters
        ----------
        x
            The main input, ``(..., M, P)``.
        z
            The auxiliary input, ``(..., N, P')``.
        """
        p, q = self._widths()
        if p is not None and int(x.shape[-1]) != p:
            raise ValueError(f"x has width P={int(x.shape[-1])} but the mechanism expects P={p}")
        if q is not None and int(z.shape[-1]) != q:
            raise ValueError(f"z has width P'={int(z.shape[-1])} but the mechanism expects P'={q}")

    def projections(self, x: Array, z: Array) -> tuple[Array, Array]:
        """Keys ``(B, K, M, D)`` and queries ``(B, K, N, D)``, biases included.

        Parameters
        ----------
        x
            The main input, ``(B, M, P)``: the keys.
        z
            The auxiliary input, ``(B, N, P')``: the queries.

        Raises
        ------
        ValueError
            If the mechanism has no key and query projections.
        """
        return self.projector()(x, z)

    def projector(self) -> Projections:
        """The key and query projections as data (the scale is that of the scores)."""
        if self.key is None or self.query is None:
            raise ValueError("this mechanism has no key and query projections")
        scale = self.scale if self.transformer else 1.0
        return Projections(self.key, self.query, key_bias=self.key_bias, query_bias=self.query_bias, scale=scale)

    def scores(self, x: Array, z: Array) -> Array:
        self.check_inputs(x, z)
        B, M, N, K = int(x.shape[0]), int(x.shape[1]), int(z.shape[1]), self.heads
        total = zeros((B, K, M, N), like=x)
        if self.bilinear is not None:
            total = total + einsum("bmp,kpr,bnr->bkmn", x, self.bilinear, z)
        if self.key is not None and self.query is not None:
            keys, queries = self.projections(x, z)
            total = total + keys @ queries.swapaxes(-1, -2)
        if self.linear is not None:
            total = total + einsum("bmp,kp->bkm", x, self.linear)[..., None]
        if self.linear_aux is not None:
            total = total + einsum("bnr,kr->bkn", z, self.linear_aux)[:, :, None, :]
        if self.offset is not None:
            total = total + self.offset.reshape(1, K, 1, 1)
        return total * self.scale if self.scale != 1.0 else total


@dataclass(frozen=True, eq=False)
class ScoreBias(Mechanism):
    r"""Fixed additive scores :math:`a(x, z)_{bkmn} = \beta_{bkmn}`, whatever the inputs.

    Added to another mechanism (``BiAffine(...) + ScoreBias(beta)``) it is an additive attention
    mask with finite values, such as the float ``attn_mask`` of ``torch.nn.MultiheadAttention``
    (:math:`-\infty` entries belong in the basis's boolean ``mask`` instead).

    Parameters
    ----------
    bias
        :math:`\beta`, shape ``(B or 1, K, M, N)``, finite.
    """

    bias: Array

    def __post_init__(self) -> None:
        check_array(self.bias, "bias", (4,), ("(B or 1, K, M, N)",))
        lib = namespace(self.bias)
        if not bool(lib.isfinite(self.bias).all()):
            raise ValueError("bias must be finite (put -inf entries in the attention mask instead)")

    @property
    def heads(self) -> int:
        return int(self.bias.shape[1])

    def arrays(self) -> dict[str, Array]:
        return {"bias": self.bias}

    def scores(self, x: Array, z: Array) -> Array:
        B, M, N = int(x.shape[0]), int(x.shape[1]), int(z.shape[1])
        b, _, m, n = (int(s) for s in self.bias.shape)
        if (m, n) != (M, N) or b not in (1, B):
            raise ValueError(
                f"bias has shape {shape_str(tuple(self.bias.shape))} but the scores are "
                f"({B}, {self.heads}, {M}, {N}) (B, K, M, N)"
            )
        return self.bias


def attention_basis(
    x: Array,
    z: Array | None = None,
    *,
    mechanism: Mechanism,
    mask: Array | None = None,
    leaky_relu: float | None = None,
    normalize: bool = True,
) -> AttentionBasis:
    r"""The attention basis :math:`A_k = \mathrm{softmax}_m(\mathrm{mask}(a(x, z; \Xi_k)))`, shape ``(B, K, M, N)``.

    Parameters
    ----------
    x
        Main input ``(B, M, P)`` or ``(M, P)``.
    z
        Auxiliary input ``(B, N, P')``; ``None`` for self-attention (:math:`z = x`).
    mechanism
        A :class:`Mechanism`, e.g. :class:`BiAffine` (its heads are the members), a
        relative-position mechanism from :mod:`structconv.structures.positional`, or a sum of
        them; required (a keyword, like every argument after ``z``).
    mask
        Boolean (``True`` = may attend) or floating additive (only :math:`-\infty` = masked and
        0 = allowed), on the backend and device of ``x``, of shape ``(M, N)``, ``(K, M, N)`` or
        ``(B, K, M, N)`` where any dimension may be 1 instead (it is broadcast): e.g. ``(M, N)``
        for a graph or a causal order, ``(B, 1, M, 1)`` for padded inputs.  It may not enlarge
        the scores (a batch of 3 for a ``x`` of batch 1 is an error).  An additive mask may also
        be given over the keys (the inputs :math:`m`) alone, as ``(M,)`` or ``(B, M)`` (the
        shapes of torch's ``key_padding_mask``): it means ``(M, 1)`` or ``(B, 1, M, 1)``.  A
        boolean mask of those shapes is refused, since torch's ``key_padding_mask`` marks the keys
        to ignore with ``True``: pass ``~key_padding_mask[:, None, :, None]`` instead.  A 2-D mask
        that also reads as ``(M, N)`` (a batch of 1 and :math:`M = N`, say) is ``(M, N)``.
    leaky_relu
        Negative slope of a LeakyReLU applied to the scores before masking (GAT uses 0.2), or
        ``None``: a score :math:`s < 0` becomes :math:`\alpha s`.  Any finite real number
        :math:`\alpha`, as for ``torch.nn.LeakyReLU`` (a NumPy scalar is taken as a ``float``).
    normalize
        Column-wise softmax (default); ``False`` keeps the masked scores (masked entries 0).

    The mechanism's arrays and ``z`` must share the backend, device and dtype of ``x`` (under
    ``torch.autocast`` the dtypes may differ: its products convert them); the basis has ``x``'s dtype.

    Returns
    -------
    AttentionBasis
        It holds the scores, evaluated here, or (scaled dot-product attention) the key and query
        projections, from which the fused order attends without forming the scores.  Scaled
        dot-product attention plus scores that ignore the input (``BiAffine(key=..., query=...)
        + learned_scores(...)``, :func:`content_and_position`) keeps the projections too, the
        positional scores evaluated here as the basis' additive ``bias`` (``(1, K, M, N)``).

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import BiAffine, attention_basis
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 3))
    >>> A = attention_basis(x, mechanism=BiAffine(bilinear=np.ones((4, 3, 3))))
    >>> A.shape, bool(np.allclose(A.to_dense().sum(2), 1.0))
    ((2, 4, 5, 5), True)
    """
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"mechanism must be a structconv Mechanism (e.g. BiAffine), got {type(mechanism).__name__}")
    check_array(x, "x", (2, 3), ("(B, M, P)", "(M, P)"))
    x3 = x[None] if x.ndim == 2 else x
    z3 = x3 if z is None else (z[None] if z.ndim == 2 else z)
    if z is not None:
        check_array(z, "z", (2, 3), ("(B, N, P')", "(N, P')"))
        if int(z3.shape[0]) != int(x3.shape[0]):
            raise ValueError(f"x has batch {int(x3.shape[0])} but z has batch {int(z3.shape[0])}")
    check_placement({"x": x} | ({} if z is None else {"z": z}) | mechanism.arrays())
    if isinstance(mechanism, BiAffine):
        mechanism.check_inputs(x3, z3)
    shape = (int(x3.shape[0]), mechanism.heads, int(x3.shape[1]), int(z3.shape[1]))
    if mask is not None:
        mask = _over_keys(mask, shape, x3)
        check_mask(mask, x3, shape, arg="x", layout="(B, K, M, N)", expected=_EXPECTED, ranks=(2, 4))
    if leaky_relu is not None:
        leaky_relu = finite_real(leaky_relu, "leaky_relu", "the LeakyReLU's negative slope, e.g. 0.2, or None")
    flag(normalize, "normalize")
    if isinstance(mechanism, BiAffine) and mechanism.transformer:
        return AttentionBasis(x3, z3, mechanism.projector(), mask=mask, leaky_relu=leaky_relu, normalize=normalize)
    split = content_and_position(mechanism)
    if split is not None:
        content, position = split
        content.check_inputs(x3, z3)
        return AttentionBasis(
            x3, z3, content.projector(), mask=mask, leaky_relu=leaky_relu, normalize=normalize,
            bias=position.scores(x3, z3),
        )  # fmt: skip
    # The scores are formed here: refused before they are allocated if the device cannot hold them (a
    # mechanism that ignores the input forms one batch of them at least).
    check_scores_memory(x3, shape if isinstance(mechanism, BiAffine) else (1, *shape[1:]), 2, "its scores and weights")
    return AttentionBasis(x3, z3, mechanism.scores(x3, z3), mask=mask, leaky_relu=leaky_relu, normalize=normalize)


_EXPECTED = MASK_SHAPES + "; or additive over the keys alone, (M,) or (B, M)"


def _over_keys(mask: Any, shape: tuple[int, ...], like: Array) -> Any:
    """A mask over the keys alone, ``(M,)`` or ``(B, M)``, as the ``(M, 1)`` or ``(B, 1, M, 1)`` mask it means.

    Any other mask, and a mask of another backend than ``like`` (the inputs), is returned as given
    (:func:`check_mask` judges it: the backend first, as for every mask).  A 2-D mask that also reads
    as ``(M, N)`` keeps that meaning.  A boolean one is refused: torch's ``key_padding_mask`` of
    these shapes marks the keys to ignore with ``True``, where a structconv mask marks the allowed
    entries, and neither reading can be told from the values.
    """
    if find(mask) is not of(like):
        return mask
    B, _, M, N = shape
    got = tuple(int(s) for s in mask.shape)
    if len(got) == 1 and got != (M,):
        raise ValueError(
            f"mask of shape {shape_str(got)}: a 1-D mask is over the keys (the inputs m), so its shape must be "
            f"(M,) = ({M},)"
        )
    if len(got) != 1 and (got != (B, M) or (got[0] in (1, M) and got[1] in (1, N))):
        return mask
    if dtype_name(mask) == "bool":
        keys = "(M,)" if len(got) == 1 else "(B, M)"
        wanted = "(M, 1)" if len(got) == 1 else "(B, 1, M, 1)"
        index = "[:, None]" if len(got) == 1 else "[:, None, :, None]"
        raise ValueError(
            f"mask of shape {shape_str(got)} is a boolean mask over the keys {keys}, as torch's key_padding_mask, "
            f"where True = ignore the key; a structconv boolean mask means True = may attend, so neither is assumed: "
            f"pass mask=~key_padding_mask{index} (shape {wanted}, True = may attend) or an additive float mask "
            f"of shape {keys} (-inf = ignored key, 0 = allowed)"
        )
    return mask.reshape(M, 1) if len(got) == 1 else mask.reshape(B, 1, M, 1)


def content_and_position(mechanism: Mechanism) -> tuple[BiAffine, Mechanism] | None:
    r"""``(content, position)`` if ``mechanism`` is scaled dot-product attention plus input-independent scores.

    That is a sum (``a + b``, either side first) of a :attr:`BiAffine.transformer` mechanism and
    one whose scores ignore the inputs (:attr:`Mechanism.positional`, e.g.
    :func:`~structconv.learned_scores`): its scores :math:`s\,q_n\cdot k_m + eta_{mn}` are a
    dot product plus a bias, which torch's fused attention takes as its float mask.  ``None``
    for any other mechanism.

    Parameters
    ----------
    mechanism
        Any :class:`Mechanism`.
    """
    if not isinstance(mechanism, Combined) or mechanism.op != "sum":
        return None
    for content, position in ((mechanism.left, mechanism.right), (mechanism.right, mechanism.left)):
        if isinstance(content, BiAffine) and content.transformer and position.positional:
            return content, position
    return None
