"""The kernels every array backend implements beyond the array API: :class:`Kernels`, a base of ``Backend``.

Products the engine runs (GEMM layouts, sparse products, scatter-add), the shift kernels of grid
bases, the graph kernels (gathers, index-adds, sparse polynomials) and fused attention: each is
an abstract method here, implemented once per backend in ``backend/numpy.py`` and
``backend/torch.py``, unless a default serves a backend without it (no GEMM kernel of its own,
no native convolution; scatter-add as :meth:`Kernels.index_add`).
:class:`~structconv.backend.interface.Backend` adds what an array is and where it lives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from .stencil import Geometry

Array = Any
"""An array of a supported backend (``numpy.ndarray`` or ``torch.Tensor``); also :data:`structconv.backend.Array`."""


class Kernels(ABC):
    """The kernels of :class:`~structconv.backend.interface.Backend` (see the module notes)."""

    name: str

    # --- products ----------------------------------------------------------------------------
    @abstractmethod
    def einsum(self, eq: str, *operands: Array) -> Array:
        """A two-operand contraction by the backend's own einsum.

        Parameters
        ----------
        eq
            The einsum equation of two operands.
        *operands
            Two arrays of this backend.
        """

    @abstractmethod
    def x_theta(self, x: Array, theta: Array) -> Array:
        r""":math:`S_{bkmq} = \sum_p x_{bmp}\Theta_{kpq}` as one GEMM, returned as a ``(B, K, M, Q)`` view.

        Parameters
        ----------
        x
            ``(B, M, P)``.
        theta
            :math:`\Theta`, ``(K, P, Q)``.
        """

    @abstractmethod
    def sparse_matrix(self, rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> Any:
        """A 2-D sparse matrix ``S`` whose ``S.times(dense)`` is ``S @ dense``; repeated coordinates add up.

        Parameters
        ----------
        rows, cols
            int64 ``(nnz,)`` coordinates.
        values
            ``(nnz,)`` entries (they may require grad).
        shape
            ``(rows, columns)``.
        """

    def scatter_add(self, values: Array, index: Array, size: int) -> Array:
        """``out[index[i]] += values[i]`` along axis 0 into ``size`` rows of zeros (:meth:`index_add` on axis 0).

        Parameters
        ----------
        values
            ``(E, ...)``.
        index
            int64 ``(E,)``, each in ``[0, size)``.
        size
            The rows of the result.
        """
        return self.index_add(values, index, size, 0)

    # --- core/engine -----------------------------------------------------------------------------
    @abstractmethod
    def from_numpy(self, a: np.ndarray) -> Array:
        """``a`` as an array of this backend on its default device (sharing memory where it can).

        Parameters
        ----------
        a
            A NumPy array.
        """

    @abstractmethod
    def sparse_product(
        self, left: tuple[Array, Array, Array], right: tuple[Array, Array, Array], shapes: tuple[int, int, int]
    ) -> tuple[Array, Array, Array]:
        """Coordinates ``(rows, cols, values)`` of the product of two sparse matrices.

        ``left`` and ``right`` are ``(rows, cols, values)`` of an ``(L, J)`` and a ``(J, R)``
        matrix, ``shapes`` is ``(L, J, R)``; repeated coordinates add up, the result has none.

        Parameters
        ----------
        left, right
            ``(rows, cols, values)`` of an ``(L, J)`` and a ``(J, R)`` matrix.
        shapes
            ``(L, J, R)``.
        """

    def dense_gemms(self, order: str, a: Array, x: Array, theta: Array) -> Array | None:
        r""":math:`y_b = \sum_k A_k^\top x_b \Theta_k` for a dense basis as plain 2-D GEMMs, or ``None``.

        ``order`` is ``"ax"`` or ``"xtheta"``, ``a`` is ``(K, M, N)`` or ``(B, K, M, N)``, ``x``
        ``(B, M, P)``, ``theta`` ``(K, P, Q)``.  ``None`` (the default) where this backend has no
        such kernel: the engine contracts by einsum (NumPy's case: opt_einsum's BLAS path is as fast).

        Parameters
        ----------
        order
            ``"ax"`` or ``"xtheta"`` (the engine's names; another order gives ``None``).
        a
            The dense basis, ``(K, M, N)`` or ``(B, K, M, N)``.
        x
            ``(B, M, P)``.
        theta
            :math:`\Theta`, ``(K, P, Q)``.
        """
        return None

    def dense_gemms_lowrank(self, a: Array, x: Array, value: Array, out: Array) -> Array | None:
        r"""As :meth:`dense_gemms`, x·Θ first, for :math:`\Theta_k = V_k O_k^\top` and a ``(K, M, N)`` basis.

        Parameters
        ----------
        a
            The dense basis, ``(K, M, N)`` (a per-instance one gives ``None``).
        x
            ``(B, M, P)``.
        value, out
            :math:`V` ``(K, P, D)`` and :math:`O` ``(K, Q, D)``.
        """
        return None

    # --- structures: grid (shift kernels) ------------------------------------------------------
    @abstractmethod
    def frame(self, xg: Array, lo: tuple[int, ...], hi: tuple[int, ...], boundary: str) -> Array:
        """Pad axes ``1..d`` of ``xg`` (``(B, *grid, C)``) by ``lo``/``hi`` zeros, or wrapped entries if periodic.

        Parameters
        ----------
        xg
            ``(B, *grid, C)``.
        lo, hi
            Entries added before and after, per grid axis.
        boundary
            ``"zero"`` or ``"periodic"``.
        """

    @abstractmethod
    def shift_gemm(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        r""":math:`Y = \sum_j X_{[f_j,\,f_j + R)}\,\Theta_j`: one GEMM per tap on contiguous rows of ``buf``.

        Parameters
        ----------
        buf
            The flat input :math:`X` (:func:`structconv.bases.shift.flat_input`).
        thetas
            :math:`\Theta_j`, ``(J, P, Q)``.
        shifts
            :math:`f_j`, the row shift of each tap.
        rows
            :math:`R`, the rows of the result.
        """

    @abstractmethod
    def gemm_shift(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        r"""One GEMM :math:`S = X\,[\Theta_1 \cdots \Theta_J]`, then :math:`Y = \sum_j S_{[f_j,\,f_j + R),\,j}`.

        Parameters
        ----------
        buf, thetas, shifts, rows
            As for :meth:`shift_gemm`.
        """

    def native_stencil_ndim(self) -> int:
        """The most grid dimensions a native convolution of this backend takes (0, the default: none)."""
        return 0

    def native_stencil(self, x: Array, thetas: Array, geo: Geometry) -> Array:
        """A shift basis with one ``(P, Q)`` map per tap as one native convolution: ``(B, M, P) -> (B, N, Q)``.

        Parameters
        ----------
        x
            ``(B, M, P)``.
        thetas
            One ``(P, Q)`` map per tap, ``(J, P, Q)``.
        geo
            The basis' geometry (its ``ndim`` at most :meth:`native_stencil_ndim`).
        """
        raise NotImplementedError(f"{self.name} has no native convolution (native_stencil_ndim() is 0)")

    def native_image(self, x: Array, weight: Array, geo: Geometry, bias: Array | None, groups: int) -> Array:
        """Native convolution on the grid layout: ``(B, P, *grid)``, kernel ``(Q, P/G, *box)`` to ``(B, Q, *out)``."""
        raise NotImplementedError(f"{self.name} has no native convolution (native_stencil_ndim() is 0)")

    def bind_native_image(self, geo: Geometry, groups: int) -> Callable[[Array, Array, Array | None], Array]:
        """:meth:`native_image` with ``geo`` and ``groups`` bound once: ``run(x, weight, bias)``.

        A backend whose native call takes its arguments as they are may precompute them here
        (torch binds ``F.conv{d}d``'s); the default calls :meth:`native_image`.

        Parameters
        ----------
        geo
            The basis' geometry.
        groups
            :math:`G`, as :meth:`native_image` takes it.
        """
        return lambda x, weight, bias: self.native_image(x, weight, geo, bias, groups)

    def native_depthwise(self, x: Array, weights: Array, geo: Geometry) -> Array:
        """Each member of a shift basis with ``(K, J)`` tap weights, per channel: ``(B, M, C) -> (B, K, N, C)``.

        Parameters
        ----------
        x
            ``(B, M, C)``.
        weights
            ``(K, J)`` tap weights.
        geo
            The basis' geometry.
        """
        raise NotImplementedError(f"{self.name} has no native convolution (native_stencil_ndim() is 0)")

    # --- structures: graph ---------------------------------------------------------------------
    @abstractmethod
    def default_float(self) -> Any:
        """The floating dtype new weights take when nothing else gives one."""

    @abstractmethod
    def plain(self, a: Array) -> Array:
        """``a`` as the backend's own array type (a subclass such as PyG's ``EdgeIndex`` stripped).

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def is_sparse(self, a: Array) -> bool:
        """Whether ``a`` is stored sparse (any layout other than dense strided).

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def coordinates(self, a: Array) -> tuple[Array, Array, tuple[int, ...]]:
        """The non-zero entries of a sparse or dense array: int64 ``(ndim, nnz)`` coordinates, values, shape.

        Parameters
        ----------
        a
            An array of this backend, sparse or dense.
        """

    @abstractmethod
    def take(self, a: Array, index: Array, axis: int) -> Array:
        """``a`` gathered at ``index`` along ``axis`` (its gradient is a scatter-add).

        Parameters
        ----------
        a
            An array of this backend.
        index
            int64 indices.
        axis
            The axis gathered along.
        """

    @abstractmethod
    def index_add(self, values: Array, index: Array, size: int, axis: int) -> Array:
        """Zeros with ``size`` entries along ``axis``, ``values``' slices added at ``index`` along it.

        Parameters
        ----------
        values
            The slices added.
        index
            int64, one entry per slice of ``values`` along ``axis``.
        size
            The entries of the result along ``axis``.
        axis
            The axis.
        """

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

        Parameters
        ----------
        rows, cols, values
            The coordinates and entries of :math:`S`.
        size
            :math:`N`, the size of the square matrix :math:`S`.
        degrees
            The degrees :math:`d` wanted, in order.
        family
            ``"powers"`` or ``"chebyshev"``.
        """

    # --- structures: attention and positions ----------------------------------------------------
    fused_attention: bool = False
    """Whether :meth:`attention` runs a fused kernel that never stores the weights (then planners offer it)."""

    @abstractmethod
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
        r"""Scaled dot-product attention :math:`\mathrm{softmax}_s(\mathrm{scale}\,q_l\cdot k_s + \beta_{ls})\,v_s`.

        ``q`` is ``(..., L, D)``, ``k`` ``(..., S, D)``, ``v`` ``(..., S, R)``; ``allowed``
        (boolean, ``True`` = may attend) broadcasts to ``(..., L, S)`` and allows at least one
        entry per row.  The result's gradient can itself be differentiated (without dropout).
        With ``dropout`` :math:`p > 0` each weight is dropped independently with probability
        :math:`p` and the others are scaled by :math:`1/(1-p)`, a fresh draw per call.

        Parameters
        ----------
        q
            Queries, ``(..., L, D)``.
        k
            Keys, ``(..., S, D)``.
        v
            Values, ``(..., S, R)``.
        allowed
            Boolean (``True`` = may attend), broadcasting to ``(..., L, S)`` and allowing at least one
            entry per row; or ``None``.
        scale
            The factor of the scores.
        bias
            Finite additive scores :math:`\beta` (floating), broadcasting to ``(..., L, S)``, added
            after the scale; their gradient is computed when they require one.  Not together with
            ``allowed``.
        dropout
            :math:`p \in [0, 1)`, the attention dropout of the weights.
        """

    @abstractmethod
    def dropout(self, a: Array, p: float) -> Array:
        r"""``a`` with each entry dropped independently with probability ``p``, the rest scaled by :math:`1/(1-p)`.

        A fresh draw per call (``torch.nn.functional.dropout``'s rule, in training).

        Parameters
        ----------
        a
            A floating array.
        p
            The probability, in ``[0, 1)``.
        """

    @abstractmethod
    def addmm(self, bias: Array, a: Array, b: Array) -> Array:
        """``bias + a @ b`` for 2-D ``a`` and ``b``, in one GEMM where the backend has one.

        Parameters
        ----------
        bias
            Broadcasts to the product's shape.
        a, b
            2-D factors.
        """

    @abstractmethod
    def addmm_(self, y: Array, a: Array, b: Array) -> Array:
        """``y += a @ b`` in place (outside autograd), returning ``y``.

        Parameters
        ----------
        y
            The accumulator, written in place.
        a, b
            2-D factors.
        """
