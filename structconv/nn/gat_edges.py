r"""How GAT reads its graph as PyG's ``GATConv`` does: the added self-loops' features, the edges of a sparse
``adj_t`` in PyG's order, and the attention weights given back in the input's layout.

The softmax over each target's edges belongs to the basis,
:class:`~structconv.bases.softmax_edges.SoftmaxEdgeBasis`.
"""

from __future__ import annotations

import torch

from ..structures.graph import Edges


def loop_features(edges: Edges, attr: torch.Tensor, loops: int, fill: float | torch.Tensor | str) -> torch.Tensor:
    """The edge features ``attr`` of the ``loops`` self-loops GAT adds, from its ``fill_value`` (as PyG's).

    A reduction reads the edges of weight 1 into the looped nodes; the others (targets beyond
    them in a bipartite graph, a compiled run's dropped loops) go to a spare row, so that no
    shape depends on the edges' values.
    """
    C = attr.shape[1]
    if isinstance(fill, str):
        inside = (edges.dst < loops) & (edges.weight != 0)
        slot = torch.where(inside, edges.dst, loops)
        if fill in ("add", "sum", "mean"):
            total = attr.new_zeros(loops + 1, C).index_add(0, slot, attr)[:loops]
            if fill != "mean":
                return total
            count = attr.new_zeros(loops + 1).index_add(0, slot, attr.new_ones(slot.shape[0]))[:loops]
            return total / count.clamp(min=1)[:, None]
        reduce = "amax" if fill == "max" else "amin"
        spread = slot[:, None].expand(-1, C)
        return attr.new_zeros(loops + 1, C).scatter_reduce(0, spread, attr, reduce, include_self=False)[:loops]
    value = torch.as_tensor(fill, dtype=attr.dtype, device=attr.device)
    return value.expand(loops, C) if value.ndim <= 1 else value


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
