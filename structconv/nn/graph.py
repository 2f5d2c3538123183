r"""Graph layers shaped like PyTorch Geometric's, each a graph basis plus :math:`\Theta`.

Every layer takes node features ``x`` of shape ``(N, P)`` and a graph: an ``edge_index``
``(2, E)`` (with optional ``edge_weight``), a torch sparse or ``scipy.sparse`` adjacency, or a
prebuilt :class:`~structconv.Basis`.  The basis is rebuilt on every call from a raw graph; no
layer caches it.  To reuse a normalised basis, build it once (e.g. :func:`structconv.gcn_basis`)
and pass it instead of ``edge_index``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..basis import Basis
from ..contract import conv
from ..edges import EdgeBasis
from ..factor import LowRank, Separable
from ..graph import (
    PolynomialBasis,
    add_remaining_self_loops,
    as_edges,
    gcn_basis,
    gcn_normalize,
    relational_basis,
    remove_self_loops,
    scaled_laplacian,
)


def glorot_(t: torch.Tensor) -> None:
    r"""Glorot-uniform over the last two axes, :math:`\mathcal U(\pm\sqrt{6/(a + b)})` for an ``(a, b)`` matrix."""
    bound = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
    nn.init.uniform_(t, -bound, bound)


def _check_x(x: torch.Tensor, channels: int, layer: str) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{layer}: x must be node features of shape (N, {channels}), got {shape}")
    if int(x.shape[1]) != channels:
        raise ValueError(f"{layer}: x has {int(x.shape[1])} channels (dim 1) but the layer expects {channels}")


def _check_basis(basis: Basis, x: torch.Tensor, layer: str) -> Basis:
    if int(x.shape[0]) != basis.M:
        raise ValueError(f"{layer}: x has {int(x.shape[0])} rows (nodes) but the graph basis has {basis.M} nodes")
    return basis


def _positive(value: Any, name: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}")
    return int(value)


class _GraphLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, members: int, bias: bool) -> None:
        super().__init__()
        name = type(self).__name__
        self.in_channels = _positive(in_channels, "in_channels", name)
        self.out_channels = _positive(out_channels, "out_channels", name)
        self.theta = nn.Parameter(torch.empty(members, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None

    def reset_parameters(self) -> None:
        """Glorot weights and a zero bias (PyG's default for these layers)."""
        glorot_(self.theta)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` (``(N, P)``) on the graph ``edge_index`` (or a prebuilt basis)."""
        name = type(self).__name__
        _check_x(x, self.in_channels, name)
        if isinstance(edge_index, Basis):
            if edge_weight is not None:
                raise ValueError(f"{name}: edge_weight goes with an edge_index, not with a prebuilt basis")
            basis = edge_index
        else:
            basis = self._basis(x, edge_index, edge_weight)
        y: torch.Tensor = conv(_check_basis(basis, x, name), x, self.theta)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={self.theta.shape[0]}, bias={self.bias is not None}"


class GCNConv(_GraphLayer):
    r"""Graph convolution of Kipf & Welling: :math:`y = \hat A^\top x\,\Theta + \beta`, one member.

    :math:`\hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (:func:`structconv.gcn_basis`).  With
    :math:`K = 1` every neighbour shares one channel map, which is what limits GCN: it can
    only average its neighbourhood, never tell neighbours apart.  Arguments as PyG's
    ``GCNConv`` (no ``cached``: pass a prebuilt basis instead).  Glorot weights, zero bias.
    ``improved=True`` gives added self-loops weight 2 whether or not edge weights are given
    (PyG 2.8 applies it only when ``edge_weight`` is passed).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__(in_channels, out_channels, 1, bias)
        if add_self_loops is None:  # as PyG: loops go with the normalisation
            add_self_loops = normalize
        elif add_self_loops and not normalize:
            raise ValueError("GCNConv: add_self_loops=True needs normalize=True (as in PyG)")
        self.improved, self.add_self_loops, self.normalize = improved, add_self_loops, normalize
        self.reset_parameters()

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        n = int(x.shape[0])
        return gcn_basis(graph, n, edge_weight, self.improved, self.add_self_loops, self.normalize, like=x)


class TAGConv(_GraphLayer):
    r"""Topology-adaptive graph convolution (Du et al.): :math:`y = \sum_{k=0}^{K} (S^k)^\top x\,\Theta_k + \beta`.

    :math:`S = D^{-1/2}AD^{-1/2}` without added loops; the basis is a
    :class:`~structconv.PolynomialBasis` applied by repeated sparse products.  Weights as
    ``torch.nn.Linear`` (as PyG's ``TAGConv``), zero bias.
    """

    def __init__(
        self, in_channels: int, out_channels: int, K: int = 3, bias: bool = True, normalize: bool = True
    ) -> None:
        self.K = _positive(K, "K", "TAGConv")
        super().__init__(in_channels, out_channels, K + 1, bias)
        self.normalize = normalize
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for k in range(self.theta.shape[0]):  # each member like an nn.Linear(in, out) weight
            nn.init.kaiming_uniform_(self.theta.data[k].T, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = as_edges(graph, int(x.shape[0]), edge_weight, like=x)
        if self.normalize:
            edges = gcn_normalize(edges, add_self_loops=False)
        return PolynomialBasis(edges.to_basis(), range(self.K + 1), "powers")


class SGConv(_GraphLayer):
    r"""Simple graph convolution (Wu et al.): one member :math:`\hat A^K`, :math:`y = (\hat A^K)^\top x\Theta + \beta`.

    Weights and bias as ``torch.nn.Linear`` (as PyG's ``SGConv``).
    """

    def __init__(
        self, in_channels: int, out_channels: int, K: int = 1, add_self_loops: bool = True, bias: bool = True
    ) -> None:
        self.K = _positive(K, "K", "SGConv")
        super().__init__(in_channels, out_channels, 1, bias)
        self.add_self_loops = add_self_loops
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.theta.data[0].T, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_channels)
            nn.init.uniform_(self.bias, -bound, bound)

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = gcn_normalize(as_edges(graph, int(x.shape[0]), edge_weight, like=x), self.add_self_loops)
        return PolynomialBasis(edges.to_basis(), [self.K], "powers")


class ChebConv(_GraphLayer):
    r"""Chebyshev spectral convolution (Defferrard et al.): :math:`y = \sum_{k<K} T_k(\hat L)^\top x\,\Theta_k + \beta`.

    :math:`\hat L = 2L/\lambda_{\max} - I` (:func:`structconv.graph.scaled_laplacian`);
    ``lambda_max`` is 2 by default, a number, or ``"auto"`` (computed).  Glorot weights, zero
    bias, as PyG's ``ChebConv``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int,
        normalization: str = "sym",
        bias: bool = True,
        lambda_max: float | str | None = None,
    ) -> None:
        self.K = _positive(K, "K", "ChebConv")
        if normalization not in ("sym", "rw"):
            raise ValueError(f"ChebConv: normalization must be 'sym' or 'rw', got {normalization!r}")
        super().__init__(in_channels, out_channels, K, bias)
        self.normalization, self.lambda_max = normalization, lambda_max
        self.reset_parameters()

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = as_edges(graph, int(x.shape[0]), edge_weight, like=x)
        laplacian, _ = scaled_laplacian(edges, self.normalization, self.lambda_max)
        return PolynomialBasis(laplacian.to_basis(), range(self.K), "chebyshev")


class RGCNConv(nn.Module):
    r"""Relational graph convolution (Schlichtkrull et al.): one member per relation plus the root.

    .. math::
       y_n = x_n\Theta_{\mathrm{root}}
       + \sum_r \frac{1}{|\mathcal N_r(n)|}\sum_{m \in \mathcal N_r(n)} x_m\Theta_r + \beta,


    i.e. the basis of :func:`structconv.graph.relational_basis` with the identity appended.
    ``num_bases`` shares :math:`\Theta_r = \sum_b a_{rb} V_b` (a
    :class:`~structconv.Separable` parameter, contracted without forming :math:`\Theta_r`);
    ``num_blocks`` makes each :math:`\Theta_r` block-diagonal.  Arguments and initialisation as
    PyG's ``RGCNConv`` with ``aggr="mean"``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_relations: int,
        num_bases: int | None = None,
        num_blocks: int | None = None,
        root_weight: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        name = "RGCNConv"
        self.in_channels = _positive(in_channels, "in_channels", name)
        self.out_channels = _positive(out_channels, "out_channels", name)
        self.num_relations = _positive(num_relations, "num_relations", name)
        if num_bases is not None and num_blocks is not None:
            raise ValueError("RGCNConv: give num_bases or num_blocks, not both")
        self.num_bases, self.num_blocks = num_bases, num_blocks
        R, P, Q = num_relations, in_channels, out_channels
        self.comp: nn.Parameter | None = None
        if num_bases is not None:
            _positive(num_bases, "num_bases", name)
            self.weight = nn.Parameter(torch.empty(num_bases, P, Q))
            self.comp = nn.Parameter(torch.empty(R, num_bases))
        elif num_blocks is not None:
            _positive(num_blocks, "num_blocks", name)
            if P % num_blocks or Q % num_blocks:
                raise ValueError(f"RGCNConv: in_channels and out_channels must be divisible by num_blocks={num_blocks}")
            self.weight = nn.Parameter(torch.empty(R, num_blocks, P // num_blocks, Q // num_blocks))
        else:
            self.weight = nn.Parameter(torch.empty(R, P, Q))
        self.root = nn.Parameter(torch.empty(P, Q)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(Q)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        if self.comp is not None:
            glorot_(self.comp)
        if self.root is not None:
            glorot_(self.root)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def parameter(self) -> torch.Tensor | Separable:
        """:math:`\\Theta` over the members (relations, then the root): full or :class:`~structconv.Separable`."""
        R = self.num_relations
        if self.comp is not None:
            B = self.comp.shape[1]
            coef = self.comp.T  # (B, R)
            channel: torch.Tensor = self.weight
            if self.root is not None:
                coef = torch.block_diag(coef, torch.ones(1, 1, dtype=coef.dtype, device=coef.device))  # type: ignore[no-untyped-call]
                channel = torch.cat([channel, self.root[None]])
            return Separable(coef if self.root is not None else coef.reshape(B, R), channel)
        if self.num_blocks is not None:
            theta = torch.stack([torch.block_diag(*self.weight[r]) for r in range(R)])  # type: ignore[no-untyped-call]
        else:
            theta = self.weight
        return theta if self.root is None else torch.cat([theta, self.root[None]])

    def forward(self, x: torch.Tensor, edge_index: Any, edge_type: torch.Tensor) -> torch.Tensor:
        """Apply the layer to ``x`` (``(N, P)``) on ``edge_index`` with one relation per edge."""
        _check_x(x, self.in_channels, "RGCNConv")
        edges = as_edges(edge_index, int(x.shape[0]), like=x)
        basis = relational_basis(edges, edge_type, self.num_relations, root=self.root is not None)
        y: torch.Tensor = conv(basis, x, self.parameter())
        return y if self.bias is None else y + self.bias


class GATConv(nn.Module):
    r"""Graph attention (Veličković et al.) as an attention basis with a low-rank :math:`\Theta`.

    Head :math:`h` is the basis member

    .. math:: A_{h,mn} = \mathrm{softmax}_{m \in \mathcal N(n)}
       \mathrm{LeakyReLU}(a_h^{s}\cdot W_h x_m + a_h^{d}\cdot W_h x_n),

    a bi-affine mechanism without its bilinear term, masked by the graph (plus self-loops) and
    normalised column-wise.  The parameter is :math:`\Theta_h = W_h E_h^\top` with :math:`E_h`
    placing head :math:`h`'s :math:`D` channels in the output (``concat``) or averaging heads.
    Because :math:`W_h x` also feeds the scores, it is computed once and the engine contracts
    :math:`\sum_h A_h^\top (xW)\,\Theta'_h` with :math:`\Theta'_h` the head's selector times
    :math:`E_h` (a :class:`~structconv.LowRank` parameter).

    Arguments as PyG's ``GATConv`` (``heads``, ``concat``, ``negative_slope``, ``dropout`` on the
    attention weights, ``add_self_loops``, ``bias``).  The optional non-negative ``edge_weight``
    of :meth:`forward` enters in the log domain, :math:`\mathrm{softmax}(e + \log w)`: each
    column stays normalised, weight 0 masks an edge, and added self-loops have weight 1.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        name = "GATConv"
        self.in_channels = _positive(in_channels, "in_channels", name)
        self.out_channels = _positive(out_channels, "out_channels", name)
        self.heads = _positive(heads, "heads", name)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GATConv: dropout must lie in [0, 1), got {dropout!r}")
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops = add_self_loops
        H, D = heads, out_channels
        self.weight = nn.Parameter(torch.empty(in_channels, H * D))
        self.att_src = nn.Parameter(torch.empty(H, D))
        self.att_dst = nn.Parameter(torch.empty(H, D))
        self.bias = nn.Parameter(torch.empty(H * D if concat else D)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        glorot_(self.att_src[None])
        glorot_(self.att_dst[None])
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _placement(self, like: torch.Tensor) -> LowRank:
        H, D = self.heads, self.out_channels
        eye = torch.eye(D, dtype=like.dtype, device=like.device)
        select = torch.zeros(H, H * D, D, dtype=like.dtype, device=like.device)
        for h in range(H):
            select[h, h * D : (h + 1) * D] = eye
        place = select if self.concat else eye.expand(H, D, D) / H
        return LowRank(select, place)

    def attention(
        self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None
    ) -> tuple[EdgeBasis, torch.Tensor]:
        """The attention basis (``H`` members) and the projected features :math:`xW` of shape ``(N, H·D)``."""
        _check_x(x, self.in_channels, "GATConv")
        N, H, D = int(x.shape[0]), self.heads, self.out_channels
        edges = as_edges(edge_index, N, edge_weight, like=x)
        if self.add_self_loops:
            edges = remove_self_loops(edges)
            edges = add_remaining_self_loops(edges, 1.0)
        h = x @ self.weight
        hv = h.view(N, H, D)
        score_src = (hv * self.att_src).sum(-1)
        score_dst = (hv * self.att_dst).sum(-1)
        # index_select, not fancy indexing: its backward is a scatter-add rather than an index_put.
        logits = F.leaky_relu(
            score_src.index_select(0, edges.src) + score_dst.index_select(0, edges.dst), self.negative_slope
        )
        if edge_weight is not None:
            if bool((edges.weight < 0).any()):
                raise ValueError("GATConv: edge_weight must be non-negative (it enters as log w)")
            keep = edges.weight > 0  # weight 0 masks the edge: drop it rather than take log 0
            edges = edges.with_edges(edges.src[keep], edges.dst[keep], edges.weight[keep])
            logits = logits[keep] + edges.weight.log()[:, None]
        alpha = _segment_softmax(logits, edges.dst, N)
        alpha = F.dropout(alpha, self.dropout, self.training)
        return EdgeBasis(edges.src, edges.dst, alpha, (N, N)), h

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` (``(N, P)``) on ``edge_index``.

        This is the engine's x·Θ-first order for :math:`\\Theta_h = W_h E_h^\top`, run step by
        step because its first step, :math:`xW`, is already computed for the attention scores:
        the layer applies the basis to it with the basis' own hook
        (:meth:`~structconv.Basis.apply_members`, unreduced) and then places the heads
        (:math:`E_h`).  :func:`structconv.conv` with ``LowRank(W, E)`` gives the same result (a
        test checks it) but would compute :math:`xW` twice.
        """
        basis, h = self.attention(x, edge_index, edge_weight)
        N, H, D = int(x.shape[0]), self.heads, self.out_channels
        heads = basis.apply_members(h.view(1, N, H, D).permute(0, 2, 1, 3), reduce=False)[0]  # (H, N, D)
        y: torch.Tensor = heads.permute(1, 0, 2).reshape(N, H * D) if self.concat else heads.mean(0)
        return y if self.bias is None else y + self.bias

    def value_and_placement(self) -> LowRank:
        """:math:`\\Theta_h = W_h E_h^\top` as a :class:`~structconv.LowRank` parameter, for :func:`structconv.conv`."""
        H, D = self.heads, self.out_channels
        value = self.weight.view(self.in_channels, H, D).permute(1, 0, 2)
        return LowRank(value, self._placement(self.weight).out)


def _segment_softmax(logits: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Softmax of ``logits`` (``(E, H)``) over the entries that share ``index`` (their target)."""
    H = logits.shape[1]
    expanded = index[:, None].expand(-1, H)
    # The shift by each group's maximum cancels in the ratio; detached, it costs no backward pass.
    peak = logits.new_full((size, H), -torch.inf).scatter_reduce(0, expanded, logits.detach(), "amax")
    exp = (logits - peak.index_select(0, index)).exp()
    total = logits.new_zeros(size, H).index_add(0, index, exp)
    return exp / total.index_select(0, index)
