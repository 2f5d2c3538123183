r"""Multi-head attention as an attention convolution (Andreoli §3.3, Eq. 10–13).

:class:`MultiHeadSelfAttention` is a drop-in for ``torch.nn.MultiheadAttention``: the same
constructor, the same ``forward`` call and return values, the same ``state_dict``; see
``docs/peers/torch_mha.rst`` for the options compared against torch and the one documented
difference (a query that may attend to nothing).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..bases.dense import DenseBasis
from ..bases.factor import LowRank
from ..engine.contract import conv
from ..structures.attention import AttentionBasis, BiAffine, Mechanism, ScoreBias, attention_basis

_NAME = "MultiHeadSelfAttention"


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{_NAME}: {name} must be a positive integer, got {value!r}")
    return value


def _split_mask(mask: torch.Tensor, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """torch's mask (bool: ``True`` = masked; float: added) -> (``allowed``, finite additive part or None)."""
    if mask.dtype == torch.bool:
        return ~mask, None
    if not torch.is_floating_point(mask):
        raise TypeError(f"{_NAME}: {name} must be a bool or floating-point tensor, got dtype {mask.dtype}")
    if bool(torch.isnan(mask).any()) or bool((mask == float("inf")).any()):
        raise ValueError(f"{_NAME}: {name} holds NaN or +inf; a float mask is added to the scores (-inf = masked)")
    allowed = mask != float("-inf")
    finite = mask.masked_fill(~allowed, 0.0).to(dtype)
    return allowed, (finite if bool((finite != 0).any()) else None)


