"""What every layer of :mod:`structconv.nn` shares as a module: a clear refusal of TorchScript, compiled runs.

A layer builds its basis in Python on every call (graph readers, plans, caches), which the
TorchScript front end cannot compile; ``torch.compile`` traces all of it.  ``torch.jit.script``
calls ``__prepare_scriptable__`` on a module, and on each of its submodules, before it reads
any source, so raising there replaces a cascade of front-end errors with one sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch

from ..backend import of
from ..engine.compiled import contraction


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


def own_parameter(module: torch.nn.Module, name: str) -> Any:
    """``module.<name>``, read from the module's parameter table when it is there.

    ``nn.Module.__getattr__`` costs about a microsecond a read, a few per cent of a small
    convolution's call; the table holds the same object.  A name the table lacks (a
    parametrization's property, a weight-norm hook's tensor, a ``None`` bias) is read as an
    attribute.
    """
    found = module._parameters.get(name)
    return found if found is not None else getattr(module, name)


_RUNS_KEPT = 16  # compiled input shapes kept per layer


class CompiledRuns:
    """A layer's compiled contractions (:func:`structconv.contraction`), one per input key.

    Put it before ``nn.Module`` among the bases.  A layer looks its run up by a key of what the
    plan depends on (input shape, dtype, device, the basis' structure) and compiles on a miss; the
    oldest of more than 16 keys is dropped.  A copy or a pickle carries none: they are rebuilt on
    the first call.
    """

    def compiled_run(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """The run kept under ``key``, built by ``build()`` on the first call with it."""
        runs: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_runs", {})
        run = runs.get(key)
        if run is None:
            run = build()
            if len(runs) >= _RUNS_KEPT:
                runs.pop(next(iter(runs)))
            runs[key] = run
        return run

    def contract(
        self, basis: Any, x: torch.Tensor, theta: Any, *, bias: torch.Tensor | None = None, order: str = "auto"
    ) -> torch.Tensor:
        r""":math:`\sum_k A_k^\top x\Theta_k` (plus ``bias``) through the run compiled for these shapes.

        ``conv(basis, x, theta, order) + bias``, with the checks and the plan made on the first
        call for the basis' structure and ``x``'s shape, dtype and device.
        """
        key = (basis.plan_key(), x.shape, x.dtype, x.device, type(theta), order)
        run = self.compiled_run(key, lambda: contraction(basis, x, theta, order=order))
        y: torch.Tensor = run.run_keyed(x, theta, bias, basis)  # keyed by all the call would compare
        return y

    def forget_runs(self) -> None:
        """Drop every compiled run (a setting they depend on changed)."""
        self.__dict__.get("_runs", {}).clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runs"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_runs", {})  # pickles from before compiled runs
        super().__setstate__(state)  # type: ignore[misc]
