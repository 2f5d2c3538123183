"""Figures of the CIFAR-10 study: geometry (offset direction, contours), averaging over images, and the files."""

from __future__ import annotations

import json
import math
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from structconv.data.cifar import CLASSES, Cifar10
from structconv.experiments.cifar import figures
from structconv.experiments.cifar.figures import (
    DPI,
    attention_maps,
    convolutionality,
    head_gaussians,
    mahalanobis_radius,
    make_figures,
    plot_accuracy,
    plot_attention_maps,
    plot_centres,
    plot_convolutionality,
    probability_contour,
)
from structconv.experiments.cifar.models import SelfAttentionNet, build_model
from structconv.experiments.cifar.presets import config_for
from structconv.experiments.cifar.train import train
from structconv.nn import PositionalAttention
from structconv.theory.conv_attention import nearest_convolution

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# integer centres (row, column) per layer of a 2-block, 4-head model: none symmetric, so a sign error shows
CENTRES = [[(1.0, 2.0), (-2.0, 0.0), (0.0, 0.0), (3.0, -1.0)], [(0.0, 1.0), (-1.0, -3.0), (2.0, 2.0), (0.0, -2.0)]]


def _mode(layer: PositionalAttention) -> str:
    """The layer's border as the theory spells it (torch's padding modes)."""
    return "circular" if layer.boundary == "periodic" else "zeros"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert len(data) > 0 and data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _check_png(path: Path, size: tuple[float, float] | None = None) -> None:
    """A valid, non-trivial PNG that matplotlib reads back with the dimensions of its header (and ``size`` inches)."""
    import matplotlib.image

    assert path.is_file() and path.stat().st_size > 0
    width, height = _png_size(path)
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width) and pixels.shape[2] in (3, 4)
    assert width >= 200 and height >= 150
    assert float(pixels[..., :3].std()) > 0.01  # not a blank canvas
    if size is not None:
        assert (width, height) == (round(size[0] * DPI), round(size[1] * DPI))


def _tiny(name: str = "sa-quadratic", **options: Any) -> SelfAttentionNet:
    torch.manual_seed(0)
    model = build_model(name, **{"width": 16, "depth": 2, "ffn": 16, "heads": 4, "dropout": 0.0, **options})
    assert isinstance(model, SelfAttentionNet)
    return model.eval()


def _hard_quadratic(alpha: float = 40.0) -> SelfAttentionNet:
    model = _tiny("sa-quadratic")
    with torch.no_grad():
        for layer, centres in zip(model.attention_layers(), CENTRES, strict=True):
            layer.encoding.centres.copy_(torch.tensor(centres))
            layer.encoding.set_alpha(alpha)
    return model


