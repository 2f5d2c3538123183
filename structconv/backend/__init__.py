"""Backend detection and the handful of array operations the engine needs.

The core works on NumPy arrays and torch tensors alike.  Torch is detected lazily (through
``sys.modules``) so that the NumPy path never imports it, in the spirit of einops.
"""

from __future__ import annotations

import sys
import warnings
from functools import lru_cache
from typing import Any

import numpy as np
import opt_einsum

Array = Any
"""A ``numpy.ndarray`` or a ``torch.Tensor``."""

NUMPY = "numpy"
TORCH = "torch"


def _torch() -> Any:
    return sys.modules.get("torch")


def is_torch(a: object) -> bool:
    """Return whether ``a`` is a torch tensor, without importing torch."""
    torch = _torch()
    return torch is not None and isinstance(a, torch.Tensor)


def namespace(a: Array) -> Any:
    """The module (``torch`` or ``numpy``) whose functions apply to ``a``."""
    return _torch() if is_torch(a) else np


def is_integer_array(a: object) -> bool:
    """Whether ``a`` is a NumPy array or torch tensor of integers (not booleans)."""
    if is_torch(a):
        t: Any = a
        return not t.is_floating_point() and not t.is_complex() and t.dtype != _torch().bool
    return isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.integer)


def backend_of(a: object, arg: str) -> str:
    """Name the backend of ``a`` or raise a ``TypeError`` naming the argument."""
    if isinstance(a, np.ndarray):
        return NUMPY
    if is_torch(a):
        return TORCH
    raise TypeError(f"{arg} must be a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")


def device_of(a: Array) -> str:
    """Return the device of ``a`` as a string (always ``"cpu"`` for NumPy)."""
    return str(a.device) if is_torch(a) else "cpu"


def dtype_name(a: Array) -> str:
    """Return a backend-neutral dtype name such as ``"float64"``."""
    return str(a.dtype).removeprefix("torch.")


def is_floating(a: Array) -> bool:
    """Whether ``a`` holds real floating-point numbers."""
    if is_torch(a):
        return bool(a.is_floating_point())
    return bool(np.issubdtype(a.dtype, np.floating))


def all_finite(a: Array) -> bool:
    """Whether every entry of ``a`` is finite."""
    if is_torch(a):
        return bool(_torch().isfinite(a.detach()).all())
    return bool(np.isfinite(a).all())


def shape_str(shape: tuple[int, ...]) -> str:
    """Format a shape the way error messages show it."""
    return str(tuple(int(s) for s in shape))


_EXPRESSIONS: dict[tuple[Any, ...], Any] = {}
_EXPRESSIONS_SIZE = 1024


def _expression(eq: str, shapes: tuple[tuple[int, ...], ...], path: tuple[tuple[int, ...], ...] | None) -> Any:
    # A plain dictionary, not functools.lru_cache: torch.compile honours a dictionary lookup (and
    # guards on it) but traces through an lru_cache into opt_einsum's planner.
    key = (eq, shapes, path)
    expression = _EXPRESSIONS.get(key)
    if expression is None:
        if len(_EXPRESSIONS) >= _EXPRESSIONS_SIZE:
            _EXPRESSIONS.pop(next(iter(_EXPRESSIONS)))  # the oldest plan
        optimize: Any = "optimal" if path is None else list(path)
        expression = _EXPRESSIONS[key] = opt_einsum.contract_expression(eq, *shapes, optimize=optimize)
    return expression


def autocast_dtype(a: Array) -> Any:
    """The dtype ``torch.autocast`` runs matrix products in on ``a``'s device, or ``None`` outside autocast."""
    if not is_torch(a):
        return None
    torch = _torch()
    kind = a.device.type
    if kind not in ("cpu", "cuda", "xpu", "mps", "hpu"):  # e.g. "meta": no autocast there
        return None
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def autocast_to(a: Array, dtype: Any) -> Array:
    """``a`` in ``dtype`` if it is a floating tensor autocast would convert (float64 is left alone)."""
    if dtype is None or not a.is_floating_point() or a.dtype in (dtype, _torch().float64):
        return a
    return a.to(dtype)


def einsum(eq: str, *operands: Array, path: tuple[tuple[int, ...], ...] | None = None) -> Array:
    """Evaluate ``eq`` with opt_einsum, planning once per (equation, shapes, path).

    Inside ``torch.autocast`` the operands are first converted to the autocast dtype: opt_einsum
    contracts through ``tensordot``, which autocast does not cover.
    """
    dtype = autocast_dtype(operands[0])
    if dtype is not None:
        operands = tuple(autocast_to(op, dtype) for op in operands)
    if len(operands) == 2 and is_torch(operands[0]):
        # Two operands leave no order to plan; torch's own einsum is the same contraction, and
        # torch.compile traces it (opt_einsum's thread-local sharing state breaks the graph).
        return _torch().einsum(eq, *operands)
    shapes = tuple(tuple(int(s) for s in op.shape) for op in operands)
    return _expression(eq, shapes, path)(*operands)


def zeros(shape: tuple[int, ...], like: Array) -> Array:
    """Zeros of ``shape`` with the backend, dtype and device of ``like``."""
    if is_torch(like):
        return _torch().zeros(shape, dtype=like.dtype, device=like.device)
    return np.zeros(shape, dtype=like.dtype)


