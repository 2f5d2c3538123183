r"""The models of Cordonnier, Loukas & Jaggi's CIFAR-10 study, built from structconv layers.

``resnet18``
    The CIFAR variant of ResNet18 (3x3 stem, no max-pooling, four stages of two basic blocks,
    64-128-256-512 channels): every convolution is a :class:`~structconv.nn.GridConv2d`, a
    shift basis plus :math:`\Theta`.
``sa-quadratic``, ``sa-gaussian``, ``sa-learned``, ``sa-learned-content``
    The fully attentional network of the paper's code: 2x2 space-to-depth (32x32x3 to 16x16x12,
    invertible), a linear embedding to width 400, six post-norm blocks of multi-head
    self-attention (:class:`~structconv.nn.PositionalAttention`, then a 400x400 output
    projection) and a GELU feed-forward layer of width 512, each sublayer followed by dropout,
    the residual sum and LayerNorm (eps 1e-12); then the mean over the 256 positions and a
    linear classifier.  The attention is

    ====================== ====================================================================
    ``sa-quadratic``       isotropic Gaussian heads :math:`-\alpha_h\lVert\delta-\Delta_h\rVert^2`,
                           centres initialised :math:`\mathcal N(0, 2^2 I)`, widths
                           :math:`\alpha_h = s_h^2/2` with :math:`s_h` started near 1
    ``sa-gaussian``        non-isotropic Gaussian heads (a learnable precision per head)
    ``sa-learned``         learned relative embeddings, a table of width 400 per axis, no content
    ``sa-learned-content`` the same plus content attention: full-width (400 per head) queries and
                           keys with biases, their scaled dot product added to the positional scores
    ====================== ====================================================================

    with 9 heads and the paper's head width :math:`D_h = D_{\mathrm{out}}`: each head averages
    the raw input and the heads' outputs are mixed by one :math:`3600\times400` map, i.e.
    :math:`\Theta_h` of :math:`400\times400` per head (the formula's parameter), then the output
    projection.  Dropout 0.1 acts on the sublayer outputs and on the attention probabilities,
    whose masks are drawn as the paper's code draws them: position-only heads (the first three
    models) are one tensor for the batch, so one mask per step is shared by every image and the
    heads stay one basis shared by the batch in training too; content heads are per image, and so
    are their masks (``attention={"dropout_shared": False}`` asks for a mask per image for
    position-only heads as well, which makes them per-image in training).  ``projection=False``
    gives Lemma 1's merged form (the output projection absorbed into the :math:`\Theta_h`).
    Position-only heads are exact softmaxes by default (``threshold=None``): Kronecker products
    of per-axis softmaxes for the quadratic and learned encodings, dense for the non-isotropic
    Gaussian; a ``threshold`` in (0, 1) lets the layers truncate concentrated Gaussian heads to
    shift bases (see
    :meth:`structconv.nn.PositionalAttention.basis`).

Every difference from the paper's code that remains is listed, with its reason, in the "paper
code vs structconv" table of docs/cifar.rst.

Pointwise maps (the embedding, the feed-forward layers, the classifier) are ``torch.nn.Linear``:
a one-member identity basis, for which the engine's contraction *is* the GEMM ``x Θ``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ...nn import (
    ContentHeads,
    GaussianHeads,
    GridConv2d,
    LearnedHeads,
    PositionalAttention,
    PositionalHeads,
    QuadraticHeads,
)
from .names import MODEL_NAMES

__all__ = [
    "MODELS",
    "PAPER_CONTENT",
    "PAPER_HEADS",
    "ResNet18",
    "SelfAttentionNet",
    "attention_encodings",
    "build_model",
    "no_decay_parameters",
]


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch normalisation and an identity (or 1x1 projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, conv: type[nn.Module] = GridConv2d) -> None:
        super().__init__()
        self.conv1 = conv(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        out: torch.Tensor = F.relu(y + self.shortcut(x))
        return out


class ResNet18(nn.Module):
    """ResNet18 for 32x32 images (He et al. 2016, CIFAR variant); ``width`` scales every stage.

    ``conv`` is the convolution class, :class:`~structconv.nn.GridConv2d` unless a benchmark asks
    for ``torch.nn.Conv2d`` (same parameters and state-dict keys) as the peer.
    """

    def __init__(
        self, classes: int = 10, width: int = 64, channels: int = 3, conv: type[nn.Module] = GridConv2d
    ) -> None:
        super().__init__()
        widths = [width, 2 * width, 4 * width, 8 * width]
        self.stem = nn.Sequential(conv(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))
        blocks: list[nn.Module] = []
        cin = width
        for i, w in enumerate(widths):
            for j in range(2):
                blocks.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1, conv))
                cin = w
        self.blocks = nn.Sequential(*blocks)
        self.classifier = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(F.relu(self.stem(x)))
        logits: torch.Tensor = self.classifier(y.mean(dim=(2, 3)))
        return logits


class SpaceToDepth(nn.Module):
    """Invertible ``b x b`` downsampling: ``(B, C, H, W)`` to tokens ``(B, H/b * W/b, C b^2)``."""

    def __init__(self, block: int = 2) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pixel_unshuffle(x, self.block)  # (B, C b^2, H/b, W/b)
        return y.flatten(2).transpose(1, 2)


class AttentionBlock(nn.Module):
    r"""Post-norm Transformer block: :math:`h = \mathrm{LN}(x + \mathrm{drop}(W_o\,\mathrm{MHSA}(x)))`,
    :math:`y = \mathrm{LN}(h + \mathrm{drop}(W_2\,\mathrm{GELU}(W_1 h)))`.

    :math:`W_o` is the paper's output projection (``projection=True``); without it the block
    has Lemma 1's merged form, where :math:`W_o` is absorbed into every :math:`\Theta_h` (the
    same functions, fewer parameters, another optimisation path).
    """

    def __init__(
        self, attention: PositionalAttention, ffn: int, dropout: float, projection: bool = True, eps: float = 1e-12
    ) -> None:
        super().__init__()
        E = attention.embed_dim
        self.attention = attention
        self.projection = nn.Linear(E, E) if projection else None
        self.norm1 = nn.LayerNorm(E, eps=eps)
        self.ff1 = nn.Linear(E, ffn)
        self.ff2 = nn.Linear(ffn, E)
        self.norm2 = nn.LayerNorm(E, eps=eps)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(x)
        if self.projection is not None:
            a = self.projection(a)
        h = self.norm1(x + self.drop(a))
        out: torch.Tensor = self.norm2(h + self.drop(self.ff2(F.gelu(self.ff1(h)))))
        return out


#: The attention of Cordonnier et al.'s code (see docs/cifar.rst, "paper code vs structconv"), per
#: encoding: centres N(0, 2^2 I); width alpha = s^2/2 with s started at 1 + N(0, 0.01^2); Gaussian
#: precision A A^T with A = I + N(0, 0.01^2); learned tables of the full width per axis (the model
#: sets positional_dim); content by full-width (the model sets key_dim) biased queries and keys
#: added to the positional scores (PAPER_CONTENT).
PAPER_HEADS: dict[str, PositionalHeads] = {
    "quadratic": QuadraticHeads(alpha=0.5, width="spread", width_noise=0.01, centre_var=4.0),
    "gaussian": GaussianHeads(alpha=0.5, width_noise=0.01, centre_var=4.0),
    "learned": LearnedHeads(relative_terms=False),
}
PAPER_CONTENT = ContentHeads(bias=True)

#: The settings of ``attention`` (a config's flat options: the layer's keywords before its encodings
#: were modules) that belong to each encoding; ``content_bias`` is the content's ``bias``.  The rest
#: are the layer's own (``dropout_shared``, ``boundary``, ...).
_FLAT = {
    "quadratic": ("alpha", "width", "width_noise", "centre_var"),
    "gaussian": ("alpha", "width_noise", "centre_var"),
    "learned": ("relative_terms",),
}
_FLAT_NAMES = {"content_bias", *(name for names in _FLAT.values() for name in names)}


def attention_encodings(
    encoding: str | PositionalHeads,
    content: bool | ContentHeads,
    width: int,
    dims: int,
    key_dim: int | None = None,
    positional_dim: int | None = None,
    attention: dict[str, Any] | None = None,
) -> tuple[PositionalHeads, ContentHeads | None, dict[str, Any]]:
    """The encodings of a model's attention layers, and the layers' own options, from the model's options.

    An encoding given as an object is used as it is.  A name (``"quadratic"``, ``"gaussian"``,
    ``"learned"``) and ``content=True`` give the paper's (:data:`PAPER_HEADS`,
    :data:`PAPER_CONTENT`) at the model's full widths (``positional_dim``: ``width`` per axis of
    the ``dims``-D grid, ``key_dim``: ``width``), with the flat settings of ``attention`` that
    belong to them applied: this maps a config, old or new, once.  As the layer did when it
    took them all, a setting of another encoding is ignored (one ``--option`` serves every
    model), and so are ``width_noise`` for ``"exp"`` widths, ``relative_terms`` without content
    and ``content_bias`` with relative terms.
    """
    flat = dict(attention or {})
    layer = {k: v for k, v in flat.items() if k not in _FLAT_NAMES}
    if isinstance(encoding, PositionalHeads):
        given = sorted(k for k in flat if k in _FLAT_NAMES and k != "content_bias")
        if given or positional_dim is not None:
            extra = given + ["positional_dim"] * (positional_dim is not None)
            raise ValueError(
                f"the encoding {encoding!r} is given as an object: set {extra} in it, not as model options"
            )
        heads = encoding
    elif encoding in PAPER_HEADS:
        settings = {k: flat[k] for k in _FLAT[encoding] if k in flat}
        if encoding == "quadratic" and settings.get("width") == "exp":
            settings["width_noise"] = 0.0  # exp widths start at alpha exactly
        if encoding == "learned":
            settings["positional_dim"] = positional_dim or dims * width
            if not content:
                settings.pop("relative_terms", None)
        heads = PAPER_HEADS[encoding].with_options(**settings)
    else:
        raise ValueError(f"encoding must be one of {sorted(PAPER_HEADS)} or a PositionalHeads, got {encoding!r}")
    relative = isinstance(heads, LearnedHeads) and heads.relative_terms
    if isinstance(content, ContentHeads):
        if key_dim is not None or "content_bias" in flat:
            raise ValueError(f"the content {content!r} is given as an object: set key_dim and bias in it")
        return heads, content, layer
    if not content:
        return heads, None, layer
    bias = bool(flat.get("content_bias", PAPER_CONTENT.bias)) and not relative
    return heads, PAPER_CONTENT.with_options(key_dim=key_dim or width, bias=bias), layer


class SelfAttentionNet(nn.Module):
    """The paper's fully attentional CIFAR model (see the module docstring); input ``(B, 3, 32, 32)``.

    ``encoding`` is the attention layers' encoding of positions: a name for the paper's
    (:data:`PAPER_HEADS`), or an encoding (:class:`~structconv.nn.QuadraticHeads`, ...) used as
    it is; ``content`` is ``True`` for the paper's content terms, or a
    :class:`~structconv.nn.ContentHeads`.  ``key_dim`` and ``positional_dim`` default to the
    paper's full widths (``width`` per head, ``width`` per axis), and ``attention`` holds flat
    settings of the layers and of the paper's encodings (e.g. ``{"alpha": 0.3}``,
    ``{"dropout_shared": False}``; see :func:`attention_encodings`).
    """

    def __init__(
        self,
        encoding: str | PositionalHeads = "quadratic",
        content: bool | ContentHeads = False,
        heads: int = 9,
        width: int = 400,
        depth: int = 6,
        ffn: int = 512,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        projection: bool = True,
        eps: float = 1e-12,
        classes: int = 10,
        image: int = 32,
        channels: int = 3,
        block: int = 2,
        head_dim: int | None = None,
        key_dim: int | None = None,
        positional_dim: int | None = None,
        threshold: float | None = None,
        attention: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if image % block:
            raise ValueError(f"SelfAttentionNet: image={image} must be divisible by block={block}")
        self.grid = (image // block, image // block)
        self.to_tokens = SpaceToDepth(block)
        self.embed = nn.Linear(channels * block * block, width)
        positions, terms, options = attention_encodings(
            encoding, content, width, len(self.grid), key_dim, positional_dim, attention
        )
        self.blocks = nn.ModuleList(
            AttentionBlock(
                PositionalAttention(
                    self.grid, width, heads, encoding=positions, content=terms, head_dim=head_dim,
                    threshold=threshold, attention_dropout=attention_dropout, **options,
                ),
                ffn,
                dropout,
                projection,
                eps,
            )
            for _ in range(depth)
        )  # fmt: skip
        self.classifier = nn.Linear(width, classes)

    def attention_layers(self) -> list[PositionalAttention]:
        """The attention layer of every block, first to last."""
        return [b.attention for b in self.blocks]  # type: ignore[misc]

    def features(self, x: torch.Tensor, upto: int | None = None) -> torch.Tensor:
        """Token features ``(B, M, E)`` entering block ``upto`` (after the last block by default)."""
        h: torch.Tensor = self.embed(self.to_tokens(x))
        for b in self.blocks[:upto]:
            h = b(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x).mean(dim=1))
        return logits


def no_decay_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The attention centres and widths of every positional layer (the paper exempts them from weight decay)."""
    return [
        p for m in model.modules() if isinstance(m, PositionalAttention) for p in m.encoding.positional_parameters()
    ]


