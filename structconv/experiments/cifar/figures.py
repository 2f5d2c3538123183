r"""Figures of the CIFAR-10 study (Cordonnier, Loukas & Jaggi 2020) from run directories.

==================================  ============================================================
:func:`plot_accuracy`               test accuracy against epoch for several runs (their Fig. 2)
:func:`plot_centres`                the centres :math:`\Delta_h` of quadratic or Gaussian heads
                                    with their 50 % and 90 % probability contours (Fig. 4)
:func:`plot_attention_maps`         every head's attention probabilities at one query pixel,
                                    layers by heads (Figs. 5 and 6)
:func:`plot_convolutionality`       each head's total-variation distance to its nearest one-hot
                                    shift, i.e. how close it is to one tap of a convolution
:func:`make_figures`                all of the above for every run under a directory
==================================  ============================================================

Conventions.  The score of a head depends on the offset :math:`\delta = \mathrm{pos}(m) -
\mathrm{pos}(n)` from the query :math:`n` to the key :math:`m`
(:func:`structconv.structures.positional.relative_offsets`), so a head centred at :math:`\Delta_h` attends
to the key at *query* :math:`+\,\Delta_h`.  Offsets are ``(row, column)`` pairs and every figure
draws them as an image is drawn: the column offset to the right, the row offset *down*, the
query pixel at the origin.  A "pixel" is one token of the :math:`16\times16` grid that the
network attends over (a :math:`2\times2` block of the :math:`32\times32` image).  Layers are
numbered from 1 in the figures, as in the paper.

Matplotlib is imported inside the functions (importing this module is cheap), and figures are
drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas, so no global backend
or pyplot state is touched.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...nn import PositionalAttention
from ...structures.grid import GridBasis
from ...theory.conv_attention import ConvolutionFit, nearest_convolution
from .models import SelfAttentionNet

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "attention_maps",
    "convolutionality",
    "head_gaussians",
    "mahalanobis_radius",
    "make_figures",
    "plot_accuracy",
    "plot_attention_maps",
    "plot_centres",
    "plot_convolutionality",
    "probability_contour",
]

#: Resolution of every PNG written here.
DPI = 120
#: Images per forward pass when attention depends on content (bounds the ``(B, H, M, N)`` heads held at once).
_CHUNK = 25
#: Probability levels of the contours of :func:`plot_centres`, and their line styles.
_LEVELS = ((0.5, "-"), (0.9, ":"))


# --- helpers ----------------------------------------------------------------------------------------
def _new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _check_model(model: Any, what: str) -> SelfAttentionNet:
    if not isinstance(model, SelfAttentionNet):
        raise TypeError(f"{what} needs a SelfAttentionNet, got {type(model).__name__}")
    return model


def _numpy(a: Any) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return np.asarray(a.detach().to("cpu", torch.float64).numpy())
    return np.asarray(a, dtype=np.float64)


class _Evaluating:
    """``torch.no_grad()`` with the model in eval mode, its previous mode restored on exit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.was = model, model.training
        self.grad = torch.no_grad()

    def __enter__(self) -> None:
        self.model.eval()
        self.grad.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.grad.__exit__(None, None, None)
        self.model.train(self.was)


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


def _mean_heads(model: SelfAttentionNet, images: torch.Tensor | None, what: str) -> list[np.ndarray]:
    r"""Per block, its heads as a dense ``(H, M, N)`` array, averaged over ``images`` for content attention.

    Position-only heads are the same for every image and are taken as they are; content heads
    are built from ``model.features(images, upto=l)`` chunk by chunk and averaged, in one
    forward pass.  Runs under ``torch.no_grad`` with the model in eval mode.
    """
    layers = model.attention_layers()
    content = [a.content for a in layers]
    if any(content) and images is None:
        first = content.index(True)
        raise ValueError(
            f"{what}: layer {first + 1} attends by content, so its heads depend on the input; pass images "
            "(B, 3, 32, 32), normalised as in training (the paper averages over 100 test images)"
        )
    heads: dict[int, np.ndarray] = {}
    with _Evaluating(model):
        for i, attention in enumerate(layers):
            if not attention.content:
                heads[i] = _numpy(attention.basis().to_dense())
        if images is not None and any(content):
            totals: dict[int, np.ndarray] = {}
            count = 0
            for inputs in _layer_inputs(model, images):
                count += int(inputs[0].shape[0])
                for i, attention in enumerate(layers):
                    if attention.content:
                        part = _numpy(attention.basis(inputs[i]).to_dense()).sum(0)
                        totals[i] = totals[i] + part if i in totals else part
            heads.update({i: total / count for i, total in totals.items()})
    return [heads[i] for i in range(len(layers))]


