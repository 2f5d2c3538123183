r"""The layer contract: a layer of :mod:`structconv.nn` is :math:`y = \sum_k A_k^\top x \Theta_k` plus its bias.

Every layer exposes its basis (``layer.basis(*inputs)``) and its parameter (``layer.theta()``);
:func:`check_layer` calls the layer and the *contract*, :func:`structconv.conv` on that basis and
parameter with the bias added and the result put in the layer's layout, and compares the outputs
and the gradients with respect to the inputs and every parameter.  Where ``forward`` reaches its
output by another route (a fused aggregation, a native kernel, bias folding) this ties two
computations; where it already calls ``conv``, it pins the layout and what is added.

A contract is a function ``contract(layer, *inputs) -> Tensor``; :func:`contract_for` picks the
one for a layer of the package by its type (:data:`CONTRACTS`), and a user's own layer passes its
own, or gets :func:`node_contract` when it has ``basis`` and ``theta``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from .. import nn as snn
from ..engine.contract import conv
from ..structures.grid import apply_shifts
from ._values import as_float64, assert_near, tolerances
from .meaning import output_diagnosis

Contract = Callable[..., torch.Tensor]
"""``contract(layer, *inputs)``: the layer's output computed through :func:`structconv.conv`."""


def _plus_bias(layer: nn.Module, y: torch.Tensor) -> torch.Tensor:
    bias = getattr(layer, "bias", None)
    return y if bias is None else y + bias


def node_contract(layer: Any, *inputs: Any) -> torch.Tensor:
    """Graph layers and :class:`~structconv.nn.StructConv`: ``conv(layer.basis(*inputs), x, layer.theta())`` + bias.

    ``x = inputs[0]`` is already in the engine's layout, ``(N, P)`` or ``(B, N, P)``.

    Parameters
    ----------
    layer
        A layer with methods ``basis(*inputs)`` and ``theta()``; its ``bias`` attribute, when
        it has one that is not ``None``, is added to the result (broadcast along its last axis).
    *inputs
        The layer's positional inputs, all passed to ``layer.basis``; the first, ``x``, is the
        operand of :func:`structconv.conv` (a graph layer's node features, for instance, and then
        its ``edge_index``).

    Returns
    -------
    torch.Tensor
        ``(N, Q)``, or ``(B, N, Q)`` for a batched ``x``.
    """
    return _plus_bias(layer, conv(layer.basis(*inputs), inputs[0], layer.theta()))


def _batched(x: torch.Tensor, dims: int) -> tuple[torch.Tensor, bool]:
    """``x`` as ``(B, C, *grid)`` for a ``dims``-dimensional grid, and whether it came unbatched."""
    unbatched = x.ndim == dims + 1
    return (x[None] if unbatched else x), unbatched


def _grid_flat(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, *grid)`` as the engine's ``(B, M, C)``."""
    return x.flatten(2).transpose(1, 2)


def _grid_back(y: torch.Tensor, basis: Any) -> torch.Tensor:
    """The engine's ``(B, M_out, Q)`` as ``(B, Q, *out_grid)``."""
    return y.transpose(1, 2).reshape(int(y.shape[0]), int(y.shape[2]), *basis.out_grid)


