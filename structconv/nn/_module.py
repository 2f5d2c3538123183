"""What every layer of :mod:`structconv.nn` shares as a module: a clear refusal of TorchScript, compiled runs.

A layer builds its basis in Python on every call (graph readers, plans, caches), which the
TorchScript front end cannot compile and ``torch.jit.trace`` freezes for the traced input;
``torch.compile`` traces all of it.  ``torch.jit.script`` calls ``__prepare_scriptable__`` on a
module, and on each of its submodules, before it reads any source, so raising there replaces a
cascade of front-end errors with one sentence.  ``torch.jit.trace`` (TensorBoard's ``add_graph``,
trace-based exporters) records the call, as it records PyG's layers, with one ``TracerWarning``
saying what it froze (:func:`warn_jit_trace`).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from ..backend import load
from ..backend.cache import BoundedCache
from ..backend.checks import check_memory
from ..backend.torch_autocast import autocast_dtype
from ..engine.compiled import contraction

load("torch")  # now, not on a layer's first call: torch.compile cannot trace an import


def script_refusal(layer: str) -> str:
    """The one sentence ``torch.jit.script`` meets for ``layer`` (a class name)."""
    return (
        f"{layer} does not support torch.jit.script (TorchScript cannot compile the Python that builds its "
        "basis); use torch.compile(layer) instead"
    )


def trace_warning(layer: str) -> str:
    """What ``torch.jit.trace`` is told, in a ``TracerWarning``, when it runs ``layer`` (a class name)."""
    return (
        f"{layer}: torch.jit.trace records this call's operators with the structure the layer built in Python for "
        "this input (its basis from this graph or grid, the plan, index tables) as constants: the traced module "
        "computes the layer for this input's structure only; trace again for another, or use torch.compile(layer)"
    )


def warn_jit_trace(layer: object) -> None:
    """Warn (a ``TracerWarning``, :func:`trace_warning`) when ``torch.jit.trace`` runs ``layer`` (first in forward)."""
    if torch.jit.is_tracing():  # type: ignore[attr-defined,no-untyped-call]  # (torch.compile folds it to False)
        warnings.warn(trace_warning(type(layer).__name__), torch.jit.TracerWarning, stacklevel=3)  # type: ignore[attr-defined]


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
    ValueError: RGCNConv: num_relations=1000000000000 asks for parameters that would take ... GiB on cpu, ...
    """
    probe = torch.empty(0, device=device, dtype=dtype)
    check_memory(numel * probe.element_size(), probe, f"{layer}: {sizes} asks for parameters that")


def own_parameter(module: torch.nn.Module, name: str) -> Any:
    """``module.<name>``, read from the module's parameter table when it is there.

    ``nn.Module.__getattr__`` costs about a microsecond a read, a few per cent of a small
    convolution's call; the table holds the same object.  A name the table lacks (a
    parametrization's property, a weight-norm hook's tensor, a ``None`` bias) is read as an
    attribute.
    """
    found = module._parameters.get(name)
    return found if found is not None else getattr(module, name)


#: The most warm runs a layer keeps (its inputs of that many keys, the first kept forgotten first).
WARM_RUNS = 64


