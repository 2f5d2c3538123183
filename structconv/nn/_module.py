"""What every layer of :mod:`structconv.nn` shares as a module: a clear refusal of TorchScript.

A layer builds its basis in Python on every call (graph readers, plans, caches), which the
TorchScript front end cannot compile; ``torch.compile`` traces all of it.  ``torch.jit.script``
calls ``__prepare_scriptable__`` on a module, and on each of its submodules, before it reads
any source, so raising there replaces a cascade of front-end errors with one sentence.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from ..backend import of


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


def check_parameter_memory(layer: str, numel: int, sizes: str, device: Any = None, dtype: Any = None) -> None:
    """Refuse ``numel`` parameter entries that exceed the memory of their device, before any is allocated.

    ``sizes`` names the arguments that ask for them (e.g. ``"num_relations=10000000000"``), so a
    size typed by mistake ends in one sentence instead of the allocator's failure.

    Examples
    --------
    >>> check_parameter_memory("RGCNConv", 2 * 3 * 10**12, "num_relations=1000000000000")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: RGCNConv: num_relations=1000000000000 asks for ... GiB of parameters, more than the ... GiB ...
    """
    probe = torch.empty(0, device=device, dtype=dtype)
    need = numel * probe.element_size()
    capacity = of(probe).memory_capacity(probe)
    if need > capacity:
        raise ValueError(
            f"{layer}: {sizes} asks for {need / 2**30:.3g} GiB of parameters, more than the "
            f"{capacity / 2**30:.3g} GiB of memory on {probe.device}"
        )
