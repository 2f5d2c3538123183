r"""The content terms of :class:`~structconv.nn.PositionalAttention`: queries and keys of the input."""

from __future__ import annotations

import math
from typing import Any, Self

import torch
from torch import nn

from ..backend.checks import positive_int
from ..structures.attention import BiAffine
from .positional_base import Encoding, flag, optional_positive_int

__all__ = ["ContentHeads"]


class ContentHeads(Encoding):
    r"""Content-based scores of every head: :math:`(x W^q_h + b^q_h)\cdot(x W^k_h + b^k_h)/\sqrt D`.

    Given to :class:`~structconv.nn.PositionalAttention` as ``content=``, the scores are added to
    those of the positional heads before the softmax (as in Cordonnier et al.'s code); with
    :class:`LearnedHeads` ``(relative_terms=True)`` they are part of the four terms of their
    Eq. 5 instead (:class:`~structconv.RelativeAttention`).  The heads then depend on the input,
    and the layer's basis is one ``(B, K, M, M)`` tensor per batch.  The projections are
    initialised as ``torch.nn.Linear(E, K D)``'s (uniform in :math:`\pm 1/\sqrt E`).

    Parameters
    ----------
    key_dim : int, optional
        :math:`D`, the width of a head's queries and keys; ``None`` gives
        ``embed_dim // num_heads`` (at least 1) when the layer binds it.
    bias : bool, default False
        Whether the queries and keys have biases :math:`b^q_h, b^k_h` (the paper's code has them).

    Shapes
    ------
    - **query**, **key:** :math:`W^q, W^k`, :math:`(K, E, D)` for a layer of :math:`K` heads of width :math:`E`
    - **query_bias**, **key_bias:** :math:`(K, D)`, with ``bias=True`` only

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import ContentHeads, PositionalAttention
    >>> content = ContentHeads(key_dim=3, bias=True)
    >>> layer = PositionalAttention((4, 4), 8, 2, content=content)
    >>> layer.content
    ContentHeads(key_dim=3, bias=True)
    >>> layer.content.query.shape, layer.content.query_bias.shape
    (torch.Size([2, 8, 3]), torch.Size([2, 3]))
    >>> layer(torch.randn(5, 16, 8)).shape
    torch.Size([5, 16, 8])
    """

    shown = ("key_dim", "bias")
    key: nn.Parameter
    query: nn.Parameter
    key_bias: nn.Parameter
    query_bias: nn.Parameter

    def __init__(self, *, key_dim: int | None = None, bias: bool = False) -> None:
        super().__init__()
        name = type(self).__name__
        self.key_dim = optional_positive_int(name, "key_dim", key_dim)
        self.bias = flag(name, "bias", bias)
        self.num_heads = 0  # 0 until bound to a layer

    def options(self) -> dict[str, Any]:
        return {"key_dim": self.key_dim, "bias": self.bias}

    def key_width(self, num_heads: int, embed_dim: int) -> int:
        """:math:`D` for a layer of ``num_heads`` heads and width ``embed_dim``: ``key_dim`` or its default."""
        return self.key_dim or max(1, embed_dim // num_heads)

    def bind(self, num_heads: int, embed_dim: int) -> Self:
        """A new ``ContentHeads`` of these options, with its parameters for the layer's sizes at their initial values.

        Parameters
        ----------
        num_heads, embed_dim
            The layer's :math:`K` and :math:`E`.
        """
        name = type(self).__name__
        H = positive_int(num_heads, "num_heads", where=name)
        E = positive_int(embed_dim, "embed_dim", where=name)
        bound: Self = type(self)(key_dim=self.key_width(H, E), bias=self.bias)
        bound.num_heads = H
        D = bound.key_width(H, E)
        bound.key = nn.Parameter(torch.empty(H, E, D))
        bound.query = nn.Parameter(torch.empty(H, E, D))
        limit = 1.0 / math.sqrt(E)  # torch.nn.Linear(E, H * D)'s initialisation
        for w in (bound.key, bound.query):
            nn.init.uniform_(w, -limit, limit)
        if bound.bias:
            bound.key_bias = nn.Parameter(torch.empty(H, D).uniform_(-limit, limit))
            bound.query_bias = nn.Parameter(torch.empty(H, D).uniform_(-limit, limit))
        return bound

    def mechanism(self) -> BiAffine:
        """The content scores as a :class:`~structconv.BiAffine` mechanism (of a bound ``ContentHeads``)."""
        if not self.num_heads:
            raise ValueError(
                f"{type(self).__name__} is not bound to a layer; give it to PositionalAttention(content=...)"
            )
        biases = {"key_bias": self.key_bias, "query_bias": self.query_bias} if self.bias else {}
        assert self.key_dim is not None  # resolved by bind
        return BiAffine(key=self.key, query=self.query, scale=1.0 / math.sqrt(self.key_dim), **biases)
