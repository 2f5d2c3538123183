r"""A layer against a peer: the same layer in another library (``torch.nn``, PyTorch Geometric, ...).

:func:`compare_to_peer` gives our layer the peer's parameters, runs both on copies of the same
inputs, and compares the outputs and the gradients of :math:`\langle y, g \rangle` (:math:`g`
drawn from a seed) with respect to every floating input and every parameter.  The tests of
``tests/peers`` hold the package's layers to ``torch.nn`` and PyG through it; a user who ports a
layer does the same.

Two ways to judge a difference:

* *tight* (float64, float32): :math:`|a - b| \le \mathrm{atol}\cdot s + \mathrm{rtol}\,|b|`,
  with the scale :math:`s = \max(\max|b|,\ \mathrm{floor},\ \mathrm{share}\cdot\max_{\text{all}}|b|)`
  (1 when that is 0): an error of a few roundings of the tensor's largest value is allowed;
* *against an exact run* (bfloat16, autocast): both are measured against ``exact``, a float64
  copy of the peer run on the same rounded inputs, and ours may be off by ``peer_factor`` times
  the peer's own error plus a ``slack`` (by default ``atol`` times the exact value's largest entry).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from ._values import max_difference


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


@dataclass(frozen=True, eq=False)
class Link:
    """Our parameter ``ours`` is ``fn(*peer)`` of the peer's parameters ``peer`` (a linear map).

    Its gradient is then compared with ``fn`` of the peer's gradients: ``fn`` must be linear
    (transposes, stacks, reshapes, slices), as a change of layout is.  Links compare by identity
    (``eq=False``).

    Parameters
    ----------
    ours
        A parameter of our layer, the tensor object itself (found among the layer's parameters by
        identity); :func:`compare_to_peer` sets it in place to ``fn(*peer)``.
    peer
        The parameters of the peer that ``ours`` is made of, the tensor objects themselves (named
        by identity among the peer's parameters), in the order ``fn`` takes them.
    fn
        ``fn(*peer) -> Tensor`` of the shape of ``ours``, linear in each argument; by default the
        identity of a single tensor.

    Examples
    --------
    >>> import torch
    >>> from structconv.testing import Link
    >>> ours, theirs = torch.nn.Linear(3, 2), torch.nn.Linear(2, 3)
    >>> link = Link(ours.weight, (theirs.weight,), lambda w: w.t())
    >>> link.fn(*link.peer).shape == ours.weight.shape
    True
    """

    ours: torch.Tensor
    peer: Sequence[torch.Tensor]
    fn: Callable[..., torch.Tensor] = _same


@dataclass(frozen=True)
class PeerRun:
    r"""One run of a layer: its raw result, the outputs compared, and the gradients by name.

    ``outputs`` holds ``"output"`` (the first output) and ``"output[i]"`` for each further
    top-level tensor (or ``None``) of a tuple result; ``inputs`` the gradients of the floating
    inputs, ``"input"`` (or ``"input i"`` for several); ``parameters`` those of the parameters.
    :func:`run_module` makes it.

    Parameters
    ----------
    result
        What the module returned, as it returned it: a tensor, or a tuple whose first item is one.
    outputs
        The outputs compared, detached: ``"output"``, the tensor result or the first item of a
        tuple result, and ``"output[i]"`` for each further item ``i`` of a tuple that is a tensor
        or ``None`` (other items are left out, for the caller to compare from ``result``).
    inputs
        The gradients of :math:`\langle y, g \rangle` with respect to the floating inputs, one
        per distinct tensor in order of first appearance: ``"input"`` when there is one,
        ``"input 0"``, ``"input 1"``, ... when there are several; zeros for an input ``y`` does not
        depend on.
    parameters
        The gradients of :math:`\langle y, g \rangle` with respect to the module's parameters that
        require gradients, by their names in ``named_parameters()``, sorted; zeros for a parameter
        ``y`` does not depend on.
    """

    result: Any
    outputs: dict[str, torch.Tensor | None] = field(default_factory=dict)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    parameters: dict[str, torch.Tensor] = field(default_factory=dict)

    def named(self) -> dict[str, torch.Tensor | None]:
        """Every result by its name: outputs, then the gradients of the inputs and of the parameters.

        Returns
        -------
        dict of str to torch.Tensor or None
            ``outputs``, ``inputs`` and ``parameters`` merged into one new dict, in that order.
        """
        return {**self.outputs, **self.inputs, **self.parameters}


def _cast(a: Any, dtype: torch.dtype | None) -> Any:
    if dtype is not None and isinstance(a, torch.Tensor) and a.is_floating_point():
        return a.to(dtype)
    return a


def run_module(
    module: nn.Module,
    *inputs: Any,
    kwargs: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    autocast: torch.dtype | None = None,
    absolute: bool = False,
) -> PeerRun:
    r"""Run ``module`` on fresh leaves made from ``inputs`` and take the gradients of :math:`\langle y, g \rangle`.

    Parameters
    ----------
    module
        The layer to run, called as ``module(*inputs, **kwargs)``; it must return a tensor, or a
        tuple whose first item is a tensor (the output :math:`y`).
    *inputs
        Its positional inputs.  Each floating tensor with the strided layout, also inside tuples
        and lists (at any depth), is replaced by a detached copy, cast to ``dtype`` when given,
        that requires gradients; a tensor passed more than once (as self-attention's query, key
        and value) becomes one leaf.  Anything else (integer or sparse tensors, ``None``, ...) is
        passed as it is.
    kwargs
        Its keyword arguments.  The floating tensors among the values (at the top level only)
        are cast to ``dtype`` when given; none becomes a leaf, so none has a gradient taken.
    dtype
        The dtype of the leaves and of the floating keyword arguments; ``None`` keeps theirs.
        The module's own parameters are not cast.
    seed
        ``torch.manual_seed(seed)`` is called just before the module (this reseeds torch's global
        generator: the same dropout draws for both layers), and :math:`g` is drawn from a
        standard normal by a generator seeded with ``seed``, in float64, then cast to the dtype
        of :math:`y`.
    autocast
        The dtype of ``torch.autocast("cpu", dtype=autocast)`` around the call; ``None``: none.
    absolute
        Use :math:`|g|` instead of :math:`g`: with :math:`|x|` and :math:`|\text{weights}|` that
        gives the sums of the terms' magnitudes, the scale of any rounding error.

    Returns
    -------
    PeerRun
        The raw result, the outputs, and the gradients of :math:`\langle y, g \rangle` with
        respect to the leaves and to every parameter that requires gradients (all zeros when
        :math:`y` does not require gradients).

    Raises
    ------
    TypeError
        When the module's output (the first item of a tuple result) is not a tensor.

    Examples
    --------
    >>> import torch
    >>> from structconv.testing import run_module
    >>> layer = torch.nn.Linear(3, 2, dtype=torch.float64)
    >>> # the input is cast to the layer's dtype
    >>> run = run_module(layer, torch.randn(4, 3), dtype=torch.float64)
    >>> sorted(run.named()), run.outputs["output"].dtype
    (['bias', 'input', 'output', 'weight'], torch.float64)
    """
    made: dict[int, torch.Tensor] = {}

    def leaf(a: Any) -> Any:
        if isinstance(a, tuple | list):
            return type(a)(leaf(t) for t in a)
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.layout == torch.strided):
            return a
        if id(a) not in made:
            made[id(a)] = _cast(a.detach().clone(), dtype).requires_grad_()
        return made[id(a)]

    args = [leaf(a) for a in inputs]
    kw = {k: _cast(v, dtype) for k, v in (kwargs or {}).items()}
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
        result = module(*args, **kw)
    y = result[0] if isinstance(result, tuple) else result
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{type(module).__name__} returned {type(y).__name__}, not a tensor, as its output")
    outputs: dict[str, torch.Tensor | None] = {"output": y.detach()}
    for i, extra in enumerate(result[1:] if isinstance(result, tuple) else (), start=1):
        if extra is None or isinstance(extra, torch.Tensor):  # anything else is the caller's to compare
            outputs[f"output[{i}]"] = None if extra is None else extra.detach()
    generator = torch.Generator().manual_seed(seed)
    g = torch.randn(y.shape, generator=generator, dtype=torch.float64).to(y.dtype)
    g = g.abs() if absolute else g
    named = sorted((n, p) for n, p in module.named_parameters() if p.requires_grad)
    targets = [*made.values(), *(p for _, p in named)]
    grads: Sequence[torch.Tensor | None] = [None] * len(targets)
    if y.requires_grad and targets:
        grads = torch.autograd.grad(y, targets, g, allow_unused=True)
    full = [torch.zeros_like(t) if d is None else d for t, d in zip(targets, grads, strict=True)]
    names = ["input"] if len(made) == 1 else [f"input {i}" for i in range(len(made))]
    inputs_ = dict(zip(names, full[: len(made)], strict=True))
    return PeerRun(result, outputs, inputs_, dict(zip([n for n, _ in named], full[len(made) :], strict=True)))


_Named = list[tuple[str, tuple[str, ...], Callable[..., torch.Tensor]]]
"""Each of our parameters: its name, the names of the peer's it is made of, and how."""


def _by_name(ours: nn.Module, peer: nn.Module, parameters_from: Sequence[Link], prefix: str) -> _Named:
    """Set each of our parameters from its :class:`Link` and name the peer's it is made of."""
    links = {id(link.ours): link for link in parameters_from}
    unlinked = [n for n, p in ours.named_parameters() if id(p) not in links]
    if unlinked:
        raise AssertionError(f"{prefix}parameters of ours without a Link: {unlinked}")
    with torch.no_grad():
        for link in parameters_from:
            link.ours.copy_(link.fn(*link.peer))
    theirs = {id(p): n for n, p in peer.named_parameters()}
    out: _Named = []
    for n, p in ours.named_parameters():
        if p.requires_grad:  # a frozen parameter has no gradient to compare
            link = links[id(p)]
            out.append((n, tuple(theirs[id(t)] for t in link.peer), link.fn))
    return out


def _as_ours(run: PeerRun, mapping: _Named) -> dict[str, torch.Tensor | None]:
    """The peer's run by our names: outputs, inputs' gradients, and each of our parameters' through its link."""
    out: dict[str, torch.Tensor | None] = {**run.outputs, **run.inputs}
    for ours, theirs, fn in mapping:
        out[ours] = fn(*(run.parameters[n] for n in theirs))
    return out


def compare_to_peer(
    ours: nn.Module,
    peer: nn.Module,
    *inputs: Any,
    kwargs: Mapping[str, Any] | None = None,
    parameters_from: Literal["state_dict"] | Sequence[Link] | None = "state_dict",
    dtype: torch.dtype | None = None,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    floor: float = 0.0,
    share: float = 0.0,
    gradients: bool = True,
    seed: int = 0,
    autocast: torch.dtype | None = None,
    exact: nn.Module | None = None,
    slack: Callable[[str, Mapping[str, Any]], float] | None = None,
    peer_factor: float = 2.0,
    name: str = "",
) -> tuple[Any, Any]:
    r"""Check that ``ours(*inputs, **kwargs)`` equals ``peer(...)``: outputs, and gradients of inputs and parameters.

    Parameters
    ----------
    ours, peer
        Our layer and the peer's.
    *inputs
        The positional inputs (copied for each layer by :func:`run_module`).
    kwargs
        Keyword arguments of both calls.
    parameters_from
        ``"state_dict"``: ``ours.load_state_dict(peer.state_dict())``, then parameters compared by
        name (both layers must have the same names); a sequence of :class:`Link`: each of ours
        set to ``fn`` of the peer's (every parameter of ours must be linked); ``None``: the
        parameters are already equal and compared by name.
    dtype
        The dtype both run in (inputs and floating keyword arguments cast to it).
    rtol, atol, floor, share
        The tight comparison (see the module notes): ``atol`` is per unit of the scale
        :math:`\max(\max|b|, \mathrm{floor}, \mathrm{share}\cdot\text{largest compared value})`.
    gradients
        Whether to compare the gradients.
    seed
        Seed of the calls (dropout) and of :math:`g`.
    autocast
        Run both inside ``torch.autocast("cpu", dtype=autocast)``.
    exact
        A float64 copy of the peer: when given, both results are measured against its run on
        the same inputs rounded to ``dtype`` (the comparison of low precision).
    slack
        ``slack(name, exact_results) -> float``: what ours may add to ``peer_factor`` times the
        peer's error, for the result ``name`` (default: ``atol`` times its largest exact value).
        A peer's error that is not finite counts as 0.
    peer_factor
        How many times the peer's own error ours may make.
    name
        The case's name, first in every message.

    Returns
    -------
    tuple
        The raw results of ``ours`` and of ``peer``, for what the caller compares itself.

    Raises
    ------
    AssertionError
        Naming the case, the result (``output``, ``input``, a parameter) and the largest difference.
    """
    prefix = f"{name}: " if name else ""
    if parameters_from is None or isinstance(parameters_from, str):
        if parameters_from == "state_dict":
            ours.load_state_dict(peer.state_dict())
        mine = sorted(n for n, p in ours.named_parameters() if p.requires_grad)
        theirs = sorted(n for n, p in peer.named_parameters() if p.requires_grad)
        if mine != theirs:
            raise AssertionError(f"{prefix}parameters differ in name: ours {mine}, the peer's {theirs}")
        mapping: _Named = [(n, (n,), _same) for n in mine]
    else:
        mapping = _by_name(ours, peer, parameters_from, prefix)
    a = run_module(ours, *inputs, kwargs=kwargs, dtype=dtype, seed=seed, autocast=autocast)
    b = run_module(peer, *inputs, kwargs=kwargs, dtype=dtype, seed=seed, autocast=autocast)
    got = a.named() if gradients else dict(a.outputs)
    want = {k: v for k, v in _as_ours(b, mapping).items() if gradients or k in b.outputs}
    if set(got) != set(want):
        raise AssertionError(f"{prefix}results differ: ours {sorted(got)}, the peer's {sorted(want)}")
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, mine_ in got.items():
        theirs_ = want[key]
        if mine_ is None or theirs_ is None:
            if (mine_ is None) != (theirs_ is None):
                raise AssertionError(f"{prefix}{key} is None in {'ours' if mine_ is None else 'the peer'} only")
            continue
        if (mine_.shape, mine_.dtype) != (theirs_.shape, theirs_.dtype):
            raise AssertionError(
                f"{prefix}{key}: ours {tuple(mine_.shape)} {mine_.dtype}, "
                f"the peer's {tuple(theirs_.shape)} {theirs_.dtype}"
            )
        if mine_.numel():
            pairs[key] = (mine_, theirs_)
    if exact is None:
        _tight(pairs, rtol, atol, floor, share, prefix)
    else:
        _against(pairs, exact, inputs, kwargs, dtype, seed, mapping, slack, atol, peer_factor, prefix)
    return a.result, b.result


def _against(
    pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    exact: nn.Module,
    inputs: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None,
    dtype: torch.dtype | None,
    seed: int,
    mapping: _Named,
    slack: Callable[[str, Mapping[str, Any]], float] | None,
    atol: float,
    peer_factor: float,
    prefix: str,
) -> None:
    """Both results against ``exact``'s float64 run on the same values rounded to ``dtype``."""
    rounded: dict[int, Any] = {}  # one copy per tensor: self-attention's x stays one leaf
    ins = [rounded.setdefault(id(t), _cast(t, dtype)) for t in inputs]
    truth = _as_ours(run_module(exact, *ins, kwargs=kwargs, dtype=torch.float64, seed=seed), mapping)

    def default(key: str, found: Mapping[str, Any]) -> float:
        return atol * (float(found[key].abs().max()) or 1.0)

    allow = slack or default
    for key, (mine, theirs) in pairs.items():
        err, peer_err = max_difference(mine, truth[key]), max_difference(theirs, truth[key])
        peer_err = peer_err if math.isfinite(peer_err) else 0.0  # a NaN of the peer's: ours held to the slack alone
        bound = peer_factor * peer_err + allow(key, truth)
        if not err <= bound:
            raise AssertionError(
                f"{prefix}{key}: error {err:.3g} from the exact result > {bound:.3g} (the peer's own: {peer_err:.3g})"
            )


def _tight(
    pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    rtol: float,
    atol: float,
    floor: float,
    share: float,
    prefix: str,
) -> None:
    largest = max((float(b.abs().max()) for _, b in pairs.values()), default=0.0)
    for key, (a, b) in pairs.items():
        scale = max(float(b.abs().max()), floor, share * largest) or 1.0
        diff = (a.double() - b.double()).abs()
        allowed = atol * scale + rtol * b.double().abs()
        if not bool(((a.double() == b.double()) | (diff <= allowed)).all()):
            raise AssertionError(
                f"{prefix}{key} differs: max |ours - peer| = {max_difference(a, b):.3g} "
                f"(allowed {atol * scale:.3g} + {rtol:.3g}·|peer|)"
            )


__all__ = ["Link", "PeerRun", "compare_to_peer", "run_module"]
