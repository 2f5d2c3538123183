r"""The encodings of :class:`~structconv.nn.PositionalAttention`: its heads' relative positions and content.

An encoding is a small module built from its own options alone (an option of another encoding
is not a parameter of its class).  It holds no parameter and serves as a template: the layer
binds it to its grid, heads and width, which gives a new module of the same class with its
size-dependent defaults resolved and its parameters created; the template is never changed, so
one encoding can configure many layers.  The layer then asks it for its scores
(:mod:`structconv.structures.positional`):

======================  ===================================================================
:class:`QuadraticHeads` isotropic Gaussians :math:`-\alpha_h\lVert\delta - \Delta_h\rVert^2`
:class:`GaussianHeads`  non-isotropic Gaussians :math:`-\tfrac12\lVert S_h(\delta - \Delta_h)\rVert^2`
:class:`LearnedHeads`   learned per-axis relative embeddings scored by one vector per head
:class:`ContentHeads`   queries and keys of the input, added to the positional scores
======================  ===================================================================
"""

from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar, Self

import torch
from torch import nn

from ..backend.checks import positive_int
from ..bases.grid_args import _grid
from ..structures.attention import BiAffine, Mechanism
from ..structures.grid import BOUNDARIES
from ..structures.positional import (
    PositionScores,
    RelativeAttention,
    gaussian_scores,
    learned_scores,
    quadratic_scores,
    relative_offsets,
)
from ._module import NotScriptable

__all__ = ["ContentHeads", "Encoding", "GaussianHeads", "LearnedHeads", "PositionalHeads", "QuadraticHeads", "heads_of"]


def optional_positive_int(owner: str, name: str, value: Any) -> int | None:
    """``None``, or ``value`` checked by :func:`~structconv.backend.checks.positive_int`."""
    return None if value is None else positive_int(value, name, where=owner)


