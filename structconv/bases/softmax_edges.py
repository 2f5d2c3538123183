r"""Edge weights that are a softmax over each target's edges: graph attention, normalised where an order needs it.

:class:`SoftmaxEdgeBasis` holds the logits :math:`s_{ek}` of the edges :math:`e = (m \to n)` of one
graph and represents

.. math:: A_{k,mn} = \sum_{e:(m\to n)} \delta_{ek}\,
   \frac{\exp s_{ek}}{\sum_{e' \to n} \exp s_{e'k}},

the softmax of member :math:`k`'s logits over the edges into each target (GAT's heads), with
:math:`\delta` an optional dropout multiplier (a Bernoulli mask scaled by :math:`1/(1-p)`, as
``torch.nn.functional.dropout`` draws it) drawn once, when the basis is built, so that every order
of one basis sees the same mask.

The hooks (:meth:`~structconv.Basis.apply_each`, :meth:`~structconv.Basis.apply_members`,
:meth:`~structconv.Basis.apply_combined`, :meth:`~structconv.Basis.to_dense`) are those of the
:class:`~structconv.EdgeBasis` of the normalised weights (:meth:`SoftmaxEdgeBasis.edges`), so every
order of the triangle stays open.  The basis adds its own order, ``"segment"``: the values
:math:`x\Theta_k` first, then one pass over the edges that accumulates
:math:`\sum_{e\to n}\delta_{ek} w_{ek} v_{m_e k}` and :math:`\sum_{e\to n} w_{ek}` with
:math:`w_{ek} = \exp(s_{ek} - \max_{e'\to n} s_{e'k})`, and their ratio per target, so that no
normalised weight is ever formed per edge.

Torch only: the per-target maximum is a scatter-maximum, which the backends do not provide for
NumPy.  The module calls tensor methods and never imports torch, so ``import structconv`` stays
torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..backend import Array, device_of, dtype_name, of, shape_str, x_theta
from .base import Cost, OwnOrder, _member_list
from .edges import EdgeBasis, OnEdgeList, cost_each_on_edges, cost_members_on_edges

if TYPE_CHECKING:
    import torch

Heads = Literal["concat", "mean"]


def head_placement(heads: int, depth: int, *, concat: bool, like: Array) -> Array:
    r"""The output maps :math:`O_k` ``(K, Q, D)`` that place :math:`K` heads of width :math:`D`.

    With ``concat`` head :math:`k` fills the output channels :math:`kD, \dots, kD + D - 1`
    (:math:`Q = KD`, :math:`O_{k,q d} = [q = kD + d]`); otherwise the heads are averaged
    (:math:`Q = D`, :math:`O_k = I/K`).  As the ``out`` of a :class:`~structconv.LowRank` whose
    ``value`` holds the heads' value maps, it is the parameter of multi-head graph attention.

    Parameters
    ----------
    heads, depth
        :math:`K` and :math:`D`.
    concat
        Concatenate the heads (else average them).
    like
        An array whose backend, dtype and device the placement takes.

    Returns
    -------
    Array
        ``(K, K D, D)`` with ``concat``, else ``(K, D, D)``.
    """
    backend = of(like)
    xp = backend.namespace()
    if concat:  # O[k, c, d] = [c = kD + d]: the (KD, KD) identity read as (KD, K, D), heads first
        eye = backend.eye(heads * depth, like)
        return xp.permute_dims(xp.reshape(eye, (heads * depth, heads, depth)), (1, 0, 2))
    return xp.broadcast_to(backend.eye(depth, like) / heads, (heads, depth, depth))


@dataclass(frozen=True, eq=False)
class Projected:
    r"""Values a caller has already computed, which the ``"segment"`` order reuses for these very arrays.

    Graph attention computes the values :math:`x V_k` to form its logits; a layer that hands them
    to the basis saves the order computing them again.  The order compares arrays by identity
    (``is``), never by value: a call of :func:`~structconv.conv` with another ``x``, ``value`` or
    ``out`` (a copy, a cast, another dtype) computes what it needs afresh, so reuse can change
    the speed, never the result or its gradients.  ``heads`` is the caller's word that ``out`` is
    :func:`head_placement`'s (checking it by value would cost a device synchronisation per call).

    Why the basis carries them: in GAT on Cora (1,433 features, 8 heads of 8) the product
    :math:`xW` and its backward are about half of a forward and backward pass, so an order that
    computed it again would cost about that much more; computing the logits from :math:`x` with
    the attention vectors folded into :math:`W` instead (:math:`x\,(W_h a_h)`, so that the basis
    needs no values) was slower on that product alone.  The product by :func:`head_placement`
    adds a GEMM of :math:`N \times KD \times Q`, which a reshape avoids.

    Attributes
    ----------
    x
        The input, ``(B, M, P)``, as it will be passed to :func:`~structconv.conv`.
    value
        The value maps :math:`V` ``(K, P, D)``, the ``value`` of the :class:`~structconv.LowRank`
        that will be passed.
    rows
        :math:`x_b V_k`, ``(B, M, K, D)``.
    out
        The ``out`` of that parameter, or ``None``.
    heads
        ``"concat"`` or ``"mean"`` when ``out`` is :func:`head_placement` ``(K, D, concat=...)``:
        the order then places the heads by a reshape or a mean instead of a product.
    """

    x: Array
    value: Array
    rows: Array
    out: Array | None = None
    heads: Heads | None = None


class SoftmaxEdgeBasis(OnEdgeList):
    r"""``K`` members on one edge pattern whose weights are a softmax over each target's edges.

    Member :math:`k` is :math:`A_{k,mn} = \sum_{e:(m\to n)} \delta_{ek}\exp s_{ek} / \sum_{e'\to n}
    \exp s_{e'k}`; a target without edges has an empty column.  The dropout multiplier
    :math:`\delta` is drawn once, here, and shared by every order, hook and :meth:`weights`.

    The own order ``"segment"`` (for a full :math:`\Theta` and a :class:`~structconv.LowRank` kept
    factored) computes the values, gathers each edge's source row once for every member (rows of
    width :math:`KD` of one 2-D matrix, which torch's scatter kernels add several times faster
    than an inner axis of a 4-D array), weighs them by the unnormalised :math:`\delta w` and divides
    each target's sum by :math:`\sum w` afterwards.  With :class:`Projected` values it skips their
    product, and with a :func:`head_placement` ``out`` it places the heads by a reshape.

    Parameters
    ----------
    src, dst
        ``(E,)`` integer arrays: edge :math:`e` goes from input entry ``src[e]`` to output entry
        ``dst[e]`` (repeated edges are separate terms of the softmax).
    logits
        :math:`s`, ``(E, K)``, a floating torch tensor (it may require grad).
    shape
        ``(M, N)``.
    dropout
        :math:`p \in [0, 1)`: each normalised weight is zeroed with probability :math:`p` and the
        others scaled by :math:`1/(1-p)`, as ``torch.nn.functional.dropout`` does.
    generator
        The ``torch.Generator`` the mask is drawn from (the default one if ``None``).
    projected
        Values already computed by the caller (:class:`Projected`), or ``None``.

    Examples
    --------
    >>> import torch
    >>> from structconv.bases.softmax_edges import SoftmaxEdgeBasis
    >>> src, dst = torch.tensor([0, 1]), torch.tensor([1, 1])
    >>> A = SoftmaxEdgeBasis(src, dst, torch.zeros(2, 1), (2, 2))
    >>> A.to_dense()[0]
    tensor([[0.0000, 0.5000],
            [0.0000, 0.5000]])
    """

    __slots__ = ("_logits", "_mask", "_projected")
    representation = "softmax-edges"
    host_orders = frozenset({"atheta"})

    def __init__(
        self,
        src: Array,
        dst: Array,
        logits: Array,
        shape: Sequence[int],
        *,
        dropout: float = 0.0,
        generator: torch.Generator | None = None,
        projected: Projected | None = None,
    ) -> None:
        if of(logits, "logits").name != "torch":  # a validation: no other backend has a scatter-maximum
            raise TypeError(f"logits must be a torch.Tensor (the segment maximum needs torch), got {type(logits)}")
        pattern = EdgeBasis(src, dst, logits, shape)  # checks the pattern against the logits, once
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
        mask = None
        if dropout > 0.0:  # F.dropout's draw: a Bernoulli(1 - p) mask, divided by 1 - p
            mask = logits.new_empty(logits.shape).bernoulli_(1.0 - dropout, generator=generator).div_(1.0 - dropout)
        M, N = pattern.shape[1:]
        self._src, self._dst, self._logits, self._shape, self._mask = src, dst, logits, (M, N), mask
        self._projected = projected

    @classmethod
    def _of(
        cls,
        src: Array,
        dst: Array,
        logits: Array,
        shape: tuple[int, int],
        mask: Array | None,
        projected: Projected | None = None,
    ) -> SoftmaxEdgeBasis:
        """A basis from checked parts and a mask already drawn (for :meth:`select` and :meth:`to`)."""
        basis = cls.__new__(cls)
        basis._src, basis._dst, basis._logits, basis._shape, basis._mask = src, dst, logits, shape, mask
        basis._projected = projected
        return basis

    def _per_edge(self) -> Array:
        return self._logits

    @property
    def logits(self) -> Array:
        """:math:`s`, ``(E, K)``."""
        return self._logits

    @property
    def mask(self) -> Array | None:
        r"""The dropout multiplier :math:`\delta` ``(E, K)`` (0 or :math:`1/(1-p)`), or ``None`` without dropout."""
        return self._mask

    def plan_key(self) -> tuple[Any, ...]:
        # The own order's cost depends on the edge count and on whether it skips the values' product.
        return (*super().plan_key(), self._projected is not None)

    def __repr__(self) -> str:
        return (
            f"SoftmaxEdgeBasis(shape={shape_str(self.shape)}, edges={int(self._logits.shape[0])}, "
            f"dropout={self._mask is not None}, dtype={dtype_name(self._logits)}, device={self.device})"
        )

    # --- the softmax ---------------------------------------------------------------------------
    def _exp(self) -> tuple[Array, Array]:
        r""":math:`w = \exp(s - \max_{e'\to n} s)` ``(E, K)`` and :math:`\sum_{e \to n} w` ``(N, K)`` (1 where empty).

        16-bit logits are exponentiated and summed in float32 (as softmax kernels do).
        """
        s = self._logits if self._logits.dtype.itemsize >= 4 else self._logits.float()
        N, K = self.N, self.K
        index = self._dst[:, None].expand(-1, K)
        # The shift by each target's maximum cancels in the ratio; detached, it costs no backward pass.
        peak = s.new_full((N, K), -float("inf")).scatter_reduce(0, index, s.detach(), "amax")
        w = (s - peak.index_select(0, self._dst)).exp()
        total = w.new_zeros(N, K).index_add(0, self._dst, w)
        return w, total.where(total > 0, 1.0)  # a target without edges: 0 / 1

    def weights(self) -> Array:
        r"""The normalised weights :math:`\delta_{ek} w_{ek} / \sum_{e'\to n} w_{e'k}` ``(E, K)`` in the logits' dtype.

        GAT's attention coefficients :math:`\alpha`, after dropout.
        """
        w, total = self._exp()
        if self._mask is not None:
            w = w * self._mask
        return (w / total.index_select(0, self._dst)).to(self._logits.dtype)

    def edges(self) -> EdgeBasis:
        """The same basis as an :class:`~structconv.EdgeBasis` of the normalised weights (:meth:`weights`)."""
        return EdgeBasis(self._src, self._dst, self.weights(), self._shape)

    # --- value operations ------------------------------------------------------------------------
    def to_dense(self) -> Array:
        return self.edges().to_dense()

    def transpose(self) -> EdgeBasis:
        """The transposed basis, an :class:`~structconv.EdgeBasis` (its columns are no longer softmaxes)."""
        return self.edges().transpose()

    def select(self, members: Sequence[int]) -> SoftmaxEdgeBasis:
        index = _member_list(members)
        mask = None if self._mask is None else self._mask[:, index]
        return SoftmaxEdgeBasis._of(self._src, self._dst, self._logits[:, index], self._shape, mask)

    def to(self, device: Any = None, dtype: Any = None) -> SoftmaxEdgeBasis:
        """The basis moved, its mask with it; :class:`Projected` values are kept where the device is.

        A dtype change keeps them (the engine casts a float32 basis under autocast, and the
        values, computed from the arrays it then receives, still serve); a move to another device
        drops them.
        """
        backend = of(self._logits)
        logits = backend.move(self._logits, device, dtype, what="basis")
        mask = None if self._mask is None else backend.move(self._mask, device, dtype, what="basis")
        src, dst = backend.move(self._src, device), backend.move(self._dst, device)
        projected = self._projected if device_of(logits) == self.device else None
        return SoftmaxEdgeBasis._of(src, dst, logits, self._shape, mask, projected)

    def energy(self) -> float:
        return self.edges().energy()

    # --- engine hooks: the normalised edge basis's -------------------------------------------------
    def apply_each(self, x: Array) -> Array:
        return self.edges().apply_each(x)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        return self.edges().apply_members(s, reduce=reduce)

    def _softmax_cost(self, *, per_edge: bool) -> Cost:
        r"""The softmax's work: maximum, shift, exponential and totals; ``per_edge``: also each edge's weight.

        Gathers and scatters over the ``(E, K)`` logits are irregular; each edge's weight (the
        hooks need it, the ``"segment"`` order does not) costs a gather of the totals, a division
        and, with dropout, a product.
        """
        E, K, N = int(self._logits.shape[0]), self.K, self.N
        # scatter-max, gather of the maxima, scatter-add of the totals; written: maxima, gathered,
        # shifted and exponentiated logits, totals and their empty-target fix.
        cost = Cost(2.0 * E * K, float(3 * E * K + 3 * N * K), 3.0 * E * K)
        if per_edge:
            steps = 2 if self._mask is not None else 1
            cost = cost + Cost(float(steps * E * K), float((1 + steps) * E * K), float(E * K))
        return cost

    def cost_each(self, batch: int, channels: int) -> Cost:
        E, K, N = int(self._logits.shape[0]), self.K, self.N
        return self._softmax_cost(per_edge=True) + cost_each_on_edges(E, K, N, batch, channels)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        E, K, N = int(self._logits.shape[0]), self.K, self.N
        return self._softmax_cost(per_edge=True) + cost_members_on_edges(E, K, N, batch, channels, reduce=reduce)

    # --- the own order: "segment" ------------------------------------------------------------------
    def _aggregate(self, rows: Array) -> Array:
        r"""Each target's :math:`\sum_{e \to n} \delta_e w_e v_{m_e} / \sum_{e\to n} w_e`, ``(B, N, K, C)``.

        ``rows`` are the values :math:`v`, ``(B, M, K, C)``, one row per input entry and member.
        """
        B, M, K, C = (int(s) for s in rows.shape)
        E, N = int(self._logits.shape[0]), self.N
        w, total = self._exp()
        dropped = w if self._mask is None else w * self._mask
        # One row per input entry holding every instance and member: for B = 1 a view.
        flat = rows.reshape(B, M, K * C).transpose(0, 1).reshape(M, B * K * C)
        messages = flat.index_select(0, self._src).view(E, B, K, C) * dropped[:, None, :, None]
        summed = messages.new_zeros(N, B * K * C).index_add(0, self._dst, messages.view(E, B * K * C))
        heads = summed.view(N, B, K, C) / total[:, None, :, None]
        return heads.transpose(0, 1).to(rows.dtype)

    def _rows(self, x: Array, value: Array) -> Array:
        """:math:`x_b V_k` as ``(B, M, K, D)``: the :class:`Projected` rows for these very arrays, else computed."""
        p = self._projected
        if p is not None and x is p.x and value is p.value:
            return p.rows
        rows: Array = x_theta(x, value).transpose(1, 2)  # torch's x_theta lays out (B, M, K, D) in memory
        return rows

    def _run_segment(self, x: Array, theta: Array) -> Array:
        y: Array = self._aggregate(self._rows(x, theta)).sum(2)
        return y

    def _run_segment_factored(self, x: Array, value: Array, out: Array) -> Array:
        heads = self._aggregate(self._rows(x, value))
        B, N, K, D = (int(s) for s in heads.shape)
        p = self._projected
        if p is not None and out is p.out and p.heads == "concat":
            return heads.reshape(B, N, K * D)
        if p is not None and out is p.out and p.heads == "mean":
            return heads.mean(2)
        wide = out.transpose(1, 2).reshape(K * D, int(out.shape[1]))  # Σ_k heads_k O_kᵀ as one product
        y: Array = heads.reshape(B, N, K * D) @ wide
        return y

    def _cost_segment(self, batch: int, p: int, q: int) -> Cost:
        r"""The values :math:`x\Theta_k`, one pass over the edges, then the sum over the members."""
        B, K, N = batch, self.K, self.N
        total = Cost(float(B * N * K * q), float(B * N * q))
        return self._cost_values(B, p, q, reused=False) + self._cost_edges(B, q) + total

    def _cost_segment_factored(self, batch: int, p: int, q: int, rank: int) -> Cost:
        r"""The values :math:`xV_k` (none with :class:`Projected` ones), one pass over the edges, the heads' map."""
        B, K, N = batch, self.K, self.N
        place = Cost(2.0 * B * N * K * rank * q, float(B * N * q))
        # With Projected values the plan is made for the arrays they hold (plan_key tells the two apart).
        values = self._cost_values(B, p, rank, reused=self._projected is not None)
        return values + self._cost_edges(B, rank) + place

    def _cost_values(self, batch: int, p: int, width: int, *, reused: bool) -> Cost:
        if reused:
            return Cost()
        return Cost(2.0 * batch * self.M * p * self.K * width, float(batch * self.M * self.K * width))

    def _cost_edges(self, batch: int, width: int) -> Cost:
        """The softmax without the per-edge weights, the messages (gathered, weighed, added), each target's division."""
        B, E, K, N, C = batch, int(self._logits.shape[0]), self.K, self.N, width
        dropped = Cost(float(E * K), float(E * K)) if self._mask is not None else Cost()
        messages = cost_members_on_edges(E, K, N, B, C, reduce=False)  # gathered, weighed, added, as EdgeBasis
        divide = Cost(float(B * N * K * C), float(B * N * K * C))
        return self._softmax_cost(per_edge=False) + dropped + messages + divide

    def own_orders(self) -> Mapping[str, OwnOrder]:
        """``"segment"``: the values, then one pass over the edges, normalised per target."""
        return _SEGMENT


_SEGMENT: Mapping[str, OwnOrder] = {
    "segment": OwnOrder(
        SoftmaxEdgeBasis._cost_segment,
        SoftmaxEdgeBasis._run_segment,
        SoftmaxEdgeBasis._cost_segment_factored,
        SoftmaxEdgeBasis._run_segment_factored,
    )
}


__all__ = ["Projected", "SoftmaxEdgeBasis", "head_placement"]
