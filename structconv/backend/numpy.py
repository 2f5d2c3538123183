"""The NumPy backend (SciPy for sparse products)."""

from __future__ import annotations

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

        matrix = scipy.sparse.csr_array((values, (rows, cols)), shape=shape)
        matrix.sum_duplicates()
        return _ScipyProduct(matrix)

    def scatter_add(self, values: Array, index: Array, size: int) -> Array:
        out = np.zeros((size, *values.shape[1:]), dtype=values.dtype)
        np.add.at(out, index, values)
        return out


class _ScipyProduct:
    """``S @ dense`` returning a plain ndarray (SciPy may return a matrix subclass)."""

    __slots__ = ("matrix",)

    def __init__(self, matrix: Any) -> None:
        self.matrix = matrix

    def __matmul__(self, dense: Array) -> Array:
        return np.asarray(self.matrix @ dense)


BACKEND = NumpyBackend()