def real(owner: str, name: str, value: Any, *, positive: bool) -> float:
    """``value`` as a finite ``float``, positive or at least zero; a clear error naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: {name} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        wanted = "positive" if positive else ">= 0"
        raise ValueError(f"{owner}: {name} must be finite and {wanted}, got {value!r}")
    return number


def flag(owner: str, name: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (an option that is on or off, never a number or a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return value


class Encoding(NotScriptable, nn.Module):
    """A module configured by the keyword options of its constructor, bound later to a layer's sizes.

    Subclasses store their options and return them from :meth:`options`; :meth:`extra_repr`
    shows them (those that differ from the constructor's defaults, and :attr:`shown` always);
    a binding starts from a new encoding of the same options.
    """

    #: Options the representation always shows, even at their defaults.
    shown: tuple[str, ...] = ()

    def options(self) -> dict[str, Any]:
        """The constructor's keyword arguments that give this encoding (after binding: with defaults resolved)."""
        raise NotImplementedError

    def with_options(self, **changes: Any) -> Any:
        """A new, unbound encoding of this class: this one's options, ``changes`` replacing some."""
        return type(self)(**{**self.options(), **changes})

    def extra_repr(self) -> str:
        defaults = {
            name: p.default
            for name, p in inspect.signature(type(self)).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        options = self.options()
        shown = [k for k, v in options.items() if k in self.shown or k not in defaults or defaults[k] != v]
        return ", ".join(f"{k}={options[k]!r}" for k in shown)

    def __repr__(self) -> str:
        # One line: the options say everything (the parameters' shapes follow from the layer's sizes).
        return f"{type(self).__name__}({self.extra_repr()})"


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
        bound: Self = self.with_options(key_dim=self.key_width(H, E))
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


WIDTHS = ("exp", "spread")


class PositionalHeads(Encoding):
    """An encoding of the heads' relative positions (the base of :class:`QuadraticHeads` and its siblings).

    Unbound, it is a template of options; :meth:`bind` gives the module a layer holds, with
    :attr:`grid`, :attr:`num_heads`, :attr:`embed_dim` and :attr:`boundary` set and its
    parameters created.  A subclass sets :attr:`name` (its ``encoding=`` shorthand), creates its
    parameters (resolving size-dependent defaults) in :meth:`_build` and returns its scores from
    :meth:`mechanism`.
    """

    #: The string that stands for this encoding at its defaults (``PositionalAttention(encoding=...)``).
    name: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.grid: tuple[int, ...] = ()  # () until bound to a layer
        self.num_heads = 0
        self.embed_dim = 0
        self.boundary = "zero"

    def bind(
        self, grid: Any, num_heads: int, embed_dim: int, boundary: str = "zero", *, content: ContentHeads | None = None
    ) -> Self:
        """A new encoding of these options, with its parameters for a layer's sizes at their initial values.

        This encoding is left as it is (a template for other layers).

        Parameters
        ----------
        grid
            The layer's grid sizes.
        num_heads, embed_dim
            The layer's :math:`K` and :math:`E`.
        boundary
            ``"zero"`` or ``"periodic"``: the offsets the heads score.
        content
            The layer's content terms (unbound), or ``None``: :class:`LearnedHeads` with
            ``relative_terms`` takes the width of their keys.
        """
        name = type(self).__name__
        try:
            sizes = _grid(grid)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None
        H = positive_int(num_heads, "num_heads", where=name)
        E = positive_int(embed_dim, "embed_dim", where=name)
        if boundary not in BOUNDARIES:
            raise ValueError(f"{name}: boundary must be one of {BOUNDARIES}, got {boundary!r}")
        bound: Self = self.with_options()
        bound.grid, bound.num_heads, bound.embed_dim, bound.boundary = sizes, H, E, boundary
        bound._build(content)
        return bound

    def _build(self, content: ContentHeads | None) -> None:
        """Create the parameters, at their initial values (the sizes are set)."""
        raise NotImplementedError

    def _check_bound(self) -> None:
        if not self.grid:
            raise ValueError(
                f"{type(self).__name__} is not bound to a layer; "
                "give it to PositionalAttention(encoding=...) or bind it"
            )

    def mechanism(self) -> PositionScores:
        """The position-only heads' scores, which depend on the offset between key and query alone."""
        raise NotImplementedError

    def with_content(self, content: ContentHeads) -> Mechanism:
        """The heads with ``content`` (bound to the same layer): its scores added to the positional ones."""
        return content.mechanism() + self.mechanism()

    def positional_parameters(self) -> list[nn.Parameter]:
        """The centres and widths of Gaussian heads (kept out of weight decay in the CIFAR study); none here."""
        return []


class QuadraticHeads(PositionalHeads):
    r"""Isotropic Gaussian heads, :math:`a_{hmn} = -\alpha_h\lVert\delta_{mn} - \Delta_h\rVert^2` (Lemma 2).

    Every head attends around its own offset :math:`\Delta_h` with its own width; the scores are
    a sum of per-axis terms (:func:`~structconv.quadratic_scores`), so the layer builds the heads
    exactly as a Kronecker product of per-axis softmaxes.  The centres start at
    :math:`\mathcal N(0, \mathrm{centre\_var}\,I)`.

    Parameters
    ----------
    alpha : float, default 1.0
        The initial :math:`\alpha_h > 0` of every head.
    width : {"exp", "spread"}
        How the widths are learned: ``"exp"`` learns :math:`\log\alpha_h`, started at
        :math:`\log\alpha`; ``"spread"`` learns :math:`s_h` with :math:`\alpha_h = s_h^2/2`,
        started at :math:`\sqrt{2\alpha} + \mathcal N(0, \mathrm{width\_noise}^2)`, as
        Cordonnier et al.'s code does.
    width_noise : float, default 0.0
        The spread of the initial :math:`s_h` (``width="spread"`` only: ``"exp"`` widths start at ``alpha``).
    centre_var : float, default 2.0
        The variance of the initial centres.

    Shapes
    ------
    - **centres:** :math:`\Delta_h`, :math:`(K, d)` for a layer of :math:`K` heads on a :math:`d`-D grid
    - **log_alpha** (``width="exp"``) or **spread** (``width="spread"``): :math:`(K,)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import PositionalAttention, QuadraticHeads
    >>> layer = PositionalAttention((8, 8), 64, 9, encoding=QuadraticHeads(alpha=1.0))
    >>> layer.encoding
    QuadraticHeads(alpha=1.0, width='exp')
    >>> layer.encoding.centres.shape, layer.encoding.alpha().shape
    (torch.Size([9, 2]), torch.Size([9]))
    >>> layer(torch.randn(2, 8, 8, 64)).shape
    torch.Size([2, 8, 8, 64])
    """

    name = "quadratic"
    shown = ("alpha", "width")
    centres: nn.Parameter
    log_alpha: nn.Parameter
    spread: nn.Parameter

    def __init__(
        self, *, alpha: float = 1.0, width: str = "exp", width_noise: float = 0.0, centre_var: float = 2.0
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.initial_alpha = real(name, "alpha", alpha, positive=True)
        if width not in WIDTHS:
            raise ValueError(f"{name}: width must be one of {WIDTHS}, got {width!r}")
        self.width = width
        self.width_noise = real(name, "width_noise", width_noise, positive=False)
        self.centre_var = real(name, "centre_var", centre_var, positive=False)
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
        H, d, alpha = self.num_heads, len(self.grid), self.initial_alpha
        self.centres = nn.Parameter(torch.randn(H, d) * math.sqrt(self.centre_var))
        if self.width == "exp":
            self.log_alpha = nn.Parameter(torch.full((H,), math.log(alpha)))
        else:
            self.spread = nn.Parameter(math.sqrt(2 * alpha) + torch.randn(H) * self.width_noise)

    def alpha(self) -> torch.Tensor:
        r""":math:`\alpha_h`, ``(K,)``: :math:`e^{\log\alpha_h}` or :math:`s_h^2/2`."""
        self._check_bound()
        return self.log_alpha.exp() if self.width == "exp" else 0.5 * self.spread * self.spread

    @torch.no_grad()
    def set_alpha(self, alpha: float | torch.Tensor) -> None:
        r"""Set :math:`\alpha_h` (a number or ``(K,)`` values, all positive) in this encoding's parametrisation."""
        self._check_bound()
        values = torch.as_tensor(alpha, dtype=self.centres.dtype, device=self.centres.device).expand(self.num_heads)
        if not bool((values > 0).all()):
            raise ValueError(f"{type(self).__name__}: set_alpha needs positive values")
        if self.width == "exp":
            self.log_alpha.copy_(values.log())
        else:
            self.spread.copy_((2 * values).sqrt())

    def mechanism(self) -> PositionScores:
        self._check_bound()
        # positive=True: alpha is positive by construction, so no value is read back from a GPU
        return quadratic_scores(self.grid, self.centres, self.alpha(), self.boundary, positive=True)

    def positional_parameters(self) -> list[nn.Parameter]:
        """The centres and widths (kept out of weight decay in the CIFAR study)."""
        self._check_bound()
        return [self.centres, self.log_alpha if self.width == "exp" else self.spread]


class GaussianHeads(PositionalHeads):
    r"""Non-isotropic Gaussian heads, :math:`a_{hmn} = -\tfrac12\lVert S_h(\delta_{mn} - \Delta_h)\rVert^2`.

    Each head has its own precision :math:`\Sigma_h^{-1} = S_h^\top S_h`, positive semi-definite
    for every value of :math:`S_h` (:func:`~structconv.gaussian_scores`).  The heads are not
    separable by axis: without content the layer builds them as a dense softmax, or truncated to
    shift bases (its ``threshold``).  :math:`S_h` starts at :math:`\sqrt{2\alpha}\,I` (the
    quadratic heads of the same ``alpha``) plus :math:`\mathcal N(0, \mathrm{width\_noise}^2)` per
    entry, the centres at :math:`\mathcal N(0, \mathrm{centre\_var}\,I)`.

    Parameters
    ----------
    alpha : float, default 1.0
        The initial isotropic width, :math:`S_h = \sqrt{2\alpha}\,I`.
    width_noise : float, default 0.0
        The spread of the initial entries of :math:`S_h`.
    centre_var : float, default 2.0
        The variance of the initial centres.

    Shapes
    ------
    - **centres:** :math:`\Delta_h`, :math:`(K, d)` for a layer of :math:`K` heads on a :math:`d`-D grid
    - **inv_sqrt_cov:** :math:`S_h`, :math:`(K, d, d)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import GaussianHeads, PositionalAttention
    >>> heads = GaussianHeads(alpha=0.5, width_noise=0.01)
    >>> layer = PositionalAttention((6, 6), 16, 4, encoding=heads)
    >>> layer.encoding
    GaussianHeads(alpha=0.5, width_noise=0.01)
    >>> layer.encoding.inv_sqrt_cov.shape
    torch.Size([4, 2, 2])
    >>> layer(torch.randn(3, 36, 16)).shape
    torch.Size([3, 36, 16])
    """

    name = "gaussian"
    shown = ("alpha",)
    centres: nn.Parameter
    inv_sqrt_cov: nn.Parameter

    def __init__(self, *, alpha: float = 1.0, width_noise: float = 0.0, centre_var: float = 2.0) -> None:
        super().__init__()
        name = type(self).__name__
        self.initial_alpha = real(name, "alpha", alpha, positive=True)
        self.width_noise = real(name, "width_noise", width_noise, positive=False)
        self.centre_var = real(name, "centre_var", centre_var, positive=False)

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

    def positional_parameters(self) -> list[nn.Parameter]:
        """The centres and precisions' factors (kept out of weight decay in the CIFAR study)."""
        self._check_bound()
        return [self.centres, self.inv_sqrt_cov]


class LearnedHeads(PositionalHeads):
    r"""Learned relative embeddings, :math:`a_{hmn} = t_h\cdot r_{\delta_{mn}}`, one table per grid axis.

    :math:`r_\delta` concatenates one row per axis, :math:`r^{(i)}_{\delta_i}` from table
    :math:`i` (``(L_i, D_i)``, :math:`N(0, 1)`; :math:`D_p` = ``positional_dim`` in all, split
    evenly over the axes), and each head scores it with its own vector :math:`t_h`
    (``weight``, initialised as ``torch.nn.Linear``'s of the widest table;
    :func:`~structconv.learned_scores`).  The scores are a sum of per-axis terms, so without
    content the layer builds the heads exactly as a Kronecker product of per-axis softmaxes.

    With ``relative_terms=True`` and content (:class:`ContentHeads`), the heads are the four
    terms of Cordonnier et al.'s Eq. 5 instead (:class:`~structconv.RelativeAttention`): content,
    query-position through :math:`\hat W` (``rel_key``), and the key and position biases
    :math:`u_h, v_h` (``u``, ``v``, started at zero), which replace ``weight``.

    Parameters
    ----------
    positional_dim : int, optional
        :math:`D_p`, at least the grid's dimension; ``None`` gives the layer's ``embed_dim``.
    relative_terms : bool, default False
        The four terms of Eq. 5; needs the layer's content terms, and takes the width :math:`D`
        of their keys (which then have no biases of their own: :math:`u_h` and :math:`v_h` are).

    Shapes
    ------
    - **tables:** :math:`(L_i, D_i)` per axis :math:`i` of :math:`L_i` offsets, :math:`\sum_i D_i = D_p`
    - **weight:** :math:`t_h`, :math:`(K, D_p)` for a layer of :math:`K` heads (without ``relative_terms``)
    - **rel_key:** :math:`\hat W`, :math:`(K, D_p, D)`; **u**, **v:** :math:`(K, D)` (with ``relative_terms``)

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import ContentHeads, LearnedHeads, PositionalAttention
    >>> layer = PositionalAttention((5, 5), 8, 2, encoding=LearnedHeads(positional_dim=6))
    >>> [tuple(t.shape) for t in layer.encoding.tables], tuple(layer.encoding.weight.shape)
    ([(9, 3), (9, 3)], (2, 6))
    >>> heads, content = LearnedHeads(relative_terms=True), ContentHeads()
    >>> eq5 = PositionalAttention((5, 5), 8, 2, encoding=heads, content=content)
    >>> eq5.encoding
    LearnedHeads(positional_dim=8, relative_terms=True)
    >>> eq5(torch.randn(3, 25, 8)).shape
    torch.Size([3, 25, 8])
    """

    name = "learned"
    shown = ("positional_dim",)
    tables: nn.ParameterList
    weight: nn.Parameter
    rel_key: nn.Parameter
    u: nn.Parameter
    v: nn.Parameter

    def __init__(self, *, positional_dim: int | None = None, relative_terms: bool = False) -> None:
        super().__init__()
        name = type(self).__name__
        self.positional_dim = optional_positive_int(name, "positional_dim", positional_dim)
        self.relative_terms = flag(name, "relative_terms", relative_terms)

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

    def with_content(self, content: ContentHeads) -> Mechanism:
        """With ``relative_terms``, the four terms of Eq. 5; otherwise the content scores plus the positional ones."""
        if not self.relative_terms:
            return super().with_content(content)
        self._check_bound()
        assert content.key_dim is not None  # resolved when bound
        return RelativeAttention(
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
