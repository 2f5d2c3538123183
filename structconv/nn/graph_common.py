r"""What the graph layers share: argument checks, the graph reading and the one-basis layer base.

The graph layers (:mod:`~structconv.nn.gcn`, :mod:`~structconv.nn.tag`, :mod:`~structconv.nn.cheb`,
:mod:`~structconv.nn.rgcn`, :mod:`~structconv.nn.gat`) are shaped like PyTorch Geometric's, each a
graph basis plus :math:`\Theta`.

Every layer takes node features ``x`` of shape ``(N, P)`` and a graph: an ``edge_index``
``(2, E)`` (with optional ``edge_weight``), a sparse adjacency, or a prebuilt
:class:`~structconv.Basis`.  The basis is rebuilt on every call from a raw graph, except in
``GCNConv`` and ``SGConv`` built with PyG's ``cached=True`` (``_CachedGraphLayer``).  To reuse a
normalised basis otherwise, build it once (e.g. :func:`structconv.gcn_basis`) and pass it
instead of ``edge_index``.

The graph's orientation (an ``edge_index``'s rows, a matrix read as PyG's ``adj_t``) and the
self-loops GCN and SG add (PyG's ``gcn_norm``, as :func:`structconv.structures.graph.gcn_edges`)
are PyG's, as ``docs/graph.rst`` (Layers) sets out.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..backend.checks import positive_int
from ..backend.torch_autocast import check_input_dtype
from ..bases.base import Basis
from ..structures.graph import Edges, as_edges, host_like, is_matrix_graph
from ._module import CompiledRuns, warn_jit_trace
from .pyg_state import PyGKey, PyGState, member_keys

FLOWS = ("source_to_target", "target_to_source")


def glorot_(t: torch.Tensor) -> None:
    r"""Glorot-uniform over the last two axes, :math:`\mathcal U(\pm\sqrt{6/(a + b)})` for an ``(a, b)`` matrix."""
    bound = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
    nn.init.uniform_(t, -bound, bound)


def pyg_linear_draw_(weight: torch.Tensor, initializer: str, bias: torch.Tensor | None = None) -> None:
    r"""Draw our ``(P, Q)`` ``weight`` (and ``bias``) as PyG's ``Linear(P, Q)`` draws its ``(Q, P)`` weight and bias.

    ``initializer`` is PyG's ``weight_initializer``: ``"glorot"``, or ``"kaiming"`` (its default,
    ``torch.nn.Linear``'s :math:`\mathcal U(\pm 1/\sqrt P)`, the bias alike).  The values are
    drawn in the ``(Q, P)`` layout, element by element as PyG draws them, so that one seed gives
    the same layer and leaves the generator where PyG's leaves it.
    """
    drawn = torch.empty(weight.shape[::-1], dtype=weight.dtype, device=weight.device)
    if initializer == "glorot":
        glorot_(drawn)
    else:
        nn.init.kaiming_uniform_(drawn, a=math.sqrt(5))
    with torch.no_grad():
        weight.copy_(drawn.T)
    if bias is not None:
        fan_in = int(weight.shape[0])
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        nn.init.uniform_(bias, -bound, bound)


def _features(x: Any, channels: int, layer: str, static: bool = True) -> torch.Tensor:
    """Node features as a dense ``(N, P)`` (or, if ``static``, ``(B, N, P)``) tensor; sparse ``x`` is densified."""
    ranks = (2, 3) if static else (2,)
    if not isinstance(x, torch.Tensor) or x.ndim not in ranks:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        form = f"(N, {channels}) or a static batch (B, N, {channels})" if static else f"(N, {channels})"
        raise ValueError(f"{layer}: x must be node features of shape {form}, got {shape}")
    if x.layout != torch.strided:  # sparse node features, as PyG's Linear accepts them
        x = x.to_dense()
    if int(x.shape[-1]) != channels:
        raise ValueError(
            f"{layer}: x has {int(x.shape[-1])} channels (dim {x.ndim - 1}) but the layer expects {channels}"
        )
    dense: torch.Tensor = x
    return dense


def _check_basis(basis: Basis, x: torch.Tensor, layer: str) -> Basis:
    if int(x.shape[-2]) != basis.M:
        raise ValueError(f"{layer}: x has {int(x.shape[-2])} rows (nodes) but the graph basis has {basis.M} nodes")
    return basis


def _check_flow(flow: Any, layer: str) -> str:
    if flow not in FLOWS:
        raise ValueError(f"{layer}: flow must be one of {FLOWS}, got {flow!r}")
    return str(flow)


def _flip(graph: Any, flow: str, layer: str) -> Any:
    """The ``edge_index`` as source-to-target: reversed for ``flow="target_to_source"``."""
    if flow == "source_to_target" or isinstance(graph, Basis):
        return graph
    if is_matrix_graph(graph):
        raise ValueError(
            f"{layer}: flow='target_to_source' needs an edge_index; for a sparse adjacency pass its "
            "transpose instead (as PyG requires)"
        )
    return graph.flip(0) if isinstance(graph, torch.Tensor) else graph[::-1]


def _read(
    graph: Any, x: torch.Tensor, edge_weight: torch.Tensor | None, layer: str, num_targets: int | None = None
) -> Edges:
    """The graph as edges on ``x``'s nodes, a matrix read as PyG's ``adj_t``.

    For ``x`` on the meta device the edges stay where the graph is (its values are read and
    normalised there); :meth:`_GraphLayer._run` places the basis beside ``x``.  An ``edge_weight``
    on meta beside it (a shape-only run, which PyG's layers take) is stood in for by ones of its
    shape and dtype there: its values would only reach the output's, which meta holds none of.
    """
    if edge_weight is not None and is_matrix_graph(graph):
        raise ValueError(f"{layer}: edge_weight goes with an edge_index; a sparse adjacency carries its own weights")
    host = host_like(x, graph, edge_weight)
    if isinstance(host, torch.Tensor) and host is not x and edge_weight is not None and edge_weight.is_meta:
        edge_weight = torch.ones(edge_weight.shape, dtype=edge_weight.dtype, device=host.device)
    rows = int(x.shape[-2])
    if num_targets is not None and is_matrix_graph(graph):  # adj_t (N_dst, N_src) beside the stacked rows
        edges = as_edges(graph, rows - num_targets, edge_weight, like=host, adj_t=True, num_targets=num_targets)
        return Edges(edges.src, edges.dst, edges.weight, rows, num_targets=num_targets)
    return as_edges(graph, rows, edge_weight, like=host, adj_t=True, num_targets=num_targets)


def _check_device(x: torch.Tensor, parameter: torch.Tensor, layer: str, arg: str = "x") -> None:
    """Raise a ``ValueError`` naming ``arg`` when ``x`` and a layer's ``parameter`` are on different devices."""
    if x.device != parameter.device:
        raise ValueError(
            f"{layer}: {arg} is on device {x.device} but the layer's parameters are on {parameter.device}; "
            f"move one of them ({arg}.to({str(parameter.device)!r}) or layer.to({str(x.device)!r}))"
        )


def _check_empty(graph: Any, layer: str) -> None:
    """A graph on zero nodes must have no edges."""
    edges = int(graph.shape[1]) if not is_matrix_graph(graph) and graph.ndim == 2 else 0
    if edges:
        raise ValueError(f"{layer}: x has 0 nodes but edge_index has {edges} edges")


class _GraphLayer(CompiledRuns, PyGState):
    def __init__(self, in_channels: int, out_channels: int, members: int, *, bias: bool, flow: str) -> None:
        super().__init__()
        name = type(self).__name__
        self.in_channels = positive_int(in_channels, "in_channels", where=name)
        self.out_channels = positive_int(out_channels, "out_channels", where=name)
        self.flow = _check_flow(flow, name)
        self.weight = nn.Parameter(torch.empty(members, self.in_channels, self.out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None

    #: PyG's ``weight_initializer`` of the ``Linear`` maps the members are (``"glorot"`` or ``"kaiming"``).
    pyg_initializer = "glorot"

    def draw_members(self) -> None:
        """Draw each member of ``weight`` as PyG draws its ``Linear`` maps, in order (:func:`pyg_linear_draw_`)."""
        for k in range(int(self.weight.shape[0])):
            pyg_linear_draw_(self.weight.data[k], self.pyg_initializer)

    def draw_as_built(self) -> None:
        """The draws PyG's layer makes while it is built: its ``Linear`` maps draw themselves, then it resets.

        A layer's ``__init__`` calls this, then :meth:`reset_parameters`, so that one seed gives
        PyG's fresh layer and the same next random number.
        """
        self.draw_members()

    def reset_parameters(self) -> None:
        """Draw the members as PyG's maps, in PyG's order, and zero the bias (PyG's ``reset_parameters``)."""
        self.draw_members()
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def pyg_keys(self) -> list[PyGKey]:
        """``weight``'s member :math:`k` is PyG's ``lins.k.weight`` transposed (TAG, Cheb); ``bias`` is PyG's."""
        return [member_keys("weight", [f"lins.{k}.weight" for k in range(int(self.weight.shape[0]))])]

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        raise NotImplementedError

    def theta(self) -> torch.Tensor:
        r""":math:`\Theta`, the parameter ``weight`` of shape ``(K, P, Q)``."""
        return self.weight

    def basis(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> Basis:
        """The graph basis the layer contracts with ``x`` (``(N, P)`` or ``(B, N, P)``) on ``edge_index``.

        A prebuilt :class:`~structconv.Basis` is returned as it is (checked against ``x``'s nodes).
        """
        name = type(self).__name__
        x = _features(x, self.in_channels, name)
        if isinstance(edge_index, Basis):
            if edge_weight is not None:
                raise ValueError(f"{name}: edge_weight goes with an edge_index, not with a prebuilt basis")
            return _check_basis(edge_index, x, name)
        return self._built(x, edge_index, edge_weight)

    def _built(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None, **extra: Any) -> Basis:
        """:meth:`basis` for a graph (not a prebuilt basis), ``x`` already read; ``extra`` goes to :meth:`_basis`."""
        name = type(self).__name__
        basis = self._basis(x, _flip(edge_index, self.flow, name), edge_weight, **extra)
        if x.device.type == "meta":  # built where the graph's values are (_read): placed beside x
            basis = basis.to(x.device)
        return _check_basis(basis, x, name)

    def _run(self, x: Any, edge_index: Any, edge_weight: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        warn_jit_trace(self)
        name = type(self).__name__
        x = _features(x, self.in_channels, name)
        _check_device(x, self.weight, name)
        check_input_dtype(x, self.weight, name)
        if not isinstance(edge_index, Basis) and int(x.shape[-2]) == 0:  # a graph without nodes: an empty output
            _check_empty(edge_index, name)
            y0: torch.Tensor = x @ self.weight.sum(0)
            return y0 if self.bias is None else y0 + self.bias
        basis = self.basis(x, edge_index, edge_weight, **extra)
        # On meta, orders that read the basis' entries (a materialised polynomial, A·Θ's pairs) cannot
        # run; A·x first reads none, and nothing is computed there anyway.
        order = "ax" if x.device.type == "meta" else "auto"
        return self.contract(basis, x, self.theta(), bias=self.bias, order=order)

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` (``(N, P)`` or ``(B, N, P)``) on ``edge_index`` (or a prebuilt basis)."""
        return self._run(x, edge_index, edge_weight)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={self.weight.shape[0]}, bias={self.bias is not None}"


def _pair(channels: int | tuple[int, int], layer: str) -> tuple[int, int]:
    """``in_channels`` as ``(source, target)`` channels."""
    if isinstance(channels, tuple | list):
        if len(channels) != 2:
            raise ValueError(f"{layer}: in_channels must be an int or a pair (source, target), got {channels!r}")
        first = positive_int(channels[0], "in_channels[0]", where=layer)
        return first, positive_int(channels[1], "in_channels[1]", where=layer)
    c = positive_int(channels, "in_channels", where=layer)
    return c, c


def _graph_size(graph: Any, x: torch.Tensor, edge_weight: torch.Tensor | None) -> tuple[Any, ...]:
    """What a cached layer compares between calls: the graph's form and size, the nodes, the weights' presence."""
    shape = tuple(int(s) for s in graph.shape) if hasattr(graph, "shape") else (len(graph),)
    if isinstance(graph, torch.Tensor) and graph.layout != torch.strided:
        stored: int | None = int(graph._nnz())
    else:
        stored = getattr(graph, "nnz", None)  # scipy.sparse
    return shape, stored, int(x.shape[-2]), edge_weight is not None, str(x.device)


class _CachedGraphLayer(_GraphLayer):
    """A graph layer with PyG's ``cached``: the basis of the first graph seen is kept and reused.

    A later graph whose form or size, number of nodes, ``edge_weight`` presence or device differs
    (:func:`_graph_size`) is refused, where PyG reuses its cache whatever comes (``docs/graph.rst``).
    :meth:`reset_cache` (and :meth:`reset_parameters`, as in PyG) forgets it.
    """

    cached: bool = False
    _cached_basis: Basis | None = None
    _cached_size: tuple[Any, ...] | None = None

    def reset_cache(self) -> None:
        """Forget the cached basis (PyG's ``_cached_edge_index = None``): the next call builds it again."""
        self._cached_basis, self._cached_size = None, None

    def _built(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None, **extra: Any) -> Basis:
        if not self.cached:
            return super()._built(x, edge_index, edge_weight, **extra)
        size = _graph_size(edge_index, x, edge_weight)
        if self._cached_basis is None:
            self._cached_basis, self._cached_size = super()._built(x, edge_index, edge_weight, **extra), size
        elif size != self._cached_size:
            raise ValueError(
                f"{type(self).__name__}: cached=True keeps the first graph's basis (shape, stored entries, nodes, "
                f"weighted, device {self._cached_size}) but this call's graph is {size}; call reset_cache() or "
                "build the layer with cached=False"
            )
        return self._cached_basis

    def extra_repr(self) -> str:
        return super().extra_repr() + (", cached=True" if self.cached else "")


def _stacked(x: Any, size: Any, layer: str) -> tuple[Any, int | None]:
    """A pair ``(x_src, x_dst)`` as one input, the targets' rows after the sources', and the number of targets.

    ``x_dst=None`` (PyG's pair without target features) stands as zeros of ``size[1]`` rows: the
    members that read the targets' own rows then add nothing, as PyG adds no root term.  A
    single ``x`` is returned as it is, its ``size`` (if given) checked to be square.
    """
    if not isinstance(x, tuple | list):
        if size is not None and isinstance(x, torch.Tensor) and tuple(size) != (x.shape[-2], x.shape[-2]):
            raise ValueError(
                f"{layer}: size={tuple(size)} describes a bipartite graph; pass x as a pair (x_src, x_dst) for it"
            )
        return x, None
    if len(x) != 2 or not isinstance(x[0], torch.Tensor) or x[0].ndim != 2:
        raise ValueError(f"{layer}: x must be a tensor (N, P) or a pair (x_src, x_dst) of (N_src, P) and (N_dst, P)")
    x_src, x_dst = x
    if x_dst is None:
        if size is None or size[1] is None:
            raise ValueError(f"{layer}: x=(x_src, None) needs size=(N_src, N_dst) for the number of targets")
        x_dst = x_src.new_zeros(int(size[1]), int(x_src.shape[-1]))
    if not isinstance(x_dst, torch.Tensor) or x_dst.ndim != 2 or x_dst.shape[-1] != x_src.shape[-1]:
        got = tuple(x_dst.shape) if isinstance(x_dst, torch.Tensor) else type(x_dst).__name__
        raise ValueError(
            f"{layer}: x_dst must be target features (N_dst, {int(x_src.shape[-1])}), as wide as x_src "
            f"{tuple(x_src.shape)}, got {got}"
        )
    if size is not None and tuple(size) != (x_src.shape[0], x_dst.shape[0]):
        raise ValueError(f"{layer}: size={tuple(size)} but the pair has {(x_src.shape[0], x_dst.shape[0])} nodes")
    return torch.cat([x_src, x_dst]), int(x_dst.shape[0])


class GraphLayer(_CachedGraphLayer):
    r"""A graph layer of your own: write :meth:`graph_basis` (and :meth:`theta` if not ``weight``).

    Basis: what :meth:`graph_basis` builds from the call's graph, any :class:`~structconv.Basis`
    (K members; :func:`structconv.graph_basis` has the usual ones)

    Θ: ``weight`` (K, P, Q), Glorot-initialised, or what an overridden :meth:`theta` returns

    .. math:: y = \sum_k A_k(G)^\top x\,\Theta_k + \beta.

    The layer reads PyG's call ``layer(x, edge_index, edge_weight=None)`` (an ``edge_index``,
    a sparse ``adj_t`` or a prebuilt basis), hands :meth:`graph_basis` the graph as
    :class:`~structconv.structures.graph.Edges` on ``x``'s nodes, dtype and device, and
    contracts through :func:`structconv.conv`'s compiled runs.  It has ``state_dict``, ``.to``,
    ``torch.compile`` (``fullgraph=True``), PyG's ``cached`` and the layer contract that
    :func:`structconv.testing.check_layer` checks.  A pair ``x = (x_src, x_dst)`` (a bipartite
    graph, PyG's convention) is stacked into one input, the targets' rows last, so that the
    ``"identity"`` member reads each target's own features.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    members : int, default 1
        :math:`K`, the members of ``weight`` (of the basis, when :meth:`theta` is ``weight``).
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    flow : {"source_to_target", "target_to_source"}, default "source_to_target"
        The direction of an ``edge_index``'s edges, as PyG's ``flow``.
    cached : bool, default False
        Keep the first graph's basis and reuse it (PyG's ``cached``; a transductive graph).

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)`, :math:`(B, N, P)` or a pair; ``edge_index`` :math:`(2, E)`
    - **output:** :math:`(N, Q)` or :math:`(B, N, Q)` (:math:`N_{dst}` rows for a pair)

    Examples
    --------
    GraphSAGE with a mean over the in-neighbours, in four lines:

    >>> import torch
    >>> from structconv import graph_basis
    >>> from structconv.nn import GraphLayer
    >>> class SAGE(GraphLayer):
    ...     def __init__(self, in_channels, out_channels):
    ...         super().__init__(in_channels, out_channels, members=2)
    ...     def graph_basis(self, edges):
    ...         return graph_basis(edges, ("mean", "identity"))
    >>> layer = SAGE(3, 4)
    >>> layer(torch.randn(5, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])).shape
    torch.Size([5, 4])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        members: int = 1,
        *,
        bias: bool = True,
        flow: str = "source_to_target",
        cached: bool = False,
    ) -> None:
        members = positive_int(members, "members", where=type(self).__name__)
        super().__init__(in_channels, out_channels, members, bias=bias, flow=flow)
        self.cached = bool(cached)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot members, a zero bias, and no cached basis (as PyG's ``reset_parameters``)."""
        super().reset_parameters()
        self.reset_cache()

    def graph_basis(self, edges: Edges) -> Basis:
        """The basis on the call's graph: ``edges``, on ``x``'s nodes, dtype and device.  Your layer defines it."""
        raise NotImplementedError(
            f"{type(self).__name__}: define graph_basis(self, edges) returning the layer's basis, e.g. "
            "structconv.graph_basis(edges, 'gin')"
        )

    def basis(self, x: Any, edge_index: Any, edge_weight: torch.Tensor | None = None, size: Any = None) -> Basis:
        """The basis the layer contracts with ``x`` on ``edge_index`` (a prebuilt basis is returned as it is)."""
        x, targets = _stacked(x, size, type(self).__name__)
        x = _features(x, self.in_channels, type(self).__name__)
        if isinstance(edge_index, Basis):
            return super().basis(x, edge_index, edge_weight)
        return self._built(x, edge_index, edge_weight, num_targets=targets)

    def _basis(
        self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None, num_targets: int | None = None
    ) -> Basis:
        return self.graph_basis(_read(graph, x, edge_weight, type(self).__name__, num_targets))

    def forward(
        self, x: Any, edge_index: Any, edge_weight: torch.Tensor | None = None, size: Any = None
    ) -> torch.Tensor:
        """Apply the layer to ``x`` (or a pair ``(x_src, x_dst)``, ``size`` for ``x_dst=None``) on ``edge_index``."""
        return self._run(x, edge_index, edge_weight, size=size)

    def _run(self, x: Any, edge_index: Any, edge_weight: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        x, targets = _stacked(x, extra.get("size"), type(self).__name__)
        if targets is None:
            return super()._run(x, edge_index, edge_weight)
        warn_jit_trace(self)
        name = type(self).__name__
        x = _features(x, self.in_channels, name, static=False)
        _check_device(x, self.weight, name)
        check_input_dtype(x, self.weight, name)
        basis = self._built(x, edge_index, edge_weight, num_targets=targets)
        return self.contract(basis, x, self.theta(), bias=self.bias)
