r"""Sparse bases: only the non-zero entries :math:`(b, k, m, n, A_{bkmn})` are stored.

Applying a sparse basis costs :math:`O(\mathrm{nnz}\cdot C)`; the dense :math:`K\times M\times N`
tensor is never formed (except by :meth:`SparseBasis.to_dense`).  Each hook multiplies one
sparse matrix, built from the entries once per basis value, by a dense matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import Array, as_index, device_of, einsum, is_torch, shape_str, sparse_matrix, to_numpy
from ..backend.checks import check_finite
from .base import Basis, Cost

#: Overheads of :meth:`SparseBasis.apply_combined`, in sparse-kernel flops (see its cost).
_COMBINED_FIXED = 1.0e6
_COMBINED_PER_PAIR = 6000.0


def _torch() -> Any:
    import torch

    return torch


class SparseBasis(Basis):
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

    __slots__ = ("_coalesced", "_indices", "_layouts", "_shape", "_values")
    representation = "sparse"

    def __init__(self, indices: Array, values: Array, shape: Sequence[int]) -> None:
        shape = tuple(int(s) for s in shape)
        if len(shape) not in (3, 4) or any(s <= 0 for s in shape):
            raise ValueError(f"shape must be (K, M, N) or (B, K, M, N) with positive sizes, got {shape_str(shape)}")
        if not (isinstance(values, np.ndarray) or is_torch(values)):
            raise TypeError(f"values must be a numpy.ndarray or a torch.Tensor, got {type(values).__name__}")
        if values.ndim != 1:
            raise ValueError(f"values must have shape (nnz,), got {shape_str(tuple(values.shape))}")
        if not (values.is_floating_point() if is_torch(values) else np.issubdtype(values.dtype, np.floating)):
            raise TypeError(f"values must hold floating-point numbers, got dtype {values.dtype}")
        check_finite(values, "values")
        index_np = to_numpy(indices) if (is_torch(indices) or isinstance(indices, np.ndarray)) else np.asarray(indices)
        if index_np.ndim != 2 or index_np.shape != (len(shape), values.shape[0]):
            raise ValueError(
                f"indices must have shape ({len(shape)}, nnz={values.shape[0]}) for a basis of shape "
                f"{shape_str(shape)}, got {shape_str(index_np.shape)}"
            )
        if index_np.size and not np.issubdtype(index_np.dtype, np.integer):
            raise TypeError(f"indices must be integers, got dtype {index_np.dtype}")
        for row, (name, size) in enumerate(zip("bkmn"[4 - len(shape) :], shape, strict=True)):
            if index_np.shape[1] and (index_np[row].min() < 0 or index_np[row].max() >= size):
                raise ValueError(
                    f"indices row {row} ({name}) must lie in [0, {size}), "
                    f"got values in [{index_np[row].min()}, {index_np[row].max()}]"
                )
        self._shape = shape
        self._layouts: dict[str, Any] = {}
        if is_torch(values):
            # Sorting is deferred: the kernels add repeated entries up anyway, and a basis built
            # for one product (a graph layer's, every call) should not pay for a sort.
            self._indices, self._values = as_index(index_np, values), values
            self._coalesced = False
        else:
            self._indices, self._values = _coalesce(as_index(index_np, values), index_np, values, shape)
            self._coalesced = True

    def _coalesce_now(self) -> None:
        if not self._coalesced:
            index_np = to_numpy(self._indices)
            # The stored values replace the given ones for good: keep them connected to autograd
            # even if the first read happens under no_grad (a validation pass, the planner).
            with _torch().enable_grad():
                self._indices, self._values = _coalesce(self._indices, index_np, self._values, self._shape)
            self._coalesced = True

    # --- constructors -------------------------------------------------------------------
    @classmethod
    def from_dense(cls, array: Array) -> SparseBasis:
        """Keep the non-zero entries of a dense ``(K, M, N)`` or ``(B, K, M, N)`` array."""
        if is_torch(array):
            idx = array.nonzero().T
            return cls(idx, array[tuple(idx)], tuple(array.shape))
        array = np.asarray(array)
        idx = np.stack(np.nonzero(array))
        return cls(idx, array[tuple(idx)], array.shape)

    @classmethod
    def from_torch(cls, tensor: Any) -> SparseBasis:
        """Build from a torch sparse COO tensor of shape ``(K, M, N)`` or ``(B, K, M, N)``."""
        torch = _torch()
        if tensor.layout != torch.sparse_coo:
            tensor = tensor.to_sparse_coo()
        tensor = tensor.coalesce()
        return cls(tensor.indices(), tensor.values(), tuple(tensor.shape))

    @classmethod
    def from_scipy(cls, matrices: Sequence[Any]) -> SparseBasis:
        """Build a ``(K, M, N)`` basis from K ``scipy.sparse`` matrices of shape ``(M, N)``."""
        import scipy.sparse

        if not matrices:
            raise ValueError("matrices must hold at least one scipy.sparse matrix")
        shapes = {tuple(m.shape) for m in matrices}
        if len(shapes) != 1:
            raise ValueError(f"matrices must all have the same shape (M, N), got {sorted(shapes)}")
        (m_size, n_size) = shapes.pop()
        ks, ms, ns, vs = [], [], [], []
        for k, mat in enumerate(matrices):
            coo = scipy.sparse.coo_array(mat)
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
        self._coalesce_now()
        return self._indices

    @property
    def values(self) -> Array:
        """Values, shape ``(nnz,)``."""
        self._coalesce_now()
        return self._values

    @property
    def stored(self) -> int:
        """Entries held, repeated coordinates counted separately until they are coalesced."""
        return int(self._values.shape[0])

    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        self._coalesce_now()
        return int(self._values.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def backend(self) -> str:
        return "torch" if is_torch(self._values) else "numpy"

    @property
    def dtype(self) -> Any:
        return self._values.dtype

    @property
    def device(self) -> str:
        return device_of(self._values)

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, self.stored)

    def to_dense(self) -> Array:
        v = self._values
        if is_torch(v):
            out = _torch().zeros(self._shape, dtype=v.dtype, device=v.device)
            return out.index_put(tuple(self._indices), v, accumulate=True)
        out = np.zeros(self._shape, dtype=v.dtype)
        np.add.at(out, tuple(self._indices), v)
        return out

    def _rebuild(self, indices: Array, values: Array, shape: tuple[int, ...]) -> SparseBasis:
        return SparseBasis(indices, values, shape)

    def transpose(self) -> SparseBasis:
        idx = self._indices
        order = list(range(idx.shape[0] - 2)) + [idx.shape[0] - 1, idx.shape[0] - 2]
        shape = self._shape[:-2] + (self._shape[-1], self._shape[-2])
        return self._rebuild(idx[order], self._values, shape)

    def select(self, members: Sequence[int]) -> SparseBasis:
        members = list(members)
        if not members:
            raise ValueError("members must name at least one basis member")
        krow = self._indices.shape[0] - 3
        ks = self._indices[krow]
        parts_idx, parts_val = [], []
        for new_k, k in enumerate(members):
            mask = ks == k
            idx = self._indices[:, mask]
            idx[krow] = new_k
            parts_idx.append(idx)
            parts_val.append(self._values[mask])
        cat = _torch().cat if is_torch(self._values) else np.concatenate
        shape = self._shape[:-3] + (len(members),) + self._shape[-2:]
        return self._rebuild(cat(parts_idx, 1), cat(parts_val, 0), shape)

    def to(self, device: Any = None, dtype: Any = None) -> SparseBasis:
        if is_torch(self._values):
            return self._rebuild(
                self._indices.to(device=device), self._values.to(device=device, dtype=dtype), self._shape
            )
        if device not in (None, "cpu"):
            raise ValueError(f"device={device!r}: a NumPy basis lives on the CPU; convert it to torch first")
        return self._rebuild(self._indices, self._values if dtype is None else self._values.astype(dtype), self._shape)

    def energy(self) -> float:
        self._coalesce_now()
        v = self._values
        return float((v * v).sum()) / (self.N * (self.batch or 1))

    # --- engine hooks -------------------------------------------------------------------
    def _layout(self, name: str) -> Any:
        """One of the three sparse matrices the hooks multiply by (cached if not differentiable)."""
        cached = self._layouts.get(name)
        if cached is not None:
            return cached
        K, M, N = self.K, self.M, self.N
        idx = self._indices
        k, m, n = idx[-3], idx[-2], idx[-1]
        b = idx[0] if self.batch is not None else 0
        B = self.batch or 1
        if name == "each":
            rows, cols, shape = (b * K + k) * N + n, b * M + m, (B * K * N, B * M)
        elif name == "reduce":
            rows, cols, shape = b * N + n, (b * K + k) * M + m, (B * N, B * K * M)
        else:
            rows, cols, shape = (b * K + k) * N + n, (b * K + k) * M + m, (B * K * N, B * K * M)
        matrix = sparse_matrix(rows, cols, self._values, shape)
        if not (is_torch(self._values) and self._values.requires_grad):
            self._layouts[name] = matrix
        return matrix

    def apply_each(self, x: Array) -> Array:
        B, M, C = x.shape
        K, N = self.K, self.N
        S = self._layout("each")
        if self.batch is None:
            cols = _permute(x, (1, 0, 2)).reshape(M, B * C)
            return _permute(_product(S, cols).reshape(K, N, B, C), (2, 0, 1, 3))
        return _product(S, x.reshape(B * M, C)).reshape(B, K, N, C)

    def apply_members(self, s: Array, reduce: bool) -> Array:
        B, K, M, C = s.shape
        N = self.N
        S = self._layout("reduce" if reduce else "members")
        if self.batch is None:
            cols = _permute(s, (1, 2, 0, 3)).reshape(K * M, B * C)
            out = _product(S, cols)
            if reduce:
                return _permute(out.reshape(N, B, C), (1, 0, 2))
            return _permute(out.reshape(K, N, B, C), (2, 0, 1, 3))
        out = _product(S, s.reshape(B * K * M, C))
        return out.reshape(B, N, C) if reduce else out.reshape(B, K, N, C)

    def apply_combined(self, x: Array, theta: Array) -> Array:
        r"""Form :math:`\Phi` only on the union of the members' patterns, then scatter."""
        B, M, P = x.shape
        K, _, Q = theta.shape
        N = self.N
        idx = self._indices
        batched = self.batch is not None
        pair = (idx[0] * M + idx[-2]) * N + idx[-1] if batched else idx[-2] * N + idx[-1]
        if is_torch(x):
            torch = _torch()
            pairs, inverse = torch.unique(pair, return_inverse=True)
        else:
            pairs, inverse = np.unique(pair, return_inverse=True)
        E = int(pairs.shape[0])
        coef = sparse_matrix(inverse, idx[-3], self._values, (E, K))
        phi = (coef @ theta.reshape(K, P * Q)).reshape(E, P, Q)
        n_e = pairs % N
        m_e = (pairs // N) % M
        if batched:
            b_e = pairs // (N * M)
            z = einsum("ep,epq->eq", x[b_e, m_e], phi)
            ones = _ones_like(z, E)
            scatter = sparse_matrix(b_e * N + n_e, as_index(np.arange(E), x), ones, (B * N, E))
            return (scatter @ z).reshape(B, N, Q)
        z = einsum("bep,epq->ebq", x[:, m_e], phi).reshape(E, B * Q)
        scatter = sparse_matrix(n_e, as_index(np.arange(E), x), _ones_like(z, E), (N, E))
        return _permute((scatter @ z).reshape(N, B, Q), (1, 0, 2))

    def _per_instance(self, batch: int) -> int:
        return 1 if self.batch is not None else batch

    def cost_each(self, batch: int, channels: int) -> Cost:
        flops = 2.0 * self.stored * self._per_instance(batch) * channels
        return Cost(0.0, float(batch * self.K * self.N * channels + batch * self.M * channels), flops)

    def cost_members(self, batch: int, channels: int, reduce: bool) -> Cost:
        flops = 2.0 * self.stored * self._per_instance(batch) * channels
        out = batch * self.N * channels * (1 if reduce else self.K)
        return Cost(0.0, float(out + batch * self.K * self.M * channels), flops)

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


def _product(S: Any, dense: Array) -> Array:
    return S @ dense


def _permute(a: Array, axes: tuple[int, ...]) -> Array:
    return a.permute(*axes) if is_torch(a) else np.transpose(a, axes)


def _ones_like(a: Array, n: int) -> Array:
    if is_torch(a):
        return _torch().ones(n, dtype=a.dtype, device=a.device)
    return np.ones(n, dtype=a.dtype)


def _coalesce(indices: Array, index_np: np.ndarray, values: Array, shape: tuple[int, ...]) -> tuple[Array, Array]:
    """Sort entries and sum duplicates (keeping autograd on torch values).

    Entries already sorted without duplicates are kept as given, so that ``values`` stays the
    caller's tensor (a leaf, when it requires grad) rather than the output of a graph node that
    a second backward pass could not traverse again.
    """
    lin_np = np.ravel_multi_index(tuple(index_np), shape) if index_np.shape[1] else np.zeros(0, np.int64)
    if lin_np.size < 2 or bool(np.all(np.diff(lin_np) > 0)):
        return indices, values
    if is_torch(values):
        torch = _torch()
        coo = torch.sparse_coo_tensor(indices, values, shape, check_invariants=False).coalesce()
        return coo.indices(), coo.values()
    lin = lin_np
    uniq, inverse = np.unique(lin, return_inverse=True)
    summed = np.bincount(inverse, weights=values, minlength=uniq.shape[0]).astype(values.dtype, copy=False)
    return np.stack(np.unravel_index(uniq, shape)).astype(np.int64), summed
