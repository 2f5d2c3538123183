"""The one interface every array backend implements: what the array API standard lacks.

Dense array code outside this package is written against the Python array API standard,
through :func:`structconv.backend.namespace` (``array_api_compat``).  What the standard does not
cover (sparse products, scatter-add, autograd functions, autocast, device moves, NumPy export)
is a method of :class:`Backend` (the kernels among them declared in
:mod:`structconv.backend.kernels`), implemented once per backend in ``backend/numpy.py`` and
``backend/torch.py``.  Adding a backend (CuPy, JAX) means adding one such module and one line
in :data:`structconv.backend.REGISTRY`.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np

from .kernels import Array, Kernels

__all__ = ["Array", "Backend"]


class Backend(Kernels):
    """Operations on one backend's arrays that the array API standard does not provide.

    Here: what an array is and where it lives (placement, dtypes, autograd, autocast); the
    kernels (products, shift kernels, graph and attention kernels) are declared by its base,
    :class:`~structconv.backend.kernels.Kernels`.
    """

    name: str
    """Short name, e.g. ``"numpy"``, as error messages and plan keys show it."""

    @abstractmethod
    def owns(self, a: object) -> bool:
        """Whether ``a`` is an array of this backend.

        Parameters
        ----------
        a
            Anything.
        """

    @abstractmethod
    def namespace(self) -> Any:
        """The array API namespace (``array_api_compat``) of this backend's arrays."""

    @abstractmethod
    def native(self) -> Any:
        """The backend's own module (``numpy`` or ``torch``), for what the standard spells differently."""

    # --- placement -------------------------------------------------------------------------
    @abstractmethod
    def device(self, a: Array) -> str:
        """The device of ``a`` as a string (``"cpu"`` for NumPy).

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def to_numpy(self, a: Array) -> np.ndarray:
        """A NumPy copy of ``a``, detached from autograd.

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def asarray(self, values: Any, like: Array, dtype: Any = None) -> Array:
        """``values`` (NumPy or Python numbers) as an array on ``like``'s backend and device.

        ``dtype`` defaults to ``like``'s dtype; pass ``"int64"`` for indices.

        Parameters
        ----------
        values
            NumPy arrays or Python numbers.
        like
            An array of this backend, on the device wanted.
        dtype
            The dtype (a dtype of this backend, or a name such as ``"int64"``); ``None`` for ``like``'s.
        """

    @abstractmethod
    def strides(self, a: Array) -> tuple[int, ...]:
        """The strides of ``a`` in elements (its memory order).

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def move(self, a: Array, device: Any = None, dtype: Any = None, *, what: str = "array") -> Array:
        """``a`` moved to ``device`` and cast to ``dtype``: what :meth:`structconv.Basis.to` does to its arrays.

        Parameters
        ----------
        a
            An array of this backend.
        device
            The device, or ``None`` to keep ``a``'s.
        dtype
            The dtype, or ``None`` to keep ``a``'s.
        what
            What ``a`` is, as an error names it (``"basis"``).

        Raises
        ------
        ValueError
            If this backend has no such device (NumPy has only the CPU).
        """

    @abstractmethod
    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        """Zeros of ``shape`` with ``like``'s dtype and device.

        Parameters
        ----------
        shape
            The shape.
        like
            An array of the dtype and device wanted.
        """

    @abstractmethod
    def eye(self, n: int, like: Array) -> Array:
        """The ``(n, n)`` identity with ``like``'s dtype and device, made by one operator.

        (``array_api_compat``'s torch ``eye`` fills a diagonal view in place, which
        ``torch.onnx`` cannot decompose.)

        Parameters
        ----------
        n
            The size.
        like
            An array of the dtype and device wanted.
        """

    @abstractmethod
    def dtype_name(self, a: Array) -> str:
        """Backend-neutral dtype name such as ``"float64"``.

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def is_floating(self, a: Array) -> bool:
        """Whether ``a`` holds real floating-point numbers.

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def is_integer(self, a: Array) -> bool:
        """Whether ``a`` holds integers (not booleans).

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def all_finite(self, a: Array) -> bool:
        """Whether every entry of ``a`` is finite (a host synchronisation on accelerators).

        Parameters
        ----------
        a
            An array of this backend.
        """

    def traced(self) -> bool:
        """Whether a compiler is tracing this backend's operations now (``torch.compile``).

        A check that reads values back to the host would break the traced graph; traced, the
        checks run as :meth:`check_all` inside it instead.
        """
        return False

    def check_all(self, condition: Array, message: str) -> None:
        """Raise a ``ValueError`` with ``message`` unless every entry of ``condition`` is true.

        Traced, the check is an assertion in the graph (raised when the compiled code runs), so
        the message cannot quote a value; it names the argument and what was expected.

        Parameters
        ----------
        condition
            A boolean array of this backend.
        message
            The error's text.
        """
        if not bool(condition.all()):
            raise ValueError(message)

    @abstractmethod
    def detach(self, a: Array) -> Array:
        """``a`` without autograd history (itself for NumPy).

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def requires_grad(self, a: Array) -> bool:
        """Whether autograd tracks ``a``.

        Parameters
        ----------
        a
            An array of this backend.
        """

    @abstractmethod
    def recording(self, *arrays: Array) -> bool:
        """Whether autograd records an operation on ``arrays`` now (grad mode on, one of them tracked).

        Parameters
        ----------
        *arrays
            Arrays of this backend.
        """

    def flush_subnormals(self, a: Array, *, nonnegative: bool = False) -> Array:
        """``a`` with its subnormal entries (nonzero, below the dtype's smallest normal number) set to zero.

        As operands they make a CPU's products about ten times slower unless its threads flush
        them (:mod:`structconv.backend.subnormals`); each is below the dtype's smallest normal
        number.  NaN is kept.  A backend whose devices read them at full speed may return ``a``.

        Parameters
        ----------
        a
            A floating array of this backend.
        nonnegative
            Whether ``a`` holds no negative entry (softmax weights): one comparison then serves.
        """
        lib = self.native()
        tiny = float(lib.finfo(a.dtype).tiny)
        return lib.where((a if nonnegative else abs(a)) < tiny, 0.0, a)

    # --- mixed precision -------------------------------------------------------------------
    @abstractmethod
    def autocast_dtype(self, a: Array) -> Any:
        """The dtype autocast runs matrix products in on ``a``'s device, or ``None`` outside autocast.

        Parameters
        ----------
        a
            An array of this backend.
        """

    def autocast_probe(self, a: Array) -> Callable[[], Any] | None:
        """A cheap call, true while autocast is on for the device of ``a``; ``None`` where autocast never applies."""
        return None

    @abstractmethod
    def autocast_to(self, a: Array, dtype: Any) -> Array:
        """``a`` in ``dtype`` if it is a floating array that autocast would convert.

        Parameters
        ----------
        a
            An array of this backend.
        dtype
            The autocast dtype (:meth:`autocast_dtype`), or ``None`` for no conversion.
        """

    def memory_capacity(self, a: Array) -> float:
        """Bytes the device holding ``a`` has in all (the host's physical memory unless overridden).

        A ceiling, not what is free: an order whose intermediates exceed it cannot run there.

        Parameters
        ----------
        a
            An array of this backend.
        """
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
