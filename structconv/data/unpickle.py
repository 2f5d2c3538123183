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

Before any of that, the stream itself is stepped over (:func:`check_stream`): CPython's unpickler allocates the
length a counted opcode states (``BINBYTES8``, ``BINUNICODE8``, ``BINSTRING``, ``LONG4``, ...) before it reads the
data, and grows its memo to twice the index a ``PUT`` names, so a pickle of a few bytes could ask for a terabyte; and
it hashes a nested tuple key by recursing in C, so objects may nest ``MAX_DEPTH`` deep at most.
:func:`restricted_loads` checks the stream, then unpickles it.
"""

from __future__ import annotations

import importlib
import io
import math
import operator
import pickle
import pickletools
from typing import IO, Any

import numpy as np

__all__ = [
    "CORRUPT_PICKLE",
    "PickledArray",
    "RefusedGlobalError",
    "RefusedObjectError",
    "RestrictedUnpickler",
    "check_stream",
    "numpy_reconstruct",
    "restricted_loads",
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
        *,
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
        """Read the object; a refused one, or a ``MemoryError``, raises :class:`RefusedObjectError` naming the file."""
        try:
            return super().load()
        except RefusedObjectError as err:
            raise RefusedObjectError(f"{self._source}: {err}") from None
        except MemoryError:
            # The fallback for what check_stream does not foresee: for files of these formats (a few MB), a size
            # stated in the file is a likelier cause than the host's memory.
            raise RefusedObjectError(
                f"{self._source}: unpickling it ran out of memory (a size stated in the file that it does not hold?)"
            ) from None


CORRUPT_PICKLE = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, LookupError, OverflowError)
"""What a truncated or corrupt pickle raises while it is read (refusals are caught before these; LookupError:
``IndexError`` and ``KeyError``)."""


# How an opcode's argument is laid out, and what the check does with it (see _layouts).
_PLAIN, _PUT, _MEMOIZE, _FRAME, _STOP, _LINES, _COUNTED, _GET = range(8)
# What an opcode does to the stack of the objects being built, for their nesting depth (see _effect).
_NONE, _ATOM, _EMPTY, _MARK, _FETCH, _POP, _DUP, _MAKE, _MAKE_MARK, _POP_MARK, _ADD, _ADD_MARK = range(12)  # ordered
_CHECKED = " (checked before unpickling)"

MAX_DEPTH = 100
"""The deepest nesting of objects :func:`check_stream` admits; the CIFAR and Planetoid pickles nest 8 deep at most."""


def _effect(op: pickletools.OpcodeInfo) -> tuple[int, int]:
    """``(effect, count)``: how ``op`` changes the stack of depths, from its stack effect in :mod:`pickletools`."""
    before, after = [s.name for s in op.stack_before], [s.name for s in op.stack_after]
    # LIST, TUPLE, DICT, FROZENSET, INST and OBJ build; POP_MARK drops; APPENDS, SETITEMS and ADDITEMS add.
    if "mark" in before:
        return (_ADD_MARK if before.index("mark") else _MAKE_MARK if after else _POP_MARK), 0
    named = {"MARK": _MARK, "POP": _POP, "DUP": _DUP, "APPEND": _ADD, "SETITEM": _ADD, "BUILD": _ADD}
    named.update(GET=_FETCH, BINGET=_FETCH, LONG_BINGET=_FETCH, MEMOIZE=_NONE, READONLY_BUFFER=_NONE)
    if op.name in named:
        return named[op.name], len(before) - 1
    if not before and after:
        return (_EMPTY if op.name.startswith("EMPTY_") else _ATOM), 0
    # TUPLE1-3, REDUCE, NEWOBJ(_EX), STACK_GLOBAL, ... make one object; PROTO, FRAME, PUT (stored apart), STOP none.
    return (_MAKE, len(before)) if after else (_NONE, 0)


def _layouts() -> list[tuple[str, int, int, int, int] | None]:
    """Per opcode byte: ``(name, kind, size, effect, count)``, from the opcode table of the running ``pickletools``.

    ``kind`` is :data:`_LINES` (``size`` lines), :data:`_COUNTED` (a ``size``-byte length, then that
    many bytes: signed for ``BINSTRING`` and ``LONG4``, whose negative lengths the unpickler refuses),
    or an argument of ``size`` bytes: :data:`_PUT`, :data:`_GET`, :data:`_FRAME` (checked), :data:`_MEMOIZE`,
    :data:`_STOP` or :data:`_PLAIN` (skipped).  ``effect`` and ``count`` are :func:`_effect`'s.
    """
    prefixed = {
        pickletools.TAKEN_FROM_ARGUMENT1: 1,
        pickletools.TAKEN_FROM_ARGUMENT4: -4,  # signed
        pickletools.TAKEN_FROM_ARGUMENT4U: 4,
        pickletools.TAKEN_FROM_ARGUMENT8U: 8,
    }
    special = {"BINPUT": _PUT, "LONG_BINPUT": _PUT, "BINGET": _GET, "LONG_BINGET": _GET, "MEMOIZE": _MEMOIZE}
    special.update(FRAME=_FRAME, STOP=_STOP)
    table: list[tuple[str, int, int, int, int] | None] = [None] * 256
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None or arg.n >= 0:
            layout = (op.name, special.get(op.name, _PLAIN), 0 if arg is None else arg.n)
        elif arg.n == pickletools.UP_TO_NEWLINE:  # GLOBAL and INST name a module and a name, one line each
            layout = (op.name, _LINES, 2 if arg.name == "stringnl_noescape_pair" else 1)
        else:
            layout = (op.name, _COUNTED, prefixed[arg.n])
        table[ord(op.code)] = (*layout, *_effect(op))
    return table


_LAYOUTS = _layouts()
# Per opcode byte, for the walk's fast path: twice the length of an opcode with a fixed-size argument that pushes
# a new object, plus its depth (BININT1: 2 * 2 + 0, EMPTY_LIST: 2 * 1 + 1); else 0.
_PUSHES = [2 + 2 * t[2] + (t[3] == _EMPTY) if t and t[1] == _PLAIN and t[3] in (_ATOM, _EMPTY) else 0 for t in _LAYOUTS]
_MARK_BYTE = pickle.MARK[0]


def check_stream(data: bytes, *, max_depth: int = MAX_DEPTH) -> None:
    """Step over the opcodes of the pickle ``data`` without building anything; raise if one states what is not there.

    CPython's unpickler allocates the length a counted opcode states (``BINBYTES8``, ``BINUNICODE8``,
    ``BYTEARRAY8``, ``BINSTRING``, ``BINBYTES``, ``BINUNICODE``, ``LONG4``, ...) before it reads the
    bytes, reads a ``FRAME``'s stated length ahead, and sizes its memo by twice the index a ``PUT``
    names.  Here every stated length must lie within the remaining bytes, and a memo index may exceed
    the values memoized before it by at most one (pickle.py numbers them from 0, Python 2's cPickle
    from 1).  The opcodes and their argument layouts are those of :mod:`pickletools`, whose ``genops``
    would make the same walk two to three times slower, decoding every argument.

    It also keeps the depth of each object on the unpickler's stack and in its memo (an atom 0, a container or
    call one more than its deepest item): CPython hashes a tuple key nested 10**6 deep by recursing in C, past its
    stack.  A list or dict deepened through a memo alias is not followed (unhashable; its repr checks recursion).

    Raises
    ------
    pickle.UnpicklingError
        Naming the opcode, its offset, what it states and what the stream holds (not the file: the
        caller names it).
    RefusedObjectError
        If objects nest deeper than ``max_depth``: naming the depth and the opcode's offset.
    """
    end, at, puts, start, name = len(data), 0, 0, 0, ""
    stack: list[int] = []  # the depth of each object on the unpickler's stack
    marks: list[int] = []  # the stack's length at each MARK
    memo: dict[int, int] = {}
    push = stack.append
    try:
        while at < end:
            op = data[at]
            pushes = _PUSHES[op]
            if pushes:
                at += pushes >> 1
                push(pushes & 1)
                continue
            if op == _MARK_BYTE:
                at += 1
                marks.append(len(stack))
                continue
            layout = _LAYOUTS[op]
            if layout is None:
                raise pickle.UnpicklingError(f"unknown opcode {data[at : at + 1]!r} at byte {at:,}{_CHECKED}")
            name, kind, size, effect, count = layout
            start, at, value = at, at + 1, -1
            if kind == _PLAIN:  # most opcodes; one that ends past the stream ends the loop
                at += size
            elif kind == _PUT and at + size <= end:  # the memo's depth is that of the object on top
                value, at = int.from_bytes(data[at : at + size], "little"), at + size
                puts = _memo_put(value, puts, name, start)
                memo[value] = stack[-1]
            elif kind == _LINES:
                for _ in range(size):
                    newline = data.find(b"\n", at)
                    if newline < 0:
                        raise pickle.UnpicklingError(f"{name} at byte {start:,} has no end of line{_CHECKED}")
                    if name in ("PUT", "GET"):
                        index = data[at:newline]
                        if not index.isdigit() or len(index) > 20:
                            raise pickle.UnpicklingError(
                                f"{name} at byte {start:,} names memo index {index!r:.40}{_CHECKED}"
                            )
                        value = int(index)
                        if name == "PUT":
                            puts = _memo_put(value, puts, name, start)
                            memo[value] = stack[-1]
                    at = newline + 1
            elif kind == _COUNTED:
                width = abs(size)
                if at + width > end:
                    break
                length = int.from_bytes(data[at : at + width], "little", signed=size < 0)
                at += width
                _within_stream(name, start, length, end - at)
                at += length
            elif kind == _MEMOIZE:
                memo[len(memo)] = stack[-1]
                puts += 1
            elif at + size <= end:  # a GET, FRAME or STOP whose argument the stream holds
                value, at = int.from_bytes(data[at : at + size], "little"), at + size
                if kind == _FRAME:
                    _within_stream(name, start, value, end - at)
                elif kind == _STOP:
                    return
            else:
                break
            if effect == _NONE:
                pass
            elif effect >= _MAKE:  # MAKE, MAKE_MARK, POP_MARK, ADD, ADD_MARK: pop items, build or add to a container
                # Below 0 for too few items: wrong, but the unpickler refuses the stream at this opcode.
                split = len(stack) - count if effect in (_MAKE, _ADD) else marks.pop()
                depth = max(stack[split:], default=0) + 1
                del stack[split:]
                if effect >= _ADD:  # the container stays on the stack, as deep as its deepest item
                    depth = max(stack[-1], depth)
                    stack[-1] = depth
                elif effect != _POP_MARK:
                    push(depth)
                if depth > max_depth:
                    message = f"objects nested {depth:,} deep, more than the {max_depth} this reader admits"
                    raise RefusedObjectError(f"{name} at byte {start:,} builds {message}; refused before unpickling")
            elif effect == _ATOM:  # one with a line or a counted argument (BINUNICODE, ...)
                push(0)
            elif effect == _EMPTY:
                push(1)
            elif effect == _FETCH:
                push(memo.get(value, 0))  # a GET of what was never stored fails in the unpickler
            elif effect == _POP:  # pickle.py and _pickle.c pop a MARK when the stack holds nothing above it
                (marks if marks and marks[-1] == len(stack) else stack).pop()
            else:  # DUP
                push(stack[-1])
    except IndexError:
        raise pickle.UnpicklingError(f"{name} at byte {start:,} takes more than the stack holds{_CHECKED}") from None
    raise pickle.UnpicklingError(f"the stream ends before its STOP opcode{_CHECKED}")


def _within_stream(name: str, start: int, length: int, remaining: int) -> None:
    if not 0 <= length <= remaining:
        raise pickle.UnpicklingError(
            f"{name} at byte {start:,} states {length:,} bytes, but only {remaining:,} remain{_CHECKED}"
        )


def _memo_put(index: int, puts: int, name: str, start: int) -> int:
    if index > puts + 1:
        raise pickle.UnpicklingError(
            f"{name} at byte {start:,} names memo index {index:,}, but only {puts:,} values were memoized before "
            f"it{_CHECKED}"
        )
    return puts + 1


def restricted_loads(
    data: bytes,
    source: str,
    admitted: dict[tuple[str, str], Any],
    needs: str,
    *,
    corrupt: str = "cannot be read as a pickle (truncated or corrupt?)",
    encoding: str = "latin1",
) -> Any:
    """Unpickle ``data`` with a :class:`RestrictedUnpickler` after :func:`check_stream`; every failure names ``source``.

    ``admitted``, ``needs`` and ``encoding`` are those of :class:`RestrictedUnpickler`; an array may
    hold no more bytes than ``data``.

    Raises
    ------
    RefusedGlobalError, RefusedObjectError
        As the unpickler raises them.
    ValueError
        If the stream is truncated or corrupt, or states a length or memo index it does not hold:
        ``"{source}: {corrupt}: {what}"``.
    """
    try:
        try:
            check_stream(data)
        except RefusedObjectError as err:
            raise RefusedObjectError(f"{source}: {err}") from None
        return RestrictedUnpickler(io.BytesIO(data), source, admitted, needs, len(data), encoding=encoding).load()
    except (RefusedGlobalError, RefusedObjectError):
        raise
    except CORRUPT_PICKLE as err:
        raise ValueError(f"{source}: {corrupt}: {type(err).__name__}: {err}") from err
