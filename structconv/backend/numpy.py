"""The NumPy backend (SciPy for sparse products)."""

from __future__ import annotations

import contextlib
from typing import Any

import array_api_compat.numpy as xp_numpy
import numpy as np

from .interface import Array, Backend


class NumpyBackend(Backend):
    """NumPy arrays; no autograd, no autocast, one device."""

    name = "numpy"

    def owns(self, a: object) -> bool:
        return isinstance(a, np.ndarray)

    def namespace(self) -> Any:
        return xp_numpy

    def native(self) -> Any:
        return np

    def device(self, a: Array) -> str:
        return "cpu"

    def to_numpy(self, a: Array) -> np.ndarray:
        return np.asarray(a)

    def asarray(self, values: Any, like: Array, dtype: Any = None) -> Array:
        return np.asarray(values, dtype=like.dtype if dtype is None else dtype)

    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        return np.zeros(shape, dtype=like.dtype)

    def eye(self, n: int, like: Array) -> Array:
        return np.eye(n, dtype=like.dtype)

    def dtype_name(self, a: Array) -> str:
        return str(a.dtype)

    def is_floating(self, a: Array) -> bool:
        return bool(np.issubdtype(a.dtype, np.floating))

    def is_integer(self, a: Array) -> bool:
        return bool(np.issubdtype(a.dtype, np.integer))

    def all_finite(self, a: Array) -> bool:
        return bool(np.isfinite(a).all())

    def detach(self, a: Array) -> Array:
        return a

    def requires_grad(self, a: Array) -> bool:
        return False

    def recording(self, *arrays: Array) -> bool:
        return False

    def autocast_dtype(self, a: Array) -> Any:
        return None

    def autocast_to(self, a: Array, dtype: Any) -> Array:
        return a

    def einsum(self, eq: str, *operands: Array) -> Array:
        return np.einsum(eq, *operands, optimize=True)

    def x_theta(self, x: Array, theta: Array) -> Array:
        B, M, P = (int(s) for s in x.shape)
        K, _, Q = (int(s) for s in theta.shape)
        wide = theta.transpose(1, 0, 2).reshape(P, K * Q)
        return (x.reshape(B * M, P) @ wide).reshape(B, M, K, Q).transpose(0, 2, 1, 3)

    def sparse_matrix(self, rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> Any:
        import scipy.sparse

        # scipy.sparse has no float16: such values are held in float32 and products cast back.
        half = values.dtype == np.float16
        matrix = scipy.sparse.csr_array((values.astype(np.float32) if half else values, (rows, cols)), shape=shape)
        matrix.sum_duplicates()
        return _ScipyProduct(matrix, values.dtype if half else None)

    # --- core/engine -----------------------------------------------------------------------------
    def from_numpy(self, a: np.ndarray) -> Array:
        return np.asarray(a)

    def sparse_product(
        self, left: tuple[Array, Array, Array], right: tuple[Array, Array, Array], shapes: tuple[int, int, int]
    ) -> tuple[Array, Array, Array]:
        import scipy.sparse

        L, J, R = shapes
        lhs = scipy.sparse.csr_array((left[2], (left[0], left[1])), shape=(L, J))
        rhs = scipy.sparse.csr_array((right[2], (right[0], right[1])), shape=(J, R))
        prod = scipy.sparse.coo_array(lhs @ rhs)  # a product of CSR arrays holds no duplicates
        return prod.row.astype(np.int64), prod.col.astype(np.int64), prod.data

    # --- structures: grid (shift kernels) ------------------------------------------------------
    def frame(self, xg: Array, lo: tuple[int, ...], hi: tuple[int, ...], boundary: str) -> Array:
        if not any(lo) and not any(hi):
            return xg
        if boundary == "periodic":
            for i in range(len(lo)):
                size = int(xg.shape[1 + i])
                xg = np.take(xg, np.arange(-lo[i], size + hi[i]) % size, axis=1 + i)
            return xg
        return np.pad(xg, [(0, 0), *zip(lo, hi, strict=True), (0, 0)])

    def shift_gemm(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        y = buf[shifts[0] : shifts[0] + rows] @ thetas[0]
        for j in range(1, len(shifts)):
            y += buf[shifts[j] : shifts[j] + rows] @ thetas[j]
        return y

    def gemm_shift(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        J, P, Q = (int(v) for v in thetas.shape)
        s = (buf @ thetas.transpose(1, 0, 2).reshape(P, J * Q)).reshape(-1, J, Q)
        y = s[shifts[0] : shifts[0] + rows, 0].copy()
        for j in range(1, J):
            y += s[shifts[j] : shifts[j] + rows, j]
        return y

    # --- structures: graph ---------------------------------------------------------------------
    def default_float(self) -> Any:
        return np.float64

    def plain(self, a: Array) -> Array:
        return a

    def is_sparse(self, a: Array) -> bool:
        return False

    def coordinates(self, a: Array) -> tuple[Array, Array, tuple[int, ...]]:
        index = np.stack(np.nonzero(a)).astype(np.int64)
        return index, a[tuple(index)], tuple(int(s) for s in a.shape)

    def strides(self, a: Array) -> tuple[int, ...]:
        return tuple(s // a.itemsize for s in a.strides)

    def move(self, a: Array, device: Any = None, dtype: Any = None, *, what: str = "array") -> Array:
        if device not in (None, "cpu"):
            raise ValueError(
                f"device={device!r}: a NumPy {what} lives on the CPU; convert it to torch first (a grid basis: "
                "build it with a torch like=)"
            )
        return a if dtype is None else a.astype(dtype)

    def take(self, a: Array, index: Array, axis: int) -> Array:
        return np.take(a, index, axis=axis)

    def index_add(self, values: Array, index: Array, size: int, axis: int) -> Array:
        shape = list(values.shape)
        shape[axis] = size
        out = np.zeros(shape, dtype=values.dtype)
        at: Any = (slice(None),) * axis + (index,)
        np.add.at(out, at, values)
        return out

    def grad_enabled(self) -> Any:
        return contextlib.nullcontext()

    def sparse_polynomials(
        self, rows: Array, cols: Array, values: Array, size: int, degrees: tuple[int, ...], family: str
    ) -> list[tuple[Array, Array, Array]]:
        import scipy.sparse

        matrix = scipy.sparse.csr_array((values, (rows, cols)), shape=(size, size))
        mats: list[Any] = [scipy.sparse.identity(size, dtype=values.dtype, format="csr"), matrix]
        for _ in range(2, max(degrees) + 1):
            nxt = mats[-1] @ matrix
            mats.append(2 * nxt - mats[-2] if family == "chebyshev" else nxt)
        out = []
        for d in degrees:
            coo = scipy.sparse.coo_array(mats[d])
            coo.sum_duplicates()
            out.append((coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data.astype(values.dtype)))
        return out

    # --- structures: attention and positions ----------------------------------------------------
    def attention(
        self,
        q: Array,
        k: Array,
        v: Array,
        allowed: Array | None,
        scale: float,
        *,
        bias: Array | None = None,
        dropout: float = 0.0,
    ) -> Array:
        scores = (q @ k.swapaxes(-1, -2)) * scale
        if bias is not None:
            scores = scores + bias
        if allowed is not None:
            scores = np.where(allowed, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights = weights / weights.sum(-1, keepdims=True)
        return (self.dropout(weights, dropout) if dropout > 0.0 else weights) @ v

    def dropout(self, a: Array, p: float) -> Array:
        keep = np.random.default_rng().random(a.shape) >= p
        return np.where(keep, a / (1.0 - p), 0.0).astype(a.dtype)

    def addmm(self, bias: Array, a: Array, b: Array) -> Array:
        return a @ b + bias

    def addmm_(self, y: Array, a: Array, b: Array) -> Array:
        y += a @ b
        return y


class _ScipyProduct:
    """``S @ dense`` returning a plain ndarray (SciPy may return a matrix subclass)."""

    __slots__ = ("matrix", "result_dtype")

    def __init__(self, matrix: Any, result_dtype: Any = None) -> None:
        self.matrix = matrix
        self.result_dtype = result_dtype

    def times(self, dense: Array) -> Array:
        """``S @ dense`` (a method, not ``@``: torch.compile traces a method of a Python object, not its operator)."""
        if self.result_dtype is None:
            return np.asarray(self.matrix @ dense)
        return np.asarray(self.matrix @ dense.astype(np.float32)).astype(self.result_dtype)


BACKEND = NumpyBackend()
