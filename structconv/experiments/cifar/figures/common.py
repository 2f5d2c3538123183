"""What every figure of the CIFAR study shares: the canvas, saving, and the heads of a model.

:func:`mean_heads` gives each block's heads as dense arrays, averaged over images for content
attention, for the attention maps and the convolutionality figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ....backend import to_numpy
from ..models import SelfAttentionNet
from ..train import _evaluating

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Resolution of every PNG written here.
DPI = 120
#: Images per forward pass when attention depends on content (bounds the ``(B, H, M, N)`` heads held at once).
_CHUNK = 25


def new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG of :data:`DPI` to ``path``, creating its folder; return ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def check_model(model: Any, what: str) -> SelfAttentionNet:
    """``model`` if it is a :class:`~..models.SelfAttentionNet`; else a ``TypeError`` naming ``what``."""
    if not isinstance(model, SelfAttentionNet):
        raise TypeError(f"{what} needs a SelfAttentionNet, got {type(model).__name__}")
    return model


def float64(a: Any) -> np.ndarray:
    """A float64 NumPy copy of an array of either backend (a parameter, a dense basis)."""
    return np.asarray(to_numpy(a), dtype=np.float64)


def _layer_inputs(model: SelfAttentionNet, images: torch.Tensor) -> Iterator[list[torch.Tensor]]:
    """Per chunk of ``images``: the tokens ``(b, M, E)`` entering each block, first to last.

    Equal to ``model.features(chunk, upto=l)`` for every ``l``, with one pass through the blocks
    (the last block itself is not run: only its input is needed).
    """
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, 3, H, W) tensor of normalised images, got {type(images).__name__}")
    if images.shape[0] == 0:
        raise ValueError("images is empty: content attention is averaged over at least one image")
    device = next(model.parameters()).device
    for start in range(0, int(images.shape[0]), _CHUNK):
        chunk = images[start : start + _CHUNK]
        h = model.features(chunk.to(device, torch.float32), upto=0)
        inputs = [h]
        for block in list(model.blocks)[:-1]:
            h = block(h)
            inputs.append(h)
        yield inputs


def mean_heads(model: SelfAttentionNet, images: torch.Tensor | None, what: str) -> list[np.ndarray]:
    r"""Per block, its heads as a dense ``(H, M, N)`` array, averaged over ``images`` for content attention.

    Position-only heads are the same for every image and are taken as they are; content heads
    are built from ``model.features(images, upto=l)`` chunk by chunk and averaged, in one
    forward pass.  Runs under ``torch.no_grad`` with the model in eval mode.
    """
    layers = model.attention_layers()
    content = [a.content is not None for a in layers]
    if any(content) and images is None:
        first = content.index(True)
        raise ValueError(
            f"{what}: layer {first + 1} attends by content, so its heads depend on the input; pass images "
            "(B, 3, 32, 32), normalised as in training (the paper averages over 100 test images)"
        )
    heads: dict[int, np.ndarray] = {}
    with _evaluating(model):
        for i, attention in enumerate(layers):
            if attention.content is None:
                heads[i] = float64(attention.basis().to_dense())
        if images is not None and any(content):
            totals: dict[int, np.ndarray] = {}
            count = 0
            for inputs in _layer_inputs(model, images):
                count += int(inputs[0].shape[0])
                for i, attention in enumerate(layers):
                    if attention.content:
                        part = float64(attention.basis(inputs[i]).to_dense()).sum(0)
                        totals[i] = totals[i] + part if i in totals else part
            heads.update({i: total / count for i, total in totals.items()})
    return [heads[i] for i in range(len(layers))]
