"""torch's conventions for :class:`~structconv.nn.MultiHeadSelfAttention`: parameters, masks, layouts, tokens.

``torch.nn.MultiheadAttention`` takes sequence-first or batch-first inputs, boolean or additive
masks in a ``[query, key]`` layout, and may append key/value tokens; these helpers turn them into
the batch-first inputs, boolean ``allowed`` mask and finite additive scores of an attention basis.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..backend.checks import check_memory

_NAME = "MultiHeadSelfAttention"


def split_mask(mask: torch.Tensor, name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def torch_masks(
    B: int,
    L: int,
    S: int,
    dtype: torch.dtype,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    causal: bool,
    H: int,
    e: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """torch's masks -> (``allowed``, additive or None), each ``(B or 1, H or 1, L, S + e)`` (torch's layout).

    ``H`` heads, ``e`` appended key tokens (never masked); ``causal`` replaces ``attn_mask`` by
    the top-left causal mask, as ``scaled_dot_product_attention`` does.  On the meta ``device``
    the masks are read on the host and the allowed set placed on meta (torch takes host masks
    there too); the finite additive part is dropped, as it changes no shape and a meta run holds
    no scores to add it to.  A mask on meta is refused: its values are read.
    """
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
        if mask.device.type == "meta":
            raise ValueError(
                f"{_NAME}: {name} is on the meta device: the layer reads its values (checked, then folded into "
                "the scores), which a meta tensor does not hold; give it on the host (CPU)"
            )
        ok, add = split_mask(mask, name, dtype)
        allowed = ok if allowed is None else allowed & ok
        if add is not None:
            additive = add if additive is None else additive + add
    if e and (allowed is not None or additive is not None):  # the appended tokens are never masked
        if allowed is not None:
            allowed = F.pad(allowed, (0, e), value=True)
        if additive is not None:
            additive = F.pad(additive, (0, e))
    meta = device.type == "meta"
    if causal:  # torch drops attn_mask for scaled_dot_product_attention's causal mask (top-left)
        allowed = torch.ones(L, S + e, dtype=torch.bool, device="cpu" if meta else device).tril()[None, None]
        additive = None
    if allowed is not None:
        allowed = None if bool(allowed.all()) else allowed.expand(-1, -1, L, -1)
    if additive is not None:
        additive = None if meta else additive.expand(-1, -1, L, -1)
    if meta and allowed is not None:
        allowed = allowed.to(device)
    return allowed, additive


def append_tokens(t: torch.Tensor, e: int) -> torch.Tensor:
    """``(B, S, P)`` -> ``(B, S + e, P + e)``: the inputs, then one identity row per appended token."""
    if not e:
        return t
    B, S, P = (int(s) for s in t.shape)
    eye = torch.eye(e, dtype=t.dtype, device=t.device)
    top = torch.cat([t, t.new_zeros(B, S, e)], -1)
    bottom = torch.cat([t.new_zeros(e, P), eye], -1).expand(B, e, P + e)
    return torch.cat([top, bottom], 1)


def batch_first(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, batched: bool, first: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs as ``(N, L, E)``, ``(N, S, kdim)``, ``(N, S, vdim)``, keeping shared tensors shared."""
    if batched and first:
        return query, key, value

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(0, 1) if batched else t[None]

    q = move(query)
    k = q if key is query else move(key)
    v = k if value is key else (q if value is query else move(value))
    return q, k, v


def checked_inputs(
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
) -> tuple[bool, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Check ``forward``'s arguments against ``layer``; (batched, q, k, v, key_padding_mask), batch first."""
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
    q, k, v = batch_first(query, key, value, batched, layer.batch_first)
    B = int(q.shape[0])
    for name, t, width in (("query", q, layer.embed_dim), ("key", k, layer.kdim), ("value", v, layer.vdim)):
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
    return batched, q, k, v, key_padding_mask


def register_torch_parameters(layer: Any, bias: bool, add_bias_kv: bool, factory: dict[str, Any]) -> None:
    """Give ``layer`` the parameters of ``torch.nn.MultiheadAttention``, same names and shapes (uninitialised).

    ``layer`` already holds ``embed_dim``, ``kdim``, ``vdim`` and ``_qkv_same_embed_dim``.  Parameters
    larger than the memory of their device are refused, naming the sizes, before any is allocated.
    """
    embed_dim = layer.embed_dim
    probe = torch.empty(0, **factory)
    # in_proj_weight (or q/k/v_proj_weight), out_proj.weight, in_proj_bias, out_proj.bias, bias_k, bias_v
    need = (embed_dim * (2 * embed_dim + layer.kdim + layer.vdim) + 6 * embed_dim) * probe.element_size()
    sizes = f"{_NAME}: embed_dim={embed_dim}, kdim={layer.kdim} and vdim={layer.vdim} ask for parameters that"
    check_memory(need, probe, sizes)
    if layer._qkv_same_embed_dim:
        layer.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
        layer.register_parameter("q_proj_weight", None)
        layer.register_parameter("k_proj_weight", None)
        layer.register_parameter("v_proj_weight", None)
    else:
        layer.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))
        layer.k_proj_weight = nn.Parameter(torch.empty(embed_dim, layer.kdim, **factory))
        layer.v_proj_weight = nn.Parameter(torch.empty(embed_dim, layer.vdim, **factory))
        layer.register_parameter("in_proj_weight", None)
    if bias:
        layer.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))
    else:
        layer.register_parameter("in_proj_bias", None)
    layer.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
    if add_bias_kv:
        layer.bias_k = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
        layer.bias_v = nn.Parameter(torch.empty(1, 1, embed_dim, **factory))
    else:
        layer.bias_k = layer.bias_v = None


def projection(layer: Any, which: int) -> Any:
    """torch's projection weight ``W`` (``x W^T``) of the query (0), key (1) or value (2)."""
    if layer.in_proj_weight is not None:
        E = layer.embed_dim
        return layer.in_proj_weight[which * E : (which + 1) * E]
    w = (layer.q_proj_weight, layer.k_proj_weight, layer.v_proj_weight)[which]
    assert w is not None
    return w


def projection_bias(layer: Any, which: int) -> Any:
    """Per-head bias ``(H, D)`` of the query (0), key (1) or value (2) projection."""
    if layer.in_proj_bias is None:
        return None
    E = layer.embed_dim
    return layer.in_proj_bias[which * E : (which + 1) * E].reshape(layer.num_heads, layer.head_dim)


def per_head(layer: Any, w: torch.Tensor) -> torch.Tensor:
    """``(E, P)`` torch projection ``W`` (``x W^T``) -> per-head ``(H, P, D)``."""
    return w.T.reshape(int(w.shape[1]), layer.num_heads, layer.head_dim).permute(1, 0, 2)


def head_weights(layer: Any, which: int) -> torch.Tensor:
    r"""Per-head projection ``(H, P [+ e], D)`` of the key (1) or value (2), then the rows of the appended tokens."""
    weights = per_head(layer, projection(layer, which))
    extra = layer.bias_k if which == 1 else layer.bias_v
    rows = []
    if extra is not None:
        rows.append(extra.reshape(layer.num_heads, layer.head_dim))
    if layer.add_zero_attn:
        rows.append(torch.zeros_like(weights[:, 0]))
    if not rows:
        return weights
    stacked = torch.stack(rows, 1)
    bias = projection_bias(layer, which)
    return torch.cat([weights, stacked if bias is None else stacked - bias[:, None]], 1)