def _framing(layer: Any, grid: tuple[int, ...]) -> list[int]:
    """``F.pad``'s list for torch's explicit framing (``padding_mode`` reflect or replicate), from torch's rules.

    ``padding`` an int or one per dimension pads both sides alike; ``(before, after)`` pairs as
    given; ``"same"`` splits :math:`d(k - 1)` with the extra entry after; ``"valid"`` pads nothing.
    """
    d = len(grid)
    padding = layer.padding
    if padding == "valid":
        pairs = [(0, 0)] * d
    elif padding == "same":
        total = [dl * (k - 1) for k, dl in zip(layer.kernel_size, layer.dilation, strict=True)]
        pairs = [(t // 2, t - t // 2) for t in total]
    elif isinstance(padding, int):
        pairs = [(padding, padding)] * d
    else:
        pairs = [(p, p) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in padding]
    return [side for before, after in reversed(pairs) for side in (before, after)]


def grid_contract(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """Grid convolutions: ``(B, C, *grid)`` flattened to ``(B, M, C)``, ``conv``, back to ``(B, Q, *out_grid)``, + bias.

    For ``padding_mode`` ``"reflect"``/``"replicate"`` the basis is on the framed grid, and ``x``
    is framed by ``F.pad`` first; an unbatched ``(C, *grid)`` input gives an unbatched output.

    Parameters
    ----------
    layer
        A grid convolution (:class:`~structconv.nn.GridConv2d` and its 1-D and 3-D kin, or one
        alike): ``basis(x)`` a grid basis (its ``grid`` and ``out_grid`` are read),
        ``theta()``, and ``bias``, ``None`` or ``(Q,)``.  Where the basis' grid is not the
        input's, ``x`` is framed by ``F.pad`` with mode ``padding_mode``, the sides taken from
        ``padding`` by torch's rules (an int, one per dimension, ``(before, after)`` pairs,
        ``"valid"``, or ``"same"`` from ``kernel_size`` and ``dilation``, any odd entry after).
    x
        ``(B, C, *grid)``, or unbatched ``(C, *grid)``, with as many grid dimensions as the basis.

    Returns
    -------
    torch.Tensor
        ``(B, Q, *out_grid)``, or ``(Q, *out_grid)`` for an unbatched ``x``.
    """
    basis = layer.basis(x)
    xb, unbatched = _batched(x, len(basis.grid))
    if tuple(xb.shape[2:]) != tuple(basis.grid):
        xb = F.pad(xb, _framing(layer, tuple(xb.shape[2:])), mode=layer.padding_mode)
    y = _grid_back(conv(basis, _grid_flat(xb), layer.theta()), basis)
    if layer.bias is not None:
        y = y + layer.bias.reshape(-1, *([1] * len(basis.grid)))
    return y[0] if unbatched else y


def pool_contract(layer: Any, x: torch.Tensor) -> torch.Tensor:
    r"""Average pooling: :math:`\Theta = I` per channel, so :math:`A^\top x` alone (:func:`structconv.apply_shifts`).

    Parameters
    ----------
    layer
        An average pooling layer (:class:`~structconv.nn.AvgPool2d` and its 1-D and 3-D kin):
        ``basis(x)`` its one-member grid basis, and ``method``, the ``order`` of
        :func:`structconv.apply_shifts`.  It has no parameter and no bias.
    x
        ``(B, C, *grid)``, or unbatched ``(C, *grid)``.  An empty one (no batch or no channels)
        goes through the basis' own ``apply_each``, as ``apply_shifts`` refuses empty arrays.

    Returns
    -------
    torch.Tensor
        ``(B, C, *out_grid)``, or ``(C, *out_grid)`` for an unbatched ``x``.
    """
    basis = layer.basis(x)
    xb, unbatched = _batched(x, len(basis.grid))
    flat = _grid_flat(xb)
    y = apply_shifts(basis, flat, order=layer.order) if flat.numel() else basis.apply_each(flat)
    back = _grid_back(y[:, 0], basis)
    return back[0] if unbatched else back


def _with_tokens(v: torch.Tensor, extra: int) -> torch.Tensor:
    """``(B, S, P)`` -> ``(B, S + e, P + e)``: the value, then one identity row per appended token."""
    if not extra:
        return v
    B, S, P = (int(s) for s in v.shape)
    top = torch.cat([v, v.new_zeros(B, S, extra)], -1)
    bottom = torch.cat([v.new_zeros(extra, P), torch.eye(extra, dtype=v.dtype, device=v.device)], -1)
    return torch.cat([top, bottom.expand(B, extra, P + extra)], 1)


def attention_contract(layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    r""":class:`~structconv.nn.MultiHeadSelfAttention`: ``conv(heads, value, theta())`` + ``output_bias()``.

    The value is taken batch first (``batch_first=False`` and unbatched inputs are moved there
    and the output back) and widened by an identity row per token that ``add_bias_kv`` or
    ``add_zero_attn`` appends (the basis has :math:`S + e` keys).  Valid in evaluation mode,
    where every query may attend to some key.

    Parameters
    ----------
    layer
        A :class:`~structconv.nn.MultiHeadSelfAttention`: its ``basis(query, key, value)`` (the
        heads, without masks), ``theta()``, ``output_bias()`` (added when not ``None``) and
        ``batch_first`` are used.
    query
        ``(L, N, E)``, ``(N, L, E)`` with ``batch_first``, or unbatched ``(L, E)``: whether the
        inputs are batched is read from its number of dimensions.
    key
        ``(S, N, E_k)``, ``(N, S, E_k)`` or ``(S, E_k)``, laid out as ``query``; it reaches the
        result only through the basis.
    value
        ``(S, N, E_v)``, ``(N, S, E_v)`` or ``(S, E_v)``, laid out as ``query``: the operand of
        :func:`structconv.conv`.

    Returns
    -------
    torch.Tensor
        The attended values, laid out as ``query``: ``(L, N, E)``, ``(N, L, E)`` or ``(L, E)``
        (no attention weights).
    """
    basis = layer.basis(query, key, value)
    batched = query.ndim == 3
    v = (value if layer.batch_first else value.transpose(0, 1)) if batched else value[None]
    y = conv(basis, _with_tokens(v, basis.M - int(v.shape[1])), layer.theta())
    bias = layer.output_bias()
    y = y if bias is None else y + bias
    out: torch.Tensor = (y if layer.batch_first else y.transpose(0, 1)) if batched else y[0]
    return out


def positional_contract(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """:class:`~structconv.nn.PositionalAttention`: ``x`` ``(B, *grid, E)`` as ``(B, M, E)``, ``conv``, + bias.

    Parameters
    ----------
    layer
        A :class:`~structconv.nn.PositionalAttention`: its ``embed_dim`` (``E``),
        ``basis(flat)`` on the flattened input, ``theta()`` and ``bias`` (added when it has
        one that is not ``None``).
    x
        ``(B, *grid, E)``, or already flattened ``(B, M, E)``, :math:`M` the grid's positions.

    Returns
    -------
    torch.Tensor
        The shape of ``x``.
    """
    flat = x.reshape(int(x.shape[0]), -1, layer.embed_dim)
    return _plus_bias(layer, conv(layer.basis(flat), flat, layer.theta())).reshape(x.shape)


def image_contract(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """:class:`~structconv.nn.GridLayer`: ``x`` as rows ``(B, M, P)``, ``conv``, back to ``(B, Q, *out_grid)``, + bias.

    Parameters
    ----------
    layer
        A layer with ``basis(x)`` (a basis that knows its grids, ``entry_shapes``), ``theta()``,
        ``bias`` and ``dims``.
    x
        ``(B, P, *grid)``, or unbatched ``(P, *grid)``.
    """
    basis = layer.basis(x)
    xb, unbatched = _batched(x, layer.dims)
    rows = xb.flatten(2).transpose(1, 2)
    y = _plus_bias(layer, conv(basis, rows, layer.theta()))
    image = y.transpose(1, 2).reshape(int(xb.shape[0]), int(y.shape[-1]), *basis.entry_shapes[1])
    return image[0] if unbatched else image


def gin_contract(layer: Any, x: torch.Tensor, edge_index: Any) -> torch.Tensor:
    r""":class:`~structconv.nn.GINConv`: ``nn`` of ``conv`` on :math:`[I, A]` with scalars :math:`(1 + \epsilon, 1)`.

    Parameters
    ----------
    layer
        The layer.
    x, edge_index
        Its node features ``(N, P)`` and graph.
    """
    y: torch.Tensor = layer.nn(conv(layer.basis(x, edge_index), x, layer.theta(int(x.shape[-1]))))
    return y


def sage_contract(layer: Any, x: torch.Tensor, edge_index: Any) -> torch.Tensor:
    """:class:`~structconv.nn.SAGEConv`: ``conv`` of its basis and ``weight`` plus the bias, then the options.

    With ``project`` the sources are ``relu(lin(x))`` and the targets ``x`` (stacked, as a pair);
    with ``normalize`` each row is scaled to unit L2 norm.

    Parameters
    ----------
    layer
        The layer.
    x, edge_index
        Its node features ``(N, P)`` and graph.
    """
    if layer.lin is None:
        y = _plus_bias(layer, conv(layer.basis(x, edge_index), x, layer.theta()))
    else:
        source = F.relu(layer.lin(x))
        basis = layer.basis((source, x), edge_index)
        y = _plus_bias(layer, conv(basis, torch.cat([source, x]), layer.theta()))
    return F.normalize(y, p=2.0, dim=-1) if layer.normalize else y


#: The contract of each layer class of :mod:`structconv.nn` (a subclass gets its base's).
CONTRACTS: dict[type, Contract] = {
    snn.GINConv: gin_contract,
    snn.GridLayer: image_contract,
    snn.SAGEConv: sage_contract,
    **{getattr(snn, f"AvgPool{d}d"): pool_contract for d in (1, 2, 3)},
    **{getattr(snn, f"GridConv{d}d"): grid_contract for d in (1, 2, 3)},
    snn.MultiHeadSelfAttention: attention_contract,
    snn.PositionalAttention: positional_contract,
    **{
        klass: node_contract
        for klass in (
            snn.ChebConv,
            snn.GATConv,
            snn.GCNConv,
            snn.GraphLayer,
            snn.RGCNConv,
            snn.SGConv,
            snn.StructConv,
            snn.TAGConv,
        )
    },
}


def contract_for(layer: nn.Module) -> Contract:
    """The contract of ``layer``: from :data:`CONTRACTS` by its class (or a base class), else :func:`node_contract`.

    Parameters
    ----------
    layer
        The layer.  Its class and then its base classes, in method resolution order, are looked
        up in :data:`CONTRACTS`; a layer of a class not there gets :func:`node_contract` when it
        has callable ``basis`` and ``theta`` attributes.

    Returns
    -------
    Contract
        ``contract(layer, *inputs) -> Tensor``, for :func:`check_layer`.

    Raises
    ------
    TypeError
        For a layer of another class without ``basis`` and ``theta`` methods.
    """
    for klass in type(layer).__mro__:
        if klass in CONTRACTS:
            return CONTRACTS[klass]
    if callable(getattr(layer, "basis", None)) and callable(getattr(layer, "theta", None)):
        return node_contract
    raise TypeError(
        f"{type(layer).__name__} has no basis() and theta(): pass contract=, a function "
        "(layer, *inputs) -> the output computed through structconv.conv"
    )


def _output(out: Any) -> torch.Tensor:
    """The output tensor (MultiHeadSelfAttention returns ``(output, weights)``)."""
    y: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return y


def _leaves(inputs: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[int, torch.Tensor]]:
    """The inputs with each floating tensor a fresh leaf that requires grad (one per tensor: x may be q, k and v)."""
    made: dict[int, torch.Tensor] = {}

    def leaf(a: Any) -> Any:
        if isinstance(a, tuple):
            return tuple(leaf(t) for t in a)
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.layout == torch.strided):
            return a
        if id(a) not in made:
            made[id(a)] = a.detach().clone().requires_grad_()
        return made[id(a)]

    return tuple(leaf(a) for a in inputs), made


def _gradients(y: torch.Tensor, leaves: list[torch.Tensor], weight: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of :math:`\\langle y, w \\rangle` (zero for a leaf ``y`` does not depend on)."""
    if not y.requires_grad:
        return [torch.zeros_like(leaf) for leaf in leaves]
    # The graph is kept: the layer's output is held to the reference and to the contract.
    grads = torch.autograd.grad((y * weight).sum(), leaves, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves, strict=True)]


class MeaningUnchecked(UserWarning):
    """:func:`check_layer` held a layer to its own basis and parameter only: a wrong meaning passes that."""


def check_layer(
    layer: nn.Module,
    *inputs: Any,
    reference: Callable[..., Any] | None = None,
    contract: Contract | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    gradients: bool = True,
    seed: int = 0,
) -> torch.Tensor:
    r"""Check that ``layer(*inputs)`` means ``reference(*inputs)`` and is its basis and :math:`\Theta` contracted.

    First use: with ``reference``, an independent statement of what the layer computes (a dense
    function of the inputs and the layer's parameters, or a peer layer holding the same
    parameters), the outputs must agree, and the gradients of every floating input too; a
    difference is told as the mistake it looks like (a bias on one side only, another layout, a
    scale).  Without one the layer is held to its own basis and :math:`\Theta` only, which a
    layer built on the wrong basis passes: a :class:`MeaningUnchecked` warning says so.

    The layer's output must also equal ``contract(layer, *inputs)`` (:func:`contract_for` by default):
    :func:`structconv.conv` on ``layer.basis(...)`` and ``layer.theta()``, plus the bias, in
    the layer's layout; and with ``gradients``, so must the gradients of
    :math:`\langle y, w \rangle` (:math:`w` drawn with ``seed``) with respect to every floating
    input and every parameter.  Each floating input is replaced by a fresh leaf (the same tensor
    passed twice stays one leaf); the layer's mode is left as it is: put a layer that draws
    dropout in evaluation mode.

    Parameters
    ----------
    layer
        The layer under test.
    *inputs
        Its positional inputs.
    reference
        ``reference(*inputs) -> Tensor``: what the layer should compute, written apart from it.
    contract
        ``contract(layer, *inputs) -> Tensor``, for a layer the defaults do not cover.
    rtol, atol
        Tolerances, by default from the output's dtype (float64: ``1e-10`` and ``1e-10``).
    gradients
        Whether to compare the gradients too.
    seed
        Seed of the weight :math:`w` of the gradients.

    Returns
    -------
    torch.Tensor
        The layer's output.

    Raises
    ------
    AssertionError
        Naming the layer, what differs (against the reference or the contract: the output, or the
        gradient of which input or parameter), the largest difference and its likely cause.

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GCNConv
    >>> from structconv.testing import check_layer
    >>> layer = GCNConv(3, 4).double()
    >>> x = torch.randn(5, 3, dtype=torch.float64)
    >>> edges = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    >>> A = torch.zeros(5, 5, dtype=torch.float64)
    >>> A[edges[0], edges[1]] = 1.0
    >>> A_hat = A + torch.eye(5, dtype=torch.float64)  # self-loops, then D^-½ Â D^-½
    >>> norm = A_hat.sum(0) ** -0.5
    >>> def gcn(x, edge_index):  # Kipf & Welling's formula, written apart from the layer
    ...     return (norm[:, None] * A_hat * norm).T @ x @ layer.weight[0] + layer.bias
    >>> check_layer(layer, x, edges, reference=gcn).shape
    torch.Size([5, 4])
    """
    run = contract or contract_for(layer)
    name = type(layer).__name__
    args, made = _leaves(inputs)
    y = _output(layer(*args))
    rtol, atol = tolerances(y.dtype, rtol, atol)
    named = [(n, p) for n, p in layer.named_parameters() if p.requires_grad]
    leaves = [*made.values(), *(p for _, p in named)]
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(y.shape, generator=generator, dtype=torch.float64).to(y)
    if reference is None:
        warnings.warn(
            f"{name}: checked against its own basis and theta only; pass reference= (what the layer should "
            "compute) to check what it means",
            MeaningUnchecked,
            stacklevel=2,
        )
    else:  # the inputs' gradients: a peer holds parameters of its own
        inputs_only = {f"input {i}": t for i, t in enumerate(made.values())}
        _held_to(name, "the reference", y, _output(reference(*args)), inputs_only, gradients, weight, rtol, atol)
    expected = _output(run(layer, *args))
    if (y.dtype, y.device) != (expected.dtype, expected.device):
        raise AssertionError(f"{name}: output in {y.dtype} on {y.device}, the contract's in {expected.dtype}")
    labels = [f"input {i}" for i in range(len(made))] + [n for n, _ in named]
    _held_to(name, "the contract", y, expected, dict(zip(labels, leaves, strict=True)), gradients, weight, rtol, atol)
    return y


def _held_to(
    name: str,
    against: str,
    y: torch.Tensor,
    expected: torch.Tensor,
    leaves: dict[str, torch.Tensor],
    gradients: bool,
    weight: torch.Tensor,
    rtol: float,
    atol: float,
) -> None:
    """``y`` and its gradients of ``leaves`` equal ``expected``'s, or an ``AssertionError`` with the likely cause."""
    try:
        assert_near(y, expected, rtol=rtol, atol=atol, what=f"{name}: output against {against}")
    except AssertionError as error:
        cause = output_diagnosis(as_float64(y), as_float64(expected), rtol=rtol, atol=atol)
        if against == "the contract" and cause.startswith("the difference is the same"):
            cause += "; the contract adds `layer.bias` alone"
        raise AssertionError(f"{error}\n  likely cause: {cause}") from None
    if gradients and leaves:
        got, want = _gradients(y, list(leaves.values()), weight), _gradients(expected, list(leaves.values()), weight)
        for label, a, b in zip(leaves, got, want, strict=True):
            assert_near(a, b, rtol=rtol, atol=atol, what=f"{name}: gradient of {label} against {against}")


__all__ = [
    "CONTRACTS",
    "Contract",
    "MeaningUnchecked",
    "attention_contract",
    "check_layer",
    "contract_for",
    "grid_contract",
    "node_contract",
    "pool_contract",
    "positional_contract",
]
