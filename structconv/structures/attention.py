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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Array, device_of, einsum, is_torch, namespace, shape_str, x_theta, zeros
from ..backend.checks import check_array
from ..bases.base import Basis, Cost
from ..bases.dense import DenseBasis


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
        """Scores of shape ``(B or 1, K, M, N)`` for ``x`` (``(B, M, P)``) and ``z`` (``(B, N, P')``)."""
        raise NotImplementedError

    @property
    def positional(self) -> bool:
        """Whether the scores ignore the content of ``x`` and ``z`` (then one basis serves the batch)."""
        return False

    def __add__(self, other: Mechanism) -> Mechanism:
        return Combined(self, other, "sum")

    def __mul__(self, other: Mechanism) -> Mechanism:
        return Combined(self, other, "product")


@dataclass(frozen=True, eq=False)
class Combined(Mechanism):
    """The entry-wise sum or product of two mechanisms with the same number of heads."""

    left: Mechanism
    right: Mechanism
    op: str = "sum"

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

    def scores(self, x: Array, z: Array) -> Array:
        a, b = self.left.scores(x, z), self.right.scores(x, z)
        return a + b if self.op == "sum" else a * b


@dataclass(frozen=True, eq=False)
class BiAffine(Mechanism):
    r"""A bi-affine mechanism with ``K`` heads (Def. 6), every term optional.

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
        A factor applied to the scores (the Transformer's :math:`1/\sqrt D`).
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
        """Raise a ``ValueError`` naming ``x`` or ``z`` if its width does not match the mechanism."""
        p, q = self._widths()
        if p is not None and int(x.shape[-1]) != p:
            raise ValueError(f"x has width P={int(x.shape[-1])} but the mechanism expects P={p}")
        if q is not None and int(z.shape[-1]) != q:
            raise ValueError(f"z has width P'={int(z.shape[-1])} but the mechanism expects P'={q}")

    def projections(self, x: Array, z: Array) -> tuple[Array, Array]:
        """Keys ``(B, K, M, D)`` and queries ``(B, K, N, D)``, biases included."""
        assert self.key is not None and self.query is not None
        keys, queries = x_theta(x, self.key), x_theta(z, self.query)
        if self.key_bias is not None:
            keys = keys + self.key_bias[None, :, None, :]
        if self.query_bias is not None:
            queries = queries + self.query_bias[None, :, None, :]
        return keys, queries

    def scores(self, x: Array, z: Array) -> Array:
        self.check_inputs(x, z)
        B, M, N, K = int(x.shape[0]), int(x.shape[1]), int(z.shape[1]), self.heads
        total = zeros((B, K, M, N), like=x)
        if self.bilinear is not None:
            total = total + einsum("bmp,kpr,bnr->bkmn", x, self.bilinear, z)
        if self.key is not None and self.query is not None:
            keys, queries = self.projections(x, z)
            total = total + keys @ (queries.transpose(-1, -2) if is_torch(queries) else queries.swapaxes(-1, -2))
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

    def scores(self, x: Array, z: Array) -> Array:
        B, M, N = int(x.shape[0]), int(x.shape[1]), int(z.shape[1])
        b, _, m, n = (int(s) for s in self.bias.shape)
        if (m, n) != (M, N) or b not in (1, B):
            raise ValueError(
                f"bias has shape {shape_str(tuple(self.bias.shape))} but the scores are "
                f"({B}, {self.heads}, {M}, {N}) (B, K, M, N)"
            )
        return self.bias


def _allowed(mask: Array, lib: Any) -> Array:
    """A boolean mask (``True`` = allowed) from a boolean or additive ``{-inf, 0}`` mask."""
    if str(mask.dtype).endswith("bool"):
        return mask
    finite = lib.isfinite(mask)
    if bool(lib.isnan(mask).any()) or bool((mask[finite] != 0).any()) or bool((mask[~finite] > 0).any()):
        raise ValueError("mask must be boolean (True = allowed) or hold only -inf and 0")
    return finite


def masked_softmax(scores: Array, mask: Array | None = None) -> Array:
    r"""Column-wise softmax over :math:`m` (axis ``-2``) with log-domain masking.

    .. math:: w_{mn} = \frac{\mathbb 1_{\Omega}(m, n)\, e^{s_{mn} - c_n}}
              {\sum_{m'} \mathbb 1_{\Omega}(m', n)\, e^{s_{m'n} - c_n}},
              \qquad c_n = \max_{m:\,(m, n)\in\Omega} s_{mn},

    over the allowed set :math:`\Omega`; a column :math:`n` with no allowed entry is 0.

    Parameters
    ----------
    scores
        Scores, at least 2-D; the softmax runs over axis ``-2``.
    mask
        Broadcasts to ``scores``: booleans (``True`` = allowed) or additive values in
        :math:`\{-\infty, 0\}`.

    Returns
    -------
    Array
        Weights of the dtype of ``scores``.  A column with no allowed entry gives zeros (never
        ``NaN``) in every floating dtype, and its gradient is zero.
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
        total = exp.sum(-2, keepdim=True)
        # A non-empty column sums to at least 1 (its peak gives exp(0)); an empty one sums to 0
        # and is divided by 1 instead (a clamp to a tiny value underflows to 0 in float32 and
        # below, and 1/tiny overflows in the backward).
        return exp / lib.where(total > 0, total, lib.ones_like(total))
    peak = scores.max(-2, keepdims=True)
    peak = lib.where(lib.isfinite(peak), peak, 0.0)
    exp = lib.exp(scores - peak)
    total = exp.sum(-2, keepdims=True)
    return exp / lib.where(total > 0, total, 1.0)


class AttentionBasis(Basis):
    r"""Softmax attention :math:`A_{bk} = \mathrm{softmax}_m(\mathrm{mask}(a(x_b, z_b; \Xi_k)))`, ``(B, K, M, N)``.

    The weights are materialised only when an order needs them (:meth:`to_dense`, the triangle's
    orders); for a Transformer mechanism (:attr:`BiAffine.transformer`) on torch the engine may
    instead run the whole layer as ``"sdpa"``: keys, queries and :math:`x\Theta_k` (or
    :math:`xU_k` for a :class:`~structconv.LowRank` parameter) by GEMMs, then
    ``torch.nn.functional.scaled_dot_product_attention``, which never stores the
    :math:`M\times N` weights.  Both paths compute the same :math:`\sum_k A_k^\top x\Theta_k`.
    Build it with :func:`attention_basis`.
    """

    __slots__ = ("_dense", "_x", "_z", "leaky_relu", "mask", "mechanism", "normalize")
    representation = "attention"

    def __init__(
        self,
        x: Array,
        z: Array,
        mechanism: Mechanism,
        mask: Array | None = None,
        leaky_relu: float | None = None,
        normalize: bool = True,
    ) -> None:
        self._x, self._z, self.mechanism = x, z, mechanism
        self.mask, self.leaky_relu, self.normalize = mask, leaky_relu, normalize
        self._dense: DenseBasis | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self._x.shape[0]), self.mechanism.heads, int(self._x.shape[1]), int(self._z.shape[1]))

    @property
    def backend(self) -> str:
        return "torch" if is_torch(self._x) else "numpy"

    @property
    def dtype(self) -> Any:
        return self._x.dtype

    @property
    def device(self) -> str:
        return device_of(self._x)

    def weights(self) -> DenseBasis:
        """The attention weights as a :class:`~structconv.DenseBasis` (computed once)."""
        if self._dense is None:
            scores = self.mechanism.scores(self._x, self._z)
            if int(scores.shape[0]) != self.shape[0]:  # a position-only mechanism: one copy per instance
                scores = (
                    scores.expand(*self.shape)
                    if is_torch(scores)
                    else namespace(scores).broadcast_to(scores, self.shape)
                )
            low = is_torch(scores) and scores.dtype.itemsize < 4  # autocast: normalise in float32, store low
            weights = _normalise(scores.float() if low else scores, self.mask, self.leaky_relu, self.normalize)
            self._dense = DenseBasis.of_weights(weights.to(self._x.dtype) if low else weights)
        return self._dense

    def to_dense(self) -> Array:
        return self.weights().to_dense()

    def transpose(self) -> Basis:
        return self.weights().transpose()

    def select(self, members: Sequence[int]) -> Basis:
        return self.weights().select(members)

    def to(self, device: Any = None, dtype: Any = None) -> Basis:
        """A dtype change stays lazy (the inputs are converted); a device change materialises the weights."""
        if self._dense is None and is_torch(self._x) and device is None:
            return AttentionBasis(
                self._x.to(dtype=dtype), self._z.to(dtype=dtype), self.mechanism, self.mask, self.leaky_relu,
                self.normalize,
            )  # fmt: skip
        return self.weights().to(device, dtype)

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, self.special_orders(), self._depth())

    def _depth(self) -> int:
        """The width ``D`` the scores are computed through (for the cost model)."""
        mech = self.mechanism
        if isinstance(mech, BiAffine) and mech.key is not None:
            return int(mech.key.shape[2])
        return int(self._x.shape[-1])

    def _score_cost(self, batch: int) -> Cost:
        B, K, M, N = self.shape
        D, P = self._depth(), int(self._x.shape[-1])
        return Cost(2.0 * B * K * (M * N * D + (M + N) * P * D), 2.0 * B * K * M * N)

    def apply_each(self, x: Array) -> Array:
        return self.weights().apply_each(x)

    def apply_members(self, s: Array, reduce: bool) -> Array:
        return self.weights().apply_members(s, reduce)

    def apply_combined(self, x: Array, theta: Array) -> Array:
        return self.weights().apply_combined(x, theta)

    def cost_each(self, batch: int, channels: int) -> Cost:
        B, K, M, N = self.shape
        return self._score_cost(batch) + Cost(2.0 * B * K * M * N * channels, float(batch * K * N * channels))

    def cost_members(self, batch: int, channels: int, reduce: bool) -> Cost:
        B, K, M, N = self.shape
        out = batch * N * channels * (1 if reduce else K)
        return self._score_cost(batch) + Cost(2.0 * B * K * M * N * channels, float(out))

    # --- the fused order -------------------------------------------------------------------
    def special_orders(self) -> tuple[str, ...]:
        mech = self.mechanism
        fused = (
            self.backend == "torch"
            and isinstance(mech, BiAffine)
            and mech.transformer
            and self.normalize
            and self.leaky_relu is None
        )
        return ("sdpa",) if fused else ()

    def factor_orders(self) -> tuple[str, ...]:
        return self.special_orders()

    def _sdpa(self, values: Array) -> Array | None:
        """Per-head outputs :math:`A_k^\top v_k`, ``(B, K, N, R)``, or ``None`` if a column is fully masked."""
        mech = self.mechanism
        assert isinstance(mech, BiAffine)
        allowed = None
        if self.mask is not None:
            allowed = _allowed(self.mask, namespace(self.mask))
            if not bool(allowed.any(-2).all()):  # torch gives NaN there; the dense path gives zeros
                return None
            allowed = allowed.transpose(-1, -2)  # torch's layout is [query, key]
        keys, queries = mech.projections(self._x, self._z)
        out: Array = _sdpa_twice_differentiable(queries, keys, values, allowed, mech.scale)
        return out

    def _fused(self, x: Array, value: Array) -> Array | None:
        """Self-attention without a mask: keys, queries and values from one GEMM, then SDPA (as torch's layer)."""
        import torch

        mech = self.mechanism
        assert isinstance(mech, BiAffine) and mech.key is not None and mech.query is not None
        if self.mask is not None or x is not self._x or self._z is not self._x:
            return None
        B, M, P = (int(s) for s in x.shape)
        K, _, D = (int(s) for s in mech.key.shape)
        R = int(value.shape[2])
        parts = [mech.key, mech.query, value]
        wide = torch.cat([w.permute(1, 0, 2).reshape(P, -1) for w in parts], 1)
        flat = x.reshape(B * M, P)
        if mech.key_bias is not None or mech.query_bias is not None:
            zeros_kd = flat.new_zeros(K * D)
            biases = [b.reshape(-1) if b is not None else zeros_kd for b in (mech.key_bias, mech.query_bias)]
            out = torch.addmm(torch.cat([*biases, flat.new_zeros(K * R)]), flat, wide)
        else:
            out = flat @ wide
        keys = out[:, : K * D].view(B, M, K, D).transpose(1, 2)
        queries = out[:, K * D : 2 * K * D].view(B, M, K, D).transpose(1, 2)
        values = out[:, 2 * K * D :].view(B, M, K, R).transpose(1, 2)
        heads: Array = _sdpa_twice_differentiable(queries, keys, values, None, mech.scale)
        return heads

    def run_order(self, order: str, x: Array, theta: Array) -> Array | None:
        if order != "sdpa":
            return None
        heads = self._fused(x, theta)
        if heads is None:
            heads = self._sdpa(x_theta(x, theta))
        if heads is None:
            return self.apply_members(x_theta(x, theta), reduce=True)
        return heads.sum(1)

    def run_factored(self, order: str, x: Array, value: Array, out: Array) -> Array:
        heads = self._fused(x, value)
        if heads is None:
            heads = self._sdpa(x_theta(x, value))
        if heads is None:
            heads = self.apply_members(x_theta(x, value), reduce=False)
        B, K, N, R = (int(s) for s in heads.shape)
        wide = out.permute(0, 2, 1).reshape(K * R, int(out.shape[1]))
        y: Array = heads.transpose(1, 2).reshape(B, N, K * R) @ wide
        return y

    def cost_order(self, order: str, batch: int, p: int, q: int) -> Cost | None:
        return self.cost_factored(order, batch, p, q, q) if order == "sdpa" else None

    def cost_factored(self, order: str, batch: int, p: int, q: int, rank: int) -> Cost:
        B, K, M, N = self.shape
        D = self._depth()
        project = 2.0 * B * K * ((M + N) * p * D + M * p * rank)
        attend = 4.0 * B * K * M * N * max(D, rank)
        mix = 2.0 * B * N * K * rank * q
        return Cost(project + attend + mix, float(B * K * ((M + N) * D + M * rank + N * rank) + B * N * q))