def _images(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every figure saved by the module."""
    saved: list[Any] = []
    original = figures.common.save

    def save(fig: Any, path: Path) -> Path:
        saved.append(fig)
        return original(fig, path)

    for module in (figures.curves, figures.centres, figures.maps, figures.taps):  # each draws with its own name
        monkeypatch.setattr(module, "save", save)
    return saved


# --- direction of offsets ---------------------------------------------------------------------------
def test_hard_quadratic_heads_are_found_at_their_centres() -> None:
    model = _hard_quadratic()
    fits = convolutionality(model)
    assert len(fits) == 2
    for fit, centres in zip(fits, CENTRES, strict=True):
        np.testing.assert_array_equal(fit.offsets, np.asarray(centres, dtype=np.int64))
        assert fit.distance.max() < 1e-6
        # the mass on the offset is the fraction of queries whose key query + offset lies on the 16x16 grid
        inside = [(16 - abs(dr)) * (16 - abs(dc)) / 256 for dr, dc in centres]
        np.testing.assert_allclose(fit.mass, inside, atol=1e-6)


def test_interior_false_is_nearest_convolution_and_counts_the_border() -> None:
    model = _hard_quadratic()
    for fit, layer in zip(convolutionality(model, interior=False), model.attention_layers(), strict=True):
        reference = nearest_convolution(layer.basis(), layer.grid, padding_mode=_mode(layer))
        np.testing.assert_array_equal(fit.offsets, reference.offsets)
        np.testing.assert_allclose(fit.distance, reference.distance, atol=1e-12)
        np.testing.assert_allclose(fit.mass, reference.mass, atol=1e-12)
    # a softmax column at the border cannot match an empty shift column: half of the outside fraction
    fit = convolutionality(model, interior=False)[0]
    np.testing.assert_allclose(fit.distance, 0.5 * (1.0 - fit.mass), atol=1e-6)
    assert fit.distance[0] == pytest.approx(0.5 * 46 / 256, abs=1e-6)  # offset (1, 2): 46 of 256 keys are off
    assert fit.distance[2] < 1e-6  # offset (0, 0)


def test_attention_maps_put_the_weight_at_query_plus_centre() -> None:
    model = _hard_quadratic()
    query = (5, 9)
    maps = attention_maps(model, query)
    assert maps.shape == (2, 4, 16, 16)
    np.testing.assert_allclose(maps.sum(axis=(2, 3)), 1.0, atol=1e-6)
    for layer, centres in enumerate(CENTRES):
        for h, (dr, dc) in enumerate(centres):
            assert maps[layer, h, query[0] + int(dr), query[1] + int(dc)] > 1 - 1e-6
    default = attention_maps(model)  # the grid centre, (8, 8)
    assert default[0, 0, 9, 10] > 1 - 1e-6


def test_window_draws_offset_dr_dc_at_x_dc_y_dr() -> None:
    values = np.zeros((16, 16))
    query, (dr, dc) = (1, 14), (2, -1)
    values[query[0] + dr, query[1] + dc] = 1.0
    for zoom in (5, 6, None):
        shown, (left, right, bottom, top) = figures.maps._window(values, query, zoom)
        rows, cols = shown.shape
        assert (right - left, bottom - top) == (cols, rows)  # one unit per pixel, rows growing downwards
        i, j = np.argwhere(shown == 1.0)[0]
        assert (left + j + 0.5, top + i + 0.5) == (dc, dr)
        qi, qj = round(-top - 0.5), round(-left - 0.5)  # the pixel drawn at the origin is the query
        assert shown[qi, qj] == values[query]
    shown, _ = figures.maps._window(values, query, 5)
    assert shown.shape == (5, 5) and np.isnan(shown[0]).all() and np.isnan(shown[:, 4]).all()  # off the grid


# --- centres and contours -------------------------------------------------------------------------------
def test_contours_match_the_closed_form() -> None:
    from scipy.stats import chi2

    for p in (0.5, 0.9):
        r = mahalanobis_radius(p)
        assert chi2.cdf(r * r, df=2) == pytest.approx(p, abs=1e-12)
        alpha, centre = 0.7, np.array([1.5, -2.0])
        circle = probability_contour(centre, 2 * alpha * np.eye(2), p)
        np.testing.assert_allclose(np.linalg.norm(circle - centre, axis=1), math.sqrt(-math.log(1 - p) / alpha))
        precision = np.array([[2.0, 0.6], [0.6, 0.5]])
        ellipse = probability_contour(centre, precision, p, points=64)
        d = ellipse - centre
        np.testing.assert_allclose(np.einsum("ni,ij,nj->n", d, precision, d), -2 * math.log(1 - p))
    with pytest.raises(ValueError, match="p must lie"):
        mahalanobis_radius(1.0)


@pytest.mark.parametrize("encoding", ["quadratic", "gaussian"])
def test_head_gaussians_are_the_moments_of_the_attention(encoding: str) -> None:
    """Centre and covariance of the softmax over keys, relative to the query, are (Delta, P^{-1})."""
    layer = PositionalAttention((31, 31), 4, 2, encoding=encoding, threshold=None)
    with torch.no_grad():
        layer.encoding.centres.copy_(torch.tensor([[2.0, -3.0], [-1.0, 1.5]]))
        if encoding == "quadratic":
            layer.encoding.set_alpha(torch.tensor([0.1, 0.25]))
        else:
            layer.encoding.inv_sqrt_cov.copy_(torch.tensor([[[0.6, 0.2], [0.0, 0.4]], [[0.5, -0.1], [0.3, 0.7]]]))
    centres, precisions = head_gaussians(layer)
    np.testing.assert_array_equal(centres, [[2.0, -3.0], [-1.0, 1.5]])
    if encoding == "quadratic":
        np.testing.assert_allclose(precisions, [0.2 * np.eye(2), 0.5 * np.eye(2)], rtol=1e-6)
    query = np.array([15, 15])
    dense = layer.basis().to_dense().detach().double().numpy()[:, :, 15 * 31 + 15]  # (H, M): weight on each key
    pos = np.stack(np.meshgrid(np.arange(31), np.arange(31), indexing="ij"), -1).reshape(-1, 2) - query
    for h in range(2):
        w = dense[h]
        mean = w @ pos
        cov = (pos - mean).T @ ((pos - mean) * w[:, None])
        np.testing.assert_allclose(mean, centres[h], atol=1e-5)
        np.testing.assert_allclose(cov, np.linalg.inv(precisions[h]), atol=1e-4)


def test_centres_figure_draws_each_centre_at_column_right_row_down() -> None:
    model = _hard_quadratic(alpha=0.5)
    fig = figures.centres._centres_figure(model)
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_title().startswith("layer")]
    assert len(axes) == 2
    r50 = math.sqrt(math.log(2) / 0.5)
    for ax, centres in zip(axes, CENTRES, strict=True):
        assert ax.yaxis_inverted() and not ax.xaxis_inverted()
        dots, query = ax.collections[0], ax.collections[1]
        np.testing.assert_allclose(np.asarray(dots.get_offsets()), [(dc, dr) for dr, dc in centres])
        np.testing.assert_allclose(np.asarray(query.get_offsets()), [(0.0, 0.0)])
        # lines: per head, the 50 % then the 90 % contour, in (x, y) = (column, row)
        solid = np.asarray(ax.lines[0].get_xydata())
        np.testing.assert_allclose(np.linalg.norm(solid - (centres[0][1], centres[0][0]), axis=1), r50)
        assert ax.lines[0].get_linestyle() == "-" and ax.lines[1].get_linestyle() == ":"


def test_centres_need_gaussian_heads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quadratic and gaussian"):
        plot_centres(_tiny("sa-learned"), tmp_path / "c.png")
    with pytest.raises(TypeError, match="SelfAttentionNet"):
        plot_centres(build_model("resnet18", width=4), tmp_path / "c.png")  # type: ignore[arg-type]
    assert not (tmp_path / "c.png").exists()


# --- content attention ---------------------------------------------------------------------------------
def test_layer_inputs_are_the_features_entering_each_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(figures.common, "_CHUNK", 2)
    model, x = _tiny("sa-learned-content"), _images(5)
    chunks = list(figures.common._layer_inputs(model, x))
    assert len(chunks) == 3
    with torch.no_grad():
        for layer in range(2):
            got = torch.cat([c[layer] for c in chunks])
            torch.testing.assert_close(got, model.features(x, upto=layer))


def test_content_maps_and_fits_average_over_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(figures.common, "_CHUNK", 2)  # several chunks must add up to the whole
    model, x = _tiny("sa-learned-content"), _images(5)
    query = (3, 12)
    maps = attention_maps(model, query, x)
    fits = convolutionality(model, x, interior=False)
    with torch.no_grad():
        for layer, attention in enumerate(model.attention_layers()):
            heads = attention.basis(model.features(x, upto=layer))
            dense = heads.to_dense().double().numpy()  # (B, H, M, N)
            expected = dense[..., query[0] * 16 + query[1]].mean(0).reshape(4, 16, 16)
            np.testing.assert_allclose(maps[layer], expected, atol=1e-6)
            assert np.abs(dense[1:] - dense[:1]).max() > 1e-3  # the images do differ
            reference = nearest_convolution(heads, attention.grid, padding_mode=_mode(attention))
            np.testing.assert_array_equal(fits[layer].offsets, reference.offsets)
            np.testing.assert_allclose(fits[layer].distance, reference.distance, atol=1e-9)
            np.testing.assert_allclose(fits[layer].mass, reference.mass, atol=1e-9)
    assert model.training is False


def test_content_layers_need_images(tmp_path: Path) -> None:
    model = _tiny("sa-learned-content")
    with pytest.raises(ValueError, match="images"):
        plot_attention_maps(model, tmp_path / "a.png")
    with pytest.raises(ValueError, match="images"):
        plot_convolutionality(model, tmp_path / "c.png")


# --- files ----------------------------------------------------------------------------------------------
def _metrics(run: Path, model: str, preset: str, accuracy: list[float]) -> None:
    run.mkdir(parents=True)
    history = [{"epoch": i + 1, "test_acc": a, "train_acc": a} for i, a in enumerate(accuracy)]
    payload = {"config": {"model": model, "preset": preset}, "environment": {}, "history": history}
    (run / "metrics.json").write_text(json.dumps(payload))


def test_plot_accuracy_draws_percent_per_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = _capture(monkeypatch)
    _metrics(tmp_path / "a", "sa-quadratic", "fast", [0.25, 0.5, 0.625])
    _metrics(tmp_path / "b", "resnet18", "", [0.4, 0.8])
    path = plot_accuracy([tmp_path / "a", tmp_path / "b"], tmp_path / "out" / "acc.png", title="t")
    assert path == tmp_path / "out" / "acc.png"
    _check_png(path, (6.4, 4.2))
    (ax,) = saved[0].axes
    lines = {line.get_label(): line.get_xydata().tolist() for line in ax.lines}
    assert lines == {"sa-quadratic (fast)": [[1, 25.0], [2, 50.0], [3, 62.5]], "resnet18": [[1, 40.0], [2, 80.0]]}
    assert ax.get_ylabel() == "test accuracy (%)" and ax.get_title() == "t"
    assert ax.title.get_fontsize() >= 10
    assert ax.get_legend() is not None


def test_plot_accuracy_names_the_run_without_metrics(tmp_path: Path) -> None:
    _metrics(tmp_path / "good", "sa-learned", "smoke", [0.1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty"):
        plot_accuracy([tmp_path / "good", tmp_path / "empty"], tmp_path / "acc.png")
    (tmp_path / "empty" / "metrics.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"metrics\.json"):
        plot_accuracy([tmp_path / "empty"], tmp_path / "acc.png")
    with pytest.raises(ValueError, match="no runs"):
        plot_accuracy([], tmp_path / "acc.png")
    assert not (tmp_path / "acc.png").exists()


def test_model_figures_are_pngs(tmp_path: Path) -> None:
    quadratic, gaussian = _hard_quadratic(alpha=0.8), _tiny("sa-gaussian", heads=9)
    _check_png(plot_centres(quadratic, tmp_path / "q.png"))
    _check_png(plot_centres(gaussian, tmp_path / "g.png"))
    _check_png(plot_attention_maps(quadratic, tmp_path / "a.png", query=(0, 15)))
    _check_png(plot_attention_maps(quadratic, tmp_path / "whole.png", zoom=None))
    _check_png(plot_convolutionality(quadratic, tmp_path / "c.png"))
    content = _tiny("sa-learned-content")
    _check_png(plot_attention_maps(content, tmp_path / "ca.png", images=_images(3)))
    with pytest.raises(ValueError, match="zoom"):
        plot_attention_maps(quadratic, tmp_path / "x.png", zoom=0)
    with pytest.raises(ValueError, match="query"):
        plot_attention_maps(quadratic, tmp_path / "x.png", query=(16, 0))
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("name", "encoding"),
    [
        ("sa-quadratic", "quadratic encoding"),
        ("sa-gaussian", "gaussian encoding"),
        ("sa-learned", "learned encoding"),
        ("sa-learned-content", "learned + content encoding"),
    ],
)
def test_figure_titles_name_the_encoding_in_readable_type(
    name: str, encoding: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Figures of different models are told apart by their titles, set in type large enough to read."""
    from matplotlib.text import Text

    saved = _capture(monkeypatch)
    model, images = _tiny(name), _images(2)
    plot_attention_maps(model, tmp_path / "a.png", images=images)
    plot_convolutionality(model, tmp_path / "c.png", images=images)
    if name in ("sa-quadratic", "sa-gaussian"):
        plot_centres(model, tmp_path / "d.png")
    assert len(saved) == (3 if name in ("sa-quadratic", "sa-gaussian") else 2)
    for fig in saved:
        title = fig.get_suptitle()
        assert title.startswith(encoding), title  # "learned encoding" is no prefix of "learned + content ..."
        (shown,) = [t for t in fig.findobj(Text) if t.get_text() == title]
        assert shown.get_fontsize() >= 11
        assert all(ax.title.get_fontsize() >= 10 for ax in fig.axes if ax.get_title())
    maps_title = saved[0].get_suptitle()
    assert "query pixel (8, 8)" in maps_title
    assert ("averaged over images" if name.endswith("content") else "position only") in maps_title


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Smoke runs of a quadratic, a content and a convolutional model on fake data, plus a stray directory."""
    rng = np.random.default_rng(0)

    def split(n: int) -> Cifar10:
        images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        return Cifar10(images, rng.integers(0, 10, size=n).astype(np.int64), CLASSES, "fake")

    root = tmp_path_factory.mktemp("runs")
    data = (split(16), split(8))
    for model in ("sa-quadratic", "sa-learned-content", "resnet18"):
        config = config_for("smoke", model, train_subset=16, test_subset=8)
        train(config, root / model, data, progress=False, log=lambda *_: None)
    (root / "notes").mkdir()  # no metrics.json: not a run
    return root


def test_make_figures_writes_one_file_per_figure(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "figs"
    paths = make_figures(runs, out, images=_images(2))
    expected = [
        "accuracy.png",
        "sa-learned-content_attention.png",
        "sa-learned-content_convolutionality.png",
        "sa-quadratic_centres.png",
        "sa-quadratic_attention.png",
        "sa-quadratic_convolutionality.png",
    ]
    assert [p.name for p in paths] == expected
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    for p in paths:
        assert p.parent == out
        _check_png(p)


def test_make_figures_without_images_skips_content_maps(runs: Path) -> None:
    with pytest.warns(UserWarning, match="sa-learned-content"):
        paths = make_figures(runs)
    assert {p.name for p in paths} == {
        "accuracy.png",
        "sa-quadratic_centres.png",
        "sa-quadratic_attention.png",
        "sa-quadratic_convolutionality.png",
    }
    assert all(p.parent == runs / "figures" and p.is_file() for p in paths)


def test_make_figures_needs_runs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with warnings.catch_warnings(), pytest.raises(ValueError, match="no run directories"):
        warnings.simplefilter("error")
        make_figures(tmp_path)
