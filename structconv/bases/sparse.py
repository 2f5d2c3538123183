r"""Sparse bases: only the non-zero entries :math:`(b, k, m, n, A_{bkmn})` are stored.

Applying a sparse basis costs :math:`O(\mathrm{nnz}\cdot C)`; the dense :math:`K\times M\times N`
tensor is never formed (except by :meth:`SparseBasis.to_dense`).  Each hook multiplies one
sparse matrix, built from the entries once per basis value, by a dense matrix.

A basis is a value: its entries are kept as given, and what is computed from them (the sorted
form, the product matrices) is held by the basis' own :class:`Derived` cache, created empty with
it, so nothing derived can go stale or pass from one basis to another.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backend import (
    Array,
    as_index,
    concatenate,
    device_of,
    einsum,
    find,
    is_integer_array,
    namespace,
    of,
    shape_str,
    sparse_matrix,
)
from ..backend.checks import check_finite, check_index_range, check_readable
from .base import Cost, _member_list, _PlacedByArray

#: The most entries (dense positions) a basis may span: each entry's position is an int64.
MAX_ENTRIES = 2**63 - 1

#: Overheads of :meth:`SparseBasis.apply_combined`, in sparse-kernel flops (see its cost).
_COMBINED_FIXED = 1.0e6
_COMBINED_PER_PAIR = 6000.0


class SparseBasis(_PlacedByArray):
    """A basis stored as coordinates and values, of shape ``(K, M, N)`` or ``(B, K, M, N)``.

    Parameters
    ----------
    indices
        Integer array of shape ``(3, nnz)`` (rows ``k, m, n``) or ``(4, nnz)``
        (rows ``b, k, m, n``), on the backend of ``values``.
    values
        Floating array of shape ``(nnz,)``; may require grad.  Duplicate coordinates are
        summed.
    shape
        ``(K, M, N)`` or ``(B, K, M, N)``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import SparseBasis
    >>> A = SparseBasis(np.array([[0, 0], [0, 1], [1, 0]]), np.array([1.0, 2.0]), (1, 2, 2))
    >>> A.to_dense()[0]
    array([[0., 1.],
           [2., 0.]])
    """

    __slots__ = ("_derived", "_indices", "_shape", "_values")
    representation = "sparse"
    host_orders = frozenset({"atheta"})

    def __init__(self, indices: Array, values: Array, shape: Sequence[int]) -> None:
        shape = _sizes(shape)
        if len(shape) not in (3, 4) or any(s <= 0 for s in shape):
            raise ValueError(f"shape must be (K, M, N) or (B, K, M, N) with positive sizes, got {shape_str(shape)}")
        if math.prod(shape) > MAX_ENTRIES:  # sorting and to_dense number the entries in int64
            raise ValueError(
                f"shape {shape_str(shape)} has {math.prod(shape)} entries, more than int64 can number ({MAX_ENTRIES})"
            )
        backend = of(values, "values")
        if values.ndim != 1:
            raise ValueError(f"values must have shape (nnz,), got {shape_str(tuple(values.shape))}")
        if not backend.is_floating(values):
            raise TypeError(f"values must hold floating-point numbers, got dtype {values.dtype}")
        check_finite(values, "values")
        index = indices if find(indices) is not None else np.asarray(indices)
        if index.ndim != 2 or tuple(index.shape) != (len(shape), values.shape[0]):
            raise ValueError(
                f"indices must have shape ({len(shape)}, nnz={values.shape[0]}) for a basis of shape "
                f"{shape_str(shape)}, got {shape_str(tuple(index.shape))}"
            )
        if int(index.shape[1]) and not is_integer_array(index):
            raise TypeError(f"indices must be integers, got dtype {index.dtype}")
        for row, (name, size) in enumerate(zip("bkmn"[4 - len(shape) :], shape, strict=True)):
            check_index_range(index[row], size, f"indices row {row} ({name})")
        # The entries are kept as given: the kernels add repeated entries up anyway, and a basis
        # built for one product (a graph layer's, every call) should not pay for a sort.  The
        # sorted form is derived on demand and held by ``_derived``.
        self._shape = shape
        self._indices = as_index(index, values)
        self._values = values
        self._derived = Derived()

    @classmethod
    def _from_checked(cls, indices: Array, values: Array, shape: tuple[int, ...]) -> SparseBasis:
        """A basis from entries its caller has checked already (int64 indices in range, finite values).

        For graph layers, which build a basis on every call from edges that :func:`as_edges`
        checked: the second check would cost about a tenth of a GCN layer's own basis work.
        """
        basis = cls.__new__(cls)
        basis._shape, basis._indices, basis._values, basis._derived = shape, indices, values, Derived()
        return basis

    def _canonical(self) -> tuple[Array, Array]:
        """The entries sorted, repeated coordinates summed: derived once, from the entries as given."""
        canonical: tuple[Array, Array] = self._derived.get(
            "canonical", lambda: _coalesce(self._indices, self._values, self._shape)
        )
        return canonical

    # --- constructors -------------------------------------------------------------------
    @classmethod
    def from_dense(cls, array: Array) -> SparseBasis:
        """Keep the non-zero entries of a dense ``(K, M, N)`` or ``(B, K, M, N)`` array.

        Parameters
        ----------
        array
            A floating NumPy array or torch tensor (or what ``numpy.asarray`` reads).
        """
        if find(array) is None:
            array = np.asarray(array)
        check_readable(array, "array", "SparseBasis.from_dense (finding the non-zero entries)")
        return cls(*of(array).coordinates(array))

    @classmethod
    def from_torch(cls, tensor: Any) -> SparseBasis:
        """Build from a torch sparse tensor of shape ``(K, M, N)`` or ``(B, K, M, N)``.

        Parameters
        ----------
        tensor
            A floating torch sparse tensor (COO, or another layout, read as COO); its
            repeated entries add up.
        """
        if type(tensor).__module__.partition(".")[0] != "torch":  # a NumPy array is SparseBasis.from_dense's
            raise TypeError(
                f"tensor must be a torch tensor, got {type(tensor).__name__} "
                "(SparseBasis.from_dense reads a dense array)"
            )
        check_readable(tensor, "tensor", "SparseBasis.from_torch (reading the entries)")
        return cls(*of(tensor).coordinates(tensor))

    @classmethod
    def from_scipy(cls, matrices: Sequence[Any]) -> SparseBasis:
        """Build a ``(K, M, N)`` basis from K ``scipy.sparse`` matrices of shape ``(M, N)``.

        Parameters
        ----------
        matrices
            At least one ``scipy.sparse`` matrix or array, all ``(M, N)``: member ``k`` is
            ``matrices[k]``.  The basis is NumPy float64.
        """
        import scipy.sparse

        if not matrices:
            raise ValueError("matrices must hold at least one scipy.sparse matrix")
        for k, mat in enumerate(matrices):
            if not scipy.sparse.issparse(mat):
                raise TypeError(f"matrices must be scipy.sparse matrices, but matrix {k} is a {type(mat).__name__}")
        shapes = {tuple(m.shape) for m in matrices}
        if len(shapes) != 1:
            raise ValueError(f"matrices must all have the same shape (M, N), got {sorted(shapes)}")
        (m_size, n_size) = shapes.pop()
        ks, ms, ns, vs = [], [], [], []
        for k, mat in enumerate(matrices):
            coo = scipy.sparse.coo_array(mat)
            if np.iscomplexobj(coo.data):  # the float64 cast below would drop the imaginary part
                raise TypeError(f"matrices must hold real numbers, but matrix {k} has dtype {coo.data.dtype}")
            ks.append(np.full(coo.nnz, k))
            ms.append(coo.row)
            ns.append(coo.col)
            vs.append(coo.data)
        idx = np.stack([np.concatenate(ks), np.concatenate(ms), np.concatenate(ns)])
        return cls(idx, np.concatenate(vs).astype(np.float64, copy=False), (len(matrices), m_size, n_size))

    # --- value interface ----------------------------------------------------------------
    @property
    def indices(self) -> Array:
        """Coordinates, shape ``(3, nnz)`` or ``(4, nnz)``, coalesced and sorted."""
        return self._canonical()[0]

    @property
    def values(self) -> Array:
        """Values, shape ``(nnz,)``, in the order of :attr:`indices`."""
        return self._canonical()[1]

    @property
    def stored(self) -> int:
        """Entries held, repeated coordinates counted separately (they add up)."""
        return int(self._values.shape[0])

    @property
    def nnz(self) -> int:
        """Number of distinct coordinates (entries after coalescing)."""
        return int(self._canonical()[1].shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def _placed(self) -> Array:
        return self._values

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, self.stored)

    def _linear(self) -> Array:
        """Each entry's position in the row-major dense array."""
        lin = self._indices[0]
        for row, size in enumerate(self._shape[1:], start=1):
            lin = lin * size + self._indices[row]
        return lin

    def to_dense(self) -> Array:
        v = self._values
        return of(v).scatter_add(v, self._linear(), math.prod(self._shape)).reshape(self._shape)

    def transpose(self) -> SparseBasis:
        idx = self._indices
        order = list(range(idx.shape[0] - 2)) + [idx.shape[0] - 1, idx.shape[0] - 2]
        shape = self._shape[:-2] + (self._shape[-1], self._shape[-2])
        return SparseBasis(idx[order], self._values, shape)

    def select(self, members: Sequence[int]) -> SparseBasis:
        members = _member_list(members)
        krow = self._indices.shape[0] - 3
        ks = self._indices[krow]
        parts_idx, parts_val = [], []
        for new_k, k in enumerate(members):
            mask = ks == k
            idx = self._indices[:, mask]  # a copy: renumbering it leaves this basis alone
            idx[krow] = new_k
            parts_idx.append(idx)
            parts_val.append(self._values[mask])
        shape = self._shape[:-3] + (len(members),) + self._shape[-2:]
        return SparseBasis(concatenate(parts_idx, 1), concatenate(parts_val, 0), shape)

    def to(self, device: Any = None, dtype: Any = None) -> SparseBasis:
        backend = of(self._values)
        values = backend.move(self._values, device, dtype, what="basis")
        indices = backend.move(self._indices, device)
        if device_of(values) == "meta":  # entries checked already; a meta copy holds none to check again
            return SparseBasis._from_checked(indices, values, self._shape)
        return SparseBasis(indices, values, self._shape)

    def energy(self) -> float:
        v = self.values
        return float((v * v).sum()) / (self.N * (self.batch or 1))

    # --- engine hooks -------------------------------------------------------------------
    def _layout(self, name: str) -> Any:
        """One of the three sparse matrices the hooks multiply by (kept if not differentiable)."""
        v = self._values
        return self._derived.get(name, lambda: self._build_layout(name), keep=not of(v).requires_grad(v))

    def _build_layout(self, name: str) -> Any:
        K, M, N = self.K, self.M, self.N
        idx = self._indices
        k, m, n = idx[-3], idx[-2], idx[-1]
        b = idx[0] if self.batch is not None else 0
        B = self.batch or 1
        if K == 1 and B == 1:  # b = k = 0 everywhere: the three layouts are one, with m and n as they are
            return sparse_matrix(n, m, self._values, (N, M))
        if name == "each":
            rows, cols, shape = (b * K + k) * N + n, b * M + m, (B * K * N, B * M)
        elif name == "reduce":
            rows, cols, shape = b * N + n, (b * K + k) * M + m, (B * N, B * K * M)
        else:
            rows, cols, shape = (b * K + k) * N + n, (b * K + k) * M + m, (B * K * N, B * K * M)
        return sparse_matrix(rows, cols, self._values, shape)

    def apply_each(self, x: Array) -> Array:
        B, M, C = x.shape
        K, N = self.K, self.N
        S = self._layout("each")
        if self.batch is None:
            cols = x.swapaxes(0, 1).reshape(M, B * C)
            return _batch_first(S.times(cols), K, N, B, C)
        return S.times(x.reshape(B * M, C)).reshape(B, K, N, C)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        B, K, M, C = s.shape
        N = self.N
        S = self._layout("reduce" if reduce else "members")
        if self.batch is None:
            cols = s.swapaxes(0, 1).swapaxes(1, 2).reshape(K * M, B * C)  # (K, M, B, C)
            out = S.times(cols)
            if reduce:
                return out.reshape(N, B, C).swapaxes(0, 1)
            return _batch_first(out, K, N, B, C)
        out = S.times(s.reshape(B * K * M, C))
        return out.reshape(B, N, C) if reduce else out.reshape(B, K, N, C)

    def apply_combined(self, x: Array, theta: Array) -> Array:
        r"""Form :math:`\Phi` only on the union of the members' patterns, then scatter.

        Parameters
        ----------
        x, theta
            As for :meth:`structconv.Basis.apply_combined`.
        """
        B, M, P = x.shape
        K, _, Q = theta.shape
        N = self.N
        idx = self._indices
        check_readable(idx, "the basis", "order='atheta' (finding the distinct (m, n) pairs)")
        batched = self.batch is not None
        pair = (idx[0] * M + idx[-2]) * N + idx[-1] if batched else idx[-2] * N + idx[-1]
        pairs, inverse = namespace(pair).unique_inverse(pair)
        E = int(pairs.shape[0])
        coef = sparse_matrix(inverse, idx[-3], self._values, (E, K))
        phi = coef.times(theta.reshape(K, P * Q)).reshape(E, P, Q)
        n_e = pairs % N
        m_e = (pairs // N) % M
        # The pairs are scattered by a sparse product with unit weights (as fast as a scatter-add
        # on the CPU, and its CSR kernel is faster than one on torch for many pairs).
        pair_ids = as_index(np.arange(E), x)
        ones = of(x).asarray(np.ones(E), x)
        if batched:
            b_e = pairs // (N * M)
            z = einsum("ep,epq->eq", x[b_e, m_e], phi)
            return sparse_matrix(b_e * N + n_e, pair_ids, ones, (B * N, E)).times(z).reshape(B, N, Q)
        z = einsum("bep,epq->ebq", of(x).take(x, m_e, 1), phi).reshape(E, B * Q)
        return sparse_matrix(n_e, pair_ids, ones, (N, E)).times(z).reshape(N, B, Q).swapaxes(0, 1)

    def _per_instance(self, batch: int) -> int:
        return 1 if self.batch is not None else batch

    def cost_each(self, batch: int, channels: int) -> Cost:
        flops = 2.0 * self.stored * self._per_instance(batch) * channels
        return Cost(0.0, float(batch * self.K * self.N * channels + batch * self.M * channels), flops)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        flops = 2.0 * self.stored * self._per_instance(batch) * channels
        out = batch * self.N * channels * (1 if reduce else self.K)
        return Cost(0.0, float(out + batch * self.K * self.M * channels), flops)

    def cost_build(self) -> Cost:
        """A sparse matrix from the entries as given: their rows sorted, the entries gathered in that order."""
        stored = self.stored
        return Cost(0.0, 3.0 * stored, stored * math.log2(max(stored, 2)))

    def cost_combined(self, batch: int, p: int, q: int) -> Cost:
        pairs = min(self.stored, self.M * self.N * (self.batch or 1))
        per = self._per_instance(batch)
        # Forming Phi on the pairs and the per-pair (batch x p) @ (p x q) products are both
        # irregular: many tiny matrices, not one GEMM.
        flops = 2.0 * self.stored * p * q + 2.0 * pairs * per * p * q
        # Fixed work (sorting the pairs, building three sparse matrices) and a per-pair
        # overhead of the batched tiny products, measured by benchmarks/bench_orders.py.
        flops += _COMBINED_FIXED + _COMBINED_PER_PAIR * pairs
        return Cost(0.0, float(pairs * p * q + pairs * per * (p + q) + batch * self.N * q), flops)


class Derived:
    """What is computed from one immutable basis on first use: a pure function of it, never stale.

    Each basis creates its own, empty, in its constructor, so a basis made from another
    (:meth:`~structconv.Basis.to`, :meth:`~structconv.Basis.select`, :meth:`~structconv.Basis.transpose`)
    never sees the other's entries.
    """

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __reduce__(self) -> tuple[type[Derived], tuple[()]]:
        """Copies (``copy``, ``deepcopy``) and pickles of a cache are empty caches.

        What is derived is rebuilt on first use, so nothing is lost; and copying it could not
        work anyway: torch cannot deepcopy sparse CSR tensors, nor tensors computed under
        autograd (the coalesced values of a differentiable basis).
        """
        return (Derived, ())

    def put(self, name: str, value: Any) -> None:
        """Keep ``value`` under ``name``, replacing what was there (a value derived again)."""
        self._items[name] = value

    def get(self, name: str, build: Callable[[], Any], *, keep: bool = True) -> Any:
        """The value named ``name``, built by ``build()`` on first use (and kept if ``keep``).

        Parameters
        ----------
        name
            What the value is called in this cache.
        build
            Computes the value from the basis, with no arguments.
        keep
            Keep the value for later calls; ``False`` for one that must not outlive the call
            (a differentiable value, whose graph a second backward pass could not traverse).
        """
        found = self._items.get(name)
        if found is None:
            found = build()
            if keep:
                self._items[name] = found
        return found


def _sizes(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as Python ints, refusing what ``int()`` would truncate (2.5) or misread (``True``)."""
    sizes = []
    for s in shape:
        if isinstance(s, bool | np.bool_):
            raise TypeError(f"shape must hold integer sizes, got {s!r} in {tuple(shape)!r}")
        try:
            sizes.append(operator.index(s))  # ints, NumPy integers, integer 0-d tensors; not floats
        except TypeError:
            raise TypeError(f"shape must hold integer sizes, got {s!r} in {tuple(shape)!r}") from None
    return tuple(sizes)


def _batch_first(a: Array, K: int, N: int, B: int, C: int) -> Array:
    """``a`` read as ``(K, N, B, C)``, returned as a ``(B, K, N, C)`` view.

    Two axis swaps, which NumPy and torch spell alike (a permutation is spelt differently).
    """
    return a.reshape(K, N, B, C).swapaxes(1, 2).swapaxes(0, 1)


def _coalesce(indices: Array, values: Array, shape: tuple[int, ...]) -> tuple[Array, Array]:
    """Sort entries and sum duplicates (keeping autograd on values that require grad).

    Entries already sorted without duplicates are kept as given, so that ``values`` stays the
    caller's array (a leaf, when it requires grad) rather than the output of a graph node that
    a second backward pass could not traverse again.  The sums are recorded by autograd even
    on a first read under ``no_grad`` (a validation pass, the planner): the result is kept.
    """
    backend = of(values)
    index_np = backend.to_numpy(indices)
    lin = np.ravel_multi_index(tuple(index_np), shape) if index_np.shape[1] else np.zeros(0, np.int64)
    if lin.size < 2 or bool(np.all(np.diff(lin) > 0)):
        return indices, values
    uniq, inverse = np.unique(lin, return_inverse=True)
    with backend.grad_enabled():
        summed = backend.scatter_add(values, as_index(inverse, values), int(uniq.shape[0]))
    return as_index(np.stack(np.unravel_index(uniq, shape)), values), summed
