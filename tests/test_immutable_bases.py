"""Bases are values: applying one, in every order the engine offers, changes nothing in it.

For every kind of basis the public API builds, on NumPy and on torch, the test snapshots the
basis' whole state (each attribute of ``vars`` and ``__slots__``, recursively; arrays by value
and by identity), runs :func:`structconv.conv` twice in every order :func:`structconv.explain`
lists, and compares.  Caches filled on first use count as changes: a value must not grow state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import structconv as sc
from structconv.backend import find, to_numpy

_SEEN_LIMIT = 4  # how deep nested objects are followed


def _slots(obj: object) -> list[str]:
    names: list[str] = []
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return [n for n in names if n not in ("__dict__", "__weakref__")]


def snapshot(obj: Any, depth: int = 0) -> Any:
    """A comparable picture of ``obj``: arrays as (identity, dtype, shape, values), objects as their attributes."""
    backend = find(obj)
    if backend is not None:
        values = obj.to_dense() if backend.is_sparse(obj) else obj  # a cached CSR form, say
        return ("array", id(obj), str(obj.dtype), tuple(obj.shape), to_numpy(values).copy())
    if obj is None or isinstance(obj, bool | int | float | str | bytes | type | torch.dtype | torch.device):
        return obj
    if isinstance(obj, tuple | list):
        return (type(obj).__name__, id(obj) if isinstance(obj, list) else None, [snapshot(v, depth) for v in obj])
    if isinstance(obj, dict):
        return ("dict", id(obj), {k: snapshot(v, depth) for k, v in obj.items()})
    if callable(obj) and not hasattr(obj, "__dict__") and not _slots(obj):
        return ("callable", id(obj))
    if depth >= _SEEN_LIMIT:
        return ("object", id(obj))
    state = {name: getattr(obj, name) for name in _slots(obj) if hasattr(obj, name)}
    state.update(getattr(obj, "__dict__", {}))
    return ("object", type(obj).__name__, id(obj), {k: snapshot(v, depth + 1) for k, v in sorted(state.items())})


def assert_same(before: Any, after: Any, path: str = "basis") -> None:
    if isinstance(before, tuple) and before and before[0] == "array":
        assert isinstance(after, tuple) and after[0] == "array", f"{path}: an array was replaced by {after!r}"
        assert before[1] == after[1], f"{path}: the array object was replaced"
        assert before[2:4] == after[2:4], f"{path}: dtype/shape changed {before[2:4]} -> {after[2:4]}"
        assert np.array_equal(before[4], after[4], equal_nan=True), f"{path}: the array's values changed"
        return
    if isinstance(before, tuple) and before and before[0] == "object":
        assert isinstance(after, tuple) and after[:3] == before[:3], f"{path}: object replaced"
        if len(before) > 3:
            assert set(before[3]) == set(after[3]), (
                f"{path}: attributes changed: added {sorted(set(after[3]) - set(before[3]))}, "
                f"removed {sorted(set(before[3]) - set(after[3]))}"
            )
            for name in before[3]:
                assert_same(before[3][name], after[3][name], f"{path}.{name}")
        return
    if isinstance(before, tuple) and before and before[0] == "dict":
        assert isinstance(after, tuple) and after[0] == "dict" and after[1] == before[1], f"{path}: dict replaced"
        assert set(before[2]) == set(after[2]), (
            f"{path}: keys changed: added {sorted(set(after[2]) - set(before[2]), key=repr)}"
        )
        for key in before[2]:
            assert_same(before[2][key], after[2][key], f"{path}[{key!r}]")
        return
    if isinstance(before, tuple) and len(before) == 3 and before[0] in ("tuple", "list"):
        assert isinstance(after, tuple) and after[:2] == before[:2], f"{path}: sequence replaced"
        assert len(before[2]) == len(after[2]), f"{path}: length changed"
        for i, (b, a) in enumerate(zip(before[2], after[2], strict=True)):
            assert_same(b, a, f"{path}[{i}]")
        return
    assert before == after, f"{path}: {before!r} -> {after!r}"


# --- the kinds of basis, each from NumPy data converted by `cv` -------------------------------------
Convert = Callable[[np.ndarray], Any]
_RNG = np.random.default_rng(0)
_DENSE = _RNG.normal(size=(3, 6, 5)) * (_RNG.random((3, 6, 5)) < 0.5)
_BATCHED = _RNG.normal(size=(2, 3, 6, 5)) * (_RNG.random((2, 3, 6, 5)) < 0.5)
_EDGES = _RNG.integers(0, 6, size=(2, 14))
_TOKENS = _RNG.normal(size=(2, 6, 4))


def _graph(kind: str) -> Callable[[Convert], Any]:
    def build(cv: Convert) -> Any:
        return sc.graph_basis(cv(_EDGES), kind, K=3, num_nodes=6, edge_weight=cv(_RNG.uniform(0.5, 1.5, size=14)))

    return build


KINDS: dict[str, Callable[[Convert], Any]] = {
    "dense": lambda cv: sc.DenseBasis(cv(_DENSE)),
    "dense-batched": lambda cv: sc.DenseBasis(cv(_BATCHED)),
    "sparse": lambda cv: sc.SparseBasis.from_dense(cv(_DENSE)),
    "sparse-batched": lambda cv: sc.SparseBasis.from_dense(cv(_BATCHED)),
    "edges": lambda cv: sc.EdgeBasis(cv(_EDGES[0]), cv(_EDGES[1]), cv(_RNG.normal(size=(14, 3))), (6, 6)),
    "kronecker": lambda cv: sc.bases.kronecker.KroneckerBasis([cv(_RNG.random((2, 2, 3))), cv(_RNG.random((2, 3, 2)))]),
    "concat": lambda cv: sc.ConcatBasis([sc.DenseBasis(cv(_DENSE[:1])), sc.SparseBasis.from_dense(cv(_DENSE[1:]))]),
    "composed": lambda cv: sc.ComposedBasis(
        sc.SparseBasis.from_dense(cv(_DENSE)), sc.DenseBasis(cv(_DENSE[:2, :5, :4]))
    ),
    "select": lambda cv: sc.SelectBasis(sc.SparseBasis.from_dense(cv(_DENSE)), [2, 0]),
    "grid": lambda cv: sc.grid_basis((4, 5), (3, 3), padding="same", like=cv(np.zeros(1))),
    "avg-pool": lambda cv: sc.avg_pool_basis((4, 4), 2, like=cv(np.zeros(1))),
    "graph-powers": _graph("powers"),
    "graph-chebyshev": _graph("chebyshev"),
    "attention": lambda cv: sc.attention_basis(
        cv(_TOKENS), mechanism=sc.BiAffine(bilinear=cv(_RNG.normal(size=(2, 4, 4))))
    ),
    "positional": lambda cv: sc.QuadraticPosition(
        (3, 3), cv(np.array([[0.0, 1.0], [1.0, -1.0]])), cv(np.array([1.0, 2.0]))
    ).basis(threshold=0.05),
}
BACKENDS: dict[str, Convert] = {"numpy": np.asarray, "torch": torch.from_numpy}


def _parameters(basis: Any, cv: Convert) -> list[Any]:
    """A full, a separable and a low-rank parameter for ``basis``."""
    K, P, Q = basis.K, 3, 2
    rng = np.random.default_rng(1)
    return [
        cv(rng.normal(size=(K, P, Q))),
        sc.Separable(cv(rng.normal(size=(2, K))), cv(rng.normal(size=(2, P, Q)))),
        sc.LowRank(cv(rng.normal(size=(K, P, 2))), cv(rng.normal(size=(K, Q, 2)))),
    ]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_applying_a_basis_in_every_order_leaves_it_unchanged(kind: str, backend: str) -> None:
    cv = BACKENDS[backend]
    basis = KINDS[kind](cv)
    x = cv(np.random.default_rng(2).normal(size=(basis.batch or 2, basis.M, 3)))
    before = snapshot(basis)
    ran = 0
    with torch.no_grad():
        for theta in _parameters(basis, cv):
            for candidate in sc.explain(basis, x, theta).candidates:
                for _ in range(2):
                    sc.conv(basis, x, theta, order=candidate.order)
                ran += 1
    assert ran >= 9
    assert_same(before, snapshot(basis))


def _frozen(obj: object) -> bool:
    params = getattr(type(obj), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_frozen_bases_refuse_assignment(kind: str) -> None:
    basis = KINDS[kind](np.asarray)
    if not _frozen(basis):
        pytest.skip(f"{type(basis).__name__} is not a frozen dataclass")
    public = [f.name for f in dataclasses.fields(basis) if not f.name.startswith("_")]
    for name in public:
        with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
            setattr(basis, name, getattr(basis, name))