@dataclass(frozen=True)
class ModelEntry:
    """A named model: its constructor and the options it fixes."""

    build: Callable[..., nn.Module]
    fixed: dict[str, Any] = field(default_factory=dict)
    summary: str = ""


MODELS: dict[str, ModelEntry] = {
    "resnet18": ModelEntry(ResNet18, {}, "ResNet18 (CIFAR variant) of GridConv2d layers"),
    "sa-quadratic": ModelEntry(SelfAttentionNet, {"encoding": "quadratic"}, "self-attention, quadratic encoding"),
    "sa-gaussian": ModelEntry(SelfAttentionNet, {"encoding": "gaussian"}, "self-attention, non-isotropic Gaussian"),
    "sa-learned": ModelEntry(SelfAttentionNet, {"encoding": "learned"}, "self-attention, learned relative encoding"),
    "sa-learned-content": ModelEntry(
        SelfAttentionNet, {"encoding": "learned", "content": True}, "self-attention, learned encoding + content"
    ),
}


assert tuple(MODELS) == MODEL_NAMES, "names.MODEL_NAMES must list MODELS"


def build_model(name: str, **options: Any) -> nn.Module:
    """The model ``name`` (one of :data:`MODELS`) with constructor ``options`` (e.g. ``width``, ``heads``)."""
    entry = MODELS.get(name)
    if entry is None:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    clash = set(options) & set(entry.fixed)
    if clash:
        raise ValueError(f"model {name!r} fixes {sorted(clash)}; choose another model name instead")
    try:
        return entry.build(**entry.fixed, **options)
    except TypeError as err:
        raise ValueError(f"model {name!r}: bad options {sorted(options)}: {err}") from err
