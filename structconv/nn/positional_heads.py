r"""The encodings of :class:`~structconv.nn.PositionalAttention`: its heads' relative positions and content.

An encoding holds its options and no parameter; the layer binds a copy of it to its grid, heads
and width (:meth:`PositionalHeads.bind`), which creates the parameters, so one encoding can
configure many layers.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, ClassVar, Self

import torch
from torch import nn

from ..backend import load
from ..backend.checks import flag, positive_int, real_number
from ..backend.torch_autocast import autocast_off
from ..bases.grid_args import _check_boundary, _grid
from ..structures.attention import BiAffine, Mechanism
from ..structures.positional import (
    PositionScores,
    gaussian_scores,
    learned_scores,
    quadratic_scores,
    relative_offsets,
)
from ..structures.relative import table_on
from ..structures.relative_attention import relative_attention
from ._module import NotScriptable, own_parameter

__all__ = ["ContentHeads", "Encoding", "GaussianHeads", "LearnedHeads", "PositionalHeads", "QuadraticHeads", "heads_of"]


class Encoding(NotScriptable, nn.Module):
    """A module given by the keyword options of its constructor (:meth:`options`), bound later to a layer."""

    #: Options the representation shows even at their defaults; the layer's keyword that takes it.
    shown: tuple[str, ...] = ()
    argument = "encoding"

    def __init__(self) -> None:
        super().__init__()
        self.num_heads = 0  # 0 until bound to a layer

    def options(self) -> dict[str, Any]:
        """The constructor's keyword arguments that give this encoding (once bound: defaults resolved)."""
        raise NotImplementedError

    def with_options(self, **changes: Any) -> Any:
        """A new, unbound encoding of this class: this one's options, ``changes`` replacing some."""
        return type(self)(**{**self.options(), **changes})

    def _check_bound(self) -> None:
        if self.num_heads == 0:  # unbound: bind sets num_heads and the parameters
            name = type(self).__name__
            raise ValueError(f"{name} is not bound to a layer; give it to PositionalAttention({self.argument}=...)")

    def extra_repr(self) -> str:
        signature = inspect.signature(type(self)).parameters
        options = self.options()
        return ", ".join(f"{k}={v!r}" for k, v in options.items() if k in self.shown or signature[k].default != v)

    def __repr__(self) -> str:  # one line: the options say everything
        return f"{type(self).__name__}({self.extra_repr()})"


