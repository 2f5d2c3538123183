r"""GAT's work on the edges: the added self-loops' features, the softmax over each target's edges, and the
edges of a sparse ``adj_t`` in the order PyG's ``GATConv`` reads them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F  # noqa: N812

from ..structures.graph import Edges


def loop_features(edges: Edges, attr: torch.Tensor, loops: int, fill: float | torch.Tensor | str) -> torch.Tensor:
    """The edge features ``attr`` of the ``loops`` self-loops GAT adds, from its ``fill_value`` (as PyG's)."""
    C = attr.shape[1]
    if isinstance(fill, str):
        inside = edges.dst < loops  # targets beyond the looped nodes (bipartite) do not count
        dst, attr = edges.dst[inside], attr[inside]
        index = dst[:, None].expand(-1, C)
        if fill in ("add", "sum", "mean"):
            total = attr.new_zeros(loops, C).index_add(0, dst, attr)
            if fill != "mean":
                return total
            count = attr.new_zeros(loops).index_add(0, dst, attr.new_ones(dst.shape[0]))
            return total / count.clamp(min=1)[:, None]
        reduce = "amax" if fill == "max" else "amin"
        return attr.new_zeros(loops, C).scatter_reduce(0, index, attr, reduce, include_self=False)
    value = torch.as_tensor(fill, dtype=attr.dtype, device=attr.device)
    return value.expand(loops, C) if value.ndim <= 1 else value


def _segment_softmax(logits: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Softmax of ``logits`` (``(E, H)``) over the entries that share ``index`` (their target)."""
    H = logits.shape[1]
    expanded = index[:, None].expand(-1, H)
    # The shift by each group's maximum cancels in the ratio; detached, it costs no backward pass.
    peak = logits.new_full((size, H), -torch.inf).scatter_reduce(0, expanded, logits.detach(), "amax")
    exp = (logits - peak.index_select(0, index)).exp()
    total = logits.new_zeros(size, H).index_add(0, index, exp)
    return exp / total.index_select(0, index)


def _attend(
    src: torch.Tensor, dst: torch.Tensor, logits: torch.Tensor, h: torch.Tensor, size: int, dropout: float
) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    r"""Every head's :math:`A_h^\top (xW)_h`, ``(N_dst, H\cdot D)``, and a function giving :math:`A` per edge.

    The softmax is normalised after the aggregation: with :math:`w_e = \exp(s_e - \max_{e' \to n}
    s_{e'})`, :math:`\sum_{e \to n} \alpha_e v_e = (\sum_{e\to n} w_e v_e) / \sum_{e \to n} w_e`, so
    no per-edge division (or its backward) is needed.  Dropout acts on the numerator's weights only,
    as it does on :math:`\alpha`.  Kept 2-D on purpose: torch's CPU ``index_add`` over the rows
    of a matrix is about three times faster than over an inner axis of a 4-D array
    (:meth:`~structconv.EdgeBasis.apply_members`' layout), and so is its backward.
    """
    E, H, C = int(src.shape[0]), int(logits.shape[1]), int(h.shape[1])
    index = dst[:, None].expand(-1, H)
    # The shift by each target's maximum cancels in the ratio; detached, it costs no backward pass.
    peak = logits.new_full((size, H), -torch.inf).scatter_reduce(0, index, logits.detach(), "amax")
    w = (logits - peak.index_select(0, dst)).exp()
    dropped = F.dropout(w, dropout) if dropout else w
    msg = h.index_select(0, src).view(E, H, C // H) * dropped[:, :, None]
    numerator = msg.new_zeros(size, C).index_add(0, dst, msg.view(E, C))
    total = w.new_zeros(size, H).index_add(0, dst, w)
    total = torch.where(total > 0, total, torch.ones_like(total))  # a target without edges: 0 / 1
    heads = (numerator.view(size, H, C // H) / total[:, :, None]).view(size, C)
    return heads, lambda: dropped / total.index_select(0, dst)


def _expand_pointers(ptr: torch.Tensor) -> torch.Tensor:
    """The compressed axis' index of every stored entry, from its pointers (``crow``/``ccol``)."""
    counts = ptr[1:] - ptr[:-1]
    return torch.repeat_interleave(torch.arange(int(counts.shape[0]), device=ptr.device), counts)


def stored_entries(adj: torch.Tensor) -> torch.Tensor:
    """The ``edge_index`` (``[src; dst]``) of a torch sparse ``adj_t``'s entries, in PyG's order.

    PyG's message passing walks a CSR or CSC tensor's stored entries as they lie, repeated or
    unsorted columns included, so those are kept; a COO tensor is coalesced, which is the only
    form PyG accepts (it raises on an uncoalesced one) and what COO's duplicates mean (a sum).
    """
    if adj.layout == torch.sparse_csr:
        dst, src = _expand_pointers(adj.crow_indices()), adj.col_indices()
    elif adj.layout == torch.sparse_csc:
        dst, src = adj.row_indices(), _expand_pointers(adj.ccol_indices())
    else:
        coo = adj if adj.layout == torch.sparse_coo else adj.to_sparse()  # blocked layouts
        index = coo.coalesce().indices()
        dst, src = index[0], index[1]
    return torch.stack([src.long(), dst.long()])


def sorted_edges(src: torch.Tensor, dst: torch.Tensor, N_src: int, N_dst: int, by_source: bool) -> torch.Tensor:
    """``[src; dst]`` coalesced: repeats merged, sorted by target then source (``by_source``: the reverse).

    This is the order PyG's ``add_self_loops`` leaves a sparse ``adj_t`` in (it rebuilds the
    tensor from its entries and the loops, coalesced), and so the order of its attention weights.
    """
    key = src * N_dst + dst if by_source else dst * N_src + src
    key = torch.unique(key, sorted=True)
    if by_source:
        return torch.stack([key // N_dst, key % N_dst])
    return torch.stack([key % N_src, key // N_src])


def attention_matrix(
    like: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, alpha: torch.Tensor, N_src: int, N_dst: int
) -> torch.Tensor:
    """The attention weights ``alpha`` (``(E, H)``) as a sparse ``(N_dst, N_src, H)`` ``adj_t`` laid out as ``like``.

    As PyG's ``set_sparse_value``: CSR and CSC keep the entries in the given order (which is the
    layout's storage order), COO is coalesced; other inputs (``scipy.sparse``, dense, blocked
    layouts) give COO.
    """
    size = (N_dst, N_src, int(alpha.shape[1]))
    if isinstance(like, torch.Tensor) and like.layout in (torch.sparse_csr, torch.sparse_csc):
        major, minor, length = (dst, src, N_dst) if like.layout == torch.sparse_csr else (src, dst, N_src)
        ptr = torch.zeros(length + 1, dtype=torch.long, device=alpha.device)
        ptr[1:] = torch.bincount(major, minlength=length).cumsum(0)
        build = torch.sparse_csr_tensor if like.layout == torch.sparse_csr else torch.sparse_csc_tensor
        return build(ptr, minor, alpha, size)
    return torch.sparse_coo_tensor(torch.stack([dst, src]), alpha, size).coalesce()
