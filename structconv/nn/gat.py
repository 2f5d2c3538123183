"""Graph attention: a softmax edge basis and a low-rank :math:`\\Theta` that places the heads."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..backend import autocast_dtype, autocast_to, x_theta
from ..backend.checks import positive_int
from ..backend.torch_autocast import check_input_dtype
from ..bases.base import Basis
from ..bases.factor import LowRank
from ..bases.softmax_edges import Projected, SoftmaxEdgeBasis, head_placement
from ..structures.graph import Edges, as_edges, host_like, is_matrix_graph
from ._module import CompiledRuns, warn_jit_trace
from .gat_edges import attention_matrix, loop_features, sorted_edges, stored_entries
from .graph_common import _check_device, _check_empty, _features, _pair, glorot_, pyg_linear_draw_
from .pyg_state import PyGKey, PyGState, heads_key, linear_key

FILL_REDUCTIONS = ("mean", "add", "sum", "max", "min")

Features = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]


class _Scored(NamedTuple):
    """The attention pattern and what the scores were computed from."""

    src: torch.Tensor
    dst: torch.Tensor
    logits: torch.Tensor  # (E, H), LeakyReLU applied
    x: torch.Tensor  # the sources as the engine's (1, N_src, P)
    theta: LowRank  # the parameter, cast as x under autocast
    rows: torch.Tensor  # x V_h, (1, N_src, H, D)
    x_dst: torch.Tensor | None
    N_dst: int


class GATConv(CompiledRuns, PyGState):
    r"""Graph attention (Veličković et al.) as an attention basis with a low-rank :math:`\Theta`.

    Basis: a :class:`~structconv.SoftmaxEdgeBasis` of the edge scores, one member per head (K = ``heads``).

    Θ: :math:`\Theta_h = W_h E_h^\top`, a :class:`~structconv.LowRank` ``(H, P, H·D or D)`` (:meth:`theta`).

    Head :math:`h` is the basis member

    .. math:: A_{h,mn} = \mathrm{softmax}_{m \in \mathcal N(n)}
       \mathrm{LeakyReLU}(a_h^{s}\cdot W_h x_m + a_h^{d}\cdot W'_h x_n + a_h^{e}\cdot W^e_h e_{mn}),

    masked by the graph (plus self-loops) and normalised column-wise, with :math:`E_h` placing
    head :math:`h`'s :math:`D` channels in the output (``concat``) or averaging the heads
    (:math:`E_h = I/H`); the output adds :math:`x_{dst} W^{res}` (``residual``) and the bias.
    The derivation is in ``docs/graph.rst``.  The third argument of :meth:`forward` is PyG's
    ``edge_attr``; it needs ``edge_dim`` (PyG would silently ignore it).

    **PyG checkpoints.**  ``load_state_dict`` also reads PyG's ``GATConv`` entries: ``lin.weight``
    (``lin_src.weight`` and ``lin_dst.weight`` for a pair ``in_channels``), ``lin_edge.weight`` and
    ``res.weight`` transposed into ``weight``, ``weight_dst``, ``weight_edge`` and ``res``, and
    ``att_src``, ``att_dst``, ``att_edge`` of shape ``(1, H, D)`` into ``(H, D)``;
    :func:`structconv.nn.pyg_state.pyg_state_dict` gives them back.  The constructor takes
    PyG's positional arguments in PyG's order with PyG's defaults (``GATConv(16, 8, 4,
    dropout=0.6)`` as in PyG's ``examples/gat.py``; this PyG's ``GATConv`` has no
    ``share_weights``).  Equals PyG's ``GATConv`` given the same parameters
    (``tests/peers/test_pyg_graph.py``).

    Parameters
    ----------
    in_channels
        :math:`P`, or a pair ``(P_src, P_dst)`` for bipartite graphs (then targets have their own
        :math:`W'`, ``weight_dst``, also when one tensor is both, ``x`` or ``(x, x)``).
    out_channels
        :math:`D`, the channels of each head.
    heads
        :math:`H`, the number of heads (basis members).
    concat
        Concatenate the heads (:math:`Q = HD`); ``False`` averages them (:math:`Q = D`).
    negative_slope
        The LeakyReLU slope of the scores.
    dropout
        Probability of dropping an attention weight in training (the kept ones scaled by
        :math:`1/(1-p)`).
    add_self_loops
        Give every target a loop (existing loops dropped first), as PyG.
    edge_dim
        Width of the edge features that enter the scores; ``None`` for none.
    fill_value
        The added loops' edge features: a number, a tensor, or ``"mean"``, ``"add"``, ``"sum"``,
        ``"max"``, ``"min"`` of the target's incoming features.
    bias
        Add a learned bias :math:`\beta` of shape ``(Q,)``.
    residual
        Add :math:`x_{dst} W^{res}`.

    Shapes
    ------
    **input:** node features :math:`(|\mathcal V|, P)` or a pair
    :math:`((|\mathcal V_s|, P_s), (|\mathcal V_t|, P_t))`, edge indices :math:`(2, |\mathcal E|)`
    or a sparse ``adj_t``, edge features :math:`(|\mathcal E|, D_e)` *(optional)*;
    **output:** :math:`(|\mathcal V_t|, H \cdot D)` with ``concat``, else :math:`(|\mathcal V_t|, D)`.

    Examples
    --------
    >>> import torch
    >>> from structconv import conv
    >>> from structconv.nn import GATConv
    >>> layer = GATConv(4, 3, heads=2, bias=False)
    >>> x, edge_index = torch.randn(5, 4), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    >>> y = layer(x, edge_index)
    >>> y.shape
    torch.Size([5, 6])
    >>> torch.allclose(y, conv(layer.basis(x, edge_index), x, layer.theta()), atol=1e-6)
    True
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | torch.Tensor | str = "mean",
        bias: bool = True,
        residual: bool = False,
    ) -> None:
        super().__init__()
        name = "GATConv"
        self.in_channels = in_channels
        P, P_dst = _pair(in_channels, name)
        self.out_channels = positive_int(out_channels, "out_channels", where=name)
        self.heads = positive_int(heads, "heads", where=name)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GATConv: dropout must lie in [0, 1), got {dropout!r}")
        if isinstance(fill_value, str) and fill_value not in FILL_REDUCTIONS:
            raise ValueError(f"GATConv: fill_value must be a number, a tensor or one of {FILL_REDUCTIONS}")
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.fill_value, self.residual = add_self_loops, fill_value, residual
        self.edge_dim = None if edge_dim is None else positive_int(edge_dim, "edge_dim", where=name)
        H, D = heads, out_channels
        total = H * D if concat else D
        self.weight = nn.Parameter(torch.empty(P, H * D))
        self.weight_dst = nn.Parameter(torch.empty(P_dst, H * D)) if isinstance(in_channels, tuple | list) else None
        self.att_src = nn.Parameter(torch.empty(H, D))
        self.att_dst = nn.Parameter(torch.empty(H, D))
        self.weight_edge = nn.Parameter(torch.empty(self.edge_dim, H * D)) if self.edge_dim is not None else None
        self.att_edge = nn.Parameter(torch.empty(H, D)) if self.edge_dim is not None else None
        self.res = nn.Parameter(torch.empty(P_dst, total)) if residual else None
        self.bias = nn.Parameter(torch.empty(total)) if bias else None
        self._draw_maps()  # PyG's Linear maps draw themselves when built; then it resets
        self.reset_parameters()

    def _draw_maps(self) -> None:
        """The maps, as PyG's ``lin`` (or ``lin_src`` and ``lin_dst``), ``lin_edge`` and ``res`` draw theirs."""
        for w in (self.weight, self.weight_dst, self.weight_edge, self.res):
            if w is not None:
                pyg_linear_draw_(w.data, "glorot")

    def reset_parameters(self) -> None:
        """Draw as PyG's ``reset_parameters``: the maps, then ``att_src``, ``att_dst``, ``att_edge``; a zero bias."""
        self._draw_maps()
        for att in (self.att_src, self.att_dst, self.att_edge):
            if att is not None:
                glorot_(att)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def pyg_keys(self) -> list[PyGKey]:
        """The weights are PyG's ``Linear`` weights transposed, the attention vectors PyG's ``(1, H, D)`` ones."""
        keys = [linear_key("weight", "lin.weight" if self.weight_dst is None else "lin_src.weight")]
        keys += [heads_key("att_src"), heads_key("att_dst")]
        if self.weight_dst is not None:
            keys.append(linear_key("weight_dst", "lin_dst.weight"))
        if self.weight_edge is not None:
            keys += [linear_key("weight_edge", "lin_edge.weight"), heads_key("att_edge")]
        if self.res is not None:
            keys.append(linear_key("res", "res.weight"))
        return keys

    def _graph(
        self, edge_index: Any, N_src: int, N_dst: int, edge_attr: torch.Tensor | None, like: torch.Tensor
    ) -> tuple[Edges, torch.Tensor | None]:
        """The attention pattern (with PyG's self-loops) and its edge features ``(E, edge_dim)``."""
        matrix = is_matrix_graph(edge_index)
        if matrix and edge_attr is not None:
            raise ValueError("GATConv: edge_attr goes with an edge_index, not with a sparse adjacency")
        sparse = isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided
        host = host_like(like, edge_index)  # for a meta x: the pattern is formed where the graph is, then placed
        if sparse:  # read in PyG's order, so that the attention weights come back in it
            if edge_index.ndim != 2:
                raise ValueError(f"GATConv: a sparse adj_t must be 2-D (N_dst, N_src), got {tuple(edge_index.shape)}")
            edges = as_edges(stored_entries(edge_index), N_src, like=host, num_targets=N_dst)
        else:
            edges = as_edges(edge_index, N_src, like=host, adj_t=True, num_targets=N_dst)
        attr = None
        if edge_attr is not None:
            _check_device(edge_attr, like, "GATConv", "edge_attr")
            E = int(edges.src.shape[0])
            attr = edge_attr.reshape(-1, 1) if edge_attr.ndim == 1 else edge_attr
            if attr.ndim != 2 or int(attr.shape[0]) != E or int(attr.shape[1]) != self.edge_dim:
                raise ValueError(
                    f"GATConv: edge_attr must have shape (E, edge_dim) = ({E}, {self.edge_dim}), got "
                    f"{tuple(edge_attr.shape)}"
                )
            if attr.is_complex():  # the cast below would drop the imaginary part
                raise TypeError(f"GATConv: edge_attr must hold real numbers, got dtype {attr.dtype}")
            attr = attr.to(like.dtype)
        if self.add_self_loops:
            keep = edges.src != edges.dst
            if torch.compiler.is_compiling():
                # Compiled, the edge count stays what it was (no data-dependent shape): an existing
                # loop keeps its place with weight 0, and _attention masks it out of the softmax.
                edges = edges.with_edges(edges.src, edges.dst, keep.to(edges.weight.dtype))
            else:
                edges = edges.with_edges(edges.src[keep], edges.dst[keep], edges.weight[keep])
                attr = None if attr is None else attr[keep]
            loops = min(N_src, N_dst)
            nodes = torch.arange(loops, device=edges.src.device)
            if attr is not None:
                if host is not like and isinstance(self.fill_value, str):
                    raise ValueError(
                        f"GATConv: x is on the meta device: fill_value={self.fill_value!r} reduces edge_attr over each "
                        "target's edges, read where the graph's values are; pass a number or tensor as fill_value"
                    )
                attr = torch.cat([attr, loop_features(edges, attr, loops, self.fill_value).to(attr.dtype)])
            src, dst = torch.cat([edges.src, nodes]), torch.cat([edges.dst, nodes])
            weight = torch.cat([edges.weight, edges.weight.new_ones(loops)])
            if matrix:  # PyG rebuilds a sparse adj_t with its loops, coalesced (edge features are refused)
                by_source = isinstance(edge_index, torch.Tensor) and edge_index.layout == torch.sparse_csc
                src, dst = sorted_edges(src, dst, N_src, N_dst, by_source)
                weight = weight.new_ones(int(src.shape[0]))
            edges = edges.with_edges(src, dst, weight)
        if host is not like:
            edges = edges.with_edges(*(t.to(like.device) for t in (edges.src, edges.dst, edges.weight)))
        return edges, attr

    def attention(
        self, x: Features, edge_index: Any, edge_attr: torch.Tensor | None = None, size: tuple[int, int] | None = None
    ) -> tuple[SoftmaxEdgeBasis, torch.Tensor]:
        """The attention basis (``H`` members, ``(N_src, N_dst)``) and the values :math:`xW` ``(N_src, H D)``."""
        scored = self._attention(x, edge_index, edge_attr, size, self.theta())
        return self._basis(scored, reuse=False), scored.rows[0].flatten(1)

    def basis(
        self, x: Features, edge_index: Any, edge_attr: torch.Tensor | None = None, size: tuple[int, int] | None = None
    ) -> SoftmaxEdgeBasis:
        """The attention basis (``H`` members, ``(N_src, N_dst)``) on ``x`` (arguments as :meth:`forward`).

        The layer's output is ``conv(basis, x_src, theta())``, plus ``x_dst @ res`` with ``residual`` and
        the bias; attention dropout is drawn in training, as in :meth:`forward`.
        """
        return self.attention(x, edge_index, edge_attr, size)[0]

    def theta(self) -> LowRank:
        r""":math:`\Theta_h = W_h E_h^\top` as a :class:`~structconv.LowRank`: value :math:`W_h` ``(H, P, D)``.

        :math:`E_h` is :func:`~structconv.bases.softmax_edges.head_placement`: head :math:`h` in
        channels :math:`hD, \dots, hD + D - 1` with ``concat``, else :math:`I/H` (the heads' mean).
        """
        H, D = self.heads, self.out_channels
        value = self.weight.view(self.weight.shape[0], H, D).permute(1, 0, 2)
        return LowRank(value, head_placement(H, D, concat=self.concat, like=self.weight))

    def _basis(self, scored: _Scored, *, reuse: bool) -> SoftmaxEdgeBasis:
        """The attention basis of ``scored``; with ``reuse`` it holds the values, for ``conv`` on ``scored.x``."""
        projected = None
        if reuse:
            theta = scored.theta
            projected = Projected(scored.x, theta.value, scored.rows, theta.out, "concat" if self.concat else "mean")
        return SoftmaxEdgeBasis(
            scored.src,
            scored.dst,
            scored.logits,
            (int(scored.x.shape[1]), scored.N_dst),
            dropout=self.dropout if self.training else 0.0,
            projected=projected,
        )

    def _attention(
        self,
        x: Features,
        edge_index: Any,
        edge_attr: torch.Tensor | None,
        size: tuple[int, int] | None,
        theta: LowRank,
    ) -> _Scored:
        """The edges (with loops), their LeakyReLU scores ``(E, H)`` and the values :math:`x_{src} V_h` of ``theta``."""
        name = "GATConv"
        P, P_dst = _pair(self.in_channels, name)

        def features(t: Any, channels: int, arg: str) -> torch.Tensor:
            f = _features(t, channels, name, static=False)
            _check_device(f, self.weight, name, arg)
            check_input_dtype(f, self.weight, name, arg)
            return f

        if isinstance(x, tuple | list):
            if len(x) != 2:
                raise ValueError("GATConv: a bipartite x must be a pair (x_src, x_dst)")
            x_src = features(x[0], P, "x[0]")
            x_dst = None if x[1] is None else features(x[1], P_dst, "x[1]")
        else:
            if P_dst != P:
                raise ValueError(
                    f"GATConv: a single x feeds sources and targets, which needs in_channels[0] == in_channels[1]; "
                    f"got in_channels={self.in_channels!r}, pass a pair (x_src, x_dst)"
                )
            x_src = x_dst = features(x, P, "x")
        if edge_attr is not None and self.edge_dim is None:
            raise ValueError(
                "GATConv: edge_attr (the third argument) needs edge_dim; PyG's GATConv would ignore it. "
                "Construct the layer with edge_dim to use edge features"
            )
        if isinstance(edge_index, Basis):
            raise ValueError("GATConv: edge_index must be a graph (edge_index or sparse adjacency), not a basis")
        N_src = int(x_src.shape[0])
        if is_matrix_graph(edge_index):
            rows, cols = int(edge_index.shape[0]), int(edge_index.shape[1])  # adj_t: (N_dst, N_src)
            if cols != N_src:
                raise ValueError(f"GATConv: the sparse adjacency (adj_t) has {cols} columns but x has {N_src} nodes")
            N_dst = rows
        elif size is not None:
            if int(size[0]) != N_src:
                raise ValueError(f"GATConv: size[0]={size[0]} but x (the sources) has {N_src} nodes")
            N_dst = int(size[1])
        else:
            N_dst = N_src if x_dst is None else int(x_dst.shape[0])
        if x_dst is not None and int(x_dst.shape[0]) != N_dst:
            raise ValueError(f"GATConv: x_dst has {int(x_dst.shape[0])} nodes but the graph has {N_dst} targets")
        H, D = self.heads, self.out_channels
        x3 = x_src[None]  # the engine's (B, M, P), one object from here to conv: the basis' values belong to it
        dtype = autocast_dtype(x3)
        if dtype is not None:  # cast as the engine would, so that conv meets the very arrays the values came from
            x3 = autocast_to(x3, dtype)
            theta = LowRank(autocast_to(theta.value, dtype), autocast_to(theta.out, dtype))
        rows = x_theta(x3, theta.value).transpose(1, 2)  # (1, N_src, H, D), each source's heads in one row
        h = rows.squeeze(0)  # not rows[0]: a squeeze's backward is a view, a select's writes a zero copy
        score_src = (h * self.att_src).sum(-1)
        score_dst = None
        if x_dst is not None:
            # One tensor as sources and targets still meets W' when in_channels is a pair (PyG's lin_dst).
            shared = x_dst is x_src and self.weight_dst is None
            weight_dst = self.weight if self.weight_dst is None else self.weight_dst
            h_dst = h if shared else (x_dst @ weight_dst).view(-1, H, D)
            score_dst = (h_dst * self.att_dst).sum(-1)
        if N_src == 0 or N_dst == 0:
            _check_empty(edge_index, name)
            empty = torch.zeros(0, dtype=torch.long, device=x_src.device)
            return _Scored(empty, empty, h.new_zeros(0, H), x3, theta, rows, x_dst, N_dst)
        edges, attr = self._graph(edge_index, N_src, N_dst, edge_attr, h)
        # index_select, not fancy indexing: its backward is a scatter-add rather than an index_put.
        logits = score_src.index_select(0, edges.src)
        if score_dst is not None:
            logits = logits + score_dst.index_select(0, edges.dst)
        if attr is not None and self.weight_edge is not None and self.att_edge is not None and len(logits):
            logits = logits + ((attr @ self.weight_edge).view(-1, H, D) * self.att_edge).sum(-1)
        logits = F.leaky_relu(logits, self.negative_slope)
        if self.add_self_loops and torch.compiler.is_compiling():  # the dropped loops of _graph, kept in place
            logits = logits.masked_fill(edges.weight[:, None] == 0, float("-inf"))
        return _Scored(edges.src, edges.dst, logits, x3, theta, rows, x_dst, N_dst)

    def forward(
        self,
        x: Features,
        edge_index: Any,
        edge_attr: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
        return_attention_weights: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        r"""Apply the layer to ``x`` (``(N, P)`` or ``(x_src, x_dst)``) on ``edge_index``.

        The output is ``conv(basis, x_src, theta())`` (:meth:`basis`, :meth:`theta`), plus
        ``x_dst @ res`` with ``residual`` and the bias, computing :math:`x W_h` once for the scores
        and the values (``docs/graph.rst``).

        With ``return_attention_weights=True`` it returns ``(out, (edge_index, alpha))`` as PyG
        does: the edges with the added self-loops and their ``(E, H)`` weights, or for a sparse
        adjacency ``(out, (adj_t, alpha))`` with ``adj_t`` a sparse ``(N_dst, N_src, H)`` tensor in
        the input's layout and ``alpha`` in its entry order, as PyG's: a CSR (or CSC) ``adj_t``
        keeps its stored entries, repeats included, a COO one comes back coalesced, and with
        ``add_self_loops`` the loops take their sorted places (PyG rebuilds the tensor coalesced).
        A ``scipy.sparse`` or dense adjacency gives a coalesced COO tensor.
        """
        warn_jit_trace(self)
        scored = self._attention(x, edge_index, edge_attr, size, self.theta())
        x3, theta, N_src, N_dst = scored.x, scored.theta, int(scored.x.shape[1]), scored.N_dst
        basis = self._basis(scored, reuse=True)
        # With nothing to attend to the output is 0 (the engine refuses empty dimensions).
        empty = N_src == 0 or N_dst == 0
        # On meta, A·Θ first (picked for few channels) forms the dense basis, whose entries meta holds none
        # of; A·x first reads none (as GraphConvBase._run does).
        order = "ax" if x3.device.type == "meta" else "auto"
        if empty:
            y = x3.new_zeros(N_dst, int(theta.out.shape[1]))
        else:
            y = self.contract(basis, x3, theta, order=order).squeeze(0)
        if self.res is not None and scored.x_dst is not None:
            y = y + scored.x_dst @ self.res
        if self.bias is not None:
            y = y + self.bias
        if not return_attention_weights:
            return y
        alpha = basis.weights()
        src, dst = scored.src, scored.dst
        if is_matrix_graph(edge_index):
            return y, (attention_matrix(edge_index, src, dst, alpha, N_src, N_dst), alpha)
        return y, (torch.stack([src, dst]), alpha)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"
