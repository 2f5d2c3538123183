"""The learnable parameters of :class:`~structconv.nn.PositionalAttention`: option checks and initial values."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..structures.grid import BOUNDARIES
from ..structures.positional import relative_offsets

ENCODINGS = ("quadratic", "gaussian", "learned")
WIDTHS = ("exp", "spread")


def _positive_int(layer: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}")
    return value


def check_options(
    name: str,
    encoding: str,
    boundary: str,
    alpha: float,
    threshold: float | None,
    width: str,
    attention_dropout: float,
    width_noise: float,
    centre_var: float,
) -> None:
    """Raise a ``ValueError`` naming the layer ``name`` for the first option out of its range."""
    if encoding not in ENCODINGS:
        raise ValueError(f"{name}: encoding must be one of {ENCODINGS}, got {encoding!r}")
    if boundary not in BOUNDARIES:
        raise ValueError(f"{name}: boundary must be one of {BOUNDARIES}, got {boundary!r}")
    if not alpha > 0:
        raise ValueError(f"{name}: alpha must be positive, got {alpha!r}")
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ValueError(f"{name}: threshold must lie in (0, 1) or be None, got {threshold!r}")
    if width not in WIDTHS:
        raise ValueError(f"{name}: width must be one of {WIDTHS}, got {width!r}")
    if not 0.0 <= attention_dropout < 1.0:
        raise ValueError(f"{name}: attention_dropout must lie in [0, 1), got {attention_dropout!r}")
    if not width_noise >= 0.0 or not centre_var >= 0.0:
        raise ValueError(f"{name}: width_noise and centre_var must be >= 0, got {width_noise!r}, {centre_var!r}")


def register_encoding(
    layer: Any,
    alpha: float,
    centre_var: float,
    width_noise: float,
    positional_dim: int | None,
    content_bias: bool,
) -> None:
    """Give ``layer`` the parameters of its encoding and content terms, at their initial values.

    ``layer`` already holds its grid, widths, head count and options (see
    :class:`~structconv.nn.PositionalAttention` for the initialisations).
    """
    name, H, E, D = type(layer).__name__, layer.num_heads, layer.embed_dim, layer.key_dim
    encoding, content, width, d = layer.encoding, layer.content, layer.width, len(layer.grid)
    if encoding in ("quadratic", "gaussian"):
        layer.centres = nn.Parameter(torch.randn(H, d) * math.sqrt(centre_var))
        start = math.sqrt(2 * alpha)
        if encoding == "gaussian":
            noise = torch.randn(H, d, d) * width_noise
            layer.inv_sqrt_cov = nn.Parameter(torch.eye(d).repeat(H, 1, 1) * start + noise)
        elif width == "exp":
            layer.log_alpha = nn.Parameter(torch.full((H,), math.log(alpha)))
        else:
            layer.spread = nn.Parameter(start + torch.randn(H) * width_noise)
    else:
        Dp = layer.positional_dim = _positive_int(name, "positional_dim", positional_dim or E)
        if Dp < d:
            raise ValueError(f"{name}: positional_dim={Dp} must be at least the grid's {d} dimensions")
        widths = [Dp // d + (1 if i < Dp % d else 0) for i in range(d)]
        lengths = relative_offsets(layer.grid, layer.boundary).lengths
        layer.tables = nn.ParameterList(nn.Parameter(torch.randn(n, w)) for n, w in zip(lengths, widths, strict=True))
        if content and layer.relative_terms:
            layer.rel_key = nn.Parameter(torch.randn(H, Dp, D) / math.sqrt(Dp))
            layer.u = nn.Parameter(torch.zeros(H, D))
            layer.v = nn.Parameter(torch.zeros(H, D))
        else:  # one key per head and axis, as a linear map of that axis' row (torch.nn.Linear's init)
            bound = 1.0 / math.sqrt(max(widths))
            layer.weight = nn.Parameter(torch.empty(H, Dp).uniform_(-bound, bound))
    if content:
        layer.key = nn.Parameter(torch.empty(H, E, D))
        layer.query = nn.Parameter(torch.empty(H, E, D))
        bound = 1.0 / math.sqrt(E)  # torch.nn.Linear(E, H * D)'s initialisation
        for w in (layer.key, layer.query):
            nn.init.uniform_(w, -bound, bound)
        if content_bias and not layer.relative_terms:
            layer.key_bias = nn.Parameter(torch.empty(H, D).uniform_(-bound, bound))
            layer.query_bias = nn.Parameter(torch.empty(H, D).uniform_(-bound, bound))
