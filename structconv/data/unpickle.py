"""Unpickling that resolves only the globals a file format needs (the CIFAR and Planetoid readers).

Unpickling runs code named by the file: a pickle may name any importable callable.  The
:class:`RestrictedUnpickler` resolves only the ``(module, name)`` pairs it is given, looked up
by exact name and never imported, and refuses everything else with a :class:`RefusedGlobalError`.
"""

from __future__ import annotations

import importlib
import pickle
from typing import IO, Any

__all__ = ["CORRUPT_PICKLE", "RefusedGlobalError", "RestrictedUnpickler", "numpy_reconstruct"]


def numpy_reconstruct() -> Any:
    """``numpy``'s ``_reconstruct``, the global an ndarray pickles with, under its current module name."""
    # numpy 2 renamed numpy.core to numpy._core and warns on imports under the old name.
    try:
        module = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # pragma: no cover - numpy < 2
        module = importlib.import_module("numpy.core.multiarray")
    return module._reconstruct


class RefusedGlobalError(pickle.UnpicklingError):
    """A pickle named a global outside the admitted ones (kept as is, unlike a corrupt stream)."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``admitted``.

    Parameters
    ----------
    file : IO[bytes]
        The open pickle file.
    source : str
        What to call the file in error messages.
    admitted : dict
        The admitted globals: ``(module, name)`` to the object it stands for.
    needs : str
        What the format holds, for the message of a refusal.
    encoding : str, default "latin1"
        How to decode Python 2 ``str`` objects (``"bytes"`` keeps them as bytes).
    """

    def __init__(
        self,
        file: IO[bytes],
        source: str,
        admitted: dict[tuple[str, str], Any],
        needs: str,
        encoding: str = "latin1",
    ) -> None:
        # Python 2 pickled numpy buffers as str; latin-1 is the one codec that maps each byte to itself.
        super().__init__(file, encoding=encoding)
        self._source = source
        self._admitted = admitted
        self._needs = needs

    def find_class(self, module: str, name: str, /) -> Any:
        """Return the admitted global ``module.name``.

        Raises
        ------
        RefusedGlobalError
            If ``(module, name)`` is not admitted.
        """
        # Looked up by exact name and never imported: importing a module named by the file could itself run code.
        try:
            return self._admitted[(module, name)]
        except KeyError:
            raise RefusedGlobalError(
                f"{self._source}: refused to unpickle global {module}.{name}; the file only needs {self._needs}"
            ) from None


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
"""What a truncated or corrupt pickle raises while it is read."""
