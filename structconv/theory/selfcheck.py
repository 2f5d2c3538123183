"""Numerical self-test of the framework's identities, run by ``structconv check``.

Each check draws random cases, compares two computations that the mathematics says are equal,
and records the largest relative error.  Nothing here is used by the engine itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import REGISTRY, to_numpy
from ..backend.interface import Backend
from ..bases.base import Basis
from ..bases.composite import ConcatBasis
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank, Separable
from ..bases.sparse import SparseBasis
from ..engine.contract import conv
from ..engine.reference import dense_reference
from .algebra import combine, compose, decompose

REPRESENTATIONS = ("dense", "sparse", "concat")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one identity over several random cases."""

    name: str
    cases: int
    max_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        """Whether the largest error is within tolerance."""
        return bool(self.max_error <= self.tolerance)


def _rel_error(a: Any, b: Any) -> float:
    a, b = _np(a), _np(b)
    scale = max(1.0, float(np.abs(b).max()))
    return float(np.abs(a - b).max()) / scale


def _np(a: Any) -> np.ndarray:
    return to_numpy(a) if not isinstance(a, float | int) else np.asarray(a)


def random_basis_array(rng: np.random.Generator, shape: tuple[int, ...], density: float) -> np.ndarray:
    """A random basis array with about ``density`` of its entries non-zero."""
    return rng.normal(size=shape) * (rng.random(shape) < density)


def build_basis(array: Any, representation: str) -> Basis:
    """Represent the dense ``array`` as ``representation`` (``dense``, ``sparse`` or ``concat``)."""
    if representation == "dense":
        return DenseBasis(array)
    if representation == "sparse":
        return SparseBasis.from_dense(array)
    if representation == "concat":
        axis = array.ndim - 3
        k = array.shape[axis]
        if k < 2:
            return ConcatBasis([SparseBasis.from_dense(array)])
        first = array[:, :1] if axis == 1 else array[:1]
        rest = array[:, 1:] if axis == 1 else array[1:]
        return ConcatBasis([DenseBasis(first), SparseBasis.from_dense(rest)])
    raise ValueError(f"representation={representation!r}; expected one of {REPRESENTATIONS}")