def concatenate(arrays: list[Array], axis: int) -> Array:
    """Concatenate along ``axis`` on whichever backend the arrays live."""
    if is_torch(arrays[0]):
        return _torch().cat(arrays, dim=axis)
    return np.concatenate(arrays, axis=axis)


def as_index(a: Array, like: Array) -> Array:
    """Convert integer indices to the backend (and device) of ``like`` as int64."""
    if is_torch(like):
        torch = _torch()
        return torch.as_tensor(a, dtype=torch.int64, device=like.device)
    return np.asarray(a, dtype=np.int64)


def to_numpy(a: Array) -> np.ndarray:
    """A NumPy copy of ``a`` (detached from autograd)."""
    if is_torch(a):
        return np.asarray(a.detach().cpu().numpy())
    return np.asarray(a)


class SparseMatrix:
    """A 2-D sparse matrix for ``S @ dense``, from (possibly repeated) coordinates.

    NumPy uses ``scipy.sparse.csr_array``.  Torch has two kernels and picks per call:

    * gather-scatter (``index_select``, scale, ``index_add``) whenever the values require grad:
      their gradient then costs one product (torch's CSR backward for the values is far slower);
    * otherwise CSR, built once per matrix by a counting sort of the rows (a radix sort on the
      CPU, so building is cheaper than one gather-scatter), with the transposed CSR built on the
      first backward pass.

    Repeated coordinates add up in every kernel.
    """

    __slots__ = ("_csr", "_csr_t", "cols", "matrix", "rows", "shape", "values")

    def __init__(self, rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.rows, self.cols, self.values = rows, cols, values
        self._csr: Any = None
        self._csr_t: Any = None
        self.matrix: Any = None
        if not is_torch(values):
            import scipy.sparse

            self.matrix = scipy.sparse.csr_array((values, (rows, cols)), shape=shape)
            self.matrix.sum_duplicates()

    def _torch_csr(self) -> Any:
        if self._csr is None:
            self._csr = _csr_from_coordinates(self.rows, self.cols, self.values, self.shape)
        return self._csr

    def __matmul__(self, dense: Array) -> Array:
        if not is_torch(dense):
            return np.asarray(self.matrix @ dense)
        if self.values.requires_grad:
            gathered = dense.index_select(0, self.cols) * self.values[:, None]
            return dense.new_zeros((self.shape[0], dense.shape[1])).index_add(0, self.rows, gathered)
        if not dense.requires_grad:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return self._torch_csr() @ dense
        return _csr_product()(self, dense)

    def _torch_csr_t(self) -> Any:
        """The transposed CSR matrix, built once for backward passes (torch's own transposes per call)."""
        if self._csr_t is None:
            flipped = SparseMatrix(self.cols, self.rows, self.values, (self.shape[1], self.shape[0]))
            self._csr_t = flipped._torch_csr()
        return self._csr_t


def _csr_from_coordinates(rows: Any, cols: Any, values: Any, shape: tuple[int, int]) -> Any:
    """A torch CSR matrix from coordinates; repeated coordinates stay separate entries and add up."""
    torch = _torch()
    if rows.device.type == "cpu":
        r = rows.numpy()
        # NumPy's stable sort is a radix sort for 16-bit keys: linear in the number of entries.
        order = torch.from_numpy(np.argsort(r.astype(np.uint16) if shape[0] <= 65536 else r, kind="stable"))
    else:
        order = torch.argsort(rows, stable=True)
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.bincount(rows, minlength=shape[0]).cumsum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols[order], values[order], shape, check_invariants=False)


@lru_cache(maxsize=1)
def _csr_product() -> Any:
    """``S @ dense`` with a backward pass through the cached ``S^T`` (values are constants here)."""
    torch = _torch()

    class CsrProduct(torch.autograd.Function):  # type: ignore[misc,name-defined]
        @staticmethod
        def forward(ctx: Any, matrix: SparseMatrix, dense: Any) -> Any:
            ctx.matrix, ctx.dtype = matrix, dense.dtype
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return matrix._torch_csr() @ dense

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            # A backward run inside torch.autocast may hand a low-precision gradient; torch has no
            # bf16 sparse product on every device, so it runs in the matrix's dtype.
            csr_t = ctx.matrix._torch_csr_t()
            with warnings.catch_warnings(), torch.autocast(grad.device.type, enabled=False):
                warnings.simplefilter("ignore", UserWarning)
                return None, (csr_t @ grad.to(csr_t.dtype)).to(ctx.dtype)

    return lambda matrix, dense: CsrProduct.apply(matrix, dense)


def x_theta(x: Array, theta: Array) -> Array:
    r""":math:`S_{bkmq} = \sum_p x_{bmp}\Theta_{kpq}` as one GEMM ``(B·M, P) @ (P, K·Q)``, returned as a view."""
    B, M, P = (int(s) for s in x.shape)
    K, _, Q = (int(s) for s in theta.shape)
    if is_torch(theta):
        wide = theta.permute(1, 0, 2).reshape(P, K * Q)
        return (x.reshape(B * M, P) @ wide).reshape(B, M, K, Q).permute(0, 2, 1, 3)
    wide = theta.transpose(1, 0, 2).reshape(P, K * Q)
    return (x.reshape(B * M, P) @ wide).reshape(B, M, K, Q).transpose(0, 2, 1, 3)