class CompiledRuns:
    """A layer's compiled contractions (:func:`structconv.contraction`), one per input key, and its warm runs.

    Put it before ``nn.Module`` among the bases.  A layer looks its run up by a key of what the
    plan depends on (input shape, dtype, device, the basis' structure) and compiles on a miss; the
    16 keys used last are kept.  Once a call has been checked, a layer may keep a *warm run* for
    its input key (:attr:`warm_runs`: the key holds everything the checks read, the run checks
    nothing, :meth:`structconv.Contraction.warm`); moving or converting the layer (``.to``,
    ``.double()``), assigning or deleting a parameter or submodule, or a parametrization forgets
    them.  A copy or a pickle carries none: they are rebuilt on the first call.
    """

    #: The layer's settings (plain attributes its runs read when built): assigning one forgets them all.
    settings: frozenset[str] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._runs: BoundedCache[Any] = BoundedCache(size=16)
        #: Warm runs by input key: a plain dictionary, so that ``torch.compile`` guards on the one
        #: entry a call reads, and an evaluation pass that adds another recompiles nothing.
        self.warm_runs: dict[Any, Any] = {}

    def compiled_run(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """The run kept under ``key``, built by ``build()`` on the first call with it."""
        return self._runs.find(key) or self._runs.put(key, build())

    def contract(
        self,
        basis: Any,
        x: torch.Tensor,
        theta: Any,
        *,
        bias: torch.Tensor | None = None,
        order: str = "auto",
        layout: str = "rows",
    ) -> torch.Tensor:
        r""":math:`\sum_k A_k^\top x\Theta_k` (plus ``bias``) through the run compiled for these shapes.

        ``conv(basis, x, theta, order) + bias``, with the checks and the plan made on the first
        call for the basis' structure and ``x``'s shape, dtype and device; ``layout`` as
        :func:`structconv.contraction`'s (``"channels_first"``: torch's image layout).
        """
        y: torch.Tensor = self.contraction_for(basis, x, theta, order, layout).run_keyed(x, theta, bias, basis)
        return y  # keyed by all the call would compare

    def contraction_for(
        self, basis: Any, x: torch.Tensor, theta: Any, order: str = "auto", layout: str = "rows"
    ) -> Any:
        """The :class:`~structconv.Contraction` :meth:`contract` runs for these operands (compiled on a miss)."""
        # Traced runs plan apart: torch.compile cannot run the orders that read the basis on the host.
        compiling = torch.compiler.is_compiling()
        key = (basis.plan_key(), x.shape, x.dtype, x.device, type(theta), order, layout, compiling)
        return self.compiled_run(key, lambda: contraction(basis, x, theta, order=order, layout=layout))

    def keep_warm_run(self, key: Any, run: Any) -> None:
        """Keep ``run`` as the warm run of ``key``, forgetting the oldest beyond :data:`WARM_RUNS`."""
        runs = self.warm_runs
        runs[key] = run
        if len(runs) > WARM_RUNS:
            del runs[next(iter(runs))]

    def forget_runs(self) -> None:
        """Drop every compiled run and warm run (a setting they depend on changed)."""
        self._runs.clear()
        self.warm_runs.clear()

    # The compiled runs compare the parameters on every call; the warm runs do not, so they go
    # wherever the parameters may have changed dtype, device, shape or place.
    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        if "warm_runs" in self.__dict__:  # .to(), .cuda(), .double(), ...
            self.warm_runs.clear()
        return super()._apply(fn, recurse)  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        if "warm_runs" in self.__dict__:
            if name in self.settings:  # a changed setting plans anew, as torch's layers read theirs on every call
                self.forget_runs()
            elif isinstance(value, torch.Tensor | torch.nn.Module):
                self.warm_runs.clear()  # a parameter, buffer or submodule replaced
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if "warm_runs" in self.__dict__:
            self.warm_runs.clear()  # e.g. a parametrization takes a parameter's place
        super().__delattr__(name)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runs"] = BoundedCache(size=16)
        state["warm_runs"] = {}
        return state


#: The layers that build their structure eagerly when torch.compile first meets an input shape, by id.
_EAGER_LAYERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_RUNNING_EAGERLY: set[int] = set()


@torch.compiler.assume_constant_result  # type: ignore[untyped-decorator]
def _run_eagerly(layer_id: int, shape: tuple[int, ...], dtype: torch.dtype, device: str, cast: Any) -> bool:
    """Run the layer once, eagerly, on zeros of this shape: it fills its caches of structure outside the graph.

    ``torch.compile`` calls a function marked ``assume_constant_result`` while it traces, as plain
    Python, with constant arguments, and keeps its result as a constant; the traced forward that
    follows finds the caches filled.  ``cast`` is the traced code's autocast dtype (``None``:
    off), set here too, so the run fills the entry the traced call reads.  The random state is
    forked, so tracing draws no numbers.  The eager run's own forward meets this call again, and
    returns at once: the test is here, in plain Python, not a guard of the graph.
    """
    if layer_id in _RUNNING_EAGERLY:
        return True
    layer = _EAGER_LAYERS[layer_id]
    place = torch.device(device)
    _RUNNING_EAGERLY.add(layer_id)  # torch.compiler.is_compiling() stays true in here
    context = contextlib.nullcontext() if cast is None else torch.autocast(place.type, dtype=cast)
    try:
        devices = [] if place.type == "cpu" else [place.index or 0]
        with torch.random.fork_rng(devices=devices, device_type=place.type), context:
            layer(torch.zeros(shape, dtype=dtype, device=place))
    finally:
        _RUNNING_EAGERLY.discard(layer_id)
    return True


class StructureOutsideGraph:
    """A layer whose structure for an input shape (NumPy index tables, plans) is built eagerly, never traced.

    Put it before ``nn.Module`` among the bases and call :meth:`prepare_outside_graph` first in
    ``forward``.  Eagerly it does nothing (the forward fills its caches as it goes).  Under
    ``torch.compile`` the first trace of an input shape runs the layer once in plain Python on
    zeros of that shape, so the traced forward only reads cached structure and is one graph
    (``fullgraph=True`` holds) for a shape the layer has never seen eagerly.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _EAGER_LAYERS[id(self)] = self

    def __setstate__(self, state: dict[str, Any]) -> None:  # copies and unpickled layers are new objects
        super().__setstate__(state)  # type: ignore[misc]
        _EAGER_LAYERS[id(self)] = self

    def runs_eagerly(self) -> bool:
        """Whether this call runs as plain Python: not traced by ``torch.compile``, or its eager pre-run.

        A layer keeps what it builds (a warm run) only then: a write in traced code is a side
        effect the compiled code would replay on every call.
        """
        return not torch.compiler.is_compiling() or id(self) in _RUNNING_EAGERLY

    def prepare_outside_graph(self, x: torch.Tensor) -> None:
        """Under ``torch.compile``, build the structure for ``x``'s shape, dtype and device eagerly (see the class)."""
        if torch.compiler.is_compiling():
            _run_eagerly(id(self), tuple(x.shape), x.dtype, str(x.device), autocast_dtype(x.device.type))