class ContentHeads(Encoding):
    r"""Content scores of every head, :math:`(x W^q_h + b^q_h)\cdot(x W^k_h + b^k_h)/\sqrt D`.

    Added to the positional scores before the softmax (part of Eq. 5 with
    ``LearnedHeads(relative_terms=True)``); projections start as ``torch.nn.Linear(E, K D)``'s.

    Parameters
    ----------
    key_dim : int, optional
        :math:`D`; ``None``: ``embed_dim // num_heads`` (at least 1).
    bias : bool, default False
        Whether the queries and keys have biases :math:`b^q_h, b^k_h` (the paper's code has them).

    Shapes
    ------
    - **query**, **key:** :math:`(K, E, D)`; **query_bias**, **key_bias:** :math:`(K, D)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import ContentHeads, PositionalAttention
    >>> content = ContentHeads(key_dim=3, bias=True)
    >>> layer = PositionalAttention((4, 4), 8, 2, content=content)
    >>> layer.content, layer.content.query.shape
    (ContentHeads(key_dim=3, bias=True), torch.Size([2, 8, 3]))
    """

    shown = ("key_dim", "bias")
    argument = "content"
    key: nn.Parameter
    query: nn.Parameter
    key_bias: nn.Parameter
    query_bias: nn.Parameter

    def __init__(self, *, key_dim: int | None = None, bias: bool = False) -> None:
        super().__init__()
        name = type(self).__name__
        self.key_dim = None if key_dim is None else positive_int(key_dim, "key_dim", where=name)
        self.bias = flag(bias, "bias", where=name)

    def options(self) -> dict[str, Any]:
        return {"key_dim": self.key_dim, "bias": self.bias}

    def key_width(self, num_heads: int, embed_dim: int) -> int:
        """:math:`D` for a layer of ``num_heads`` heads of width ``embed_dim``."""
        return self.key_dim or max(1, embed_dim // num_heads)

    def bind(self, num_heads: int, embed_dim: int) -> Self:
        """A new ``ContentHeads`` of these options with its parameters for a layer of these sizes."""
        name = type(self).__name__
        H = positive_int(num_heads, "num_heads", where=name)
        E = positive_int(embed_dim, "embed_dim", where=name)
        D = self.key_width(H, E)
        bound: Self = self.with_options(key_dim=D)
        bound.num_heads = H
        limit = 1.0 / math.sqrt(E)  # torch.nn.Linear(E, H * D)'s initialisation
        bound.key = nn.Parameter(torch.empty(H, E, D).uniform_(-limit, limit))
        bound.query = nn.Parameter(torch.empty(H, E, D).uniform_(-limit, limit))
        if bound.bias:
            bound.key_bias = nn.Parameter(torch.empty(H, D).uniform_(-limit, limit))
            bound.query_bias = nn.Parameter(torch.empty(H, D).uniform_(-limit, limit))
        return bound

    def mechanism(self) -> BiAffine:
        """The content scores as a :class:`~structconv.BiAffine` mechanism."""
        self._check_bound()
        biases = {"key_bias": self.key_bias, "query_bias": self.query_bias} if self.bias else {}
        assert self.key_dim is not None  # resolved by bind
        return BiAffine(key=self.key, query=self.query, scale=1.0 / math.sqrt(self.key_dim), **biases)


class PositionalHeads(Encoding):
    """The base of the relative-position encodings: parameters by :meth:`_build`, scores by :meth:`mechanism`."""

    #: The ``encoding=`` name of this encoding at its defaults.
    name: ClassVar[str] = ""
    #: Whether the heads are Kronecker products of per-axis softmaxes (:meth:`heads_run`).
    separable: ClassVar[bool] = False
    #: The parameter whose dtype and device the heads take (a layer's warm runs are keyed by them).
    placed_by: ClassVar[str] = "centres"
    positional_names: ClassVar[tuple[str, ...]] = ()  # the parameters positional_parameters() returns

    def __init__(self) -> None:
        super().__init__()
        self.grid: tuple[int, ...] = ()  # () until bound to a layer
        self.embed_dim, self.boundary = 0, "zero"

    def bind(
        self, grid: Any, num_heads: int, embed_dim: int, boundary: str = "zero", *, content: ContentHeads | None = None
    ) -> Self:
        """A new encoding of these options with parameters for a layer's sizes (``content``: the layer's, unbound)."""
        name = type(self).__name__
        try:
            sizes = _grid(grid)
            _check_boundary(boundary)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None
        H = positive_int(num_heads, "num_heads", where=name)
        E = positive_int(embed_dim, "embed_dim", where=name)
        bound: Self = self.with_options()
        bound.grid, bound.num_heads, bound.embed_dim, bound.boundary = sizes, H, E, boundary
        bound._build(content)
        return bound

    def _build(self, content: ContentHeads | None) -> None:
        """Create the parameters at their initial values (the sizes are set)."""
        raise NotImplementedError

    def mechanism(self) -> PositionScores:
        """The position-only heads' scores."""
        raise NotImplementedError

    def heads_run(self, *, flush: bool = False) -> Callable[[], tuple[torch.Tensor, ...]]:
        """A function of no argument: each head's softmax over the keys of its scores, from the parameters' values now.

        For an encoding separable by axis (:attr:`separable`), one ``(K, S_i, S_i)`` factor per
        axis of the bound grid (key, query; the heads are their Kronecker product); else one
        ``(K, M, M)`` array.  In the parameters' precision; ``flush``: subnormal weights set to
        zero on a CPU (:meth:`~structconv.backend.interface.Backend.flush_subnormals`).  What the
        run needs beyond the parameters (tables of offsets) is placed once, here, so a layer's
        warm call runs the operators alone.
        """
        self._check_bound()
        kind = next(self.parameters()).device.type

        def run() -> tuple[torch.Tensor, ...]:
            with autocast_off(kind):  # scores in the parameters' precision: bf16 would blur them
                return (self.mechanism().basis(None).to_dense(),)  # a dense softmax, flushed

        return run

    def with_content(self, content: ContentHeads) -> Mechanism:
        """The heads with ``content`` (bound to the same layer): its scores added to the positional ones."""
        return content.mechanism() + self.mechanism()

    def positional_parameters(self) -> list[nn.Parameter]:
        """The centres and widths of Gaussian heads (kept out of weight decay in the CIFAR study)."""
        self._check_bound()
        return [p for n, p in self.named_parameters() if n in self.positional_names]


class QuadraticHeads(PositionalHeads):
    r"""Isotropic Gaussian heads, :math:`a_{hmn} = -\alpha_h\lVert\delta_{mn} - \Delta_h\rVert^2` (Lemma 2).

    Scores by :func:`~structconv.quadratic_scores` (separable by axis).

    Parameters
    ----------
    alpha : float, default 1.0
        The initial :math:`\alpha_h > 0` of every head.
    width : {"exp", "spread"}
        Learn :math:`\log\alpha_h`, or :math:`s_h` with :math:`\alpha_h = s_h^2/2` (Cordonnier et al.'s code).
    width_noise : float, default 0.0
        The standard deviation of the initial :math:`s_h` about :math:`\sqrt{2\alpha}` (``"spread"`` only).
    centre_var : float, default 2.0
        The variance of the initial centres, :math:`\mathcal N(0, \mathrm{centre\_var}\,I)`.

    Shapes
    ------
    - **centres:** :math:`(K, d)`; **log_alpha** or **spread:** :math:`(K,)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import PositionalAttention, QuadraticHeads
    >>> layer = PositionalAttention((8, 8), 64, 9, encoding=QuadraticHeads(alpha=1.0))
    >>> layer.encoding, layer.encoding.centres.shape, layer.encoding.alpha().shape
    (QuadraticHeads(alpha=1.0, width='exp'), torch.Size([9, 2]), torch.Size([9]))
    """

    name = "quadratic"
    separable = True
    positional_names = ("centres", "log_alpha", "spread")
    shown = ("alpha", "width")
    centres: nn.Parameter
    log_alpha: nn.Parameter
    spread: nn.Parameter

    def __init__(
        self, *, alpha: float = 1.0, width: str = "exp", width_noise: float = 0.0, centre_var: float = 2.0
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.initial_alpha = real_number(alpha, "alpha", positive=True, where=name)
        if width not in ("exp", "spread"):
            raise ValueError(f"{name}: width must be one of ('exp', 'spread'), got {width!r}")
        self.width = width
        self.width_noise = real_number(width_noise, "width_noise", positive=False, where=name)
        self.centre_var = real_number(centre_var, "centre_var", positive=False, where=name)
        if width == "exp" and self.width_noise:
            raise ValueError(f"{name}: width_noise needs width='spread' (widths learned as 'exp' start at alpha)")

    def options(self) -> dict[str, Any]:
        return {
            "alpha": self.initial_alpha,
            "width": self.width,
            "width_noise": self.width_noise,
            "centre_var": self.centre_var,
        }

    def _build(self, content: ContentHeads | None) -> None:
        H, alpha = self.num_heads, self.initial_alpha
        self.centres = nn.Parameter(torch.randn(H, len(self.grid)) * math.sqrt(self.centre_var))
        if self.width == "exp":
            self.log_alpha = nn.Parameter(torch.full((H,), math.log(alpha)))
        else:
            self.spread = nn.Parameter(math.sqrt(2 * alpha) + torch.randn(H) * self.width_noise)

    def alpha(self) -> torch.Tensor:
        r""":math:`\alpha_h`, ``(K,)``."""
        self._check_bound()
        return self.log_alpha.exp() if self.width == "exp" else 0.5 * self.spread * self.spread

    @torch.no_grad()
    def set_alpha(self, alpha: float | torch.Tensor) -> None:
        r"""Set :math:`\alpha_h` (a number or ``(K,)`` positive values) in this encoding's parametrisation."""
        self._check_bound()
        values = torch.as_tensor(alpha, dtype=self.centres.dtype, device=self.centres.device).expand(self.num_heads)
        if not bool((values > 0).all()):
            raise ValueError(f"{type(self).__name__}: set_alpha needs positive values")
        if self.width == "exp":
            self.log_alpha.copy_(values.log())
        else:
            self.spread.copy_((2 * values).sqrt())

    def mechanism(self) -> PositionScores:
        alpha = self.alpha()  # positive by construction: positive=True reads no value back from a GPU
        return quadratic_scores(self.grid, self.centres, alpha, self.boundary, positive=True)

    def heads_run(self, *, flush: bool = False) -> Callable[[], tuple[torch.Tensor, ...]]:
        r"""Per axis :math:`\operatorname{softmax}_{m_i}(-\alpha_h(\delta_i - \Delta_{h,i})^2)`.

        Axes of one size run as one (the axes a batch dimension).
        """
        self._check_bound()
        exp, K, d = self.width == "exp", self.num_heads, len(self.grid)
        width = "log_alpha" if exp else "spread"
        centres = own_parameter(self, "centres")  # read through a parametrization, if one is registered
        tables = [table_on(relative_offsets((s,), self.boundary), "axis_offsets0", centres) for s in self.grid]
        wrap = [float(s) for s in self.grid] if self.boundary == "periodic" else None
        backend = load("torch")
        same = len(set(self.grid)) == 1
        if same:  # one (S, S) table for every axis: the axes as a batch dimension
            S = self.grid[0]
            table = tables[0].reshape(1, 1, S, S)

        def run() -> tuple[torch.Tensor, ...]:
            c, w = own_parameter(self, "centres"), own_parameter(self, width)
            neg_alpha = -w.exp() if exp else (-0.5 * w) * w  # -alpha_h, alpha = s^2 / 2 (bit-equal either way)
            if same:
                diff = table - c.reshape(K, d, 1, 1)  # (K, d, S keys, S queries)
                if wrap is not None:  # the representative in [-S/2, S/2) on a torus
                    diff = (diff + wrap[0] / 2) % wrap[0] - wrap[0] / 2
                weights = torch.softmax(diff * diff * neg_alpha.reshape(K, 1, 1, 1), dim=2)
                if flush:
                    weights = backend.flush_subnormals(weights, nonnegative=True)
                return weights.unbind(1)
            out = []
            for i, t in enumerate(tables):
                diff = t - c[:, i].reshape(K, 1, 1)
                if wrap is not None:
                    diff = (diff + wrap[i] / 2) % wrap[i] - wrap[i] / 2
                f = torch.softmax(diff * diff * neg_alpha.reshape(K, 1, 1), dim=1)
                out.append(backend.flush_subnormals(f, nonnegative=True) if flush else f)
            return tuple(out)

        return run


class GaussianHeads(PositionalHeads):
    r"""Non-isotropic Gaussian heads, :math:`a_{hmn} = -\tfrac12\lVert S_h(\delta_{mn} - \Delta_h)\rVert^2`.

    Scores by :func:`~structconv.gaussian_scores` (not separable by axis).

    Parameters
    ----------
    alpha : float, default 1.0
        The initial isotropic width: :math:`S_h = \sqrt{2\alpha}\,I` plus noise.
    width_noise : float, default 0.0
        The standard deviation of the noise of each entry of :math:`S_h`.
    centre_var : float, default 2.0
        The variance of the initial centres, :math:`\mathcal N(0, \mathrm{centre\_var}\,I)`.

    Shapes
    ------
    - **centres:** :math:`(K, d)`; **inv_sqrt_cov:** :math:`S_h`, :math:`(K, d, d)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GaussianHeads, PositionalAttention
    >>> heads = GaussianHeads(alpha=0.5, width_noise=0.01)
    >>> layer = PositionalAttention((6, 6), 16, 4, encoding=heads)
    >>> layer.encoding, layer.encoding.inv_sqrt_cov.shape
    (GaussianHeads(alpha=0.5, width_noise=0.01), torch.Size([4, 2, 2]))
    """

    name = "gaussian"
    positional_names = ("centres", "inv_sqrt_cov")
    shown = ("alpha",)
    centres: nn.Parameter
    inv_sqrt_cov: nn.Parameter

    def __init__(self, *, alpha: float = 1.0, width_noise: float = 0.0, centre_var: float = 2.0) -> None:
        super().__init__()
        name = type(self).__name__
        self.initial_alpha = real_number(alpha, "alpha", positive=True, where=name)
        self.width_noise = real_number(width_noise, "width_noise", positive=False, where=name)
        self.centre_var = real_number(centre_var, "centre_var", positive=False, where=name)

    def options(self) -> dict[str, Any]:
        return {"alpha": self.initial_alpha, "width_noise": self.width_noise, "centre_var": self.centre_var}

    def _build(self, content: ContentHeads | None) -> None:
        H, d = self.num_heads, len(self.grid)
        self.centres = nn.Parameter(torch.randn(H, d) * math.sqrt(self.centre_var))
        noise = torch.randn(H, d, d) * self.width_noise
        self.inv_sqrt_cov = nn.Parameter(torch.eye(d).repeat(H, 1, 1) * math.sqrt(2 * self.initial_alpha) + noise)

    def mechanism(self) -> PositionScores:
        self._check_bound()
        return gaussian_scores(self.grid, self.centres, self.inv_sqrt_cov, self.boundary)


class LearnedHeads(PositionalHeads):
    r"""Learned relative embeddings, :math:`a_{hmn} = t_h\cdot r_{\delta_{mn}}`, one table per grid axis.

    Scores by :func:`~structconv.learned_scores` (separable by axis); tables start at
    :math:`N(0, 1)`, :math:`D_p` split evenly over the axes.

    Parameters
    ----------
    positional_dim : int, optional
        :math:`D_p`, at least the grid's dimension; ``None``: the layer's ``embed_dim``.
    relative_terms : bool, default False
        The four terms of Eq. 5 (:func:`~structconv.relative_attention`) with ``ContentHeads(bias=False)``:
        ``rel_key`` :math:`\hat W`, ``u`` and ``v`` replace ``weight``.

    Shapes
    ------
    - **tables:** :math:`(L_i, D_i)` per axis; **weight:** :math:`(K, D_p)`
    - with ``relative_terms``: **rel_key:** :math:`(K, D_p, D)`; **u**, **v:** :math:`(K, D)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import ContentHeads, LearnedHeads, PositionalAttention
    >>> layer = PositionalAttention((5, 5), 8, 2, encoding=LearnedHeads(positional_dim=6))
    >>> [tuple(t.shape) for t in layer.encoding.tables], tuple(layer.encoding.weight.shape)
    ([(9, 3), (9, 3)], (2, 6))
    >>> heads, content = LearnedHeads(relative_terms=True), ContentHeads()
    >>> eq5 = PositionalAttention((5, 5), 8, 2, encoding=heads, content=content)
    >>> eq5.encoding, eq5(torch.randn(3, 25, 8)).shape
    (LearnedHeads(positional_dim=8, relative_terms=True), torch.Size([3, 25, 8]))
    """

    name = "learned"
    separable = True
    placed_by = "weight"
    shown = ("positional_dim",)
    tables: nn.ParameterList
    weight: nn.Parameter
    rel_key: nn.Parameter
    u: nn.Parameter
    v: nn.Parameter

    def __init__(self, *, positional_dim: int | None = None, relative_terms: bool = False) -> None:
        super().__init__()
        name = type(self).__name__
        self.positional_dim = (
            None if positional_dim is None else positive_int(positional_dim, "positional_dim", where=name)
        )
        self.relative_terms = flag(relative_terms, "relative_terms", where=name)

    def options(self) -> dict[str, Any]:
        return {"positional_dim": self.positional_dim, "relative_terms": self.relative_terms}

    def _build(self, content: ContentHeads | None) -> None:
        name, H, d = type(self).__name__, self.num_heads, len(self.grid)
        if self.relative_terms and content is None:
            raise ValueError(
                f"{name}: relative_terms are the content terms of Eq. 5; give the layer content=ContentHeads(...)"
            )
        if self.relative_terms and content is not None and content.bias:
            raise ValueError(f"{name}: with relative_terms, u and v are the biases; give ContentHeads(bias=False)")
        Dp = self.positional_dim = self.positional_dim or self.embed_dim
        if Dp < d:
            raise ValueError(f"{name}: positional_dim={Dp} must be at least the grid's {d} dimensions")
        widths = [Dp // d + (1 if i < Dp % d else 0) for i in range(d)]
        lengths = relative_offsets(self.grid, self.boundary).lengths
        self.tables = nn.ParameterList(nn.Parameter(torch.randn(n, w)) for n, w in zip(lengths, widths, strict=True))
        if content is not None and self.relative_terms:
            D = content.key_width(self.num_heads, self.embed_dim)
            self.rel_key = nn.Parameter(torch.randn(H, Dp, D) / math.sqrt(Dp))
            self.u = nn.Parameter(torch.zeros(H, D))
            self.v = nn.Parameter(torch.zeros(H, D))
        else:  # one key per head and axis, as a linear map of that axis' row (torch.nn.Linear's init)
            bound = 1.0 / math.sqrt(max(widths))
            self.weight = nn.Parameter(torch.empty(H, Dp).uniform_(-bound, bound))

    def mechanism(self) -> PositionScores:
        self._check_bound()
        if self.relative_terms:
            raise ValueError(f"{type(self).__name__}: relative_terms score the content too; use with_content")
        return learned_scores(self.grid, tuple(self.tables), self.weight, self.boundary)

    def heads_run(self, *, flush: bool = False) -> Callable[[], tuple[torch.Tensor, ...]]:
        r"""Per axis :math:`\operatorname{softmax}_{m_i}(t_{h,i}\cdot r^{(i)}_{\delta_i})`."""
        self.mechanism()  # refuses relative_terms, as the layer's basis does
        weight = self.weight
        index = [table_on(relative_offsets((s,), self.boundary), "axis_index0", weight) for s in self.grid]
        tables, backend, widths = self.tables, load("torch"), [int(t.shape[1]) for t in self.tables]
        starts = [sum(widths[:i]) for i in range(len(widths))]
        kind = weight.device.type

        def run() -> tuple[torch.Tensor, ...]:
            w = own_parameter(self, "weight")
            out = []
            with autocast_off(kind):  # scores in the parameters' precision: bf16 would blur them
                for start, width, table, ix in zip(starts, widths, tables, index, strict=True):
                    scores = w[:, start : start + width] @ table.T  # (K, L_i): one score per offset
                    f = torch.softmax(scores[:, ix], dim=1)
                    out.append(backend.flush_subnormals(f, nonnegative=True) if flush else f)
            return tuple(out)

        return run

    def with_content(self, content: ContentHeads) -> Mechanism:
        """With ``relative_terms``, the four terms of Eq. 5; otherwise the content scores plus the positional ones."""
        if not self.relative_terms:
            return super().with_content(content)
        self._check_bound()
        assert content.key_dim is not None  # resolved when bound
        return relative_attention(
            self.grid, tuple(self.tables), key=content.key, query=content.query, rel_key=self.rel_key,
            u=self.u, v=self.v, boundary=self.boundary, scale=1.0 / math.sqrt(content.key_dim),
        )  # fmt: skip


_BY_NAME: dict[str, type[PositionalHeads]] = {c.name: c for c in (QuadraticHeads, GaussianHeads, LearnedHeads)}


def heads_of(owner: str, heads: Any) -> PositionalHeads:
    """``heads`` as an encoding: itself, or the encoding a name (``"quadratic"``, ...) stands for, at its defaults."""
    if isinstance(heads, PositionalHeads):
        return heads
    if isinstance(heads, str) and heads in _BY_NAME:
        return _BY_NAME[heads]()
    wanted = f"one of {tuple(_BY_NAME)} or a PositionalHeads (e.g. QuadraticHeads(alpha=1.0))"
    raise (ValueError if isinstance(heads, str) else TypeError)(
        f"{owner}: encoding must be {wanted}, got {type(heads).__name__} {heads!r:.60}"
    )
