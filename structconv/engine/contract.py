r"""The one contraction engine: :math:`y_b = \sum_k A_k^\top x_b \Theta_k`.

Three orders compute the same result (the triangle of Andreoli's Fig. 1):

``"ax"``
    A·x first: :math:`R_{bknp} = \sum_m A_{kmn} x_{bmp}`, then one GEMM over :math:`(k, p)`.
``"xtheta"``
    x·Θ first: :math:`S_{bkmq} = \sum_p x_{bmp}\Theta_{kpq}` (one GEMM), then
    :math:`\sum_k A_k^\top S_{bk}`.
``"atheta"``
    A·Θ first: :math:`\Phi = \sum_k A_k\otimes\Theta_k` of shape ``(M, N, P, Q)``, then
    :math:`y_{bnq} = \sum_{m,p} x_{bmp}\Phi_{mnpq}` (small structures only).

With a factorised parameter (:class:`~structconv.Separable`, :class:`~structconv.LowRank`),
``"ax"`` and ``"xtheta"`` keep the factors and ``"ax+full"`` / ``"xtheta+full"`` form the full
:math:`\Theta` first.

Dense bases are contracted by opt_einsum along the explicit path of each order (its
``PathInfo`` supplies the cost); other representations run through their hooks and report
their own (nnz-based) costs.  ``order="auto"`` picks the order of least estimated cost
:math:`\mathrm{flops} + w\cdot\mathrm{memory}`, where ``memory`` counts the elements written by
intermediates.  Plans are cached per shape key, so repeated calls do not re-plan.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import opt_einsum

from ..backend import (
    Array,
    autocast_dtype,
    autocast_to,
    backend_of,
    device_of,
    dtype_name,
    einsum,
    is_torch,
    shape_str,
    x_theta,
)
from ..backend.checks import check_array, check_same_placement
from ..bases.base import Basis, Cost, as_basis
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank, Parameter, Separable

#: Price of writing one element of an intermediate, in GEMM flops (calibrated on CPU by
#: ``benchmarks/bench_orders.py``; memory traffic, not arithmetic, dominates small contractions).
MEMORY_WEIGHT = 64.0
#: Price of one flop of a sparse or gather kernel, in GEMM flops (calibrated likewise).
SPARSE_FLOP_WEIGHT = 12.0

_BASE_ORDERS = ("ax", "xtheta", "atheta")
_FACTOR_ORDERS = ("ax", "xtheta", "ax+full", "xtheta+full", "atheta")

# Explicit opt_einsum paths: operands are (A, x, Θ) or (A, x, F1, F2).
_DENSE_PATHS: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {
    "full": {"ax": ((0, 1), (0, 1)), "xtheta": ((1, 2), (0, 1)), "atheta": ((0, 2), (0, 1))},
    "separable": {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 3), (1, 2), (0, 1)),
        "ax+full": ((2, 3), (0, 1), (0, 1)),
        "xtheta+full": ((2, 3), (1, 2), (0, 1)),
        "atheta": ((2, 3), (0, 2), (0, 1)),
    },
    "lowrank": {
        "ax": ((0, 1), (0, 2), (0, 1)),
        "xtheta": ((1, 2), (0, 2), (0, 1)),
        "ax+full": ((2, 3), (0, 1), (0, 1)),
        "xtheta+full": ((2, 3), (1, 2), (0, 1)),
        "atheta": ((2, 3), (0, 2), (0, 1)),
    },
}
_PARAM_SUBSCRIPTS = {"full": "kpq", "separable": "hk,hpq", "lowrank": "kpd,kqd"}


@dataclass(frozen=True)
class Candidate:
    """One way to run the contraction and its estimated cost."""

    order: str
    flops: float
    memory: float
    irregular: float = 0.0

    @property
    def score(self) -> float:
        """``flops + SPARSE_FLOP_WEIGHT * irregular + MEMORY_WEIGHT * memory``, which ``auto`` minimises."""
        return self.flops + SPARSE_FLOP_WEIGHT * self.irregular + MEMORY_WEIGHT * self.memory


@dataclass(frozen=True)
class Plan:
    """How :func:`conv` contracts given operands: every candidate order and the chosen one.

    ``str(plan)`` prints a table in the spirit of opt_einsum's ``PathInfo``.
    """

    representation: str
    sizes: dict[str, int]
    parameter: str
    candidates: tuple[Candidate, ...]
    chosen: str
    requested: str = "auto"
    equation: str = field(default="")

    def candidate(self, order: str) -> Candidate:
        """The candidate named ``order``."""
        for c in self.candidates:
            if c.order == order:
                return c
        raise KeyError(order)

    def __str__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        lines = [
            "structconv plan for y[b,n,q] = sum_k A[k,m,n] x[b,m,p] Theta[k,p,q]",
            f"  basis: {self.representation}   parameter: {self.parameter}   sizes: {dims}",
        ]
        if self.equation:
            lines.append(f"  opt_einsum equation: {self.equation}")
        lines.append(f"  {'order':<12} {'flops':>12} {'sparse flops':>12} {'memory':>12} {'score':>12}")
        best = min(c.score for c in self.candidates)
        for c in self.candidates:
            mark = " <- chosen" if c.order == self.chosen else ""
            row = f"  {c.order:<12} {c.flops:12.3e} {c.irregular:12.3e} {c.memory:12.3e} {c.score / best:11.2f}x"
            lines.append(row + mark)
        lines.append(f"  requested: {self.requested}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Param:
    kind: str
    operands: tuple[Array, ...]
    K: int
    P: int
    Q: int
    R: int


def _as_param(theta: Parameter) -> _Param:
    if isinstance(theta, Separable):
        k, p, q = theta.shape
        return _Param("separable", (theta.basis_coef, theta.channel), k, p, q, theta.rank)
    if isinstance(theta, LowRank):
        k, p, q = theta.shape
        return _Param("lowrank", (theta.value, theta.out), k, p, q, theta.rank)
    check_array(theta, "theta", (3,), ("(K, P, Q)",))
    k, p, q = (int(s) for s in theta.shape)
    return _Param("full", (theta,), k, p, q, 0)


def _autocast(a: Basis | Array, x: Array, theta: Parameter) -> tuple[Basis | Array, Array, Parameter]:
    """Inside ``torch.autocast``, every floating operand in the autocast dtype, as ``torch.matmul`` would.

    Autocast leaves layers' outputs in the low dtype and their parameters in float32; the
    engine's dtype check would refuse that mix, so the operands are converted here, once, and
    the contraction runs in the autocast dtype (float64 is left alone, as autocast does).
    """
    dtype = autocast_dtype(x)
    if dtype is None:
        return a, x, theta
    if isinstance(theta, LowRank):
        theta = LowRank(autocast_to(theta.value, dtype), autocast_to(theta.out, dtype))
    elif isinstance(theta, Separable):
        theta = Separable(autocast_to(theta.basis_coef, dtype), autocast_to(theta.channel, dtype))
    else:
        theta = autocast_to(theta, dtype)
    if not isinstance(a, Basis):
        a = autocast_to(a, dtype)
    elif a.dtype.is_floating_point and a.dtype.itemsize == 4 and a.dtype != dtype:
        a = a.to(dtype=dtype)
    return a, autocast_to(x, dtype), theta


def _placed(a: Basis | Array, x: Array) -> Basis | Array:
    """A basis that holds no arrays (a weightless grid basis: offsets only) takes the placement of ``x``.

    Such a basis has no backend, dtype or device of its own to mismatch, so it is applied to
    whatever float array ``x`` is; every other basis is returned as it is and checked
    by :func:`_prepare`.  The hook is duck-typed (``placed_like``) to keep the engine unaware of grids.
    """
    place = getattr(a, "placed_like", None)
    return a if place is None else place(x)


def _prepare(a: Basis | Array, x: Array, theta: Parameter) -> tuple[Basis, Array, _Param, bool]:
    basis = as_basis(_placed(a, x))
    check_array(x, "x", (2, 3), ("(B, M, P)", "(M, P)"))
    param = _as_param(theta)
    placement = {"x": x}
    names = {
        "full": ("theta",),
        "separable": ("theta.basis_coef", "theta.channel"),
        "lowrank": ("theta.value", "theta.out"),
    }
    placement.update(zip(names[param.kind], param.operands, strict=True))
    check_same_placement(placement)
    if basis.backend != backend_of(x, "x"):
        raise TypeError(
            f"the basis is a {basis.backend} basis but x is a {backend_of(x, 'x')} array; do not mix backends"
        )
    if dtype_name(x) != str(basis.dtype).removeprefix("torch."):
        raise TypeError(f"the basis has dtype {basis.dtype} but x has dtype {dtype_name(x)}; convert explicitly")
    if basis.device != device_of(x):
        raise ValueError(f"the basis is on device {basis.device} but x is on {device_of(x)}")
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    B, M, P = (int(s) for s in x.shape)
    if M != basis.M:
        raise ValueError(
            f"x has shape {shape_str(tuple(x.shape[1:] if squeeze else x.shape))} but the basis has "
            f"M={basis.M} input entries; expected x of shape (B, {basis.M}, P) or ({basis.M}, P)"
        )
    if basis.batch is not None and basis.batch != B:
        raise ValueError(f"the basis is per-instance with batch {basis.batch} but x has batch {B}; they must agree")
    if param.K != basis.K:
        raise ValueError(
            f"theta has K={param.K} members (shape {shape_str((param.K, param.P, param.Q))}) "
            f"but the basis has K={basis.K}"
        )
    if param.P != P:
        raise ValueError(
            f"theta has P={param.P} input channels but x has {P}; expected theta of shape ({basis.K}, {P}, Q)"
        )
    return basis, x, param, squeeze


def _orders(kind: str, basis: Basis | None = None) -> tuple[str, ...]:
    special = basis.special_orders() if basis is not None else ()
    return (_BASE_ORDERS if kind == "full" else _FACTOR_ORDERS) + special


def _dense_equation(batched: bool, kind: str) -> str:
    return f"{'bkmn' if batched else 'kmn'},bmp,{_PARAM_SUBSCRIPTS[kind]}->bnq"


@lru_cache(maxsize=4096)
def _dense_candidate(eq: str, shapes: tuple[tuple[int, ...], ...], order: str, kind: str) -> Candidate:
    path = _DENSE_PATHS[kind][order]
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=[tuple(p) for p in path])
    memory = float(sum(info.size_list))
    return Candidate(order, float(info.opt_cost), memory)


def _generic_candidates(basis: Basis, B: int, prm: _Param) -> list[Candidate]:
    K, M, N, P, Q, R = basis.K, basis.M, basis.N, prm.P, prm.Q, prm.R

    def gemm(*dims: int) -> float:
        return 2.0 * float(np.prod(dims))

    def full_cost(order: str) -> Cost:
        own = basis.cost_order(order, B, P, Q)
        if own is not None:
            return own
        if order == "ax":
            return basis.cost_each(B, P) + Cost(gemm(B, N, K, P, Q), float(B * K * N * P + B * N * Q))
        if order == "xtheta":
            return Cost(gemm(B, M, P, K, Q), 2.0 * B * K * M * Q) + basis.cost_members(B, Q, True)
        return basis.cost_combined(B, P, Q)

    out = []
    special = basis.special_orders()
    for order in _orders(prm.kind, basis):
        if prm.kind == "lowrank" and order in basis.factor_orders():
            cost = basis.cost_factored(order, B, P, Q, R)
        elif prm.kind == "full" or order == "atheta" or order.endswith("+full") or order in special:
            cost = full_cost(order.removesuffix("+full"))
            if prm.kind != "full":
                cost = cost + Cost(gemm(K, P, Q, R), float(K * P * Q))
        elif prm.kind == "separable" and order == "ax":
            cost = basis.cost_each(B, P) + Cost(
                gemm(B, K, N, P, R) + gemm(B, N, R, P, Q), float(B * R * N * P + B * N * Q)
            )
        elif prm.kind == "separable":
            cost = Cost(
                gemm(B, M, P, R, Q) + gemm(B, M, R, K, Q), float(B * M * R * Q + B * K * M * Q)
            ) + basis.cost_members(B, Q, True)
        elif order == "ax":
            cost = basis.cost_each(B, P) + Cost(
                gemm(B, K, N, P, R) + gemm(B, N, K, R, Q), float(B * K * N * R + B * N * Q)
            )
        else:
            cost = Cost(
                gemm(B, M, P, K, R) + gemm(B, N, K, R, Q), float(B * M * K * R + B * N * Q)
            ) + basis.cost_members(B, R, False)
        out.append(Candidate(order, cost.flops, cost.memory, cost.irregular))
    return out


_PLAN_CACHE: OrderedDict[tuple[Any, ...], Plan] = OrderedDict()
_PLAN_CACHE_SIZE = 2048


def _dense_gemms(a: Array, x: Array, prm: _Param, order: str) -> Array | None:
    r"""A shared dense basis with a full :math:`\Theta` on torch: plain 2-D GEMMs, nothing broadcast or refolded.

    The batch is moved next to the channels once (``x`` as :math:`(M, B P)`, a copy of the
    input only), so that every product is one GEMM over the whole batch and the large
    intermediate (:math:`K` times the activations) is written once and read in place:

    * ``"xtheta"``: :math:`S_k = x\,\Theta_k` as :math:`(M, B Q)`, then :math:`y \mathrel{+}= A_k^\top S_k`;
    * ``"ax"``: :math:`R_k = A_k^\top x` as :math:`(N B, P)`, then :math:`y \mathrel{+}= R_k \Theta_k`;
    * ``"xtheta"`` with :math:`\Theta_k = V_k O_k^\top` (:class:`LowRank`): :math:`S = x\,[V_1 \cdots V_K]`
      in one GEMM, :math:`Z_k = A_k^\top S_k` in one batched GEMM, then
      :math:`y = [Z_1 \cdots Z_K]\,[O_1 \cdots O_K]^\top`.

    Broadcasting the shared basis over the batch instead (``torch.matmul`` of a matrix with a
    batch) makes torch copy or transpose the :math:`K`-fold intermediate (measured: 13 % of a
    CPU forward and backward at 16x16 tokens, 9 heads, width 400).  The result is the
    ``(B, N, Q)`` view of an ``(N, B, Q)`` array.  Returns ``None`` where the einsum path
    applies (NumPy, per-instance bases, separable parameters, the other orders).
    """
    if not is_torch(a) or order not in ("ax", "xtheta") or prm.kind == "separable":
        return None
    if a.ndim == 4:
        return _instance_gemms(a, x, prm) if prm.kind == "full" and order == "xtheta" else None
    K, M, N = (int(s) for s in a.shape)
    B, P, Q = int(x.shape[0]), prm.P, prm.Q
    if prm.kind == "lowrank":
        if order != "xtheta":
            return None
        value, out = prm.operands
        D = prm.R
        xm = x.transpose(0, 1).reshape(M * B, P)
        s = (xm @ value.permute(1, 0, 2).reshape(P, K * D)).reshape(M, B, K, D).permute(2, 0, 1, 3)
        z = a.transpose(1, 2) @ s.reshape(K, M, B * D)  # (K, N, B D): one batched GEMM, nothing broadcast
        z = z.reshape(K, N * B, D).permute(1, 0, 2).reshape(N * B, K * D)
        y = z @ out.permute(0, 2, 1).reshape(K * D, Q)
        return y.reshape(N, B, Q).transpose(0, 1)
    (theta,) = prm.operands
    # Members as separate GEMMs: unbinding a stacked K-fold intermediate would stack its gradient again.
    members, thetas = a.unbind(0), theta.unbind(0)
    if order == "xtheta":
        xm = x.transpose(0, 1).reshape(M * B, P)
        y = members[0].T @ (xm @ thetas[0]).reshape(M, B * Q)
        for k in range(1, K):
            y = y.addmm(members[k].T, (xm @ thetas[k]).reshape(M, B * Q))
    else:
        xm = x.transpose(0, 1).reshape(M, B * P)
        y = (members[0].T @ xm).reshape(N * B, P) @ thetas[0]
        for k in range(1, K):
            y = y.addmm((members[k].T @ xm).reshape(N * B, P), thetas[k])
    return y.reshape(N, B, Q).transpose(0, 1)


def _instance_gemms(a: Array, x: Array, prm: _Param) -> Array:
    r"""A per-instance dense basis ``(B, K, M, N)`` with a full :math:`\Theta` on torch, x·Θ first, as two GEMMs.

    :math:`S_b = x_b [\Theta_1 \cdots \Theta_K]` is one GEMM over the whole batch, laid out as
    :math:`(B, M K, Q)`; then :math:`y_b = A_b'^\top S_b` is one batched GEMM, with
    :math:`A'_b` the basis of instance :math:`b` read as :math:`(M K, N)`.  That reading is a view
    when the basis is stored in ``(B, M, K, N)`` memory order (as
    :class:`~structconv.nn.PositionalAttention` builds its dropped-out heads) and one copy of the
    basis otherwise.  Measured on CPU (batch 25, 9 heads, 256 positions, width 400, forward and
    backward): 554 ms against 663 ms for opt_einsum's ``tensordot`` path, which permutes both the
    basis and the :math:`K`-fold intermediate.  (A per-head batched GEMM for ``"ax"`` measured
    slower than opt_einsum, 846 against 623 ms, so that order keeps the einsum path.)
    """
    (theta,) = prm.operands
    B, K, M, N = (int(s) for s in a.shape)
    P, Q = prm.P, prm.Q
    s = (x.reshape(B * M, P) @ theta.permute(1, 0, 2).reshape(P, K * Q)).reshape(B, M * K, Q)
    stacked = a.permute(0, 2, 1, 3).reshape(B, M * K, N)  # a view for (B, M, K, N) memory, else one copy
    return stacked.transpose(1, 2) @ s


def _plan(basis: Basis, x: Array, prm: _Param, order: str) -> Plan:
    valid = _orders(prm.kind, basis)
    if order != "auto" and order not in valid:
        raise ValueError(
            f"order={order!r} is not valid for a {prm.kind} parameter and a {basis.representation} basis "
            f"on {basis.backend}; expected one of {('auto',) + valid}"
        )
    B = int(x.shape[0])
    key = (basis.plan_key(), B, prm.kind, prm.P, prm.Q, prm.R, order)
    cached = _PLAN_CACHE.get(key)
    if cached is not None:
        _PLAN_CACHE.move_to_end(key)
        return cached
    sizes = {"B": B, "K": basis.K, "M": basis.M, "N": basis.N, "P": prm.P, "Q": prm.Q}
    if prm.kind != "full":
        sizes["H" if prm.kind == "separable" else "D"] = prm.R
    equation = ""
    if isinstance(basis, DenseBasis):
        equation = _dense_equation(basis.batch is not None, prm.kind)
        shapes = (basis.shape, tuple(int(s) for s in x.shape)) + tuple(
            tuple(int(s) for s in op.shape) for op in prm.operands
        )
        candidates = [_dense_candidate(equation, shapes, o, prm.kind) for o in valid]
    else:
        candidates = _generic_candidates(basis, B, prm)
    chosen = order if order != "auto" else min(candidates, key=lambda c: c.score).order
    plan = Plan(basis.representation, sizes, prm.kind, tuple(candidates), chosen, order, equation)
    _PLAN_CACHE[key] = plan
    if len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
        _PLAN_CACHE.popitem(last=False)
    return plan


def explain(a: Basis | Array, x: Array, theta: Parameter, order: str = "auto") -> Plan:
    """Report the cost of every order for these operands and the one :func:`conv` would run.

    Parameters are those of :func:`conv`.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import explain
    >>> plan = explain(np.ones((9, 64, 64)), np.ones((8, 64, 3)), np.ones((9, 3, 16)))
    >>> plan.chosen in ("ax", "xtheta", "atheta")
    True
    """
    basis, x3, prm, _ = _prepare(a, x, theta)
    return _plan(basis, x3, prm, order)


def _run_generic(basis: Basis, x: Array, prm: _Param, order: str) -> Array:
    if prm.kind == "lowrank" and order in basis.factor_orders():
        return basis.run_factored(order, x, *prm.operands)
    if prm.kind != "full" and (order == "atheta" or order.endswith("+full") or order in basis.special_orders()):
        full = einsum("hk,hpq->kpq" if prm.kind == "separable" else "kpd,kqd->kpq", *prm.operands)
        return _run_generic(basis, x, _Param("full", (full,), prm.K, prm.P, prm.Q, 0), order.removesuffix("+full"))
    if prm.kind == "full":
        (theta,) = prm.operands
        fast = basis.run_order(order, x, theta)
        if fast is not None:
            return fast
        if order == "ax":
            return einsum("bknp,kpq->bnq", basis.apply_each(x), theta)
        if order == "xtheta":
            return basis.apply_members(x_theta(x, theta), reduce=True)
        return basis.apply_combined(x, theta)
    f1, f2 = prm.operands
    if prm.kind == "separable":
        if order == "ax":
            return einsum("bhnp,hpq->bnq", einsum("hk,bknp->bhnp", f1, basis.apply_each(x)), f2)
        mixed = einsum("hk,bhmq->bkmq", f1, einsum("bmp,hpq->bhmq", x, f2))
        return basis.apply_members(mixed, reduce=True)
    if order == "ax":
        heads = einsum("bknp,kpd->bknd", basis.apply_each(x), f1)
    else:
        heads = basis.apply_members(einsum("bmp,kpd->bkmd", x, f1), reduce=False)
    return einsum("bknd,kqd->bnq", heads, f2)


def conv(a: Basis | Array, x: Array, theta: Parameter, order: str = "auto") -> Array:
    r"""Compute :math:`y_b = \sum_k A_k^\top x_b \Theta_k` (Andreoli, Prop. 2, batched).

    Parameters
    ----------
    a
        The basis: a :class:`~structconv.Basis`, or a dense array of shape ``(K, M, N)`` or
        ``(B, K, M, N)``.
    x
        Input of shape ``(B, M, P)`` or ``(M, P)``.
    theta
        Parameter of shape ``(K, P, Q)``, or a :class:`~structconv.Separable` /
        :class:`~structconv.LowRank` factorisation of it.
    order
        ``"auto"`` (least estimated cost), ``"ax"``, ``"xtheta"``, ``"atheta"``, and for
        factorised parameters also ``"ax+full"`` and ``"xtheta+full"``.  See
        :func:`explain`.

    Returns
    -------
    Array
        ``y`` of shape ``(B, N, Q)`` (or ``(N, Q)`` for 2-D ``x``), on the backend of ``x``.

    Raises
    ------
    ValueError, TypeError
        On mismatched shapes, ranks, backends, dtypes or devices, empty dimensions or an
        unknown ``order``; the message names the argument.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import conv
    >>> rng = np.random.default_rng(0)
    >>> A, x, theta = rng.random((4, 5, 6)), rng.random((2, 5, 3)), rng.random((4, 3, 7))
    >>> y = conv(A, x, theta)
    >>> bool(np.allclose(y, np.einsum("kmn,bmp,kpq->bnq", A, x, theta)))
    True
    """
    a, x, theta = _autocast(_placed(a, x), x, theta)  # placed first: autocast reads the basis' dtype
    basis, x3, prm, squeeze = _prepare(a, x, theta)
    plan = _plan(basis, x3, prm, order)
    if isinstance(basis, DenseBasis):
        y = _dense_gemms(basis.array, x3, prm, plan.chosen)
        if y is None:
            y = einsum(plan.equation, basis.array, x3, *prm.operands, path=_DENSE_PATHS[prm.kind][plan.chosen])
    else:
        y = _run_generic(basis, x3, prm, plan.chosen)
    return y[0] if squeeze else y