def _cases(rng: np.random.Generator, count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        batched = i % 3 == 2
        K, M, N, P, Q, B = (int(v) for v in rng.integers(1, 7, size=6))
        shape = (B, K, M, N) if batched else (K, M, N)
        yield {
            "A": random_basis_array(rng, shape, float(rng.uniform(0.2, 1.0))),
            "x": rng.normal(size=(B, M, P)),
            "theta": rng.normal(size=(K, P, Q)),
        }


def _on(name: str) -> Callable[[np.ndarray], Any]:
    """The conversion of NumPy test data to the backend registered as ``name`` (:data:`structconv.backend.REGISTRY`)."""
    backend: Backend = importlib.import_module(REGISTRY[name][1]).BACKEND
    return backend.from_numpy


def run_checks(seed: int = 0, cases: int = 12, backends: tuple[str, ...] = ("numpy", "torch")) -> list[CheckResult]:
    """Run every identity on ``cases`` random cases per check and return the results."""
    rng = np.random.default_rng(seed)
    data = list(_cases(rng, cases))
    tol = 1e-10
    results: list[CheckResult] = []

    def against_einsum(c: dict[str, Any], backend: str, rep: str, order: str) -> float:
        cv = _on(backend)
        y = conv(build_basis(cv(c["A"]), rep), cv(c["x"]), cv(c["theta"]), order=order)
        return _rel_error(y, dense_reference(c["A"], c["x"], c["theta"]))

    for backend in backends:
        for rep in REPRESENTATIONS:
            for order in ("ax", "xtheta", "atheta", "auto"):
                err = max(against_einsum(c, backend, rep, order) for c in data)
                results.append(CheckResult(f"conv = einsum   [{backend}, {rep}, {order}]", cases, err, tol))

    def linearity(c: dict[str, Any]) -> float:
        x2, t2 = rng.normal(size=c["x"].shape), rng.normal(size=c["theta"].shape)
        a, b = 0.7, -1.3
        basis = SparseBasis.from_dense(c["A"])
        lhs_x = conv(basis, a * c["x"] + b * x2, c["theta"])
        rhs_x = a * conv(basis, c["x"], c["theta"]) + b * conv(basis, x2, c["theta"])
        lhs_t = conv(basis, c["x"], a * c["theta"] + b * t2)
        rhs_t = a * conv(basis, c["x"], c["theta"]) + b * conv(basis, c["x"], t2)
        return max(_rel_error(lhs_x, rhs_x), _rel_error(lhs_t, rhs_t))

    results.append(CheckResult("linearity in x and in theta", cases, max(map(linearity, data)), tol))

    def agree(c: dict[str, Any], name: str) -> float:
        ys = [
            conv(SparseBasis.from_dense(cv(c["A"])), cv(c["x"]), cv(c["theta"])) for cv in (_on(backends[0]), _on(name))
        ]
        return _rel_error(ys[1], ys[0])

    for name in backends[1:]:  # every backend against the first one
        err = max(agree(c, name) for c in data)
        results.append(CheckResult(f"{backends[0]} = {name} (sparse, auto)", cases, err, tol))

    def transpose(c: dict[str, Any]) -> float:
        A = c["A"]
        At = np.swapaxes(A, -1, -2)
        xt = rng.normal(size=(c["x"].shape[0], A.shape[-1], c["x"].shape[2]))
        return _rel_error(conv(SparseBasis.from_dense(A).T, xt, c["theta"]), dense_reference(At, xt, c["theta"]))

    results.append(CheckResult("transpose swaps inputs and outputs", cases, max(map(transpose, data)), tol))

    def factorised(c: dict[str, Any]) -> float:
        K, P, Q = c["theta"].shape
        H, D = 2, 3
        coef, chan = rng.normal(size=(H, K)), rng.normal(size=(H, P, Q))
        val, out = rng.normal(size=(K, P, D)), rng.normal(size=(K, Q, D))
        basis = build_basis(c["A"], "concat")
        errs = []
        for order in ("ax", "xtheta"):
            errs.append(
                _rel_error(
                    conv(basis, c["x"], Separable(coef, chan), order=order),
                    dense_reference(c["A"], c["x"], np.einsum("hk,hpq->kpq", coef, chan)),
                )
            )
            errs.append(
                _rel_error(
                    conv(basis, c["x"], LowRank(val, out), order=order),
                    dense_reference(c["A"], c["x"], np.einsum("kpd,kqd->kpq", val, out)),
                )
            )
        return max(errs)

    results.append(CheckResult("separable / low-rank factors kept", cases, max(map(factorised, data)), tol))

    def prop1(_: dict[str, Any]) -> float:
        M, N, P, Q = (int(v) for v in rng.integers(1, 4, size=4))
        A = rng.normal(size=(M * N, M, N))
        phi = rng.normal(size=(M, N, P, Q))
        theta = decompose(A, phi)
        return max(_rel_error(combine(A, theta), phi), _rel_error(decompose(A, combine(A, theta)), theta))

    results.append(CheckResult("Prop. 1: decompose(combine) round trip", cases, max(map(prop1, data)), 1e-8))

    def prop3(c: dict[str, Any]) -> float:
        A1 = c["A"] if c["A"].ndim == 3 else c["A"][0]
        x = c["x"]
        K2, N2, Q2 = (int(v) for v in rng.integers(1, 5, size=3))
        A2 = random_basis_array(rng, (K2, A1.shape[2], N2), 0.6)
        t1, t2 = c["theta"], rng.normal(size=(c["theta"].shape[2], Q2))[None].repeat(K2, 0)
        t2 = t2 + rng.normal(size=t2.shape)
        expected = conv(A2, conv(A1, x, t1), t2)
        errs = []
        for rep in REPRESENTATIONS:
            basis, theta = compose(build_basis(A1, rep), t1, build_basis(A2, rep), t2)
            errs.append(_rel_error(conv(basis, x, theta), expected))
        return max(errs)

    results.append(CheckResult("Prop. 3: compose = sequence", cases, max(map(prop3, data)), tol))

    results.extend(_grid_checks(rng, cases, backends))
    results.extend(_graph_checks(rng, cases, backends))
    for name in backends:  # checks of what only some backends have (autograd)
        results.extend(check(data[: min(4, len(data))]) for check in _GRADIENT_CHECKS.get(name, ()))
    return results


def _graph_checks(rng: np.random.Generator, count: int, backends: tuple[str, ...]) -> list[CheckResult]:
    from ..bases.edges import EdgeBasis
    from ..structures.graph import graph_basis

    tol = 1e-10
    graphs = []
    for _ in range(count):
        N = int(rng.integers(2, 9))
        E = int(rng.integers(0, 3 * N))
        graphs.append((N, rng.integers(0, N, size=(2, E)), rng.uniform(0.1, 2.0, size=E)))

    def adjacency(N: int, index: np.ndarray, weight: np.ndarray) -> np.ndarray:
        A = np.zeros((N, N))
        np.add.at(A, (index[0], index[1]), weight)
        return A

    def inv_sqrt(d: np.ndarray) -> np.ndarray:
        return np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)

    def gcn(g: tuple[int, np.ndarray, np.ndarray]) -> float:
        N, index, weight = g
        A = adjacency(N, index[:, index[0] != index[1]], weight[index[0] != index[1]])
        for n in range(N):  # the last given loop weight, else 1
            loops = weight[(index[0] == n) & (index[1] == n)]
            A[n, n] = loops[-1] if loops.size else 1.0
        d = inv_sqrt(A.sum(0))
        return _rel_error(graph_basis(index, "gcn", num_nodes=N, edge_weight=weight).to_dense()[0], d[:, None] * A * d)

    out = [CheckResult("graph: gcn basis = D^-1/2 (A+I) D^-1/2", count, max(gcn(g) for g in graphs), tol)]

    def polynomial(g: tuple[int, np.ndarray, np.ndarray], backend: str) -> float:
        N, index, weight = g
        cv = _on(backend)
        errs = []
        for kind in ("powers", "chebyshev", "diffusion"):
            basis = graph_basis(cv(index), kind, K=3, num_nodes=N, edge_weight=cv(weight))
            dense = _np(basis.to_dense())
            x, theta = rng.normal(size=(2, N, 3)), rng.normal(size=(basis.K, 3, 2))
            for order in ("ax", "xtheta", "auto") + (("materialized",) if kind != "diffusion" else ()):
                errs.append(_rel_error(conv(basis, cv(x), cv(theta), order=order), dense_reference(dense, x, theta)))
        return max(errs)

    def edges(g: tuple[int, np.ndarray, np.ndarray], backend: str) -> float:
        N, index, _ = g
        cv = _on(backend)
        w = rng.normal(size=(index.shape[1], 3))
        basis = EdgeBasis(cv(index[0]), cv(index[1]), cv(w), (N, N))
        dense = np.stack([adjacency(N, index, w[:, k]) for k in range(3)])
        x, theta = rng.normal(size=(2, N, 3)), rng.normal(size=(3, 3, 2))
        return max(
            _rel_error(conv(basis, cv(x), cv(theta), order=o), dense_reference(dense, x, theta))
            for o in ("ax", "xtheta")
        )

    for backend in backends:
        worst = max(polynomial(g, backend) for g in graphs)
        out.append(CheckResult(f"graph: polynomial orders = einsum [{backend}]", count, worst, tol))
        worst = max(edges(g, backend) for g in graphs)
        out.append(CheckResult(f"graph: edge basis = einsum [{backend}]", count, worst, tol))
    return out