class MultiHeadSelfAttention(nn.Module):
    r"""``torch.nn.MultiheadAttention`` written as :math:`y = \sum_h A_h^\top v\,\Theta_h + \beta`.

    Head :math:`h` is the bi-affine mechanism (Def. 6) between the key input :math:`x` (main,
    ``(S, kdim)``) and the query input :math:`z` (auxiliary, ``(L, E)``) with the low-rank
    bilinear term :math:`\Lambda_h = W^{k}_h W^{q\top}_h/\sqrt D` (Eq. 12) and the biases of
    the key and query projections; torch's ``attn_mask`` and ``key_padding_mask`` become the
    basis's boolean mask (their :math:`-\infty`/``True`` entries) plus a
    :class:`~structconv.structures.attention.ScoreBias` (their finite float entries).  The parameter is
    low-rank, :math:`\Theta_h = W^{v}_h W^{o\top}_h` (Eq. 13), applied to the value input
    :math:`v`.  A column of :math:`A_h` sums to one, so the value bias becomes the constant
    :math:`\beta = b^o + \sum_h W^o_h b^v_h`.  On torch the engine runs plain scaled
    dot products through ``scaled_dot_product_attention`` (order ``"sdpa"``).

    ``add_bias_kv`` and ``add_zero_attn`` append one key/value token each after the inputs: a
    row :math:`e_j` of an identity block appended to :math:`x` and :math:`v`, whose projection
    rows are :math:`b^{k}_{\mathrm{extra}} - b^k` and :math:`b^{v}_{\mathrm{extra}} - b^v`
    (``bias_k`` / ``bias_v``, or zero for ``add_zero_attn``), so that after the projection
    biases the token's key and value are exactly torch's.

    Parameters
    ----------
    embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first, device, dtype
        As ``torch.nn.MultiheadAttention`` (same defaults; ``batch_first=False`` reads
        ``(L, N, E)``).  The parameters have torch's names and shapes (``in_proj_weight``, or
        ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` when ``kdim`` or ``vdim``
        differs from ``embed_dim``; ``in_proj_bias``; ``bias_k``/``bias_v``; ``out_proj``), so
        ``load_state_dict`` accepts torch's state.

    Notes
    -----
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
        _positive_int("embed_dim", embed_dim)
        _positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"{_NAME}: embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"{_NAME}: dropout must be a probability in [0, 1), got {dropout!r}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.kdim = embed_dim if kdim is None else _positive_int("kdim", kdim)
        self.vdim = embed_dim if vdim is None else _positive_int("vdim", vdim)
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.dropout, self.batch_first, self.add_zero_attn = float(dropout), bool(batch_first), bool(add_zero_attn)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
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
    def _projection(self, which: int) -> torch.Tensor:
        """torch's projection weight ``W`` (``x W^T``) of the query (0), key (1) or value (2)."""
        if self.in_proj_weight is not None:
            E = self.embed_dim
            return self.in_proj_weight[which * E : (which + 1) * E]
        w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[which]
        assert w is not None
        return w

    def _projection_bias(self, which: int) -> torch.Tensor | None:
        """Per-head bias ``(H, D)`` of the query (0), key (1) or value (2) projection."""
        if self.in_proj_bias is None:
            return None
        E = self.embed_dim
        return self.in_proj_bias[which * E : (which + 1) * E].reshape(self.num_heads, self.head_dim)

    def _heads(self, w: torch.Tensor) -> torch.Tensor:
        """``(E, P)`` torch projection ``W`` (``x W^T``) -> per-head ``(H, P, D)``."""
        return w.T.reshape(int(w.shape[1]), self.num_heads, self.head_dim).permute(1, 0, 2)

    def _extra_rows(self, which: int) -> torch.Tensor | None:
        r"""Projection rows ``(H, e, D)`` of the appended tokens (``bias_k``/``bias_v``, zero attention)."""
        extra = self.bias_k if which == 1 else self.bias_v
        bias = self._projection_bias(which)
        rows = []
        if extra is not None:
            rows.append(extra.reshape(self.num_heads, self.head_dim))
        if self.add_zero_attn:
            rows.append(torch.zeros_like(self._heads(self._projection(which))[:, 0]))
        if not rows:
            return None
        stacked = torch.stack(rows, 1)
        return stacked if bias is None else stacked - bias[:, None]

    @property
    def _extras(self) -> int:
        return int(self.bias_k is not None) + int(self.add_zero_attn)

    def mechanism(self) -> BiAffine:
        r"""The heads' bi-affine mechanism (key input :math:`x`, query input :math:`z`), scaled by :math:`1/\sqrt D`.

        With ``add_bias_kv`` or ``add_zero_attn`` its key weight has one row per appended token
        (see the class notes), and the key input must be widened by :meth:`_append_tokens`.
        """
        key = self._heads(self._projection(1))
        rows = self._extra_rows(1)
        if rows is not None:
            key = torch.cat([key, rows], 1)
        return BiAffine(
            key=key,
            query=self._heads(self._projection(0)),
            key_bias=self._projection_bias(1),
            query_bias=self._projection_bias(0),
            scale=1.0 / math.sqrt(self.head_dim),
        )

    def parameter(self) -> LowRank:
        r""":math:`\Theta_h = W^v_h W^{o\top}_h` as a :class:`~structconv.LowRank` parameter ``(H, vdim [+ e], E)``."""
        value = self._heads(self._projection(2))
        rows = self._extra_rows(2)
        if rows is not None:
            value = torch.cat([value, rows], 1)
        E = self.embed_dim
        out = self.out_proj.weight.reshape(E, self.num_heads, self.head_dim).permute(1, 0, 2)
        return LowRank(value, out)

    def _value_bias(self) -> torch.Tensor | None:
        r"""Per-head :math:`W^o_h b^v_h`, ``(H, E)``."""
        b_v = self._projection_bias(2)
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

    def _append_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, S, P)`` -> ``(B, S + e, P + e)``: the inputs, then one identity row per appended token."""
        e = self._extras
        if not e:
            return t
        B, S, P = (int(s) for s in t.shape)
        eye = torch.eye(e, dtype=t.dtype, device=t.device)
        top = torch.cat([t, t.new_zeros(B, S, e)], -1)
        bottom = torch.cat([t.new_zeros(e, P), eye], -1).expand(B, e, P + e)
        return torch.cat([top, bottom], 1)

    # --- masks -------------------------------------------------------------------------------
    def _masks(
        self,
        B: int,
        L: int,
        S: int,
        dtype: torch.dtype,
        key_padding_mask: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        causal: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """torch's masks -> (``allowed``, additive or None), each ``(B or 1, H or 1, L, S + e)`` (torch's layout)."""
        H, e = self.num_heads, self._extras
        allowed: torch.Tensor | None = None
        additive: torch.Tensor | None = None
        parts = []
        if attn_mask is not None:
            if not isinstance(attn_mask, torch.Tensor):
                raise TypeError(f"{_NAME}: attn_mask must be a tensor, got {type(attn_mask).__name__}")
            if attn_mask.ndim == 2 and tuple(attn_mask.shape) == (L, S):
                parts.append((attn_mask[None, None], "attn_mask"))
            elif attn_mask.ndim == 3 and tuple(attn_mask.shape) == (B * H, L, S):
                parts.append((attn_mask.reshape(B, H, L, S), "attn_mask"))
            else:
                raise ValueError(
                    f"{_NAME}: attn_mask must have shape (L, S) = ({L}, {S}) or (N*num_heads, L, S) = "
                    f"({B * H}, {L}, {S}), got {tuple(attn_mask.shape)}"
                )
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, torch.Tensor):
                raise TypeError(f"{_NAME}: key_padding_mask must be a tensor, got {type(key_padding_mask).__name__}")
            if tuple(key_padding_mask.shape) != (B, S):
                raise ValueError(
                    f"{_NAME}: key_padding_mask must have shape (N, S) = ({B}, {S}) (or (S,) for unbatched "
                    f"input), got {tuple(key_padding_mask.shape)}"
                )
            parts.append((key_padding_mask[:, None, None, :], "key_padding_mask"))
        for mask, name in parts:
            ok, add = _split_mask(mask, name, dtype)
            allowed = ok if allowed is None else allowed & ok
            if add is not None:
                additive = add if additive is None else additive + add
        if e and (allowed is not None or additive is not None):  # the appended tokens are never masked
            if allowed is not None:
                allowed = F.pad(allowed, (0, e), value=True)
            if additive is not None:
                additive = F.pad(additive, (0, e))
        if causal:  # torch drops attn_mask for scaled_dot_product_attention's causal mask (top-left)
            allowed = torch.ones(L, S + e, dtype=torch.bool, device=self.out_proj.weight.device).tril()[None, None]
            additive = None
        if allowed is not None:
            allowed = None if bool(allowed.all()) else allowed.expand(-1, -1, L, -1)
        if additive is not None:
            additive = additive.expand(-1, -1, L, -1)
        return allowed, additive

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
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{_NAME}: {name} must be a tensor, got {type(t).__name__}")
            if t.is_nested:
                raise TypeError(f"{_NAME}: {name} must be a dense tensor; nested tensors are not supported (pad them)")
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(
                f"{_NAME}: query, key and value must be all 3-D (batched) or all 2-D (unbatched), got "
                f"{query.ndim}-D, {key.ndim}-D and {value.ndim}-D"
            )
        q, k, v = self._batch_first(query, key, value, batched)
        B, L, S = int(q.shape[0]), int(q.shape[1]), int(k.shape[1])
        for name, t, width in (("query", q, self.embed_dim), ("key", k, self.kdim), ("value", v, self.vdim)):
            if int(t.shape[-1]) != width:
                dim = {"query": "embed_dim", "key": "kdim", "value": "vdim"}[name]
                raise ValueError(f"{_NAME}: {name} must have width {dim}={width}, got shape {tuple(t.shape)}")
        if int(k.shape[0]) != B or int(v.shape[0]) != B or tuple(v.shape[:2]) != tuple(k.shape[:2]):
            raise ValueError(
                f"{_NAME}: key and value must share the batch and the length S, and the batch of query; got "
                f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if is_causal and attn_mask is None:
            raise ValueError(f"{_NAME}: is_causal=True needs attn_mask (torch's is_causal is a hint about attn_mask)")
        if not batched and key_padding_mask is not None:
            if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.ndim != 1:
                shape = tuple(key_padding_mask.shape) if isinstance(key_padding_mask, torch.Tensor) else None
                raise ValueError(f"{_NAME}: key_padding_mask must have shape (S,) for unbatched input, got {shape}")
            key_padding_mask = key_padding_mask[None]
        causal = is_causal and key_padding_mask is None and not need_weights
        allowed, additive = self._masks(B, L, S, q.dtype, key_padding_mask, attn_mask, causal)

        self_attention = k is q and v is q and not self._extras
        x_key = self._append_tokens(k)
        x_value = x_key if v is k else self._append_tokens(v)
        mech: Mechanism = self.mechanism()
        if additive is not None:
            mech = mech + ScoreBias(additive.transpose(-1, -2).expand(-1, self.num_heads, -1, -1))
        mask = None if allowed is None else allowed.transpose(-1, -2)  # ours: [key, query]
        basis: AttentionBasis | DenseBasis = attention_basis(
            x_key, None if self_attention else q, mechanism=mech, mask=mask
        )
        theta = self.parameter()
        drop = self.training and self.dropout > 0.0
        weights = None  # torch's layout (B, H, L, S + e)
        if need_weights or drop:
            weights = basis.to_dense().transpose(-1, -2)
            if drop:
                weights = F.dropout(weights.contiguous(), self.dropout, training=True)
            basis = DenseBasis.of_weights(weights.transpose(-1, -2))
        y: torch.Tensor = conv(basis, x_value, theta)

        vb = self._value_bias()
        mass = None  # each column's total weight, (B or 1, H or 1, L), where it may differ from 1
        if drop and weights is not None:
            mass = weights.sum(-1)
        elif allowed is not None:
            mass = allowed.any(-1).to(y.dtype)
        if vb is not None and mass is not None:  # the value bias, times each column's mass
            y = y + torch.einsum("bhl,he->ble", mass.expand(-1, self.num_heads, -1), vb)
            if self.out_proj.bias is not None:
                y = y + self.out_proj.bias
        else:
            bias = self.output_bias() if vb is not None else self.out_proj.bias
            if bias is not None:
                y = y + bias

        if batched and not self.batch_first:
            y = y.transpose(0, 1)
        if not batched:
            y = y[0]
        if not need_weights or weights is None:
            return y, None
        out_w = weights.mean(1) if average_attn_weights else weights
        return y, (out_w if batched else out_w[0])

    def _batch_first(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, batched: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The inputs as ``(N, L, E)``, ``(N, S, kdim)``, ``(N, S, vdim)``, keeping shared tensors shared."""
        if not batched:
            q = query[None]
            k = q if key is query else key[None]
            v = k if value is key else (q if value is query else value[None])
            return q, k, v
        if self.batch_first:
            return query, key, value
        q = query.transpose(0, 1)
        k = q if key is query else key.transpose(0, 1)
        v = k if value is key else (q if value is query else value.transpose(0, 1))
        return q, k, v
