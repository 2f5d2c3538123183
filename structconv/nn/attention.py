r"""Multi-head attention as an attention convolution (Andreoli §3.3, Eq. 10–13).

:class:`MultiHeadSelfAttention` is a drop-in for ``torch.nn.MultiheadAttention``: the same
constructor arguments (in torch's order, with torch's defaults), the same ``forward``
call and return values, the same ``state_dict``; see ``docs/peers/torch_mha.rst`` for the
options compared against torch and the one documented difference (a query that may attend to
nothing).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..backend.checks import positive_int
from ..backend.torch_autocast import autocast_dtype, check_input_dtype
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank
from ..structures.attention import AttentionBasis, BiAffine, Mechanism, ScoreBias, attention_basis
from ._module import CompiledRuns, NotScriptable, warn_jit_trace
from .mha_torch import (
    _NAME,
    append_tokens,
    checked_inputs,
    head_weights,
    per_head,
    projection,
    projection_bias,
    register_torch_parameters,
    torch_masks,
)


class MultiHeadSelfAttention(CompiledRuns, NotScriptable, nn.Module):
    r"""``torch.nn.MultiheadAttention`` as an attention convolution: one attention basis member per head.

    Basis: the heads' attention matrices :math:`A_h` between keys and queries, by
    :func:`~structconv.structures.attention.attention_basis` with :meth:`mechanism` (K = ``num_heads``)

    Θ: :math:`\Theta_h = W^v_h W^{o\top}_h`, a :class:`~structconv.LowRank` of rank ``embed_dim // num_heads``,
    as :meth:`theta` returns it (K, P, Q) = ``(num_heads, vdim, embed_dim)``

    .. math::

        y = \sum_h A_h^\top v\,\Theta_h + \beta, \qquad
        (A_h)_{sl} = \operatorname{softmax}_s\Bigl(\frac{(x_s W^k_h + b^k_h)\cdot(z_l W^q_h + b^q_h)}{\sqrt D}\Bigr),

    with :math:`x` the keys, :math:`z` the queries, :math:`v` the values and :math:`D` the head
    width (the mechanism and :math:`\beta` are derived in ``docs/attention.rst``).  Equals
    ``torch.nn.MultiheadAttention`` built with the same arguments and loaded with its
    ``state_dict``, but for the one difference in the notes (``tests/peers/test_torch_mha.py``,
    ``docs/peers/torch_mha.rst``).  The constructor takes torch's positional arguments in torch's
    order with torch's defaults: ``MultiHeadSelfAttention(16, 4, 0.1)`` is ``dropout=0.1`` in both.

    Parameters
    ----------
    embed_dim : int
        :math:`E`, the width of the queries and of the output.
    num_heads : int
        :math:`H`; must divide ``embed_dim``.
    dropout : float, default 0.0
        Dropout on the attention weights in training.
    bias : bool, default True
        Whether the input and output projections have biases.
    add_bias_kv : bool, default False
        Append a learnt key/value token (``bias_k``, ``bias_v``).
    add_zero_attn : bool, default False
        Append a key/value token of zeros.
    kdim : int, optional
        The width of the keys; ``embed_dim`` by default.
    vdim : int, optional
        The width of the values; ``embed_dim`` by default.
    batch_first : bool, default False
        Read and return ``(N, L, E)`` instead of ``(L, N, E)``.
    device : optional
        Where the parameters live.
    dtype : optional
        The parameters' dtype.

    Shapes
    ------
    - **input:** query :math:`(L, N, E)`, key :math:`(S, N, E_k)`, value :math:`(S, N, E_v)`
      (:math:`(N, L, E)` etc. with ``batch_first=True``; no :math:`N` unbatched),
      ``key_padding_mask`` :math:`(N, S)` *(optional)*, ``attn_mask`` :math:`(L, S)` or
      :math:`(N \cdot H, L, S)` *(optional)*
    - **output:** the attended values, shaped as the query, and the attention weights
      :math:`(N, L, S)` (:math:`(N, H, L, S)` if not averaged) or ``None``

    Notes
    -----
    The parameters have torch's names and shapes (``in_proj_weight``, or
    ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when ``kdim`` or ``vdim`` differs
    from ``embed_dim``; ``in_proj_bias``; ``bias_k``/``bias_v``; ``out_proj``), so
    ``load_state_dict`` accepts torch's state.

    The one difference from torch: a query that may attend to no key (every key masked) gets
    attention weights 0 and output ``out_proj.bias`` (it attends to nothing), where torch's
    ``need_weights=True`` path gives ``NaN`` (its ``need_weights=False`` path gives
    ``out_proj.bias`` too).  Dropout on the attention weights draws torch's mask for the same
    random state as torch's ``need_weights=True`` path (the weights are dropped in torch's
    ``(N, H, L, S)`` layout).

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import MultiHeadSelfAttention
    >>> ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    >>> layer = MultiHeadSelfAttention(16, 4, batch_first=True)
    >>> _ = layer.load_state_dict(ref.state_dict())
    >>> x = torch.randn(2, 7, 16)
    >>> y, w = layer(x, x, x)
    >>> y_ref, w_ref = ref(x, x, x)
    >>> torch.allclose(y, y_ref, atol=1e-5), torch.allclose(w, w_ref, atol=1e-6)
    (True, True)
    """

    # Registered by register_torch_parameters (torch's names and shapes).
    in_proj_weight: torch.Tensor | None
    q_proj_weight: torch.Tensor | None
    k_proj_weight: torch.Tensor | None
    v_proj_weight: torch.Tensor | None
    in_proj_bias: torch.Tensor | None
    out_proj: nn.Linear
    bias_k: torch.Tensor | None
    bias_v: torch.Tensor | None

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        embed_dim = positive_int(embed_dim, "embed_dim", where=_NAME)
        num_heads = positive_int(num_heads, "num_heads", where=_NAME)
        if embed_dim % num_heads:
            raise ValueError(f"{_NAME}: embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"{_NAME}: dropout must be a probability in [0, 1), got {dropout!r}")
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else positive_int(kdim, "kdim", where=_NAME)
        self.vdim = embed_dim if vdim is None else positive_int(vdim, "vdim", where=_NAME)
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.dropout, self.batch_first, self.add_zero_attn = float(dropout), bool(batch_first), bool(add_zero_attn)
        register_torch_parameters(self, bias, add_bias_kv, {"device": device, "dtype": dtype})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``torch.nn.MultiheadAttention``'s initialisation."""
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if w is not None:
                nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                nn.init.xavier_normal_(b)

    # --- the basis and the parameter -------------------------------------------------------
    @property
    def _extras(self) -> int:
        return int(self.bias_k is not None) + int(self.add_zero_attn)

    def mechanism(self) -> BiAffine:
        r"""The heads' bi-affine mechanism (key input :math:`x`, query input :math:`z`), scaled by :math:`1/\sqrt D`.

        With ``add_bias_kv`` or ``add_zero_attn`` its key weight has one row per appended token
        (see the class notes), and the key input must be widened by :func:`~structconv.nn.mha_torch.append_tokens`.
        """
        return BiAffine(
            key=head_weights(self, 1),
            query=per_head(self, projection(self, 0)),
            key_bias=projection_bias(self, 1),
            query_bias=projection_bias(self, 0),
            scale=1.0 / math.sqrt(self.head_dim),
        )

    def theta(self) -> LowRank:
        r""":math:`\Theta_h = W^v_h W^{o\top}_h` as a :class:`~structconv.LowRank` parameter ``(H, vdim [+ e], E)``."""
        E = self.embed_dim
        out = self.out_proj.weight.reshape(E, self.num_heads, self.head_dim).permute(1, 0, 2)
        return LowRank(head_weights(self, 2), out)

    def _value_bias(self) -> torch.Tensor | None:
        r"""Per-head :math:`W^o_h b^v_h`, ``(H, E)``."""
        b_v = projection_bias(self, 2)
        if b_v is None:
            return None
        w_o = self.out_proj.weight.reshape(self.embed_dim, self.num_heads, self.head_dim)
        return torch.einsum("ehd,hd->he", w_o, b_v)

    def output_bias(self) -> torch.Tensor | None:
        r""":math:`b^o + \sum_h W^o_h b^v_h` (the value bias passes through the normalised columns)."""
        vb = self._value_bias()
        if vb is None or self.out_proj.bias is None:
            return None
        bias: torch.Tensor = self.out_proj.bias + vb.sum(0)
        return bias

    def basis(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> AttentionBasis:
        r"""The heads :math:`A_h` ``(N, H, S [+ e], L)``, before attention dropout (arguments as :meth:`forward`).

        The layer's output is ``conv(basis, v, theta())`` plus :meth:`output_bias` (in eval mode, where
        every query may attend to some key), with ``v`` the value batch first, widened by
        :func:`~structconv.nn.mha_torch.append_tokens` for ``add_bias_kv``/``add_zero_attn``.
        """
        return self._heads(query, key, value, key_padding_mask, need_weights, attn_mask, is_causal)[1]

    def _heads(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        need_weights: bool,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> tuple[bool, AttentionBasis, torch.Tensor, torch.Tensor | None]:
        """``(batched, heads, value input, allowed)``: :meth:`basis` with what :meth:`forward` needs beside it."""
        batched, q, k, v, key_padding_mask = checked_inputs(
            self, query, key, value, key_padding_mask, attn_mask, is_causal
        )
        for name, t in (("query", q), ("key", k), ("value", v)):
            check_input_dtype(t, self.out_proj.weight, _NAME, name)
        B, L, S = int(q.shape[0]), int(q.shape[1]), int(k.shape[1])
        causal = is_causal and key_padding_mask is None and not need_weights
        n_heads, e, device = self.num_heads, self._extras, self.out_proj.weight.device
        allowed, additive = torch_masks(B, L, S, q.dtype, key_padding_mask, attn_mask, causal, n_heads, e, device)

        self_attention = k is q and v is q and not self._extras
        x_key = append_tokens(k, self._extras)
        x_value = x_key if v is k else append_tokens(v, self._extras)
        mech: Mechanism = self.mechanism()
        if additive is not None:
            mech = mech + ScoreBias(additive.transpose(-1, -2).expand(-1, self.num_heads, -1, -1))
        mask = None if allowed is None else allowed.transpose(-1, -2)  # ours: [key, query]
        heads = attention_basis(x_key, None if self_attention else q, mechanism=mech, mask=mask)
        return batched, heads, x_value, allowed

    # --- forward -------------------------------------------------------------------------------
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""Attend from ``query`` to ``key``/``value``, exactly as ``torch.nn.MultiheadAttention.forward``.

        Parameters
        ----------
        query
            ``(L, N, E)``, ``(N, L, E)`` with ``batch_first=True``, or ``(L, E)`` unbatched.
        key, value
            ``(S, N, kdim)`` and ``(S, N, vdim)`` (batch first or unbatched likewise).
        key_padding_mask
            ``(N, S)`` or ``(S,)``: bool (``True`` = ignore that key) or float (added to the scores).
        need_weights
            Return the attention weights as well.
        attn_mask
            ``(L, S)`` or ``(N * num_heads, L, S)``: bool (``True`` = may *not* attend) or float
            (added to the scores; ``-inf`` masks).
        average_attn_weights
            Average the returned weights over the heads.
        is_causal
            torch's hint that ``attn_mask`` is causal; as in torch it needs ``attn_mask``, and with
            no ``key_padding_mask`` and ``need_weights=False`` the causal mask
            :math:`s \le l` replaces ``attn_mask``.

        Returns
        -------
        tuple
            The output (shaped as ``query``, width ``embed_dim``) and the weights ``(N, L, S)``
            (``(N, num_heads, L, S)`` if not averaged; no ``N`` for unbatched input), or
            ``None`` when ``need_weights=False``.  ``S`` counts the appended tokens.
        """
        warn_jit_trace(self)
        batched, heads, x_value, allowed = self._heads(
            query, key, value, key_padding_mask, need_weights, attn_mask, is_causal
        )
        basis: AttentionBasis | DenseBasis = heads
        theta = self.theta()
        drop = self.training and self.dropout > 0.0
        weights = None  # torch's layout (B, H, L, S + e)
        if need_weights or drop:
            weights = basis.to_dense().transpose(-1, -2)
            narrow = autocast_dtype(weights.device.type)
            if narrow is not None and weights.dtype == torch.float32:  # as torch's, whose products run narrow
                weights = weights.to(narrow)
            if drop:
                weights = F.dropout(weights.contiguous(), self.dropout, training=True)
            basis = DenseBasis.of_weights(weights.transpose(-1, -2))
        y = self.contract(basis, x_value, theta)

        vb = self._value_bias()
        mass = None  # each column's total weight, (B or 1, H or 1, L), where it may differ from 1
        if drop and weights is not None:
            mass = weights.sum(-1)
        elif allowed is not None:
            mass = allowed.any(-1).to(y.dtype)
        # Under autocast y has its dtype and the biases float32: added in y's dtype, as torch's out_proj does.
        if vb is not None and mass is not None:  # the value bias, times each column's mass
            y = y + torch.einsum("bhl,he->ble", mass.expand(-1, self.num_heads, -1), vb).to(y.dtype)
            if self.out_proj.bias is not None:
                y = y + self.out_proj.bias.to(y.dtype)
        else:
            bias = self.output_bias() if vb is not None else self.out_proj.bias
            if bias is not None:
                y = y + bias.to(y.dtype)

        if batched and not self.batch_first:
            y = y.transpose(0, 1)
        if not batched:
            y = y[0]
        if not need_weights or weights is None:
            return y, None
        out_w = weights.mean(1) if average_attn_weights else weights
        return y, (out_w if batched else out_w[0])
