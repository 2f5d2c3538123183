"""Figs. 5 and 6 of Cordonnier et al. (2020): every head's attention at one query pixel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..models import SelfAttentionNet
from .common import check_model, mean_heads, new_figure, save

__all__ = ["attention_maps", "plot_attention_maps"]


def _query(model: SelfAttentionNet, query: tuple[int, int] | None) -> tuple[int, int]:
    rows, cols = model.grid
    if query is None:
        return rows // 2, cols // 2
    q = tuple(int(v) for v in query)
    if len(q) != 2 or not (0 <= q[0] < rows and 0 <= q[1] < cols):
        raise ValueError(f"query must be a (row, column) pixel of the {rows}x{cols} grid, got {query!r}")
    return q[0], q[1]


def attention_maps(
    model: SelfAttentionNet, query: tuple[int, int] | None = None, images: torch.Tensor | None = None
) -> np.ndarray:
    r"""Each head's attention probabilities over the keys for one query pixel.

    Position-only heads are the same for every image; content heads are averaged over
    ``images`` (the paper averages over 100 test images): for block :math:`l` the column
    :math:`A_h[:, n]` of ``layer.basis(model.features(images, upto=l))``.

    Parameters
    ----------
    model
        A :class:`~.models.SelfAttentionNet`.
    query
        ``(row, column)`` of the query pixel on ``model.grid``; the grid centre by default.
    images
        ``(B, 3, 32, 32)`` normalised images; needed by content attention only.

    Returns
    -------
    numpy.ndarray
        ``(L, H, rows, cols)``: ``[l, h, i, j]`` is the weight that head ``h`` of block ``l``
        gives the key ``(i, j)``; it sums to 1 over ``(i, j)``.
    """
    model = check_model(model, "attention_maps")
    q = _query(model, query)
    n = q[0] * model.grid[1] + q[1]
    heads = mean_heads(model, images, "attention_maps")
    if not heads:
        return np.zeros((0, 0, *model.grid))
    return np.stack([h[:, :, n].reshape(-1, *model.grid) for h in heads])


def _window(
    values: np.ndarray, query: tuple[int, int], zoom: int | None
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The part of a ``(rows, cols)`` map shown around ``query`` and its ``imshow`` extent in offsets.

    With ``zoom`` the window is ``2 (zoom // 2) + 1`` pixels wide, centred on the query (NaN off
    the grid); the extent puts the pixel at offset ``(dr, dc)`` at ``x = dc, y = dr``.
    """
    rows, cols = values.shape
    qr, qc = query
    if zoom is None:
        return values, (-qc - 0.5, cols - qc - 0.5, rows - qr - 0.5, -qr - 0.5)
    h = zoom // 2
    window = np.full((2 * h + 1, 2 * h + 1), np.nan)
    r0, r1, c0, c1 = max(qr - h, 0), min(qr + h + 1, rows), max(qc - h, 0), min(qc + h + 1, cols)
    window[r0 - qr + h : r1 - qr + h, c0 - qc + h : c1 - qc + h] = values[r0:r1, c0:c1]
    return window, (-h - 0.5, h + 0.5, h + 0.5, -h - 0.5)


def plot_attention_maps(
    model: SelfAttentionNet,
    path: Path,
    query: tuple[int, int] | None = None,
    images: torch.Tensor | None = None,
    zoom: int | None = 7,
) -> Path:
    """Attention probabilities of every head at one query pixel: layers as rows, heads as columns (Figs. 5-6).

    Each panel shows the keys around the query (axes in offsets from it, the query outlined in
    red), coloured from 0 to that panel's largest weight, which is printed in its corner.

    Parameters
    ----------
    model
        A :class:`~.models.SelfAttentionNet`.
    path
        The PNG to write.
    query
        ``(row, column)`` of the query pixel; the grid centre by default.
    images
        ``(B, 3, 32, 32)`` normalised images, over which content attention is averaged
        (required for content models, ignored otherwise).
    zoom
        Side of the window of keys shown (rounded up to an odd number so that the query is at
        its centre); ``None`` shows the whole grid.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        For a content model without ``images``, a query off the grid or a ``zoom`` below 1.
    """
    model = check_model(model, "plot_attention_maps")
    if zoom is not None and (isinstance(zoom, bool) or not isinstance(zoom, int) or zoom < 1):
        raise ValueError(f"zoom must be a positive integer or None, got {zoom!r}")
    q = _query(model, query)
    maps = attention_maps(model, q, images)
    from matplotlib.patches import Rectangle

    L, H = maps.shape[:2]
    size = 1.35 if zoom is not None else 1.6
    fig = new_figure(size * H + 0.6, size * L + 0.7)
    axes = fig.subplots(L, H, squeeze=False)
    for layer in range(L):
        for h in range(H):
            ax = axes[layer, h]
            shown, extent = _window(maps[layer, h], q, zoom)
            top = float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0
            ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=max(top, 1e-12), extent=extent, interpolation="nearest")
            ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
            ax.text(0.03, 0.97, f"{top:.2g}", transform=ax.transAxes, va="top", ha="left", fontsize=7, color="white")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {h + 1}", fontsize=10)
            if h == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=10)
    layers = model.attention_layers()
    content = any(a.content is not None for a in layers)
    encoding = layers[0].encoding.name + (" + content" if content else "")
    kind = "averaged over images" if content else "position only"
    fig.suptitle(f"{encoding} encoding ({kind})\nattention of each head at query pixel {q}", fontsize=12)
    return save(fig, path)