def _attention_math(q: Array, k: Array, v: Array, allowed: Array | None, scale: float) -> Array:
    """``softmax(q k^T scale, masked) v`` from differentiable operations (no empty rows: checked by the caller)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    out: Array = scores.softmax(-1) @ v
    return out


_SDPA_FUNCTION: Any = None


def _sdpa_function() -> Any:
    """A ``torch.autograd.Function`` around ``scaled_dot_product_attention`` that can be differentiated twice.

    torch's fused kernels (flash attention on CPU and GPU) have a backward that is not itself
    differentiable, so ``create_graph=True`` (``gradgradcheck``, gradient penalties, Hessian-vector
    products) would stop with "derivative for ..._backward is not implemented".  The forward keeps
    the fused kernel's own graph; a first-order backward uses it (the fused backward, no
    recomputation); a backward under ``create_graph=True`` recomputes the attention from
    differentiable operations instead, so its gradient is differentiable again.
    """
    global _SDPA_FUNCTION
    if _SDPA_FUNCTION is not None:
        return _SDPA_FUNCTION
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    class TwiceDifferentiableSDPA(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, allowed: Any, scale: float) -> Any:
            inner = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
            with torch.enable_grad():
                out = scaled_dot_product_attention(inner[0], inner[1], inner[2], attn_mask=allowed, scale=scale)
            ctx.save_for_backward(q, k, v)
            ctx.inner, ctx.out, ctx.allowed, ctx.scale = inner, out, allowed, scale
            return out.detach()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            wanted = ctx.needs_input_grad[:3]
            if torch.is_grad_enabled():  # create_graph=True: a gradient that can be differentiated again
                q, k, v = ctx.saved_tensors
                with torch.enable_grad():
                    out = _attention_math(q, k, v, ctx.allowed, ctx.scale)
                    inputs = [t for t, w in zip((q, k, v), wanted, strict=True) if w]
                    found = iter(torch.autograd.grad(out, inputs, grad, create_graph=torch.is_grad_enabled()))
            else:
                inputs = [t for t, w in zip(ctx.inner, wanted, strict=True) if w]
                # retained: a repeated backward (retain_graph=True) gives the same gradient; the fused
                # graph holds only what the output does, plus the kernel's row statistics
                found = iter(torch.autograd.grad(ctx.out, inputs, grad, retain_graph=True))
            return (*(next(found) if w else None for w in wanted), None, None)

    _SDPA_FUNCTION = TwiceDifferentiableSDPA
    return _SDPA_FUNCTION


def _sdpa_twice_differentiable(q: Array, k: Array, v: Array, allowed: Array | None, scale: float) -> Array:
    """``scaled_dot_product_attention(q, k, v, allowed, scale)`` whose gradient can be differentiated again."""
    from torch.nn.functional import scaled_dot_product_attention

    if not (q.requires_grad or k.requires_grad or v.requires_grad):
        out: Array = scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
        return out
    result: Array = _sdpa_function().apply(q, k, v, allowed, scale)
    return result


def _normalise(scores: Array, mask: Array | None, leaky_relu: float | None, normalize: bool) -> Array:
    """LeakyReLU, log-domain mask and column-wise softmax of raw scores."""
    lib = namespace(scores)
    if leaky_relu is not None:
        scores = lib.where(scores >= 0, scores, scores * leaky_relu)
    if normalize:
        return masked_softmax(scores, mask)
    if mask is None:
        return scores
    allowed = _allowed(mask, lib)
    return scores.masked_fill(~allowed, 0.0) if is_torch(scores) else lib.where(allowed, scores, 0.0)


def attention_basis(
    x: Array,
    z: Array | None = None,
    mechanism: Mechanism | None = None,
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
        relative-position mechanism from :mod:`structconv.structures.positional`, or a sum of them.
    mask
        Boolean (``True`` = may attend) or additive :math:`\{-\infty, 0\}`, broadcastable to
        ``(B, K, M, N)`` (e.g. ``(M, N)`` for a graph or a causal order).
    leaky_relu
        Negative slope of a LeakyReLU applied to the scores before masking (GAT), or ``None``.
    normalize
        Column-wise softmax (default); ``False`` keeps the masked scores (masked entries 0).

    Returns
    -------
    AttentionBasis
        Lazy: the weights are computed when an order needs them (see :class:`AttentionBasis`).

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
    if not isinstance(mechanism, Mechanism):
        raise TypeError(f"mechanism must be a structconv Mechanism (e.g. BiAffine), got {type(mechanism).__name__}")
    check_array(x, "x", (2, 3), ("(B, M, P)", "(M, P)"))
    x3 = x[None] if x.ndim == 2 else x
    z3 = x3 if z is None else (z[None] if z.ndim == 2 else z)
    if z is not None:
        check_array(z, "z", (2, 3), ("(B, N, P')", "(N, P')"))
        if int(z3.shape[0]) != int(x3.shape[0]):
            raise ValueError(f"x has batch {int(x3.shape[0])} but z has batch {int(z3.shape[0])}")
    if isinstance(mechanism, BiAffine):
        mechanism.check_inputs(x3, z3)
    shape = (int(x3.shape[0]), mechanism.heads, int(x3.shape[1]), int(z3.shape[1]))
    if mask is not None:
        _check_mask(mask, shape)
    return AttentionBasis(x3, z3, mechanism, mask, leaky_relu, normalize)


def _check_mask(mask: Array, shape: tuple[int, ...]) -> None:
    if not is_torch(mask) and not hasattr(mask, "dtype"):
        raise TypeError(f"mask must be an array or tensor, got {type(mask).__name__}")
    try:
        np.broadcast_shapes(tuple(int(s) for s in mask.shape), shape)
    except ValueError as err:
        raise ValueError(
            f"mask of shape {shape_str(tuple(mask.shape))} does not broadcast to the scores "
            f"{shape_str(shape)} (B, K, M, N)"
        ) from err
    _allowed(mask, namespace(mask))
