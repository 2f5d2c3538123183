r"""The attention basis: softmax-normalised scores, normalised when an order needs them.

:class:`AttentionBasis` is the representation of :math:`A_{bk} = \mathrm{softmax}_m(\mathrm{mask}(a(x_b,
z_b; \Xi_k)))`; the mechanisms :math:`a` and the builder :func:`~structconv.attention_basis` live in
:mod:`structconv.structures.attention`, one layer up.  The basis holds data only (no mechanism):
either the scores, evaluated by the builder, or, for scaled dot-product attention, the
:class:`Projections` that give keys and queries, so that the fused order never forms the scores.
Nothing it runs calls back into the mechanism.  The weights are normalised afresh on each use
(no stored dense copy); a caller that needs them several times holds on to
:meth:`AttentionBasis.weights`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from ..backend import Array, concatenate, dtype_name, namespace, of, shape_str, x_theta, zeros
from ..backend.checks import check_memory
from .base import NO_ORDERS, Basis, Cost, OwnOrder, _PlacedByArray
from .dense import DenseBasis
from .scores import allowed_mask, finite_real, normalise


def check_scores_memory(like: Array, shape: tuple[int, ...], copies: int, what: str) -> None:
    """Refuse ``copies`` arrays of attention scores ``shape`` that cannot fit on ``like``'s device, before allocating.

    The scores themselves, which the dense orders form whichever order is chosen, through the
    package's one guard (:func:`~structconv.backend.checks.check_memory`).

    Parameters
    ----------
    like
        The inputs, whose device and dtype the scores take.
    shape
        The scores' shape ``(B, K, M, N)``.
    copies
        How many arrays of that shape are held at once (the scores and the weights: 2).
    what
        What would be formed, as the message says it.
    """
    check_memory(
        float(copies) * math.prod(shape) * like.dtype.itemsize,
        like,
        f"attention of {shape[2]:,} inputs to {shape[3]:,} outputs: {what} {shape_str(shape)} (B, K, M, N)",
        advice="use fewer tokens or a smaller batch, or torch tensors with BiAffine(key=..., query=...), whose "
        "fused 'sdpa' order does not form them",
    )


@dataclass(frozen=True, eq=False)
class Projections:
    r"""Affine key and query projections of scaled dot-product attention, ``K`` heads of width ``D``.

    The score of head :math:`k` is :math:`s\,(x_m W^k_k + b^k_k)\cdot(z_n W^q_k + b^q_k)`.

    Parameters
    ----------
    key, query
        :math:`W^k` ``(K, P, D)`` and :math:`W^q` ``(K, P', D)``.
    key_bias, query_bias
        :math:`b^k`, :math:`b^q`, ``(K, D)`` each, or ``None``.
    scale
        :math:`s`, e.g. :math:`1/\sqrt D`, a finite real number.

    Everything after ``query`` is a keyword.
    """

    key: Array
    query: Array
    _: KW_ONLY
    key_bias: Array | None = None
    query_bias: Array | None = None
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", finite_real(self.scale, "scale", "e.g. 1/sqrt(D)"))

    def __call__(self, x: Array, z: Array) -> tuple[Array, Array]:
        """Keys ``(B, K, M, D)`` of ``x`` ``(B, M, P)`` and queries ``(B, K, N, D)`` of ``z``."""
        keys, queries = x_theta(x, self.key), x_theta(z, self.query)
        if self.key_bias is not None:
            keys = keys + self.key_bias[None, :, None, :]
        if self.query_bias is not None:
            queries = queries + self.query_bias[None, :, None, :]
        return keys, queries

    def scores(self, x: Array, z: Array) -> Array:
        """The scores ``(B, K, M, N)``: keys against queries, scaled.

        Parameters
        ----------
        x
            The main input, ``(B, M, P)``: the keys.
        z
            The auxiliary input, ``(B, N, P')``: the queries.
        """
        keys, queries = self(x, z)
        product = keys @ queries.swapaxes(-1, -2)
        return product * self.scale if self.scale != 1.0 else product


#: The dtypes torch's fused attention kernels take, by device type (``None``: any other device).
_FUSED_DTYPES = {"cpu": ("float16", "bfloat16", "float32", "float64"), "cuda": ("float16", "bfloat16", "float32")}


def fused_width(device: str, dtype: str, width: int) -> int | None:
    r"""The head width at which torch's fused attention takes keys, queries and values of width up to ``width``.

    ``None`` where no fused kernel applies: ``scaled_dot_product_attention`` then runs its math
    kernel, which stores every score (:math:`M\times N` per head and instance).  Keys and queries
    widened by zero columns keep their dot products, values widened likewise give outputs whose
    first columns are the originals, so the width returned serves all three.  torch 2.13 asks
    (``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`` and ``cuda/sdp_utils.cpp``):

    * CPU, flash attention: q, k and v of one width and one dtype among float16, bfloat16,
      float32, float64; a mask of 2 or 4 dimensions, each the scores' or 1; no dropout;
      the last dimension contiguous.  Gradients are allowed.
    * CUDA, flash attention: float16 or bfloat16, one width up to 256, no mask; or
      memory-efficient attention: float16, bfloat16 or float32, key and query widths equal,
      every width a multiple of 8 (16-bit) or 4 (float32, sm80 and later), masks allowed
      (last dimension contiguous).  No kernel takes float64.
    * Any other device: none is known to apply.

    Attention dropout is taken by the CUDA kernels only (:func:`fused_dropout`).  An
    additive float mask that requires grad sends torch's CPU kernel to its math kernel; the
    backend's :meth:`~structconv.backend.kernels.Kernels.attention` then runs the fused forward
    with the mask as a constant and a chunked backward instead, so it counts as fused here.

    Parameters
    ----------
    device
        The device, as :func:`~structconv.backend.device_of` spells it (``"cpu"``, ``"cuda:0"``).
    dtype
        The dtype's name (``"float32"``).
    width
        The widest of the keys, queries and values.

    Examples
    --------
    >>> fused_width("cpu", "float64", 5), fused_width("cuda:0", "float32", 5), fused_width("cuda:0", "float64", 5)
    (5, 8, None)
    """
    kind = device.split(":")[0]
    if dtype not in _FUSED_DTYPES.get(kind, ()):
        return None
    return width if kind == "cpu" else -(-width // 8) * 8


def fused_dropout(device: str) -> bool:
    """Whether torch's fused attention kernels drop weights (``dropout_p``) on ``device``: CUDA's do, the CPU's not.

    torch 2.13's CPU flash kernel refuses ``dropout_p > 0`` (``sdp_utils_cpp.cpp``), and
    ``scaled_dot_product_attention`` then runs its math kernel, which stores every weight.

    Parameters
    ----------
    device
        The device, as :func:`~structconv.backend.device_of` spells it.

    Examples
    --------
    >>> fused_dropout("cpu"), fused_dropout("cuda:0")
    (False, True)
    """
    return device.split(":")[0] == "cuda"


def _padded(a: Array, width: int) -> Array:
    """``a`` with zero columns appended to its last axis up to ``width``."""
    extra = width - int(a.shape[-1])
    return a if extra == 0 else concatenate([a, zeros((*a.shape[:-1], extra), like=a)], -1)


def _as_4d(a: Array) -> Array:
    """``a`` (2-D to 4-D) with leading axes of size 1 up to 4 dimensions (a view)."""
    return a.reshape((1,) * (4 - a.ndim) + tuple(int(s) for s in a.shape))


class AttentionBasis(_PlacedByArray):
    r"""Softmax attention :math:`A_{bk} = \mathrm{softmax}_m(\mathrm{mask}(a(x_b, z_b; \Xi_k)))`, ``(B, K, M, N)``.

    The weights are materialised only when an order needs them (:meth:`to_dense`, the triangle's
    orders), afresh each time (the basis keeps no copy that a parameter changed in place would
    leave stale).  For a Transformer mechanism (:attr:`~structconv.BiAffine.transformer`) on a
    backend with a fused kernel (torch) the engine may instead run the whole layer as
    ``"sdpa"``: keys, queries and :math:`x\Theta_k` (or :math:`xU_k` for a
    :class:`~structconv.LowRank` parameter) by GEMMs, then
    ``torch.nn.functional.scaled_dot_product_attention``, which never stores the :math:`M\times N`
    weights.  Keys, queries and values are widened by zero columns to the one width torch's fused
    kernels need (:func:`~structconv.bases.attention.fused_width`), the mask is given in a layout
    they take, and a column with no allowed input attends to all of them and is zeroed after;
    where no fused kernel takes the dtype on the device (float64 on CUDA), the order's cost
    counts the scores torch's math kernel stores.  Both paths compute the same
    :math:`\sum_k A_k^\top x\Theta_k`.  Build it with :func:`~structconv.attention_basis`.

    Additive scores :math:`\beta` (``bias``, e.g. relative positions that do not depend on the
    input, ``(1, K, M, N)``) join the projections' scores before the softmax; the fused order
    hands them to the kernel as its float mask, so content plus position never forms the
    :math:`M\times N` weights either.  With ``dropout`` :math:`p` every order drops each weight
    independently with probability :math:`p` and scales the rest by :math:`1/(1-p)`, a fresh draw
    per contraction (the fused order in the kernel, through ``dropout_p``; the others on the
    weights they form): a basis with dropout is a random matrix, each contraction one sample.

    Parameters
    ----------
    x
        The main input, ``(B, M, P)``.
    z
        The auxiliary input, ``(B, N, P')`` (``x`` for self-attention).
    scores
        The raw scores ``(B or 1, K, M, N)``, or the :class:`Projections` that give them.
    mask, leaky_relu, normalize
        As for :func:`~structconv.attention_basis`, which checks every argument (this
        constructor checks none).
    bias
        Finite additive scores :math:`\beta`, ``(1 or B, K, M, N)`` (key :math:`m`, query
        :math:`n`), or ``None``.
    dropout
        :math:`p \in [0, 1)`, attention dropout of the weights (0: none).
    """

    __slots__ = (
        "_bias",
        "_depth",
        "_dropout",
        "_heads",
        "_leaky_relu",
        "_mask",
        "_normalize",
        "_projections",
        "_scores",
        "_x",
        "_z",
    )
    representation = "attention"

    def __init__(
        self,
        x: Array,
        z: Array,
        scores: Array | Projections,
        *,
        mask: Array | None = None,
        leaky_relu: float | None = None,
        normalize: bool = True,
        bias: Array | None = None,
        dropout: float = 0.0,
    ) -> None:
        self._scores: Array | None
        self._projections: Projections | None
        if isinstance(scores, Projections):
            self._scores, self._projections = None, scores
            self._heads, self._depth = int(scores.key.shape[0]), int(scores.key.shape[2])
        else:
            self._scores, self._projections = scores, None
            self._heads, self._depth = int(scores.shape[1]), int(x.shape[-1])
        self._x, self._z = x, z
        self._mask, self._leaky_relu, self._normalize = mask, leaky_relu, normalize
        self._bias, self._dropout = bias, float(dropout)

    @property
    def mask(self) -> Array | None:
        """The mask (boolean, ``True`` = may attend, or additive), or ``None``."""
        return self._mask

    @property
    def leaky_relu(self) -> float | None:
        """Negative slope of the LeakyReLU applied to the scores, or ``None``."""
        return self._leaky_relu

    @property
    def normalize(self) -> bool:
        """Whether the masked scores are softmax-normalised over the inputs."""
        return self._normalize

    @property
    def bias(self) -> Array | None:
        """The additive scores ``(1 or B, K, M, N)`` joined to the projections' (or the scores), or ``None``."""
        return self._bias

    @property
    def dropout(self) -> float:
        """The attention dropout :math:`p` of the weights (0: none)."""
        return self._dropout

    def with_dropout(self, p: float) -> AttentionBasis:
        """This basis with attention dropout ``p`` (each contraction drops weights afresh).

        Parameters
        ----------
        p
            The probability of dropping a weight, in ``[0, 1)``.
        """
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {p!r}")
        data = self._scores if self._projections is None else self._projections
        assert data is not None
        return AttentionBasis(
            self._x, self._z, data, mask=self._mask, leaky_relu=self._leaky_relu, normalize=self._normalize,
            bias=self._bias, dropout=p,
        )  # fmt: skip

    @property
    def projections(self) -> Projections | None:
        """The key and query projections, for scaled dot-product attention; else ``None``."""
        return self._projections

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self._x.shape[0]), self._heads, int(self._x.shape[1]), int(self._z.shape[1]))

    def _placed(self) -> Array:
        return self._x

    def weights(self) -> DenseBasis:
        """The weights as a :class:`~structconv.DenseBasis`, normalised from the scores (or projections)."""
        # Checked before anything is formed: the scores (unless held) and the weights normalised from them.
        check_scores_memory(self._x, self.shape, 1 if self._projections is None else 2, "its dense weights")
        scores: Array = self._scores if self._projections is None else self._projections.scores(self._x, self._z)
        if self._bias is not None:
            scores = scores + self._bias
        lib = of(scores).native()
        if int(scores.shape[0]) != self.shape[0]:  # a position-only mechanism: one copy per instance
            scores = lib.broadcast_to(scores, self.shape)
        # Under autocast the scores may be 16-bit: normalise in float32, store in the inputs' dtype.
        if scores.dtype.itemsize >= 4:
            return DenseBasis.of_weights(self._normalised(scores))
        xp = namespace(scores)
        weights = self._normalised(xp.astype(scores, xp.float32))
        return DenseBasis.of_weights(xp.astype(weights, self._x.dtype))

    def _normalised(self, scores: Array) -> Array:
        weights = normalise(scores, self.mask, leaky_relu=self.leaky_relu, normalize=self.normalize)
        return of(weights).dropout(weights, self._dropout) if self._dropout > 0.0 else weights

    def to_dense(self) -> Array:
        return self.weights().to_dense()

    def transpose(self) -> Basis:
        return self.weights().transpose()

    def select(self, members: Sequence[int]) -> Basis:
        return self.weights().select(members)

    def to(self, device: Any = None, dtype: Any = None) -> Basis:
        """A dtype change stays lazy (the inputs and projections are converted); a device change materialises.

        Parameters
        ----------
        device, dtype
            As for :meth:`structconv.Basis.to`.
        """
        if device is None and self._projections is not None:
            p, lib = self._projections, namespace(self._x)

            def cast(a: Any) -> Any:  # the projections too: the products refuse mixed dtypes
                return a if dtype is None or a is None else lib.astype(a, dtype)

            w = Projections(
                cast(p.key), cast(p.query), key_bias=cast(p.key_bias), query_bias=cast(p.query_bias), scale=p.scale
            )
            return AttentionBasis(
                cast(self._x), cast(self._z), w, mask=self._mask, leaky_relu=self._leaky_relu,
                normalize=self._normalize, bias=cast(self._bias), dropout=self._dropout,
            )  # fmt: skip
        return self.weights().to(device, dtype)

    def plan_key(self) -> tuple[Any, ...]:
        # The fused order's cost depends on the kernel torch picks (dtype, device) and on the mask.
        mask = None if self._mask is None else tuple(int(s) for s in self._mask.shape)
        bias = None if self._bias is None else tuple(int(s) for s in self._bias.shape)
        placement = (dtype_name(self._x), self.device)
        return (
            type(self).__name__,
            self.shape,
            tuple(self.own_orders()),
            self._depth,
            self._projections is None,
            mask,
            bias,
            self._dropout > 0.0,
            placement,
        )

    def _score_cost(self, batch: int) -> Cost:
        B, K, M, N = self.shape
        D, P = self._depth, int(self._x.shape[-1])
        # the keys and queries (from projections), the scores, the weights (and with dropout the
        # mask and the dropped weights)
        stored = 2.0 * B * K * M * N * (2 if self._dropout > 0.0 else 1)
        if self._projections is not None:
            stored += B * K * (M + N) * D
        return Cost(2.0 * B * K * (M * N * D + (M + N) * P * D), stored)

    def apply_each(self, x: Array) -> Array:
        return self.weights().apply_each(x)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        return self.weights().apply_members(s, reduce=reduce)

    def cost_each(self, batch: int, channels: int) -> Cost:
        B, K, M, N = self.shape
        return self._score_cost(batch) + Cost(2.0 * B * K * M * N * channels, float(batch * K * N * channels))

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        B, K, M, N = self.shape
        out = batch * N * channels * (1 if reduce else K)
        return self._score_cost(batch) + Cost(2.0 * B * K * M * N * channels, float(out))

    # --- the fused order -------------------------------------------------------------------
    def own_orders(self) -> Mapping[str, OwnOrder]:
        """``"sdpa"``, the fused kernel (a :class:`~structconv.LowRank` kept factored), where it applies."""
        fused = (
            of(self._x).fused_attention
            and self._projections is not None
            and self._normalize
            and self._leaky_relu is None
            and (self._bias is None or self._mask is None)  # the kernel takes one mask
        )
        return _ATTENTION_ORDERS if fused else NO_ORDERS

    def kernel_takes_dropout(self) -> bool:
        """Whether the fused order can drop weights inside a fused kernel here (the backend, dtype and device)."""
        fused = bool(self.own_orders()) and fused_width(self.device, dtype_name(self._x), 1) is not None
        return fused and fused_dropout(self.device)

    def _kernel_width(self, width: int) -> int | None:
        """The common width of keys, queries and values of width up to ``width`` (:func:`fused_width`)."""
        if self._dropout > 0.0 and not fused_dropout(self.device):
            return None
        return fused_width(self.device, dtype_name(self._x), max(self._depth, width))

    def _kernel_bias(self, like: Array) -> Array | None:
        """The additive scores in the kernel's layout, ``(1 or B, K, N, M)`` contiguous, in ``like``'s dtype."""
        if self._bias is None:
            return None
        bias = self._bias.swapaxes(-1, -2)
        bias = bias.reshape(-1).reshape(tuple(int(s) for s in bias.shape))  # [query, key] in memory too
        if bias.dtype != like.dtype:  # under autocast: the kernel takes one dtype
            bias = namespace(like).astype(bias, like.dtype)
        return bias

    def _projected(self, width: int | None) -> Projections:
        """The projections, their keys and queries widened by zero columns to ``width``."""
        mech = self._projections
        assert mech is not None  # only the fused order runs this
        if width is None or width == self._depth:
            return mech
        kb, qb = (None if b is None else _padded(b, width) for b in (mech.key_bias, mech.query_bias))
        key, query = _padded(mech.key, width), _padded(mech.query, width)
        return Projections(key, query, key_bias=kb, query_bias=qb, scale=mech.scale)

    def _sdpa(self, mech: Projections, values: Array) -> Array:
        r"""Per-head outputs :math:`A_k^\top v_k`, ``(B, K, N, R)``, through the backend's fused kernel."""
        keys, queries = mech(self._x, self._z)
        if keys.dtype != values.dtype:  # under autocast a float32 bias promotes them; the kernel needs one dtype
            xp = namespace(values)
            keys, queries = xp.astype(keys, values.dtype), xp.astype(queries, values.dtype)
        if self.mask is None:
            bias = self._kernel_bias(values)
            heads: Array = of(values).attention(
                queries, keys, values, None, mech.scale, bias=bias, dropout=self._dropout
            )
            return heads
        lib = of(values).native()
        allowed = allowed_mask(self.mask)
        # A column that may attend to nothing is 0 on every other path; the fused kernel would give
        # NaN there, so it attends to every input instead and its output is zeroed afterwards.
        empty = ~namespace(allowed).any(allowed, axis=-2, keepdims=True)
        # The kernel's layout is [query, key], in memory too (CUDA's memory-efficient kernel wants the
        # last axis contiguous), and torch's CPU kernel takes 2-D or 4-D masks only.
        allowed = lib.logical_or(allowed, empty).swapaxes(-1, -2)
        allowed = _as_4d(allowed.reshape(-1).reshape(tuple(int(s) for s in allowed.shape)))
        heads = of(values).attention(queries, keys, values, allowed, mech.scale, dropout=self._dropout)
        return lib.where(_as_4d(empty.swapaxes(-1, -2)), 0.0, heads)

    def _attend(self, x: Array, value: Array) -> Array:
        """Per-head outputs ``(B, K, N, R)`` of the values :math:`x V_k`, at the kernel's width."""
        R = int(value.shape[2])
        width = self._kernel_width(R)
        mech = self._projected(width)
        if width is not None and width != R:
            value = _padded(value, width)
        heads = self._fused(mech, x, value)
        if heads is None:
            heads = self._sdpa(mech, x_theta(x, value))
        return heads if int(heads.shape[-1]) == R else heads[..., :R]

    def _fused(self, mech: Projections, x: Array, value: Array) -> Array | None:
        """Self-attention without a mask: keys, queries and values from one GEMM, then the fused kernel.

        Not with additive scores: their kernel's backward returns the gradients of keys, queries
        and values apart, and the backward of three slices of one output would allocate that
        output's size three times over.
        """
        if self.mask is not None or self._bias is not None or x is not self._x or self._z is not self._x:
            return None
        B, M, P = (int(s) for s in x.shape)
        K, _, D = (int(s) for s in mech.key.shape)
        R = int(value.shape[2])
        wide = concatenate([w.swapaxes(0, 1).reshape(P, -1) for w in (mech.key, mech.query, value)], 1)
        flat = x.reshape(B * M, P)
        backend = of(flat)
        if mech.key_bias is not None or mech.query_bias is not None:
            zeros_kd = zeros((K * D,), like=flat)
            biases = [b.reshape(-1) if b is not None else zeros_kd for b in (mech.key_bias, mech.query_bias)]
            out = backend.addmm(concatenate([*biases, zeros((K * R,), like=flat)], 0), flat, wide)
        else:
            out = flat @ wide
        keys = out[:, : K * D].reshape(B, M, K, D).swapaxes(1, 2)
        queries = out[:, K * D : 2 * K * D].reshape(B, M, K, D).swapaxes(1, 2)
        values = out[:, 2 * K * D :].reshape(B, M, K, R).swapaxes(1, 2)
        bias = self._kernel_bias(values)
        heads: Array = backend.attention(queries, keys, values, None, mech.scale, bias=bias, dropout=self._dropout)
        return heads

    def _run_sdpa(self, x: Array, theta: Array) -> Array:
        heads: Array = self._attend(x, theta).sum(1)
        return heads

    def _run_sdpa_factored(self, x: Array, value: Array, out: Array) -> Array:
        heads = self._attend(x, value)
        B, K, N, R = (int(s) for s in heads.shape)
        wide = out.swapaxes(1, 2).reshape(K * R, int(out.shape[1]))  # (K, Q, R) -> (K R, Q)
        y: Array = heads.swapaxes(1, 2).reshape(B, N, K * R) @ wide
        return y

    def _cost_sdpa(self, batch: int, p: int, q: int) -> Cost:
        B, _, _, N = self.shape
        return self._cost_attend(batch, p, q) + Cost(0.0, float(B * N * q))  # the heads summed

    def _cost_sdpa_factored(self, batch: int, p: int, q: int, rank: int) -> Cost:
        B, K, _, N = self.shape
        return self._cost_attend(batch, p, rank) + Cost(2.0 * B * N * K * rank * q, float(B * N * q))

    def _cost_attend(self, batch: int, p: int, rank: int) -> Cost:
        r"""Keys, queries and values of width ``rank``, then attention.

        :math:`M\times N` memory where no fused kernel applies.
        """
        B, K, M, N = self.shape
        width = self._kernel_width(rank)
        dk, dv = (self._depth, rank) if width is None else (width, width)  # widths of keys and values
        project = 2.0 * B * K * ((M + N) * dk + M * dv) * p
        written = B * K * ((M + N) * dk + (M + N) * dv)
        if self._mask is not None:  # a boolean copy of it, and the kernel's additive copy
            written += 2 * math.prod(int(s) for s in self._mask.shape)
        if self._bias is not None:  # its copy in the kernel's layout
            written += math.prod(int(s) for s in self._bias.shape)
        if width is None:  # the math kernel: every score, then every weight (and dropped weight), stored
            stored = 2.0 * B * K * M * N * (2 if self._dropout > 0.0 else 1)
            return Cost(project + 2.0 * B * K * M * N * (self._depth + rank), written + stored)
        return Cost(project + 4.0 * B * K * M * N * width, float(written))


_ATTENTION_ORDERS: Mapping[str, OwnOrder] = {
    "sdpa": OwnOrder(
        AttentionBasis._cost_sdpa,
        AttentionBasis._run_sdpa,
        AttentionBasis._cost_sdpa_factored,
        AttentionBasis._run_sdpa_factored,
    )
}
