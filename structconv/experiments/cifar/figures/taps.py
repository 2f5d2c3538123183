r"""How close each head is to one tap of a convolution: its distance to the nearest one-hot shift."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ....bases.grid import GridBasis
from ....theory.conv_attention import ConvolutionFit, nearest_convolution
from ..models import SelfAttentionNet
from .common import check_model, float64, mean_heads, new_figure, save

__all__ = ["convolutionality", "plot_convolutionality"]


def convolutionality(
    model: SelfAttentionNet, images: torch.Tensor | None = None, interior: bool = True
) -> list[ConvolutionFit]:
    r"""Per block, each head's nearest one-hot shift and its distance from it.

    The offset of head :math:`h` is the one of largest mean weight (over queries, and images for
    content attention), as :func:`~structconv.theory.conv_attention.nearest_convolution` chooses it, and
    ``mass`` is that mean weight.  The distance is the mean total variation
    :math:`\tfrac12\lVert a_{:,n} - s_{:,n}\rVert_1` between the head's column and the shift's
    over the queries :math:`n` (and images): with ``interior=True`` (default) over the queries
    whose key :math:`n + \Delta` lies on the grid, with ``interior=False`` over all of them
    (exactly ``nearest_convolution``'s distance).  Content heads are averaged over the images
    first, which gives the same distance.  Why both hold is in docs/cifar.rst ("The figures").

    Parameters
    ----------
    model
        A :class:`~.models.SelfAttentionNet`.
    images
        ``(B, 3, 32, 32)`` normalised images (content attention only).
    interior
        As above.

    Returns
    -------
    list of ConvolutionFit
        One per block, first to last.
    """
    model = check_model(model, "convolutionality")
    fits = []
    for attention, mean in zip(model.attention_layers(), mean_heads(model, images, "convolutionality"), strict=True):
        mode = "circular" if attention.boundary == "periodic" else "zeros"  # the layer's grid, in torch's words
        fit = nearest_convolution(mean, attention.grid, padding_mode=mode)
        if interior:
            shifts = float64(GridBasis(fit.grid, fit.grid, fit.offsets, boundary=attention.boundary).to_dense())
            valid = shifts.sum(axis=1) > 0.5  # (H, N): the queries whose key n + offset is on the grid
            per_query = 0.5 * np.abs(mean - shifts).sum(axis=1)  # (H, N)
            distance = (per_query * valid).sum(axis=1) / np.maximum(valid.sum(axis=1), 1)
            fit = ConvolutionFit(fit.grid, fit.padding_mode, fit.offsets, distance, fit.mass)
        fits.append(fit)
    return fits


def plot_convolutionality(model: SelfAttentionNet, path: Path, images: torch.Tensor | None = None) -> Path:
    r"""Heat map, layers by heads, of each head's distance to its nearest one-hot shift.

    The colour is the total-variation distance of :func:`convolutionality` (interior queries):
    0 means the head is exactly one tap of a convolution, 1 that it shares nothing with any
    shift.  Each cell is annotated with the nearest offset ``(row, column)`` from the query and the distance.

    Parameters
    ----------
    model
        A :class:`~.models.SelfAttentionNet`.
    path
        The PNG to write.
    images
        ``(B, 3, 32, 32)`` normalised images (content attention only).

    Returns
    -------
    Path
        ``path``.
    """
    fits = convolutionality(model, images)
    distance = np.stack([f.distance for f in fits])
    L, H = distance.shape
    fig = new_figure(0.75 * H + 2.2, 0.6 * L + 1.4)
    ax = fig.add_subplot()
    image = ax.imshow(distance, cmap="viridis_r", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    for layer, fit in enumerate(fits):
        for h in range(H):
            dr, dc = (int(v) for v in fit.offsets[h])
            colour = "black" if distance[layer, h] < 0.5 else "white"
            text = f"{dr},{dc}\n{distance[layer, h]:.2f}"
            ax.text(h, layer, text, ha="center", va="center", fontsize=7.5, color=colour)
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)])
    ax.set_yticks(range(L), [str(layer + 1) for layer in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("cells: the tap's (row, column) offset, then the distance", fontsize=10)
    layers = model.attention_layers()
    content = any(a.content is not None for a in layers)
    encoding = layers[0].encoding.name + (" + content" if content else "")
    fig.suptitle(f"{encoding} encoding\ndistance of each head to its nearest convolution tap", fontsize=12)
    fig.colorbar(image, ax=ax, label="total variation")
    return save(fig, path)
