"""Unpickling that resolves only the globals a file format needs (the CIFAR and Planetoid readers).

Unpickling runs code named by the file: a pickle may name any importable callable.  The
:class:`RestrictedUnpickler` resolves only the ``(module, name)`` pairs it is given, looked up
by exact name and never imported, and refuses everything else with a :class:`RefusedGlobalError`.

Even admitted globals can be made to allocate whatever a few bytes of the stream ask for: numpy's
``_reconstruct`` builds an array of any stated shape, ``ndarray`` called directly likewise, and an
object dtype makes ``ndarray.__setstate__`` allocate before it checks the data.  So the numpy globals
are swapped for checked ones (:class:`PickledArray` for ``numpy.ndarray``): an array must be plain
numeric and hold no more bytes than the stream itself (``limit``), checked before it is allocated,
else a :class:`RefusedObjectError` names the file and the size.
"""

from __future__ import annotations

import importlib
import math
import operator
import pickle
from typing import IO, Any

import numpy as np

__all__ = [
    "CORRUPT_PICKLE",
    "PickledArray",
    "RefusedGlobalError",
    "RefusedObjectError",
    "RestrictedUnpickler",
    "numpy_reconstruct",
]


def numpy_reconstruct() -> Any:
    """``numpy``'s ``_reconstruct``, the global an ndarray pickles with, under its current module name."""
    # numpy 2 renamed numpy.core to numpy._core and warns on imports under the old name.
    try:
        module = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # pragma: no cover - numpy < 2
        module = importlib.import_module("numpy.core.multiarray")
    return module._reconstruct


_RECONSTRUCT = numpy_reconstruct()


class RefusedGlobalError(pickle.UnpicklingError, ValueError):
    """A pickle named a global outside the admitted ones (kept as is, unlike a corrupt stream).

    Both a ``pickle.UnpicklingError`` and a ``ValueError``: callers that report malformed files
    catch it with them.
    """


class RefusedObjectError(ValueError):
    """A pickle asked for an object the reader refuses to build, before it is built.

    An array larger than the stream could encode or of a non-numeric dtype, or a call of an admitted
    constructor that the format never makes; the message names the file and the size.
    """


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise RefusedObjectError(f"an array shape must be a tuple of sizes, got {type(value).__name__}")
    try:
        shape = tuple(operator.index(n) for n in value)
    except TypeError:
        raise RefusedObjectError(f"an array shape must hold integers, got {value!r:.80}") from None
    if any(n < 0 for n in shape):
        raise RefusedObjectError(f"an array shape must hold sizes >= 0, got {shape}")
    return shape


def _numeric(dtype: np.dtype[Any]) -> np.dtype[Any]:
    # flags are settable through a dtype's pickled state: an innocent kind with object flags would make
    # ndarray.__setstate__ allocate first and read Python objects from the stream.
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None or dtype.flags:
        raise RefusedObjectError(f"arrays of dtype {dtype} (flags {dtype.flags}) are refused; expected a numeric dtype")
    return dtype


def _within(shape: tuple[int, ...], dtype: np.dtype[Any], limit: int) -> None:
    count = math.prod(shape)
    nbytes = count * max(dtype.itemsize, 1)
    if nbytes > limit:
        raise RefusedObjectError(
            f"an array of shape {shape} and dtype {dtype} would take {nbytes:,} bytes, more than the {limit:,} "
            "bytes of its stream could encode; refused before allocating it"
        )


def _checked_dtype(*args: Any) -> np.dtype[Any]:
    """``numpy.dtype`` for a pickle: only numeric dtypes are built."""
    return _numeric(np.dtype(*args))


class PickledArray(np.ndarray[Any, Any]):
    """The class a restricted pickle gets for ``numpy.ndarray``: never called, its pickled state checked.

    Arrays unpickle as ``_reconstruct(ndarray, (0,), dtype)`` followed by ``__setstate__``; the
    state's shape, dtype and data come from the stream and are checked here before numpy allocates
    (the data must be a byte string of exactly the stated size).  ``numpy.asarray`` turns one into a
    plain ``ndarray`` without copying.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> PickledArray:
        raise RefusedObjectError("numpy.ndarray called directly; the format's arrays pickle through _reconstruct")

    def __setstate__(self, state: Any, /) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise RefusedObjectError(f"malformed array state of type {type(state).__name__}")
        shape, dtype, _, data = state[-4:]
        shape = _shape(shape)
        if not isinstance(dtype, np.dtype):
            raise RefusedObjectError(f"an array's dtype must be a numpy dtype, got {type(dtype).__name__}")
        _numeric(dtype)
        if not isinstance(data, bytes | str):
            raise RefusedObjectError(f"an array's data must be a byte string, got {type(data).__name__}")
        # len(data) bounds what numpy copies; a stated shape that disagrees is refused before it is multiplied out.
        _within(shape, dtype, len(data))
        super().__setstate__(state)


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``admitted``.

    Parameters
    ----------
    file : IO[bytes]
        The open pickle file.
    source : str
        What to call the file in error messages.
    admitted : dict
        The admitted globals: ``(module, name)`` to the object it stands for.  ``numpy.ndarray``,
        ``numpy.dtype`` and numpy's ``_reconstruct`` are resolved to checked versions.
    needs : str
        What the format holds, for the message of a refusal.
    limit : int
        The most bytes one array may hold: the stream's length, since the arrays of these formats
        are stored in it byte for byte.
    encoding : str, default "latin1"
        How to decode Python 2 ``str`` objects (``"bytes"`` keeps them as bytes).
    """

    def __init__(
        self,
        file: IO[bytes],
        source: str,
        admitted: dict[tuple[str, str], Any],
        needs: str,
        limit: int,
        encoding: str = "latin1",
    ) -> None:
        # Python 2 pickled numpy buffers as str; latin-1 is the one codec that maps each byte to itself.
        super().__init__(file, encoding=encoding)
        self._source = source
        self._admitted = admitted
        self._needs = needs
        self._limit = limit

    def find_class(self, module: str, name: str, /) -> Any:
        """Return the admitted global ``module.name`` (the checked version of numpy's constructors).

        Raises
        ------
        RefusedGlobalError
            If ``(module, name)`` is not admitted.
        """
        # Looked up by exact name and never imported: importing a module named by the file could itself run code.
        try:
            found = self._admitted[(module, name)]
        except KeyError:
            raise RefusedGlobalError(
                f"{self._source}: refused to unpickle global {module}.{name}; the file only needs {self._needs}"
            ) from None
        if found is np.ndarray:
            return PickledArray
        if found is np.dtype:
            return _checked_dtype
        if found is _RECONSTRUCT:
            return self._reconstruct
        return found

    def _reconstruct(self, subtype: Any, shape: Any, dtype: Any) -> PickledArray:
        if subtype is not PickledArray:
            raise RefusedObjectError(f"_reconstruct of {subtype!r:.80}; expected numpy.ndarray")
        checked_shape = _shape(shape)
        checked = _numeric(np.dtype(dtype))
        _within(checked_shape, checked, self._limit)
        array: PickledArray = _RECONSTRUCT(PickledArray, checked_shape, checked)
        return array

    def load(self) -> Any:
        """Read the object; a refused one raises :class:`RefusedObjectError` naming the file."""
        try:
            return super().load()
        except RefusedObjectError as err:
            raise RefusedObjectError(f"{self._source}: {err}") from None


CORRUPT_PICKLE = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
    KeyError,
    OverflowError,
)
"""What a truncated or corrupt pickle raises while it is read (refusals are caught before these)."""
