r"""Fig. 4 of Cordonnier et al. (2020): each head's centre :math:`\Delta_h` with its probability contours.

A quadratic or Gaussian head is, up to the lattice, the normal density
:math:`\mathcal N(\Delta_h, P_h^{-1})` over offsets from the query (:func:`head_gaussians`); its
50 % and 90 % regions are ellipses (:func:`probability_contour`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ....nn import GaussianHeads, PositionalAttention, QuadraticHeads
from ..models import SelfAttentionNet
from .common import check_model, float64, new_figure, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["head_gaussians", "mahalanobis_radius", "plot_centres", "probability_contour"]

#: Probability levels of the contours of :func:`plot_centres`, and their line styles.
_LEVELS = ((0.5, "-"), (0.9, ":"))


def head_gaussians(layer: PositionalAttention) -> tuple[np.ndarray, np.ndarray]:
    r"""The centre and precision of each head's Gaussian, in offsets from the query.

    A quadratic head scores :math:`-\alpha_h\lVert\delta - \Delta_h\rVert^2` and a Gaussian one
    :math:`-\tfrac12(\delta - \Delta_h)^\top P_h(\delta - \Delta_h)` with :math:`P_h = S_h^\top S_h`;
    the softmax over keys is then (on an unbounded grid, up to the lattice) the normal density
    :math:`\mathcal N(\Delta_h, P_h^{-1})` with :math:`P_h = 2\alpha_h I` for the quadratic heads,
    i.e. covariance :math:`I/(2\alpha_h)`.

    Parameters
    ----------
    layer
        A layer with :class:`~structconv.nn.QuadraticHeads` or :class:`~structconv.nn.GaussianHeads`.

    Returns
    -------
    (centres, precisions)
        ``(H, d)`` centres :math:`\Delta_h` (key minus query, ``(row, column)`` in 2-D) and
        ``(H, d, d)`` precisions :math:`P_h`.

    Raises
    ------
    ValueError
        For :class:`~structconv.nn.LearnedHeads`, which have no centre.
    """
    heads = layer.encoding
    if not isinstance(heads, QuadraticHeads | GaussianHeads):
        raise ValueError(
            f"head centres exist for the quadratic and gaussian encodings only, not {heads.name!r} "
            "(plot its attention maps instead)"
        )
    centres = float64(heads.centres)
    d = centres.shape[1]
    if isinstance(heads, QuadraticHeads):
        alpha = float64(heads.alpha())
        precisions = 2.0 * alpha[:, None, None] * np.eye(d)[None]
    else:
        S = float64(heads.inv_sqrt_cov)
        precisions = np.einsum("hij,hik->hjk", S, S)
    return centres, precisions


def mahalanobis_radius(p: float) -> float:
    r"""The Mahalanobis radius :math:`\sqrt{-2\ln(1-p)}` of the 2-D normal region of probability ``p``.

    :math:`\lVert x-\mu\rVert^2_{\Sigma^{-1}}` is :math:`\chi^2_2`-distributed, whose distribution
    function is :math:`1 - e^{-r^2/2}`.  For the isotropic covariance :math:`I/(2\alpha)` this is
    the circle of radius :math:`\sqrt{-\ln(1-p)/\alpha}`.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p!r}")
    return math.sqrt(-2.0 * math.log1p(-p))


def probability_contour(centre: np.ndarray, precision: np.ndarray, p: float, points: int = 129) -> np.ndarray:
    r"""Points of the ellipse holding probability ``p`` of :math:`\mathcal N(\Delta, P^{-1})` in 2-D.

    The ellipse is :math:`\{x : (x-\Delta)^\top P (x-\Delta) = r^2\}` with
    :math:`r` = :func:`mahalanobis_radius` ``(p)``; with :math:`P = V\Lambda V^\top` its points
    are :math:`\Delta + r\,V\Lambda^{-1/2}(\cos t, \sin t)^\top`.  A direction of (near) zero
    precision gives a (near) unbounded axis, clipped at :math:`10^6`.

    Parameters
    ----------
    centre
        :math:`\Delta`, shape ``(2,)``.
    precision
        :math:`P`, shape ``(2, 2)``, symmetric positive semi-definite.
    p
        The probability inside, in ``(0, 1)``.
    points
        How many points (the first and last coincide, closing the curve).

    Returns
    -------
    numpy.ndarray
        ``(points, 2)``, in the coordinates of ``centre``.
    """
    centre = np.asarray(centre, dtype=np.float64)
    precision = np.asarray(precision, dtype=np.float64)
    if centre.shape != (2,) or precision.shape != (2, 2):
        raise ValueError(f"need a (2,) centre and a (2, 2) precision, got {centre.shape} and {precision.shape}")
    lam, V = np.linalg.eigh(0.5 * (precision + precision.T))
    axes = np.minimum(mahalanobis_radius(p) / np.sqrt(np.maximum(lam, 1e-12)), 1e6)
    t = np.linspace(0.0, 2.0 * np.pi, points)
    circle = np.stack([np.cos(t), np.sin(t)], axis=1)
    return np.asarray(centre + (circle * axes) @ V.T)


