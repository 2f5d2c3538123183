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

One module per figure: ``curves`` (accuracy), ``centres``, ``maps`` (attention maps) and
``taps`` (convolutionality), on ``common`` (canvas, saving, the heads of a model); this package
re-exports their public names and draws them all with :func:`make_figures`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ....nn import GaussianHeads, QuadraticHeads
from ..models import SelfAttentionNet
from .centres import head_gaussians, mahalanobis_radius, plot_centres, probability_contour
from .common import DPI
from .curves import plot_accuracy
from .maps import attention_maps, plot_attention_maps
from .taps import convolutionality, plot_convolutionality

__all__ = [
    "DPI",
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
    from ..train import iterate_runs, model_from_checkpoint

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
        if all(isinstance(layer.encoding, QuadraticHeads | GaussianHeads) for layer in layers):
            paths.append(plot_centres(model, out / f"{run.name}_centres.png"))
        if any(layer.content is not None for layer in layers) and images is None:
            warnings.warn(
                f"{run.name}: content attention needs images; its attention maps and convolutionality are skipped",
                UserWarning,
                stacklevel=2,
            )
            continue
        paths.append(plot_attention_maps(model, out / f"{run.name}_attention.png", images=images))
        paths.append(plot_convolutionality(model, out / f"{run.name}_convolutionality.png", images=images))
    return paths
