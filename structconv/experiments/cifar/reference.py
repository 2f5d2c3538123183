r"""A paper-faithful dense implementation of quadratic positional attention: the speed peer.

For position-only encodings the reference code of Cordonnier et al. (``models/bert.py``,
``GaussianSelfAttention.get_attention_probs`` and ``forward``) computes the attention
probabilities once per layer and step with no batch axis: the relative encoding
:math:`r_\delta = (\lVert\delta\rVert^2, \delta_1, \delta_2)` of every (key, query) pair, the
scores :math:`v_h^\top r_\delta` and a dense :math:`T\times T` softmax per head.  Attention
dropout acts on that tensor, so one mask per step is shared by every image of the batch; only
then does the batch enter, through the value einsum.  :func:`paper_dense` does exactly that with
the parameters of a :class:`~structconv.nn.PositionalAttention` layer; :func:`dense_twin` swaps
it into a copy of a :class:`~.models.SelfAttentionNet` that shares the original's parameters, so
the benchmark trains the *same* model both ways.

This path bypasses the engine on purpose (it is the peer the engine is measured against); the
tests check it equals the structconv model, in evaluation and, drawing the same dropout masks
from the same random state, in training.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ...backend.torch_autocast import autocast_dtype, autocast_off
from ...nn import PositionalAttention, QuadraticHeads
from .models import SelfAttentionNet

__all__ = ["PaperDenseAttention", "dense_twin", "paper_dense", "position_probabilities"]


def position_probabilities(layer: PositionalAttention) -> torch.Tensor:
    r"""The quadratic heads' attention probabilities, ``(H, M, N)`` (key :math:`m`, query :math:`n`).

    One tensor for the whole batch, as the paper's code builds it: with :math:`\delta = p_m - p_n`,
    the scores are :math:`-\alpha_h\lVert\delta\rVert^2 + 2\alpha_h\Delta_h\cdot\delta`, which
    differ from :math:`-\alpha_h\lVert\delta - \Delta_h\rVert^2` by a constant per query, so the
    softmax over the keys is the same.

    Computed in the parameters' precision, with autocast off, like the layer's own heads: the
    scores of a 16x16 grid reach 450, which bf16 would round.
    """
    heads = layer.encoding
    if not isinstance(heads, QuadraticHeads) or layer.content is not None or len(layer.grid) != 2:
        raise ValueError("paper_dense implements the 2-D quadratic encoding without content only")
    centres = heads.centres
    rows, cols = layer.grid
    with autocast_off(centres.device.type):
        axes = (torch.arange(rows, device=centres.device), torch.arange(cols, device=centres.device))
        pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)
        delta = (pos[:, None, :] - pos[None, :, :]).to(centres.dtype)  # (M keys, N queries, 2)
        r = torch.cat([(delta**2).sum(-1, keepdim=True), delta], -1)  # the quadratic encoding, D_p = 3
        alpha = heads.alpha()
        v = -alpha[:, None] * torch.cat([torch.ones_like(alpha)[:, None], -2 * centres], 1)  # (H, 3)
        scores = torch.einsum("hc,mnc->hmn", v, r)
        return torch.softmax(scores, dim=1)  # over the keys


def paper_dense(layer: PositionalAttention, x: torch.Tensor) -> torch.Tensor:
    r"""The paper's dense computation of ``layer`` on ``x`` (``(B, M, E)``): the same function as ``layer(x)``.

    One softmax per head for the whole batch (:func:`position_probabilities`), dropped out in
    training with one mask shared by the batch (the paper's rule, ``layer.dropout_shared`` ``None``
    or ``True``), or with a mask per image when ``layer.dropout_shared is False``; then the value
    einsum over every image and the output map.  The probabilities are laid out, and masks
    drawn, in the layer's memory order (``(H, M, N)`` shared, ``(B, M, H, N)`` per image), so the
    same random state gives both the same mask; which index comes first changes nothing else.
    """
    B, M, E = x.shape
    H = layer.num_heads
    kind = x.device.type
    # Dropped out in the dtype the products run in, as the layer does.
    dtype = autocast_dtype(kind) or x.dtype
    probs = position_probabilities(layer).to(dtype)
    per_image = False
    if layer.training and layer.attention_dropout > 0:
        p = layer.attention_dropout
        if layer.dropout_shared is False:
            probs = F.dropout(probs.permute(1, 0, 2)[None].expand(B, -1, -1, -1).contiguous(), p, training=True)
            per_image = True
        else:
            probs = F.dropout(probs, p, training=True)  # one mask for the batch, as the paper's code
    if layer.head_dim is None:  # D_h = D_out: each head averages the raw input, then one linear map
        spec = "bmhn,bme->bnhe" if per_image else "hmn,bme->bnhe"
        per_head = torch.einsum(spec, probs, x).reshape(B, M, H * E)
        y = per_head @ layer.weight.reshape(H * E, E)
    else:
        values = torch.einsum("bme,hed->bhmd", x, layer.value)
        spec = "bmhn,bhmd->bnhd" if per_image else "hmn,bhmd->bnhd"
        per_head = torch.einsum(spec, probs, values).reshape(B, M, -1)
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
