"""Bases are values: applying one, in every order the engine offers, changes nothing in it.

For every kind of basis the public API builds, on NumPy and on torch, the test snapshots the
basis' whole state (each attribute of ``vars`` and ``__slots__``, recursively; arrays by value
and by identity), runs :func:`structconv.conv` twice in every order :func:`structconv.explain`
lists, and compares.

Derived data is allowed in exactly two explicit forms, which the snapshot reads as caches:
a :class:`~structconv.bases.sparse.Derived` object (each basis creates its own, empty) and a
``functools.cached_property`` of a frozen value.  Everything else counts: a value must not grow
state.  The caches themselves are tested for purity: after use they hold what a fresh, equal
basis computes, and a basis made from another (``to``, ``select``, ``transpose``) never shares
its cache.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from basis_kinds import KINDS, TORCH_ONLY, Convert, parameters

import structconv as sc
from structconv.backend import find, to_numpy
from structconv.bases.sparse import Derived

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
    if isinstance(obj, Derived):
        return ("cache", id(obj))
    if depth >= _SEEN_LIMIT:
        return ("object", id(obj))
    state = {name: getattr(obj, name) for name in _slots(obj) if hasattr(obj, name)}
    memo = {n for n, v in vars(type(obj)).items() if isinstance(v, functools.cached_property)}
    state.update({k: v for k, v in getattr(obj, "__dict__", {}).items() if k not in memo})
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


# --- the kinds of basis (tests/basis_kinds.py), each from NumPy data converted by `cv` --------------
BACKENDS: dict[str, Convert] = {"numpy": np.asarray, "torch": torch.from_numpy}


def _backend(kind: str, backend: str) -> Convert:
    if kind in TORCH_ONLY and backend == "numpy":
        pytest.skip(f"a {kind} basis is torch only")
    return BACKENDS[backend]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_applying_a_basis_in_every_order_leaves_it_unchanged(kind: str, backend: str) -> None:
    cv = _backend(kind, backend)
    basis = KINDS[kind](cv)
    x = cv(np.random.default_rng(2).normal(size=(basis.batch or 2, basis.M, 3)))
    before = snapshot(basis)
    ran = 0
    with torch.no_grad():
        for theta in parameters(basis, cv):
            for candidate in sc.explain(basis, x, theta).candidates:
                for _ in range(2):
                    sc.conv(basis, x, theta, order=candidate.order)
                ran += 1
    assert ran >= 9
    assert_same(before, snapshot(basis))


def _caches(obj: Any, depth: int = 0) -> list[Derived]:
    """Every explicit cache reachable from ``obj``, in a stable order."""
    if isinstance(obj, Derived):
        return [obj]
    if depth >= _SEEN_LIMIT or find(obj) is not None or obj is None:
        return []
    if isinstance(obj, tuple | list):
        return [c for v in obj for c in _caches(v, depth)]
    state = [getattr(obj, n) for n in _slots(obj) if hasattr(obj, n)]
    state += list(getattr(obj, "__dict__", {}).values())
    return [c for v in state for c in _caches(v, depth + 1)]


def _cache_values(cache: Derived) -> dict[str, Any]:
    return {k: snapshot(v) for k, v in cache._items.items()}


def _strip_ids(picture: Any) -> Any:
    if isinstance(picture, tuple) and picture and picture[0] == "array":
        return ("array", *picture[2:4], picture[4].tolist())
    if isinstance(picture, tuple):
        return tuple(_strip_ids(p) for p in picture if not isinstance(p, int) or isinstance(p, bool))
    if isinstance(picture, list):
        return [_strip_ids(p) for p in picture]
    if isinstance(picture, dict):
        return {k: _strip_ids(v) for k, v in picture.items()}
    return picture


CACHED = ["sparse", "sparse-batched", "concat", "composed", "select", "graph-powers", "graph-chebyshev"]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kind", CACHED)
def test_caches_hold_what_a_fresh_equal_basis_computes(kind: str, backend: str) -> None:
    cv = _backend(kind, backend)
    used, fresh = KINDS[kind](cv), KINDS[kind](cv)
    assert _caches(used), f"{kind} has no explicit cache: remove it from CACHED"
    x = cv(np.random.default_rng(2).normal(size=(used.batch or 2, used.M, 3)))
    theta = parameters(used, cv)[0]
    with torch.no_grad():
        for candidate in sc.explain(used, x, theta).candidates:
            sc.conv(used, x, theta, order=candidate.order)
        sc.conv(fresh, x, theta)  # one order only: a second basis fills less, never differently
    for a, b in zip(_caches(used), _caches(fresh), strict=True):
        assert a is not b
        shared = set(a._items) & set(b._items)
        for name in shared:
            assert _strip_ids(snapshot(a._items[name])) == _strip_ids(snapshot(b._items[name])), name


@pytest.mark.parametrize("kind", CACHED)
def test_a_basis_made_from_another_never_shares_its_cache(kind: str) -> None:
    basis = KINDS[kind](torch.from_numpy)
    x = torch.randn(basis.batch or 2, basis.M, 3, dtype=torch.float64)
    sc.conv(basis, x, parameters(basis, torch.from_numpy)[0])
    old = {id(c) for c in _caches(basis)}
    # A new dtype changes every part of the value: no cache may be shared.
    assert not old & {id(c) for c in _caches(basis.to(dtype=torch.float32))}
    # A selection or a transpose may keep unchanged parts (and their caches); its own cache is new.
    own = {id(c) for c in _caches(basis, depth=_SEEN_LIMIT - 1)}
    for made in (basis.select([0]), basis.transpose()):
        assert not own & {id(c) for c in _caches(made, depth=_SEEN_LIMIT - 1)}, type(made).__name__


def _public_attributes(obj: object) -> list[str]:
    klass = type(obj)
    names = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()  # type: ignore[arg-type]
    names |= {n for k in klass.__mro__ for n, v in vars(k).items() if isinstance(v, property)}
    return sorted(n for n in names if not n.startswith("_"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_public_attributes_cannot_be_reassigned(kind: str) -> None:
    basis = KINDS[kind](torch.from_numpy if kind in TORCH_ONLY else np.asarray)
    names = _public_attributes(basis)
    assert names, f"{type(basis).__name__} shows no public attributes"
    for name in names:
        with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
            setattr(basis, name, getattr(basis, name))


def _concrete_bases() -> set[type]:
    def below(klass: type) -> set[type]:
        found = set()
        for sub in klass.__subclasses__():
            found |= {sub} | below(sub)
        return found

    # The package's own representations (tests define stand-in bases of their own).
    return {k for k in below(sc.Basis) if not k.__abstractmethods__ and k.__module__.startswith("structconv.")}


def test_every_representation_is_among_the_kinds() -> None:
    built = {type(build(torch.from_numpy if kind in TORCH_ONLY else np.asarray)) for kind, build in KINDS.items()}
    assert _concrete_bases() <= built, sorted(k.__name__ for k in _concrete_bases() - built)


def _round_trips() -> dict[str, Callable[[Any], Any]]:
    def torch_save(basis: Any) -> Any:
        buffer = io.BytesIO()
        torch.save(basis, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    return {
        "deepcopy": copy.deepcopy,
        "copy": copy.copy,
        "pickle": lambda basis: pickle.loads(pickle.dumps(basis)),
        "torch.save": torch_save,
    }


@pytest.mark.parametrize("how", sorted(_round_trips()))
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_used_basis_copies_and_pickles_to_an_equal_value(kind: str, backend: str, how: str) -> None:
    """Its derived caches (sparse CSR products, autograd sums) are dropped by the copy, then rebuilt."""
    cv = _backend(kind, backend)
    basis = KINDS[kind](cv)
    x = cv(np.random.default_rng(2).normal(size=(basis.batch or 2, basis.M, 3)))
    theta = parameters(basis, cv)[0]
    with torch.no_grad():
        expected = {c.order: sc.conv(basis, x, theta, order=c.order) for c in sc.explain(basis, x, theta).candidates}
    twin = _round_trips()[how](basis)
    assert type(twin) is type(basis) and twin.shape == basis.shape
    if how != "copy":  # a shallow copy shares the arrays, and may share what is derived from them
        assert not {id(c) for c in _caches(basis)} & {id(c) for c in _caches(twin)}
    np.testing.assert_array_equal(to_numpy(twin.to_dense()), to_numpy(basis.to_dense()))
    with torch.no_grad():
        for order, y in expected.items():
            np.testing.assert_array_equal(to_numpy(sc.conv(twin, x, theta, order=order)), to_numpy(y), err_msg=order)


def test_a_copied_differentiable_sparse_basis_keeps_its_gradient_path() -> None:
    values = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    basis = sc.SparseBasis(torch.tensor([[0, 0, 0], [1, 0, 1], [0, 1, 0]]), values, (1, 2, 2))
    assert basis.nnz == 2  # the repeated entry is summed under autograd: a non-leaf kept in the cache
    x = torch.ones(1, 2, 1, dtype=torch.float64)
    twin = copy.deepcopy(basis)
    twin_values = twin._values
    sc.conv(twin, x, torch.ones(1, 1, 1, dtype=torch.float64)).sum().backward()
    assert twin_values.grad is not None and values.grad is None