def _grid_cases(rng: np.random.Generator, count: int) -> Iterator[dict[str, Any]]:
    for _ in range(count):
        grid = tuple(int(v) for v in rng.integers(3, 9, size=2))
        kernel = tuple(int(v) for v in rng.integers(1, 4, size=2))
        same = bool(rng.integers(2))
        stride = (1, 1) if same else tuple(int(v) for v in rng.integers(1, 3, size=2))
        B, P, Q = (int(v) for v in rng.integers(1, 4, size=3))
        yield {
            "grid": grid,
            "kernel": kernel,
            "stride": stride,
            "padding": "same" if same else tuple(k // 2 for k in kernel),
            "boundary": str(rng.choice(["zero", "periodic"])),
            "x": rng.normal(size=(B, grid[0] * grid[1], P)),
            "theta": rng.normal(size=(kernel[0] * kernel[1], P, Q)),
        }


def _grid_checks(rng: np.random.Generator, count: int, backends: tuple[str, ...]) -> list[CheckResult]:
    from ..structures.grid import grid_basis

    cases = list(_grid_cases(rng, count))
    tol = 1e-10
    out = []

    def basis(c: dict[str, Any], like: Any) -> Any:
        return grid_basis(
            c["grid"], c["kernel"], stride=c["stride"], padding=c["padding"], boundary=c["boundary"], like=like
        )

    for backend in backends:
        cv = _on(backend)
        # The orders of every grid basis, and those the backend adds (a native convolution).
        own = grid_basis((3, 3), (1, 1), like=cv(np.zeros(1))).own_orders()
        orders = tuple(dict.fromkeys((*own, "ax", "xtheta", "auto")))
        for order in orders:

            def err(c: dict[str, Any], order: str = order, cv: Callable[[np.ndarray], Any] = cv) -> float:
                A = basis(c, cv(np.zeros(1)))
                y = conv(A, cv(c["x"]), cv(c["theta"]), order=order)
                dense = basis(c, None).to_dense()
                return _rel_error(y, dense_reference(dense, c["x"], c["theta"]))

            out.append(CheckResult(f"grid conv = einsum [{backend}, {order}]", count, max(map(err, cases)), tol))
    for name in backends:  # comparisons with a backend's own convolution
        out.extend(check(cases, basis) for check in _GRID_REFERENCES.get(name, ()))

    def equivariance(c: dict[str, Any]) -> float:
        grid = c["grid"]
        A = grid_basis(grid, c["kernel"], padding="same", boundary="periodic")
        t = tuple(int(v) for v in rng.integers(-3, 4, size=2))
        B = c["x"].shape[0]

        def roll(v: np.ndarray) -> np.ndarray:
            rolled: np.ndarray = np.roll(v.reshape(B, *grid, -1), t, axis=(1, 2)).reshape(B, grid[0] * grid[1], -1)
            return rolled

        return _rel_error(conv(A, roll(c["x"]), c["theta"]), roll(conv(A, c["x"], c["theta"])))

    out.append(CheckResult("periodic grid conv is shift-equivariant", count, max(map(equivariance, cases)), tol))
    return out


def _against_conv2d(cases: list[dict[str, Any]], basis: Callable[[dict[str, Any], Any], Basis]) -> CheckResult:
    """Torch's ``F.conv2d`` on the padded image against the engine on the grid basis."""
    import torch
    from torch.nn import functional as F  # noqa: N812

    def err(c: dict[str, Any]) -> float:
        x, theta = torch.from_numpy(c["x"]), torch.from_numpy(c["theta"])
        B, _, P = x.shape
        img = x.transpose(1, 2).reshape(B, P, *c["grid"])
        weight = theta.permute(2, 1, 0).reshape(theta.shape[2], P, *c["kernel"])
        if c["padding"] == "same":
            total = [k - 1 for k in c["kernel"]]
            pads = [total[1] // 2, total[1] - total[1] // 2, total[0] // 2, total[0] - total[0] // 2]
        else:
            pads = [c["padding"][1], c["padding"][1], c["padding"][0], c["padding"][0]]
        mode = "circular" if c["boundary"] == "periodic" else "constant"
        ref = F.conv2d(F.pad(img, pads, mode=mode), weight, stride=c["stride"])
        y = conv(basis(c, x), x, theta)
        return _rel_error(y, ref.flatten(2).transpose(1, 2))

    return CheckResult("grid conv = F.conv2d (zero / circular padding)", len(cases), max(map(err, cases)), 1e-10)


def _gradcheck(cases: list[dict[str, Any]]) -> CheckResult:
    """Torch's ``gradcheck`` of the engine in every order, dense and sparse, in float64."""
    import torch

    ok = True
    for c in cases:
        x = torch.from_numpy(c["x"]).requires_grad_()
        theta = torch.from_numpy(c["theta"]).requires_grad_()
        dense = torch.from_numpy(c["A"]).requires_grad_()
        pattern = SparseBasis.from_dense(torch.from_numpy(c["A"]))
        values = pattern.values.clone().requires_grad_()
        for order in ("ax", "xtheta", "atheta"):

            def dense_fn(A: Any, xx: Any, t: Any, order: str = order) -> Any:
                return conv(DenseBasis(A), xx, t, order=order)

            # The sparsity pattern is fixed: only the stored values are differentiated.
            def sparse_fn(v: Any, xx: Any, t: Any, order: str = order, pattern: SparseBasis = pattern) -> Any:
                return conv(SparseBasis(pattern.indices, v, pattern.shape), xx, t, order=order)

            ok &= bool(torch.autograd.gradcheck(dense_fn, (dense, x, theta), raise_exception=False))
            ok &= bool(torch.autograd.gradcheck(sparse_fn, (values, x, theta), raise_exception=False))
    return CheckResult("float64 gradcheck (x, theta, basis)", len(cases), 0.0 if ok else float("inf"), 0.0)


#: Checks against a backend's own reference (its convolution, its autograd), by backend name:
#: a backend without such a reference simply has none.
_GRID_REFERENCES: dict[str, tuple[Callable[[list[dict[str, Any]], Any], CheckResult], ...]] = {
    "torch": (_against_conv2d,)
}
_GRADIENT_CHECKS: dict[str, tuple[Callable[[list[dict[str, Any]]], CheckResult], ...]] = {"torch": (_gradcheck,)}


def format_results(results: list[CheckResult]) -> str:
    """Render results as a fixed-width table."""
    width = max(len(r.name) for r in results)
    lines = [f"{'identity':<{width}}  {'cases':>5}  {'max rel. error':>14}  {'tolerance':>9}  status"]
    lines.append("-" * len(lines[0]))
    for r in results:
        lines.append(
            f"{r.name:<{width}}  {r.cases:>5}  {r.max_error:>14.2e}  {r.tolerance:>9.0e}  "
            + ("ok" if r.passed else "FAIL")
        )
    failed = sum(not r.passed for r in results)
    lines.append(f"{len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)


__all__ = ["CheckResult", "build_basis", "format_results", "random_basis_array", "run_checks"]
