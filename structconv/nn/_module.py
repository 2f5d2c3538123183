"""What every layer of :mod:`structconv.nn` shares as a module: a clear refusal of TorchScript.

A layer builds its basis in Python on every call (graph readers, plans, caches), which the
TorchScript front end cannot compile; ``torch.compile`` traces all of it.  ``torch.jit.script``
calls ``__prepare_scriptable__`` on a module, and on each of its submodules, before it reads
any source, so raising there replaces a cascade of front-end errors with one sentence.
"""

from __future__ import annotations

from typing import NoReturn


def script_refusal(layer: str) -> str:
    """The one sentence ``torch.jit.script`` meets for ``layer`` (a class name)."""
    return (
        f"{layer} does not support torch.jit.script (TorchScript cannot compile the Python that builds its "
        "basis); use torch.compile(layer) instead"
    )


class NotScriptable:
    """Mixin for a layer: ``torch.jit.script(layer)`` raises a ``TypeError`` pointing to ``torch.compile``.

    Put it before ``nn.Module`` among the bases, ``class Layer(NotScriptable, nn.Module)``; it
    adds no state and no ``__init__``.

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import StructConv
    >>> torch.jit.script(StructConv(torch.eye(3)[None], 2, 2))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: StructConv does not support torch.jit.script (...); use torch.compile(layer) instead
    """

    __slots__ = ()

    def __prepare_scriptable__(self) -> NoReturn:
        raise TypeError(script_refusal(type(self).__name__))
