r"""Multi-head self-attention as an attention convolution (Andreoli §3.3, Eq. 10–13)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..attention import BiAffine, attention_basis
from ..contract import conv
from ..factor import LowRank


class MultiHeadSelfAttention(nn.Module):
    r"""Transformer self-attention written as :math:`y = \sum_h A_h^\top x\,\Theta_h + \beta`.

    Head :math:`h` is the bi-affine mechanism with the low-rank bilinear term
    :math:`\Lambda_h = W^{k}_h W^{q\top}_h/\sqrt D` (Eq. 12) plus the linear term
    :math:`\lambda_h = W^k_h b^q_h/\sqrt D` that the query bias brings (the key bias only adds
    a constant per column, which the column-wise softmax ignores); on torch the engine runs it
    through ``scaled_dot_product_attention`` (order ``"sdpa"``), as torch's own layer does.  The parameter is low-rank,
    :math:`\Theta_h = W^{v}_h W^{o\top}_h` (Eq. 13), and since every column of :math:`A_h`
    sums to one the value bias becomes the constant :math:`\sum_h W^o_h b^v_h`, added to the
    output bias.

    Parameters and their layout are those of ``torch.nn.MultiheadAttention`` (``in_proj_weight``
    ``(3E, E)``, ``in_proj_bias``, ``out_proj``), so ``load_state_dict`` accepts its state; inputs
    are batch-first ``(B, T, E)``.

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import MultiHeadSelfAttention
    >>> ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    >>> layer = MultiHeadSelfAttention(16, 4)
    >>> _ = layer.load_state_dict(ref.state_dict())
    >>> x = torch.randn(2, 7, 16)
    >>> torch.allclose(layer(x), ref(x, x, x, need_weights=False)[0], atol=1e-5)
    True
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, device: Any = None, dtype: Any = None):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"MultiHeadSelfAttention: {name} must be a positive integer, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiHeadSelfAttention: embed_dim={embed_dim} must be divisible by num_heads={num_heads}"
            )
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``torch.nn.MultiheadAttention``'s initialisation."""
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _heads(self, w: torch.Tensor) -> torch.Tensor:
        """``(E, E)`` torch projection ``W`` (``x W^T``) -> per-head ``(H, E, D)``."""
        return w.T.reshape(self.embed_dim, self.num_heads, self.head_dim).permute(1, 0, 2)

    def mechanism(self) -> BiAffine:
        """The bi-affine mechanism of the heads: affine key and query projections, scaled."""
        E, D, H = self.embed_dim, self.head_dim, self.num_heads
        w_q, w_k = self.in_proj_weight[:E], self.in_proj_weight[E : 2 * E]
        b_q = b_k = None
        if self.in_proj_bias is not None:
            b_q, b_k = self.in_proj_bias[:E].reshape(H, D), self.in_proj_bias[E : 2 * E].reshape(H, D)
        return BiAffine(
            key=self._heads(w_k), query=self._heads(w_q), key_bias=b_k, query_bias=b_q, scale=1.0 / math.sqrt(D)
        )

    def parameter(self) -> LowRank:
        r""":math:`\Theta_h = W^v_h W^{o\top}_h` as a :class:`~structconv.LowRank` parameter."""
        E = self.embed_dim
        value = self._heads(self.in_proj_weight[2 * E :])
        out = self.out_proj.weight.reshape(E, self.num_heads, self.head_dim).permute(1, 0, 2)
        return LowRank(value, out)

    def output_bias(self) -> torch.Tensor | None:
        """:math:`b^o + \\sum_h W^o_h b^v_h` (the value bias passes through the normalised columns)."""
        if self.in_proj_bias is None:
            return None
        bias: torch.Tensor = self.out_proj.bias + self.out_proj.weight @ self.in_proj_bias[2 * self.embed_dim :]
        return bias

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attend over ``x`` (``(B, T, E)``); ``mask`` (``(T, T)``, ``True`` = may attend, as ``[key, query]``)."""
        if not isinstance(x, torch.Tensor) or x.ndim != 3 or int(x.shape[-1]) != self.embed_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"MultiHeadSelfAttention: x must have shape (B, T, {self.embed_dim}), got {shape}")
        basis = attention_basis(x, mechanism=self.mechanism(), mask=mask)
        y: torch.Tensor = conv(basis, x, self.parameter())
        bias = self.output_bias()
        return y if bias is None else y + bias
