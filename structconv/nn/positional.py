r"""Relative-position multi-head self-attention on a grid: the layer of Cordonnier et al.'s study."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..backend.torch_autocast import autocast_dtype, autocast_off, check_input_dtype
from ..bases.base import Basis
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank
from ..bases.grid_args import _grid
from ..engine.contract import conv
from ..structures.attention import BiAffine, Mechanism, attention_basis
from ..structures.positional import (
    GaussianPosition,
    LearnedPosition,
    PositionalMechanism,
    QuadraticPosition,
    RelativeAttention,
)
from ._module import NotScriptable
from .positional_params import ENCODINGS, WIDTHS, _positive_int, check_options, register_encoding

__all__ = ["ENCODINGS", "WIDTHS", "PositionalAttention"]


class PositionalAttention(NotScriptable, nn.Module):
    r"""Multi-head self-attention over the positions of a grid, :math:`y = \sum_h A_h^\top x\,\Theta_h + \beta`.

    The heads :math:`A_h` come from a relative-position encoding (:mod:`structconv.structures.positional`):

    * ``"quadratic"``: isotropic Gaussians :math:`-\alpha_h\lVert\delta - \Delta_h\rVert^2`
      (learnable centres, initialised :math:`\mathcal N(0, \mathrm{centre\_var}\,I)`, and widths:
      ``width="exp"`` learns :math:`\log\alpha_h`, started at ``alpha``; ``width="spread"``
      learns :math:`s_h` with :math:`\alpha_h = s_h^2/2`, started at :math:`\sqrt{2\alpha}` plus
      :math:`\mathcal N(0, \mathrm{width\_noise}^2)`, as Cordonnier et al.'s code does);
    * ``"gaussian"``: non-isotropic Gaussians :math:`-\tfrac12\lVert S_h(\delta - \Delta_h)\rVert^2`,
      :math:`\Sigma_h^{-1} = S_h^\top S_h`, started at :math:`S_h = \sqrt{2\alpha}\,I` plus
      :math:`\mathcal N(0, \mathrm{width\_noise}^2)` per entry;
    * ``"learned"``: learned per-axis relative embeddings (:math:`D_p` = ``positional_dim`` in all,
      split evenly over the axes; default ``embed_dim``) scored by one vector per head and axis.

    ``content=True`` adds content-based attention.  With ``relative_terms=True`` (``"learned"``
    only) these are the four terms of Eq. 5 (:class:`~structconv.structures.positional.RelativeAttention`);
    otherwise a scaled dot product :math:`(x W^q_h + b^q_h)\cdot(x W^k_h + b^k_h)/\sqrt{D}`
    (``key_dim`` :math:`= D`, biases when ``content_bias``) added to the positional scores, as in
    the paper's code.  Without content the heads do not depend on the input, so they are built
    once per forward for the whole batch: exactly, as a Kronecker product of per-axis softmaxes
    for separable heads (quadratic, learned), else as truncated renormalised shift bases when
    that is cheaper (``threshold``, see
    :meth:`~structconv.structures.positional.PositionalMechanism.basis`; ``None`` keeps the exact
    softmax).

    The parameter is :math:`\Theta_h` of shape ``(H, E, E)`` when ``head_dim`` is ``None`` (the
    paper's :math:`D_h = D_{\mathrm{out}}`: every head averages the raw input, then one linear
    map of the concatenated heads), otherwise :math:`\Theta_h = W^v_h W^{o\top}_h` of rank
    ``head_dim`` (:class:`~structconv.LowRank`).

    ``attention_dropout`` drops attention weights in training, after the softmax (scaled by
    :math:`1/(1-p)`).  ``dropout_shared=None`` (the default) does what Cordonnier et al.'s code
    does: position-only heads are one ``(H, M, M)`` tensor with no batch axis, and one mask per
    step is drawn for it, shared by every image of the batch (the heads stay one shared basis);
    content heads are per image, and so are their masks.  ``dropout_shared=False`` draws a mask
    per image for position-only heads too (another regulariser: the shared heads become one
    ``(B, H, M, M)`` basis per batch, which costs the sharing); ``True`` is the default's rule
    for position-only heads and changes nothing for content heads, whose weights are per image.

    Input is ``(B, *grid, E)`` or the flattened ``(B, M, E)``; ``grid`` is fixed at construction.
    """

    # Registered by register_encoding, depending on the encoding and the content terms.
    centres: nn.Parameter
    log_alpha: nn.Parameter
    spread: nn.Parameter
    inv_sqrt_cov: nn.Parameter
    tables: nn.ParameterList
    weight: nn.Parameter
    rel_key: nn.Parameter
    u: nn.Parameter
    v: nn.Parameter
    key: nn.Parameter
    query: nn.Parameter
    key_bias: nn.Parameter
    query_bias: nn.Parameter

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
        width: str = "exp",
        width_noise: float = 0.0,
        relative_terms: bool = True,
        content_bias: bool = False,
        attention_dropout: float = 0.0,
        dropout_shared: bool | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_options(name, encoding, boundary, alpha, threshold, width, attention_dropout, width_noise, centre_var)
        try:
            self.grid = _grid(grid)
        except (TypeError, ValueError) as error:  # the layer's name first, like its other arguments
            raise type(error)(f"{name}: {error}") from None
        E = self.embed_dim = _positive_int(name, "embed_dim", embed_dim)
        H = self.num_heads = _positive_int(name, "num_heads", num_heads)
        self.encoding, self.content, self.boundary, self.threshold = encoding, bool(content), boundary, threshold
        self.width = width
        self.relative_terms = bool(relative_terms) and encoding == "learned"
        self.attention_dropout = float(attention_dropout)
        self.dropout_shared = None if dropout_shared is None else bool(dropout_shared)
        self.key_dim = _positive_int(name, "key_dim", key_dim or max(1, E // H))
        self.head_dim = None if head_dim is None else _positive_int(name, "head_dim", head_dim)
        if self.head_dim is None:
            self.theta = nn.Parameter(torch.empty(H, E, E))
        else:
            self.value = nn.Parameter(torch.empty(H, E, self.head_dim))
            self.out = nn.Parameter(torch.empty(H, E, self.head_dim))
        self.bias = nn.Parameter(torch.empty(E)) if bias else None
        register_encoding(self, alpha, centre_var, width_noise, positional_dim, content_bias)
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
            bound = 1.0 / math.sqrt(H * Dh)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def positional_parameters(self) -> list[nn.Parameter]:
        """The centres and widths of Gaussian heads (kept out of weight decay in the CIFAR study)."""
        names = ("centres", "log_alpha", "spread", "inv_sqrt_cov")
        return [p for n, p in self.named_parameters(recurse=False) if n in names]

    def alpha(self) -> torch.Tensor:
        r""":math:`\alpha_h` of the quadratic heads (``(H,)``): :math:`e^{\log\alpha_h}` or :math:`s_h^2/2`."""
        if self.encoding != "quadratic":
            raise ValueError(f"{type(self).__name__}: alpha() belongs to the quadratic encoding, not {self.encoding!r}")
        return self.log_alpha.exp() if self.width == "exp" else 0.5 * self.spread * self.spread

    @torch.no_grad()
    def set_alpha(self, alpha: float | torch.Tensor) -> None:
        r"""Set :math:`\alpha_h` (a number or ``(H,)`` values, all positive) in the layer's width parametrisation."""
        values = torch.as_tensor(alpha, dtype=self.centres.dtype, device=self.centres.device).expand(self.num_heads)
        if self.encoding != "quadratic" or not bool((values > 0).all()):
            raise ValueError(f"{type(self).__name__}: set_alpha needs the quadratic encoding and positive values")
        if self.width == "exp":
            self.log_alpha.copy_(values.log())
        else:
            self.spread.copy_((2 * values).sqrt())

    def mechanism(self) -> Mechanism:
        """The heads' mechanism (position-only, or content and position)."""
        position: PositionalMechanism
        if self.encoding == "learned":
            tables = tuple(self.tables)
            if self.content and self.relative_terms:
                return RelativeAttention(
                    self.grid, tables, self.key, self.query, self.rel_key, self.u, self.v, self.boundary,
                    scale=1.0 / math.sqrt(self.key_dim),
                )  # fmt: skip
            position = LearnedPosition(self.grid, tables, self.weight, self.boundary)
        elif self.encoding == "quadratic":
            position = QuadraticPosition(self.grid, self.centres, self.alpha(), self.boundary, positive=True)
        else:
            position = GaussianPosition(self.grid, self.centres, self.inv_sqrt_cov, self.boundary)
        if not self.content:
            return position
        biases = {"key_bias": getattr(self, "key_bias", None), "query_bias": getattr(self, "query_bias", None)}
        return BiAffine(key=self.key, query=self.query, scale=1.0 / math.sqrt(self.key_dim), **biases) + position

    def parameter(self) -> torch.Tensor | LowRank:
        r""":math:`\Theta`: ``(H, E, E)``, or ``LowRank(value, out)`` when ``head_dim`` is set."""
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
            with autocast_off(self.theta_device().type):
                return mech.basis(self.threshold)
        if x is None:
            raise ValueError(f"{type(self).__name__}: content attention needs x to build its heads")
        return attention_basis(self._flat(x), mechanism=mech)

    def dropped(self, basis: Basis, batch: int) -> Basis:
        """``basis`` with :attr:`attention_dropout` applied (in training; ``basis`` itself otherwise)."""
        if not self.training or self.attention_dropout == 0.0:
            return basis
        weights = basis.to_dense()
        narrow = autocast_dtype(weights.device.type)
        if narrow is not None and weights.dtype == torch.float32:
            weights = weights.to(narrow)  # drop in the dtype the products run in
        p = self.attention_dropout
        if weights.ndim == 3 and self.dropout_shared is False:
            # Every image its own mask, drawn in (B, M, H, N) memory order: the engine then reads the
            # heads of an image as one (M H, N) matrix without copying the largest tensor again.
            weights = weights.permute(1, 0, 2)[None].expand(batch, -1, -1, -1).contiguous()
            weights = F.dropout(weights, p, training=True).permute(0, 2, 1, 3)
        else:
            weights = F.dropout(weights, p, training=True)
        # Weights the layer just computed (a softmax, then dropout): finite by construction, so the
        # finiteness check, a host synchronisation per layer and step on a GPU, is skipped.
        return DenseBasis.of_weights(weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the grid positions of ``x``."""
        flat = self._flat(x)
        check_input_dtype(flat, self.theta if self.head_dim is None else self.value, type(self).__name__)
        heads = self.basis(flat)
        basis = self.dropped(heads, int(flat.shape[0]))
        # Heads dropped out per image are stored for the x-Theta-first order's batched GEMM, which
        # reads them in place (see structconv.backend.torch._instance_gemms); otherwise the engine plans.
        per_image = basis is not heads and basis.batch is not None and self.head_dim is None
        y: torch.Tensor = conv(basis, flat, self.parameter(), order="xtheta" if per_image else "auto")
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)  # under autocast, as torch.nn.Linear's bias: no float32 copy
        return y.reshape(x.shape)