# --- Fig. 2: accuracy ---------------------------------------------------------------------------------
def _read_metrics(run: Path) -> dict[str, Any]:
    path = Path(run) / "metrics.json"
    if not path.is_file():
        raise ValueError(f"run directory {run} has no metrics.json")
    try:
        metrics = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    ok = isinstance(metrics, dict) and isinstance(metrics.get("config"), dict) and "model" in metrics["config"]
    if not ok or not isinstance(metrics.get("history"), list):
        raise ValueError(f"{path}: not the metrics of a training run (needs config.model and history)")
    return dict(metrics)


def plot_accuracy(runs: Sequence[Path], path: Path, title: str | None = None) -> Path:
    """Test accuracy (%) against epoch for each run, as in Fig. 2 of Cordonnier et al. (2020).

    Parameters
    ----------
    runs
        Run directories, each holding the ``metrics.json`` written by
        :func:`~structconv.experiments.cifar.train.train`.
    path
        The PNG to write (parent directories are created).
    title
        The axes' title, if any.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        If ``runs`` is empty, or a run has no (readable) ``metrics.json``; the message names it.
    """
    runs = [Path(r) for r in runs]
    if not runs:
        raise ValueError("plot_accuracy: no runs given")
    curves = []
    for run in runs:
        metrics = _read_metrics(run)
        config = metrics["config"]
        label = str(config["model"]) + (f" ({config['preset']})" if config.get("preset") else "")
        epochs = [int(row["epoch"]) for row in metrics["history"]]
        accuracy = [100.0 * float(row["test_acc"]) for row in metrics["history"]]
        curves.append((run, label, epochs, accuracy))
    labels = [c[1] for c in curves]
    from matplotlib.ticker import MaxNLocator

    fig = _new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    for run, label, epochs, accuracy in curves:
        name = f"{label} [{run.name}]" if labels.count(label) > 1 else label
        ax.plot(epochs, accuracy, marker="o" if len(epochs) <= 30 else None, markersize=3, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    if title:
        ax.set_title(title)
    return _save(fig, path)


# --- Fig. 4: centres and widths ---------------------------------------------------------------------
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
        A layer with ``encoding`` ``"quadratic"`` or ``"gaussian"``.

    Returns
    -------
    (centres, precisions)
        ``(H, d)`` centres :math:`\Delta_h` (key minus query, ``(row, column)`` in 2-D) and
        ``(H, d, d)`` precisions :math:`P_h`.

    Raises
    ------
    ValueError
        For a ``"learned"`` encoding, which has no centre.
    """
    centres = _numpy(layer.centres) if layer.encoding in ("quadratic", "gaussian") else None
    if centres is None:
        raise ValueError(
            f"head centres exist for the quadratic and gaussian encodings only, not {layer.encoding!r} "
            "(plot its attention maps instead)"
        )
    d = centres.shape[1]
    if layer.encoding == "quadratic":
        alpha = _numpy(layer.alpha())
        precisions = 2.0 * alpha[:, None, None] * np.eye(d)[None]
    else:
        S = _numpy(layer.inv_sqrt_cov)
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
    fig = _new_figure(3.2 * cols + 1.3, 3.2 * rows)
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
        ax.set_title(f"layer {i + 1}")
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
    fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    fig.suptitle(f"attention centres ({layers[0].encoding} encoding)")
    return fig


def plot_centres(model: SelfAttentionNet, path: Path) -> Path:
    r"""The centre of every head of every layer with its 50 % and 90 % probability contours (Fig. 4).

    Head :math:`h` is a dot at :math:`\Delta_h`, in pixel offsets from the query pixel (the black
    square at the origin), with the contours of :math:`\mathcal N(\Delta_h, P_h^{-1})` (see
    :func:`head_gaussians`): solid for 50 %, dotted for 90 %.  An isotropic head's
    :math:`p`-contour is the circle of radius :math:`\sqrt{-\ln(1-p)/\alpha_h}`, a non-isotropic
    one's the ellipse of Mahalanobis radius :math:`\sqrt{-2\ln(1-p)}`.  One subplot per layer,
    all on the same scale; colours identify heads within a layer.

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
    model = _check_model(model, "plot_centres")
    return _save(_centres_figure(model), path)


# --- Figs. 5 and 6: attention maps ------------------------------------------------------------------
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
    model = _check_model(model, "attention_maps")
    q = _query(model, query)
    n = q[0] * model.grid[1] + q[1]
    heads = _mean_heads(model, images, "attention_maps")
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
    model = _check_model(model, "plot_attention_maps")
    if zoom is not None and (isinstance(zoom, bool) or not isinstance(zoom, int) or zoom < 1):
        raise ValueError(f"zoom must be a positive integer or None, got {zoom!r}")
    q = _query(model, query)
    maps = attention_maps(model, q, images)
    from matplotlib.patches import Rectangle

    L, H = maps.shape[:2]
    size = 1.35 if zoom is not None else 1.6
    fig = _new_figure(size * H + 0.6, size * L + 0.7)
    axes = fig.subplots(L, H, squeeze=False)
    for layer in range(L):
        for h in range(H):
            ax = axes[layer, h]
            shown, extent = _window(maps[layer, h], q, zoom)
            top = float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0
            ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=max(top, 1e-12), extent=extent, interpolation="nearest")
            ax.add_patch(Rectangle((-0.5, -0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
            ax.text(0.03, 0.97, f"{top:.2g}", transform=ax.transAxes, va="top", ha="left", fontsize=6, color="white")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {h + 1}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=8)
    kind = "averaged over images" if any(a.content for a in model.attention_layers()) else "position only"
    fig.suptitle(f"attention at query pixel {q} ({kind})", fontsize=9)
    return _save(fig, path)


# --- convolutionality -------------------------------------------------------------------------------
def convolutionality(
    model: SelfAttentionNet, images: torch.Tensor | None = None, interior: bool = True
) -> list[ConvolutionFit]:
    r"""Per block, each head's nearest one-hot shift and its distance from it.

    The offset of head :math:`h` is the one of largest mean weight (over queries, and images for
    content attention), as :func:`~structconv.theory.conv_attention.nearest_convolution` chooses it, and
    ``mass`` is that mean weight.  The distance is the mean total variation
    :math:`\tfrac12\lVert a_{:,n} - s_{:,n}\rVert_1` between the head's column and the shift's
    over the queries :math:`n` (and images):

    * ``interior=True`` (default): over the queries whose key :math:`n + \Delta` lies on the
      grid.  On a ``"zero"`` grid the shift's column of any other query is empty, and no
      softmax column (which sums to 1) can match it, so counting those would give a head that
      is exactly a convolution tap a distance of half the fraction of such queries.
    * ``interior=False``: over all queries, exactly ``nearest_convolution``'s distance.

    Content heads are averaged over the images first.  This loses nothing: a column
    :math:`a` of attention is a probability vector, so its distance to the one-hot column
    :math:`e_k` is :math:`\tfrac12(1 - a_k + \sum_{j\ne k} a_j) = 1 - a_k`, linear in
    :math:`a`, and the mean over images of the distances is the distance of the mean head.

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
    model = _check_model(model, "convolutionality")
    fits = []
    for attention, mean in zip(model.attention_layers(), _mean_heads(model, images, "convolutionality"), strict=True):
        fit = nearest_convolution(mean, attention.grid, attention.boundary)
        if interior:
            shifts = _numpy(GridBasis(fit.grid, fit.grid, fit.offsets, 1, fit.boundary).to_dense())
            valid = shifts.sum(axis=1) > 0.5  # (H, N): the queries whose key n + offset is on the grid
            per_query = 0.5 * np.abs(mean - shifts).sum(axis=1)  # (H, N)
            distance = (per_query * valid).sum(axis=1) / np.maximum(valid.sum(axis=1), 1)
            fit = ConvolutionFit(fit.grid, fit.boundary, fit.offsets, distance, fit.mass)
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
    fig = _new_figure(0.75 * H + 2.2, 0.6 * L + 1.4)
    ax = fig.add_subplot()
    image = ax.imshow(distance, cmap="viridis_r", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    for layer, fit in enumerate(fits):
        for h in range(H):
            dr, dc = (int(v) for v in fit.offsets[h])
            colour = "black" if distance[layer, h] < 0.5 else "white"
            text = f"{dr},{dc}\n{distance[layer, h]:.2f}"
            ax.text(h, layer, text, ha="center", va="center", fontsize=6.5, color=colour)
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)])
    ax.set_yticks(range(L), [str(layer + 1) for layer in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("distance to the nearest convolution tap (cells: its row,col offset; the distance)", fontsize=9)
    fig.colorbar(image, ax=ax, label="total variation")
    return _save(fig, path)


# --- everything -------------------------------------------------------------------------------------
def make_figures(root: Path, out: Path | None = None, images: torch.Tensor | None = None) -> list[Path]:
    """All figures for the runs under ``root`` (the directories with a ``metrics.json``).

    Writes ``accuracy.png`` (every run) and, for each run whose ``checkpoint.pt`` holds a
    self-attention model, ``<run>_centres.png`` (quadratic and Gaussian encodings),
    ``<run>_attention.png`` and ``<run>_convolutionality.png``.  Content models need ``images``
    for the last two; without them those two are skipped with a :class:`UserWarning`.  Runs
    without a checkpoint and convolutional models contribute their accuracy curve only.

    Parameters
    ----------
    root
        The directory holding the run directories.
    out
        Where to write; ``root / "figures"`` by default.
    images
        ``(B, 3, 32, 32)`` normalised test images (e.g. 100, as in the paper).

    Returns
    -------
    list of Path
        The files written, ``accuracy.png`` first.

    Raises
    ------
    ValueError
        If there is no run under ``root``.
    """
    from .train import iterate_runs, model_from_checkpoint

    root = Path(root)
    out = root / "figures" if out is None else Path(out)
    runs = list(iterate_runs(root))
    if not runs:
        raise ValueError(f"no run directories (holding a metrics.json) under {root}")
    paths = [plot_accuracy(runs, out / "accuracy.png", title=f"CIFAR-10 test accuracy ({root.name})")]
    for run in runs:
        checkpoint = run / "checkpoint.pt"
        if not checkpoint.is_file():
            continue
        model, _, _ = model_from_checkpoint(checkpoint)
        if not isinstance(model, SelfAttentionNet) or not model.attention_layers():
            continue
        layers = model.attention_layers()
        if all(layer.encoding in ("quadratic", "gaussian") for layer in layers):
            paths.append(plot_centres(model, out / f"{run.name}_centres.png"))
        if any(layer.content for layer in layers) and images is None:
            warnings.warn(
                f"{run.name}: content attention needs images; its attention maps and convolutionality are skipped",
                UserWarning,
                stacklevel=2,
            )
            continue
        paths.append(plot_attention_maps(model, out / f"{run.name}_attention.png", images=images))
        paths.append(plot_convolutionality(model, out / f"{run.name}_convolutionality.png", images=images))
    return paths
