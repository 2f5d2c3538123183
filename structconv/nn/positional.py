r"""Relative-position multi-head self-attention on a grid: the layer of Cordonnier et al.'s study."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..attention import BiAffine, Mechanism, attention_basis
from ..basis import Basis
from ..contract import conv
from ..factor import LowRank
from ..grid import BOUNDARIES
from ..positional import (
    GaussianPosition,
    LearnedPosition,
    PositionalMechanism,
    QuadraticPosition,
    RelativeAttention,
    relative_offsets,
)

ENCODINGS = ("quadratic", "gaussian", "learned")


def _positive_int(layer: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}")
    return value


class PositionalAttention(nn.Module):
    r"""Multi-head self-attention over the positions of a grid, :math:`y = \sum_h A_h^\top x\,\Theta_h + \beta`.

    The heads :math:`A_h` come from a relative-position encoding (:mod:`structconv.positional`):

    * ``"quadratic"``: isotropic Gaussians :math:`-\alpha_h\lVert\delta - \Delta_h\rVert^2`
      (learnable centres, initialised :math:`\mathcal N(0, \mathrm{centre\_var}\,I)`, and widths
      :math:`\alpha_h = e^{\log\alpha_h}`);
    * ``"gaussian"``: non-isotropic Gaussians with :math:`\Sigma_h^{-1} = S_h^\top S_h`
      (initialised isotropic, :math:`S_h = \sqrt{2\alpha}\,I`);
    * ``"learned"``: learned per-axis relative embeddings (:math:`D_p` = ``positional_dim``,
      default ``embed_dim``) scored by one vector per head.

    ``content=True`` adds content-based attention: for ``"learned"`` all four terms of Eq. 5
    (:class:`~structconv.positional.RelativeAttention`), for the Gaussians a scaled dot-product
    term added to the positional scores.  Without content the heads do not depend on the
    input, so they are built once per forward for the whole batch, as truncated renormalised
    shift bases when that is cheaper (``threshold``, see
    :meth:`~structconv.positional.PositionalMechanism.basis`; ``None`` keeps the exact dense
    softmax).

    The parameter is :math:`\Theta_h` of shape ``(H, E, E)`` when ``head_dim`` is ``None`` (the
    paper's :math:`D_h = D_{\mathrm{out}}`: the heads' outputs concatenated, then one linear
    map), otherwise :math:`\Theta_h = W^v_h W^{o\top}_h` of rank ``head_dim``
    (:class:`~structconv.LowRank`).

    Input is ``(B, *grid, E)`` or the flattened ``(B, M, E)``; ``grid`` is fixed at construction.
    """

    def __init__(
        self,
        grid: tuple[int, ...],
        embed_dim: int,
        num_heads: int,
        encoding: str = "quadratic",
        content: bool = False,
        head_dim: int | None = None,
        key_dim: int | None = None,
        positional_dim: int | None = None,
        boundary: str = "zero",
        threshold: float | None = 1e-7,
        alpha: float = 1.0,
        centre_var: float = 2.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if encoding not in ENCODINGS:
            raise ValueError(f"{name}: encoding must be one of {ENCODINGS}, got {encoding!r}")
        if boundary not in BOUNDARIES:
            raise ValueError(f"{name}: boundary must be one of {BOUNDARIES}, got {boundary!r}")
        if not alpha > 0:
            raise ValueError(f"{name}: alpha must be positive, got {alpha!r}")
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError(f"{name}: threshold must lie in (0, 1) or be None, got {threshold!r}")
        self.grid = tuple(_positive_int(name, "grid", int(s)) for s in grid)
        E = self.embed_dim = _positive_int(name, "embed_dim", embed_dim)
        H = self.num_heads = _positive_int(name, "num_heads", num_heads)
        self.encoding, self.content, self.boundary, self.threshold = encoding, bool(content), boundary, threshold
        d = len(self.grid)
        D = self.key_dim = _positive_int(name, "key_dim", key_dim or max(1, E // H))
        self.head_dim = None if head_dim is None else _positive_int(name, "head_dim", head_dim)
        if self.head_dim is None:
            self.theta = nn.Parameter(torch.empty(H, E, E))
        else:
            self.value = nn.Parameter(torch.empty(H, E, self.head_dim))
            self.out = nn.Parameter(torch.empty(H, E, self.head_dim))
        self.bias = nn.Parameter(torch.zeros(E)) if bias else None
        if encoding in ("quadratic", "gaussian"):
            self.centres = nn.Parameter(torch.randn(H, d) * math.sqrt(centre_var))
            if encoding == "quadratic":
                self.log_alpha = nn.Parameter(torch.full((H,), math.log(alpha)))
            else:
                self.inv_sqrt_cov = nn.Parameter(torch.eye(d).repeat(H, 1, 1) * math.sqrt(2 * alpha))
        else:
            Dp = self.positional_dim = _positive_int(name, "positional_dim", positional_dim or E)
            if Dp < d:
                raise ValueError(f"{name}: positional_dim={Dp} must be at least the grid's {d} dimensions")
            widths = [Dp // d + (1 if i < Dp % d else 0) for i in range(d)]
            lengths = relative_offsets(self.grid, boundary).lengths
            self.tables = nn.ParameterList(
                nn.Parameter(torch.randn(n, w)) for n, w in zip(lengths, widths, strict=True)
            )
            if content:
                self.rel_key = nn.Parameter(torch.randn(H, Dp, D) / math.sqrt(Dp))
                self.u = nn.Parameter(torch.zeros(H, D))
                self.v = nn.Parameter(torch.zeros(H, D))
            else:
                self.weight = nn.Parameter(torch.randn(H, Dp) / math.sqrt(Dp))
        if content:
            self.key = nn.Parameter(torch.empty(H, E, D))
            self.query = nn.Parameter(torch.empty(H, E, D))
            for w in (self.key, self.query):
                nn.init.xavier_uniform_(w.view(H * E, D))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise the channel maps as ``torch.nn.Linear`` would (fan-in of the concatenated heads)."""
        if self.head_dim is None:
            bound = 1.0 / math.sqrt(self.num_heads * self.embed_dim)
            nn.init.uniform_(self.theta, -bound, bound)
        else:
            H, E, Dh = self.num_heads, self.embed_dim, self.head_dim
            nn.init.xavier_uniform_(self.value.view(H * E, Dh))
            nn.init.xavier_uniform_(self.out.view(H * E, Dh))

    def positional_parameters(self) -> list[nn.Parameter]:
        """The centres and widths of Gaussian heads (kept out of weight decay in the CIFAR study)."""
        names = ("centres", "log_alpha", "inv_sqrt_cov")
        return [p for n, p in self.named_parameters(recurse=False) if n in names]

    def mechanism(self) -> Mechanism:
        """The heads' mechanism (position-only, or content and position)."""
        if self.encoding == "learned":
            tables = tuple(self.tables)
            if not self.content:
                return LearnedPosition(self.grid, tables, self.weight, self.boundary)
            return RelativeAttention(
                self.grid, tables, self.key, self.query, self.rel_key, self.u, self.v, self.boundary,
                scale=1.0 / math.sqrt(self.key_dim),
            )  # fmt: skip
        position: PositionalMechanism
        if self.encoding == "quadratic":
            position = QuadraticPosition(self.grid, self.centres, self.log_alpha.exp(), self.boundary, positive=True)
        else:
            position = GaussianPosition(self.grid, self.centres, self.inv_sqrt_cov, self.boundary)
        if not self.content:
            return position
        return BiAffine(key=self.key, query=self.query, scale=1.0 / math.sqrt(self.key_dim)) + position

    def parameter(self) -> torch.Tensor | LowRank:
        """:math:`\\Theta`: ``(H, E, E)``, or ``LowRank(value, out)`` when ``head_dim`` is set."""
        return self.theta if self.head_dim is None else LowRank(self.value, self.out)

    def theta_device(self) -> torch.device:
        """The device of the layer's parameters."""
        return next(self.parameters()).device

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        M = math.prod(self.grid)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: x must be a torch.Tensor, got {type(x).__name__}")
        shape = tuple(x.shape)
        ok = (x.ndim == 3 and shape[1:] == (M, self.embed_dim)) or shape[1:] == (*self.grid, self.embed_dim)
        if not ok:
            raise ValueError(
                f"{type(self).__name__}: x must have shape (B, {M}, {self.embed_dim}) or "
                f"(B, {', '.join(map(str, self.grid))}, {self.embed_dim}), got {shape}"
            )
        return x.reshape(shape[0], M, self.embed_dim)

    def basis(self, x: torch.Tensor | None = None) -> Basis:
        """The heads: shared ``(H, M, M)`` without content, ``(B, H, M, M)`` for ``x`` with content."""
        mech = self.mechanism()
        if isinstance(mech, PositionalMechanism):
            # Shared by the batch and cheap: built in the parameters' precision even under autocast
            # (bf16 scores would blur the Gaussians); the engine converts the finished weights.
            with torch.autocast(self.theta_device().type, enabled=False):
                return mech.basis(self.threshold)
        if x is None:
            raise ValueError(f"{type(self).__name__}: content attention needs x to build its heads")
        return attention_basis(self._flat(x), mechanism=mech)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the grid positions of ``x``."""
        flat = self._flat(x)
        y: torch.Tensor = conv(self.basis(flat), flat, self.parameter())
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(x.shape)
