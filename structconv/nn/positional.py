r"""Relative-position multi-head self-attention on a grid: the layer of Cordonnier et al.'s study."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..backend.checks import positive_int
from ..backend.torch_autocast import AUTOCAST_DEVICES, autocast_dtype, autocast_off, check_input_dtype
from ..bases.base import Basis
from ..bases.dense import DenseBasis
from ..bases.factor import LowRank
from ..bases.grid_args import _check_boundary, _grid, _ints
from ..bases.kronecker import KroneckerBasis
from ..structures.attention import AttentionBasis, Mechanism, attention_basis
from ..structures.positional import inner_positions
from ..structures.relative import check_host_memory
from ._module import CompiledRuns, NotScriptable, StructureOutsideGraph, warn_jit_trace
from .positional_heads import ContentHeads, PositionalHeads, QuadraticHeads, heads_of

__all__ = ["PositionalAttention"]


class PositionalAttention(StructureOutsideGraph, CompiledRuns, NotScriptable, nn.Module):
    r"""Multi-head self-attention over the positions of a grid, its heads given by relative-position encodings.

    .. math::

        y = \sum_h A_h^\top x\,\Theta_h + \beta, \qquad
        (A_h)_{mn} = \operatorname{softmax}_m\bigl(a_{hmn}\bigr),

    the score :math:`a_{hmn}` of key :math:`m` for query :math:`n` a function of their offset
    :math:`\delta_{mn}` (the ``encoding``), plus, with ``content``, a score of their features.
    The heads are the basis (``docs/attention.rst`` derives their forms and orders).

    Parameters
    ----------
    grid : tuple of int
        The grid sizes.
    embed_dim : int
        :math:`E`, the width of the input and the output.
    num_heads : int
        :math:`K`.
    encoding : PositionalHeads or {"quadratic", "gaussian", "learned"}
        The relative-position encoding (a name: at its defaults); the layer binds a copy.
    content : ContentHeads, optional
        Content scores added to the positional ones (Eq. 5 with ``LearnedHeads(relative_terms=True)``).
    attention_dropout : float, default 0.0
        Dropout of the attention weights in training, after the softmax.
    dropout_shared : bool, optional
        ``None``/``True``: one mask per step for position-only heads, one per image with content
        (as Cordonnier et al.'s code); ``False``: one per image always.
    head_dim : int, optional
        The rank of each :math:`\Theta_h` (``value`` and ``out``); ``None``: the full ``weight``.
    bias : bool, default True
        Whether to add the output bias :math:`\beta`.
    boundary : {"zero", "periodic"}
        Offsets within the grid's box, or wrapped around it.
    threshold : float or None, default 1e-7
        Position-only :class:`GaussianHeads` truncated to shift bases (``None`` and compiled: exact).
    padding : int or tuple of int, default 0
        Zero tokens around the grid per side and axis (``boundary="zero"``): keys only.

    Shapes
    ------
    - **input:** :math:`(B, *\mathrm{grid}, E)` or :math:`(B, M, E)`; **output:** the input's shape
    - **weight:** :math:`(K, E, E)`, or **value**, **out:** :math:`(K, E, D_h)`; **bias:** :math:`(E,)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import PositionalAttention, QuadraticHeads
    >>> from structconv import conv
    >>> layer = PositionalAttention((8, 8), 64, 9, encoding=QuadraticHeads(alpha=1.0))
    >>> x = torch.randn(2, 8, 8, 64)
    >>> flat = x.reshape(2, 64, 64)  # (B, M, E): the grid's positions row-major
    >>> y = conv(layer.basis(flat), flat, layer.theta()) + layer.bias
    >>> layer(x).shape, torch.allclose(y, layer(flat), atol=1e-6)
    (torch.Size([2, 8, 8, 64]), True)
    """

    encoding: PositionalHeads
    content: ContentHeads | None
    settings = frozenset(
        ("grid", "embed_dim", "num_heads", "attention_dropout", "dropout_shared", "head_dim", "boundary", "threshold",
         "padding")
    )  # fmt: skip

    def __init__(
        self,
        grid: tuple[int, ...],
        embed_dim: int,
        num_heads: int,
        *,
        encoding: PositionalHeads | str = "quadratic",
        content: ContentHeads | None = None,
        attention_dropout: float = 0.0,
        dropout_shared: bool | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        boundary: str = "zero",
        threshold: float | None = 1e-7,
        padding: int | tuple[int, ...] = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        try:  # the layer's name first, as in its other messages
            self.grid = _grid(grid)
            self.padding = _ints(padding, len(self.grid), "padding", 0)
            _check_boundary(boundary)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None
        E = self.embed_dim = positive_int(embed_dim, "embed_dim", where=name)
        H = self.num_heads = positive_int(num_heads, "num_heads", where=name)
        unbound = heads_of(name, encoding)
        if content is not None and not isinstance(content, ContentHeads):
            raise TypeError(
                f"{name}: content must be None or a ContentHeads, got {type(content).__name__} {content!r:.60}"
            )
        if boundary == "periodic" and any(self.padding):
            raise ValueError(
                f"{name}: padding={padding!r} adds zero tokens beyond the grid, and a periodic grid has no beyond; "
                "give boundary='zero' (or padding=0)"
            )
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError(f"{name}: threshold must lie in (0, 1) or be None, got {threshold!r}")
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"{name}: attention_dropout must lie in [0, 1), got {attention_dropout!r}")
        self.boundary, self.threshold = boundary, threshold
        self.attention_dropout = float(attention_dropout)
        self.dropout_shared = None if dropout_shared is None else bool(dropout_shared)
        self.head_dim = None if head_dim is None else positive_int(head_dim, "head_dim", where=name)
        if self.head_dim is None:
            self.weight = nn.Parameter(torch.empty(H, E, E))
        else:
            self.value = nn.Parameter(torch.empty(H, E, self.head_dim))
            self.out = nn.Parameter(torch.empty(H, E, self.head_dim))
        self.bias = nn.Parameter(torch.empty(E)) if bias else None
        # The encodings draw their initial values in this order (positions, then content), then Θ
        # and the bias: the order of the layer's flat parameters before, so a seed gives the same layer.
        # With padding the heads score every token, the zero tokens too (the basis keeps the grid's own).
        self.encoding = unbound.bind(self.tokens, H, E, boundary, content=content)
        self.content = None if content is None else content.bind(H, E)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise the channel maps as ``torch.nn.Linear`` would (fan-in of the concatenated heads)."""
        if self.head_dim is None:
            bound = 1.0 / math.sqrt(self.num_heads * self.embed_dim)
            nn.init.uniform_(self.weight, -bound, bound)
        else:
            H, E, Dh = self.num_heads, self.embed_dim, self.head_dim
            nn.init.xavier_uniform_(self.value.view(H * E, Dh))
            nn.init.xavier_uniform_(self.out.view(H * E, Dh))
            bound = 1.0 / math.sqrt(H * Dh)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_conv(
        cls, conv: nn.Module, grid: Any, *, alpha: float | None = None, head_dim: int | None = None
    ) -> PositionalAttention:
        r"""The layer that computes what the convolution ``conv`` computes, one quadratic head per kernel position.

        Cordonnier et al.'s construction, by :func:`~structconv.theory.conv_module_heads` (which
        states what ``conv`` may be and raises for the rest).  The layer is channels-last:
        ``layer(x.movedim(1, -1)).movedim(-1, 1)`` equals ``conv(x)``.

        Parameters
        ----------
        conv : torch.nn.Conv1d, Conv2d, Conv3d or structconv.nn.GridConv1d, GridConv2d, GridConv3d
            The convolution.
        grid : tuple of int
            The grid the layer runs on.
        alpha : float, optional
            The heads' inverse width; ``None``: one-hot to the last bit
            (:data:`~structconv.theory.conv_attention.ONE_HOT_ALPHA`).
        head_dim : int, optional
            Heads of this width, at least the channels (Lemma 1); ``None``: the full :math:`\Theta_h`.

        Examples
        --------
        >>> import torch
        >>> from structconv.nn import PositionalAttention
        >>> conv = torch.nn.Conv2d(8, 8, 3, padding=1, dtype=torch.float64)
        >>> layer = PositionalAttention.from_conv(conv, grid=(6, 6))
        >>> layer.num_heads, layer.padding
        (9, (1, 1))
        >>> x = torch.randn(2, 8, 6, 6, dtype=torch.float64)
        >>> y = layer(x.movedim(1, -1)).movedim(-1, 1)
        >>> torch.allclose(y, conv(x), rtol=0, atol=1e-12)
        True
        """
        from ..theory.conv_attention import ONE_HOT_ALPHA, conv_module_heads

        where = f"{cls.__name__}.from_conv"
        with torch.no_grad():
            heads = conv_module_heads(conv, grid, head_dim=head_dim, where=where)
            if alpha is not None and not 0.0 < float(alpha) < math.inf:
                raise ValueError(
                    f"{where}: alpha must be positive and finite (or None for one-hot heads), got {alpha!r}"
                )
            width = ONE_HOT_ALPHA if alpha is None else float(alpha)
            weight = conv.get_parameter("weight")  # (out_channels, in_channels / groups, *kernel)
            layer = cls(
                heads.grid, int(weight.shape[0]), len(heads.offsets), encoding=QuadraticHeads(alpha=width),
                head_dim=head_dim, bias=heads.bias is not None, boundary=heads.boundary, padding=heads.margin,
            )  # fmt: skip
            layer.to(device=weight.device, dtype=weight.dtype)
            quadratic = layer.encoding
            assert isinstance(quadratic, QuadraticHeads)
            quadratic.centres.copy_(torch.as_tensor(heads.offsets))
            quadratic.set_alpha(width)  # in the layer's dtype, not rounded through float32
            if isinstance(heads.theta, LowRank):
                layer.value.copy_(heads.theta.value)
                layer.out.copy_(heads.theta.out)
            else:
                layer.weight.copy_(heads.theta)
            if layer.bias is not None and heads.bias is not None:
                layer.bias.copy_(heads.bias)
        return layer

    def extra_repr(self) -> str:
        shown = [
            f"{k}={getattr(self, k)!r}" for k in ("grid", "embed_dim", "num_heads", "encoding", "content", "head_dim")
        ]
        settings = {
            "attention_dropout": (self.attention_dropout, 0.0),
            "dropout_shared": (self.dropout_shared, None),
            "bias": (self.bias is not None, True),
            "boundary": (self.boundary, "zero"),
            "threshold": (self.threshold, 1e-7),
            "padding": (self.padding, (0,) * len(self.grid)),
        }
        shown += [f"{k}={v!r}" for k, (v, default) in settings.items() if v != default]
        return ", ".join(shown)

    def __repr__(self) -> str:
        # One line: the encodings are shown by extra_repr, so they are not listed again as children.
        return f"{type(self).__name__}({self.extra_repr()})"

    @property
    def tokens(self) -> tuple[int, ...]:
        """The grid of tokens the heads score: :attr:`grid` with :attr:`padding` zero tokens on each side."""
        return tuple(s + 2 * p for s, p in zip(self.grid, self.padding, strict=True))

    def mechanism(self) -> Mechanism:
        """The heads' mechanism: position-only, or content and position (on :attr:`tokens`, padding included)."""
        if self.content is None:
            return self.encoding.mechanism()
        return self.encoding.with_content(self.content)

    def theta(self) -> torch.Tensor | LowRank:
        r""":math:`\Theta`: ``(H, E, E)``, or ``LowRank(value, out)`` when ``head_dim`` is set."""
        return self.weight if self.head_dim is None else LowRank(self.value, self.out)

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
        """The heads: shared ``(K, M, M)`` without content, ``(B, K, M, M)`` for ``x`` with content.

        With :attr:`padding` the heads attend over :attr:`tokens`; the basis keeps the grid's own.
        """
        if self.content is None:
            # Shared by the batch and cheap: built in the parameters' precision even under autocast
            # (bf16 scores would blur the Gaussians); the engine converts the finished weights.
            if self._exact_heads():
                return self._heads_builder(0, None, flush=True, dropout=False)()
            # The shift form takes its structure from the heads' values (a host read).
            with autocast_off(next(self.parameters()).device.type):
                return inner_positions(self.encoding.mechanism().basis(self.threshold), self.tokens, self.padding)
        if x is None:
            raise ValueError(f"{type(self).__name__}: content attention needs x to build its heads")
        mech = self.mechanism()
        return inner_positions(attention_basis(self._padded(self._flat(x)), mechanism=mech), self.tokens, self.padding)

    def _exact_heads(self) -> bool:
        """Whether position-only heads are exact softmaxes, their structure fixed by the sizes alone.

        Truncated to shifts (:attr:`threshold`, non-separable heads, eagerly) they are not: the
        shift form reads the heads' values.  Compiled, the layer runs the exact heads, one graph
        for any parameters.
        """
        return self.encoding.separable or self.threshold is None or torch.compiler.is_compiling()

    def _heads_builder(self, batch: int, cast: Any, *, flush: bool, dropout: bool = True) -> Callable[[], Basis]:
        """What builds the position-only heads of a call from the parameters' values then: ``build() -> Basis``.

        In training with :attr:`attention_dropout`, dense heads dropped out for ``batch`` images
        (one mask for all, or one per image), in the autocast dtype ``cast`` unless the weights
        are float64 (the dtype the products run in); otherwise the heads as the encoding
        separates them (Kronecker factors, or one dense array), cast likewise.  The cold call and
        the warm run call the same ``build``, so both compute the same heads; ``flush`` (on a
        CPU) sets their subnormal weights to zero; ``dropout=False`` leaves the dropout out (the heads
        themselves, in training too).
        """
        p = self.attention_dropout if self.training and dropout else 0.0
        separable, tokens, padding = self.encoding.separable, self.tokens, self.padding
        # Dropped-out heads are dense: the factors are multiplied first, and the product is flushed.
        heads = self.encoding.heads_run(flush=flush and not (p and separable))
        per_image = self.dropout_shared is False
        if p:
            M = math.prod(self.grid)
            copies = batch if per_image else 1
            need = 2 * copies * self.num_heads * M * M * 4  # the dense heads and their dropped copy, float32 or wider
            check_host_memory(self.grid, f"attention dropout on dense heads ({copies} per step)", need)

        def build() -> Basis:
            weights = heads()
            if any(padding):
                whole = KroneckerBasis.of_built(weights) if separable else DenseBasis.of_weights(weights[0])
                restricted = inner_positions(whole, tokens, padding)
                weights = restricted.factors if isinstance(restricted, KroneckerBasis) else (restricted.to_dense(),)
            # Cast as autocast casts a product's operands (float64 kept), so the engine takes them as they are.
            if separable and not p:
                if cast is not None and weights[0].dtype not in (cast, torch.float64):
                    weights = tuple([w.to(cast) for w in weights])
                return KroneckerBasis.of_built(weights)
            dense = KroneckerBasis.of_built(weights).to_dense() if separable else weights[0]
            if cast is not None and dense.dtype not in (cast, torch.float64):
                dense = dense.to(cast)  # dropped out in the dtype the products run in
            return DenseBasis.of_weights(self._drop(dense, batch, per_image) if p else dense)

        return build

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` ``(B, M, E)`` among the zero tokens of :attr:`padding`, ``(B, prod(tokens), E)``."""
        if not any(self.padding):
            return flat
        pads = [0, 0] + [q for p in reversed(self.padding) for q in (p, p)]  # F.pad: the features first, axes backwards
        framed = F.pad(flat.reshape(flat.shape[0], *self.grid, self.embed_dim), pads)
        return framed.reshape(flat.shape[0], -1, self.embed_dim)

    def _drop(self, weights: torch.Tensor, batch: int, per_image: bool) -> torch.Tensor:
        """Dense heads ``(K, M, N)`` after :attr:`attention_dropout`: one mask, or one per image ``(B, K, M, N)``."""
        p = self.attention_dropout
        if weights.ndim == 3 and per_image:
            # Every image its own mask, drawn in (B, M, H, N) memory order: the engine then reads the
            # heads of an image as one (M H, N) matrix without copying the largest tensor again.
            weights = weights.permute(1, 0, 2)[None].expand(batch, -1, -1, -1).contiguous()
            return F.dropout(weights, p, training=True).permute(0, 2, 1, 3)
        return F.dropout(weights, p, training=True)

    def dropped(self, basis: Basis, batch: int) -> Basis:
        """``basis`` with :attr:`attention_dropout` applied (in training; ``basis`` itself otherwise)."""
        if not self.training or self.attention_dropout == 0.0:
            return basis
        if isinstance(basis, AttentionBasis) and basis.kernel_takes_dropout():
            # Content plus position: the fused order drops inside the kernel (sdpa's dropout_p, a mask
            # per image and head), the engine still costing it beside the dense orders.
            return basis.with_dropout(self.attention_dropout)
        # From the layer's sizes, not the basis' (torch.compile traces this without a break).
        M = math.prod(self.grid)
        per_image = self.content is not None or self.dropout_shared is False
        copies = batch if per_image else 1
        need = 2 * copies * self.num_heads * M * M * 4  # the dense heads and their dropped copy, float32 or wider
        check_host_memory(self.grid, f"attention dropout on dense heads ({copies} per step)", need)
        weights = basis.to_dense()
        narrow = autocast_dtype(weights.device.type)
        if narrow is not None and weights.dtype == torch.float32:
            weights = weights.to(narrow)  # drop in the dtype the products run in
        # Weights the layer just computed (a softmax, then dropout): finite by construction, so the
        # finiteness check, a host synchronisation per layer and step on a GPU, is skipped.
        return DenseBasis.of_weights(self._drop(weights, batch, per_image))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the grid positions of ``x``."""
        compiling = torch.compiler.is_compiling()
        if compiling:
            self.prepare_outside_graph(x)  # the warm run, built eagerly before the graph reads it
        key = None
        if isinstance(x, torch.Tensor) and torch._C._get_tracing_state() is None:
            # Everything the first call checked, so the warm run checks nothing (Contraction.warm).
            kind = x.device.type  # autocast_dtype(kind), spelt out: a call here is a cost on every call
            on = kind in AUTOCAST_DEVICES and torch.is_autocast_enabled(kind)
            cast = torch.get_autocast_dtype(kind) if on else None
            key = (x.shape, x.dtype, x.device, cast, self.training)
            warm = self.warm_runs.get(key)
            # The parameters' placement, compared eagerly; compiled, dynamo's own guards on them hold it.
            if warm is not None and (compiling or warm[0] == self._placement()):
                y: torch.Tensor = warm[1](x)
                return y
        return self._checked(x, key)

    def _placement(self) -> tuple[Any, ...] | None:
        """Shapes, dtypes and devices of what a warm run reads: Θ, the bias, the heads' parameters' placement.

        ``None`` where one is parametrized (read through a property each call): no warm run then.
        """
        params = self._parameters
        w: Any = params.get("weight", params.get("value"))
        encoding: Any = self._modules["encoding"]
        placed: Any = encoding._parameters.get(encoding.placed_by)
        if w is None or placed is None:
            return None
        b = params.get("bias")
        return (w.shape, w.dtype, w.device, None if b is None else (b.shape, b.dtype), placed.dtype, placed.device)

    def _checked(self, x: torch.Tensor, key: tuple[Any, ...] | None) -> torch.Tensor:
        """The call with every check, through the contraction compiled for ``x``; then keeps the warm run."""
        warn_jit_trace(self)
        flat = self._flat(x)
        check_input_dtype(flat, self.weight if self.head_dim is None else self.value, type(self).__name__)
        B = int(flat.shape[0])
        if self.content is not None or not self._exact_heads():
            basis = self.dropped(self.basis(flat), B)
            # Under autocast the bias joins y's dtype, as torch.nn.Linear's does: no float32 copy.
            return self.contract(basis, flat, self.theta(), bias=self.bias).reshape(x.shape)
        cast = autocast_dtype(x.device.type)
        build = self._heads_builder(B, cast, flush=x.device.type == "cpu")
        basis = build()
        theta = self.theta()
        compiled = self.contraction_for(basis, flat, theta)
        y: torch.Tensor = compiled.run_keyed(flat, theta, self.bias, basis).reshape(x.shape)
        placement = self._placement()
        if key is not None and placement is not None and self.runs_eagerly():
            contract = compiled.warm_per_call(cast)
            params = self._parameters
            names = ("weight",) if self.head_dim is None else ("value", "out")
            if contract is not None and all(n in params for n in names) and self.bias is params.get("bias"):
                run = _warm_run(build, contract, params, names, tuple(flat.shape), tuple(x.shape))
                self.keep_warm_run(key, (placement, run))
        return y


def _warm_run(
    build: Callable[[], Basis],
    contract: Callable[..., torch.Tensor],
    params: dict[str, Any],
    names: tuple[str, ...],
    rows: tuple[int, ...],
    shape: tuple[int, ...],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A layer's warm call: its heads built, then the contraction's warm run (no check: the key fixed them)."""
    full = names == ("weight",)

    def run(x: torch.Tensor) -> torch.Tensor:
        operands = (params["weight"],) if full else (params["value"], params["out"])
        return contract(build(), x.reshape(rows), operands, params.get("bias")).reshape(shape)

    return run
