r"""GAT's work on the edges: the added self-loops' features and the softmax over each target's edges."""

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
