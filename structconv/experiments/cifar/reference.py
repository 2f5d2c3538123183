r"""A paper-faithful dense implementation of quadratic positional attention: the speed peer.

The reference code of Cordonnier et al. builds, for every image of the batch, the relative
encoding :math:`r_\delta = (\lVert\delta\rVert^2, \delta_1, \delta_2)` of every (query, key)
pair, the scores :math:`v_h^\top r_\delta`, a dense :math:`T\times T` softmax per head and the
value products.  :func:`paper_dense` does exactly that with the parameters of a
:class:`~structconv.nn.PositionalAttention` layer; :func:`dense_twin` swaps it into a copy of a
:class:`~.models.SelfAttentionNet` that shares the original's parameters, so the benchmark
trains the *same* model both ways.

This path bypasses the engine on purpose (it is the peer the engine is measured against); the
tests check it equals the structconv model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ...nn import PositionalAttention
from .models import SelfAttentionNet

__all__ = ["PaperDenseAttention", "dense_twin", "paper_dense"]


def paper_dense(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    """The paper's dense computation: per-image scores, softmax and dropout, value einsum, output map."""
    if layer.encoding != "quadratic" or layer.content or len(layer.grid) != 2:
        raise ValueError("paper_dense implements the 2-D quadratic encoding without content only")
    B, M, E = x.shape
    H = layer.num_heads
    rows, cols = layer.grid
    pos = torch.stack(
        torch.meshgrid(torch.arange(rows, device=x.device), torch.arange(cols, device=x.device), indexing="ij"), -1
    )
    delta = (pos.reshape(-1, 1, 2) - pos.reshape(1, -1, 2)).to(x.dtype)  # (M keys, N queries, 2)
    r = torch.cat([(delta**2).sum(-1, keepdim=True), delta], -1)  # the quadratic encoding, D_p = 3
    alpha = layer.alpha()
    v = -alpha[:, None] * torch.cat([torch.ones_like(alpha)[:, None], -2 * layer.centres], 1)  # (H, 3)
    scores = torch.einsum("hc,mnc->hnm", v.to(x.dtype), r)[None].expand(B, H, M, M)  # every image: [query, key]
    probs = torch.softmax(scores, dim=-1)
    if layer.training and layer.attention_dropout > 0:
        probs = F.dropout(probs, layer.attention_dropout, training=True)  # per image, as the paper's code
    if layer.head_dim is None:  # D_h = D_out: each head averages the raw input, then one linear map
        per_head = torch.einsum("bhnm,bme->bnhe", probs, x).reshape(B, M, H * E)
        y = per_head @ layer.theta.reshape(H * E, E)
    else:
        values = torch.einsum("bme,hed->bhmd", x, layer.value)
        per_head = torch.einsum("bhnm,bhmd->bnhd", probs, values).reshape(B, M, -1)
        y = per_head @ layer.out.permute(0, 2, 1).reshape(-1, E)
    return y if layer.bias is None else y + layer.bias


class PaperDenseAttention(nn.Module):
    """A :class:`~structconv.nn.PositionalAttention` layer evaluated by :func:`paper_dense` (same parameters)."""

    def __init__(self, layer: PositionalAttention) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return paper_dense(self.layer, x)


def dense_twin(model: SelfAttentionNet) -> SelfAttentionNet:
    """A shallow copy of ``model`` whose attention runs as :func:`paper_dense`; parameters are shared."""
    twin = copy.copy(model)
    twin._modules = dict(model._modules)
    twin.blocks = nn.ModuleList()
    for block in model.blocks:
        b = copy.copy(block)
        b._modules = dict(block._modules)
        b.attention = PaperDenseAttention(block.attention)  # type: ignore[arg-type]
        twin.blocks.append(b)
    return twin
