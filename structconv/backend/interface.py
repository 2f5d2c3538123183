"""The one interface every array backend implements: what the array API standard lacks.

Dense array code outside this package is written against the Python array API standard,
through :func:`structconv.backend.namespace` (``array_api_compat``).  What the standard does not
cover (sparse products, scatter-add, autograd functions, autocast, device moves, NumPy export)
is a method of :class:`Backend`, implemented once per backend in ``backend/numpy.py`` and
``backend/torch.py``.  Adding a backend (CuPy, JAX) means adding one such module and one line
in :data:`structconv.backend.REGISTRY`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from .stencil import Geometry

Array = Any
"""An array of a supported backend (``numpy.ndarray`` or ``torch.Tensor``)."""


class Backend(ABC):
    """Operations on one backend's arrays that the array API standard does not provide."""

    name: str
    """Short name, e.g. ``"numpy"``, as error messages and plan keys show it."""

    @abstractmethod
    def owns(self, a: object) -> bool:
        """Whether ``a`` is an array of this backend."""

    @abstractmethod
    def namespace(self) -> Any:
        """The array API namespace (``array_api_compat``) of this backend's arrays."""

    @abstractmethod
    def native(self) -> Any:
        """The backend's own module (``numpy`` or ``torch``), for what the standard spells differently."""

    # --- placement -------------------------------------------------------------------------
    @abstractmethod
    def device(self, a: Array) -> str:
        """The device of ``a`` as a string (``"cpu"`` for NumPy)."""

    @abstractmethod
    def to_numpy(self, a: Array) -> np.ndarray:
        """A NumPy copy of ``a``, detached from autograd."""

    @abstractmethod
    def asarray(self, values: Any, like: Array, dtype: Any = None) -> Array:
        """``values`` (NumPy or Python numbers) as an array on ``like``'s backend and device.

        ``dtype`` defaults to ``like``'s dtype; pass ``"int64"`` for indices.
        """

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        """Zeros of ``shape`` with ``like``'s dtype and device."""

    @abstractmethod
    def dtype_name(self, a: Array) -> str:
        """Backend-neutral dtype name such as ``"float64"``."""

    @abstractmethod
    def is_floating(self, a: Array) -> bool:
        """Whether ``a`` holds real floating-point numbers."""

    @abstractmethod
    def is_integer(self, a: Array) -> bool:
        """Whether ``a`` holds integers (not booleans)."""

    @abstractmethod
    def all_finite(self, a: Array) -> bool:
        """Whether every entry of ``a`` is finite (a host synchronisation on accelerators)."""

    @abstractmethod
    def detach(self, a: Array) -> Array:
        """``a`` without autograd history (itself for NumPy)."""

    @abstractmethod
    def requires_grad(self, a: Array) -> bool:
        """Whether autograd tracks ``a``."""

    @abstractmethod
    def recording(self, *arrays: Array) -> bool:
        """Whether autograd records an operation on ``arrays`` now (grad mode on, one of them tracked)."""

    # --- mixed precision -------------------------------------------------------------------
    @abstractmethod
    def autocast_dtype(self, a: Array) -> Any:
        """The dtype autocast runs matrix products in on ``a``'s device, or ``None`` outside autocast."""

    @abstractmethod
    def autocast_to(self, a: Array, dtype: Any) -> Array:
        """``a`` in ``dtype`` if it is a floating array that autocast would convert."""

    # --- products ----------------------------------------------------------------------------
    @abstractmethod
    def einsum(self, eq: str, *operands: Array) -> Array:
        """A two-operand contraction by the backend's own einsum."""

    @abstractmethod
    def x_theta(self, x: Array, theta: Array) -> Array:
        r""":math:`S_{bkmq} = \sum_p x_{bmp}\Theta_{kpq}` as one GEMM, returned as a ``(B, K, M, Q)`` view."""

    @abstractmethod
    def sparse_matrix(self, rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> Any:
        """A 2-D sparse matrix ``S`` supporting ``S @ dense``; repeated coordinates add up."""

    @abstractmethod
    def scatter_add(self, values: Array, index: Array, size: int) -> Array:
        """``out[index[i]] += values[i]`` along axis 0 into ``size`` rows of zeros."""

    # --- core/engine -----------------------------------------------------------------------------
    @abstractmethod
    def from_numpy(self, a: np.ndarray) -> Array:
        """``a`` as an array of this backend on its default device (sharing memory where it can)."""

    @abstractmethod
    def sparse_product(
        self, left: tuple[Array, Array, Array], right: tuple[Array, Array, Array], shapes: tuple[int, int, int]
    ) -> tuple[Array, Array, Array]:
        """Coordinates ``(rows, cols, values)`` of the product of two sparse matrices.

        ``left`` and ``right`` are ``(rows, cols, values)`` of an ``(L, J)`` and a ``(J, R)``
        matrix, ``shapes`` is ``(L, J, R)``; repeated coordinates add up, the result has none.
        """

    @abstractmethod
    def dense_gemms(self, order: str, a: Array, x: Array, theta: Array) -> Array | None:
        r""":math:`y_b = \sum_k A_k^\top x_b \Theta_k` for a dense basis as plain 2-D GEMMs, or ``None``.

        ``order`` is ``"ax"`` or ``"xtheta"``, ``a`` is ``(K, M, N)`` or ``(B, K, M, N)``, ``x``
        ``(B, M, P)``, ``theta`` ``(K, P, Q)``.  ``None`` where this backend has no such kernel
        (then the engine contracts by einsum).
        """

    @abstractmethod
    def dense_gemms_lowrank(self, a: Array, x: Array, value: Array, out: Array) -> Array | None:
        r"""As :meth:`dense_gemms`, x·Θ first, for :math:`\Theta_k = V_k O_k^\top` and a ``(K, M, N)`` basis."""

    # --- structures: grid (shift kernels) ------------------------------------------------------
    @abstractmethod
    def placed(self, a: Array, device: Any = None, dtype: Any = None) -> Array:
        """``a`` moved to ``device`` and cast to ``dtype`` (``None`` keeps either)."""

    @abstractmethod
    def frame(self, xg: Array, lo: tuple[int, ...], hi: tuple[int, ...], boundary: str) -> Array:
        """Pad axes ``1..d`` of ``xg`` (``(B, *grid, C)``) by ``lo``/``hi`` zeros, or wrapped entries if periodic."""

    @abstractmethod
    def shift_gemm(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        r""":math:`Y = \sum_j X_{[f_j,\,f_j + R)}\,\Theta_j`: one GEMM per tap on contiguous rows of ``buf``."""

    @abstractmethod
    def gemm_shift(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        r"""One GEMM :math:`S = X\,[\Theta_1 \cdots \Theta_J]`, then :math:`Y = \sum_j S_{[f_j,\,f_j + R),\,j}`."""

    @abstractmethod
    def native_stencil_ndim(self) -> int:
        """The most grid dimensions a native convolution of this backend takes (0: none)."""

    @abstractmethod
    def native_stencil(self, x: Array, thetas: Array, geo: Geometry) -> Array:
        """A shift basis with one ``(P, Q)`` map per tap as one native convolution: ``(B, M, P) -> (B, N, Q)``."""

    @abstractmethod
    def native_depthwise(self, x: Array, weights: Array, geo: Geometry) -> Array:
        """Each member of a shift basis with ``(K, J)`` tap weights, per channel: ``(B, M, C) -> (B, K, N, C)``."""

    # --- structures: graph ---------------------------------------------------------------------
    @abstractmethod
    def default_float(self) -> Any:
        """The floating dtype new weights take when nothing else gives one."""

    @abstractmethod
    def plain(self, a: Array) -> Array:
        """``a`` as the backend's own array type (a subclass such as PyG's ``EdgeIndex`` stripped)."""

    @abstractmethod
    def is_sparse(self, a: Array) -> bool:
        """Whether ``a`` is stored sparse (any layout other than dense strided)."""

    @abstractmethod
    def coordinates(self, a: Array) -> tuple[Array, Array, tuple[int, ...]]:
        """The non-zero entries of a sparse or dense array: int64 ``(ndim, nnz)`` coordinates, values, shape."""

    @abstractmethod
    def move(self, a: Array, device: Any = None, dtype: Any = None, what: str = "array") -> Array:
        """``a`` on ``device`` in ``dtype`` (``None`` keeps either); ``what`` names it in errors."""

    @abstractmethod
    def take(self, a: Array, index: Array, axis: int) -> Array:
        """``a`` gathered at ``index`` along ``axis`` (its gradient is a scatter-add)."""

    @abstractmethod
    def index_add(self, values: Array, index: Array, size: int, axis: int) -> Array:
        """Zeros with ``size`` entries along ``axis``, ``values``' slices added at ``index`` along it."""

    @abstractmethod
    def grad_enabled(self) -> Any:
        """A context manager in which autograd records (a no-op for a backend without autograd)."""

    @abstractmethod
    def sparse_polynomials(
        self, rows: Array, cols: Array, values: Array, size: int, degrees: tuple[int, ...], family: str
    ) -> list[tuple[Array, Array, Array]]:
        r"""Coordinates ``(rows, cols, values)`` of :math:`p_d(S)` for each ``d`` in ``degrees``.

        :math:`S` is the square ``size`` matrix of the given coordinates; ``family`` is
        ``"powers"`` (:math:`S^d`) or ``"chebyshev"`` (:math:`T_d(S)`), formed by sparse-sparse
        products.
        """

    # --- structures: attention and positions ----------------------------------------------------
    fused_attention: bool = False
    """Whether :meth:`attention` runs a fused kernel that never stores the weights (then planners offer it)."""

    @abstractmethod
    def attention(self, q: Array, k: Array, v: Array, allowed: Array | None, scale: float) -> Array:
        r"""Scaled dot-product attention :math:`\mathrm{softmax}_s(\mathrm{scale}\,q_l\cdot k_s)\,v_s`.

        ``q`` is ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S, R)``; ``allowed``
        (boolean, ``True`` = may attend) broadcasts to ``(..., L, S)`` and allows at least one
        entry per row.  The result's gradient can itself be differentiated.
        """

    @abstractmethod
    def addmm(self, bias: Array, a: Array, b: Array) -> Array:
        """``bias + a @ b`` for 2-D ``a`` and ``b``, in one GEMM where the backend has one."""

    @abstractmethod
    def addmm_(self, y: Array, a: Array, b: Array) -> Array:
        """``y += a @ b`` in place (outside autograd), returning ``y``."""

    def memory_capacity(self, a: Array) -> float:
        """Bytes the device holding ``a`` has in all (the host's physical memory unless overridden).

        A ceiling, not what is free: an order whose intermediates exceed it cannot run there.
        """
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
