"""Plans: the estimated cost of every order, the chosen one, and the cache that keeps them.

``order="auto"`` picks the candidate of least score
:math:`\\mathrm{flops} + w_s\\,\\mathrm{irregular} + w_m\\,\\mathrm{memory}`, where ``memory``
counts the elements written by intermediates and ``irregular`` the flops of sparse or gather
kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Price of writing one element of an intermediate, in GEMM flops (calibrated on CPU by
#: ``benchmarks/bench_orders.py``; memory traffic, not arithmetic, dominates small contractions).
MEMORY_WEIGHT = 64.0
#: Price of one flop of a sparse or gather kernel, in GEMM flops (calibrated likewise).
SPARSE_FLOP_WEIGHT = 12.0


@dataclass(frozen=True)
class Candidate:
    """One way to run the contraction and its estimated cost.

    Parameters
    ----------
    order
        The order's name, as :func:`structconv.conv` takes it.
    flops
        Dense floating-point operations.
    memory
        Entries written (intermediates and the output), in array elements.
    irregular
        Operations of scatter/gather kernels, weighted apart (:data:`SPARSE_FLOP_WEIGHT`).
    """

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
    """How :func:`structconv.conv` contracts given operands: every candidate order and the chosen one.

    ``str(plan)`` prints a table in the spirit of opt_einsum's ``PathInfo``.

    Parameters
    ----------
    representation
        The basis' representation (``"dense"``, ``"shift"``, ``"sparse"``, ...).
    sizes
        The contraction's sizes by letter (``B``, ``K``, ``M``, ``N``, ``P``, ``Q``, and ``H``,
        ``D`` or ``G`` for a factorised parameter).
    parameter
        The parameter's kind: ``"full"``, ``"separable"``, ``"lowrank"``, ``"convweight"`` or
        ``"aggregation"``.
    candidates
        Every order open to these operands, with its cost.
    chosen
        The order :func:`structconv.conv` runs.
    requested
        The ``order`` argument (``"auto"`` or a name).
    equation
        The einsum equation of a dense basis (empty otherwise).
    build
        The work of deriving the basis' layouts from its entries
        (:meth:`~structconv.Basis.cost_build`), paid once per basis built: on every call of a
        layer that builds its basis per call.  ``None`` where there is none.  ``str(plan)``
        shows it on a ``build`` line, its score relative to the chosen order's.
    """

    representation: str
    sizes: dict[str, int]
    parameter: str
    candidates: tuple[Candidate, ...]
    chosen: str
    requested: str = "auto"
    equation: str = field(default="")
    build: Candidate | None = None

    @property
    def orders(self) -> tuple[str, ...]:
        """The names of every candidate order, as :func:`structconv.conv` accepts them."""
        return tuple(c.order for c in self.candidates)

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
        if self.build is not None:
            b = self.build
            share = b.score / self.candidate(self.chosen).score
            lines.append(
                f"  {'build':<12} {b.flops:12.3e} {b.irregular:12.3e} {b.memory:12.3e} {share:11.2f}x  per basis"
            )
        lines.append(f"  requested: {self.requested}")
        return "\n".join(lines)


__all__ = ["MEMORY_WEIGHT", "SPARSE_FLOP_WEIGHT", "Candidate", "Plan"]