def _head_colours(H: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if H <= 10 else "tab20"] if H <= 20 else colormaps["hsv"]
    n = cmap.N if H <= 20 else H + 1
    return [cmap(h % n if H <= 20 else h / n) for h in range(H)]


def _centres_figure(model: SelfAttentionNet) -> Figure:
    layers = model.attention_layers()
    if not layers:
        raise ValueError("plot_centres: the model has no attention layers")
    if len(model.grid) != 2:
        raise ValueError(f"plot_centres draws 2-D grids only, got {model.grid}")
    heads = [head_gaussians(layer) for layer in layers]
    from matplotlib.lines import Line2D

    # one view for all layers: the centres and their 90 % contours, within the grid's offsets
    far = 3.0
    for centres, precisions in heads:
        for c, P in zip(centres, precisions, strict=True):
            far = max(far, float(np.abs(probability_contour(c, P, 0.9, 33)).max()))
    limit = min(far + 0.5, max(model.grid) - 0.5)
    cols = min(len(layers), 3)
    rows = -(-len(layers) // cols)
    fig = new_figure(3.2 * cols + 1.3, 3.2 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    H = layers[0].num_heads
    colours = _head_colours(H)
    for i, (centres, precisions) in enumerate(heads):
        ax = axes.flat[i]
        for h, (c, P) in enumerate(zip(centres, precisions, strict=True)):
            for p, style in _LEVELS:
                curve = probability_contour(c, P, p)
                ax.plot(curve[:, 1], curve[:, 0], style, color=colours[h], linewidth=1.0)
        ax.scatter(centres[:, 1], centres[:, 0], c=colours[: len(centres)], s=28, zorder=3, edgecolors="white")
        ax.scatter([0.0], [0.0], marker="s", c="black", s=40, zorder=4)
        ax.set_xlim(-limit, limit)
        ax.set_ylim(limit, -limit)  # rows grow downwards, as in an image
        ax.set_aspect("equal")
        ax.grid(True, alpha=0.25)
        ax.set_title(f"layer {i + 1}", fontsize=12)
        ax.set_xlabel("column offset")
        ax.set_ylabel("row offset")
    for ax in axes.flat[len(layers) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], marker="o", linestyle="", color=colours[h], label=f"head {h + 1}") for h in range(H)]
    handles += [
        Line2D([], [], marker="s", linestyle="", color="black", label="query pixel"),
        Line2D([], [], linestyle="-", color="gray", label="50 % contour"),
        Line2D([], [], linestyle=":", color="gray", label="90 % contour"),
    ]
    fig.legend(handles=handles, loc="outside right upper", fontsize=10)
    fig.suptitle(f"{layers[0].encoding.name} encoding: attention centres of each head", fontsize=13)
    return fig


def plot_centres(model: SelfAttentionNet, path: Path) -> Path:
    r"""The centre of every head of every layer with its 50 % and 90 % probability contours (Fig. 4).

    Head :math:`h` is a dot at :math:`\Delta_h`, in pixel offsets from the query pixel (the black
    square at the origin), with the contours of :math:`\mathcal N(\Delta_h, P_h^{-1})` (see
    :func:`head_gaussians` and :func:`probability_contour`): solid for 50 %, dotted for 90 %.
    One subplot per layer, all on the same scale; colours identify heads within a layer.

    Parameters
    ----------
    model
        A :class:`~.models.SelfAttentionNet` with the quadratic or Gaussian encoding.
    path
        The PNG to write.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        For the learned encoding (no centres).
    """
    model = check_model(model, "plot_centres")
    return save(_centres_figure(model), path)
