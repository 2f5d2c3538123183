r"""``structconv tour``: the library doing real work on real data, with results to check against papers.

The main job of the repository (``bash scripts/main.sh``), in four parts, each timed:

1. **Identities**: :func:`structconv.theory.selfcheck.run_checks`, the framework's laws (every
   order equals the dense einsum, composition, decomposition, ...) on random cases.
2. **Planetoid (Cora)**: semi-supervised node classification with the papers' set-ups
   (:mod:`structconv.experiments.planetoid`) for GCN, ChebNet and GAT, two seeds each by
   default (``--seeds``), each mean against the test accuracy its paper reports on the same
   split; it counts as reproduced within :data:`TOLERANCE` points:

   =======  ==========  ==============================================================
   model    published   source
   =======  ==========  ==============================================================
   GCN      81.5        Kipf & Welling (ICLR 2017), Table 2
   ChebNet  79.5        Kipf & Welling (ICLR 2017), Table 3 (Chebyshev, :math:`K = 3`)
   GAT      83.0 ± 0.7  Veličković et al. (ICLR 2018), Table 2
   =======  ==========  ==============================================================

3. **Convolution = attention on a real image**: a 3×3 convolution (fixed edge filters) turned
   into multi-head self-attention by
   :meth:`structconv.nn.PositionalAttention.from_conv` (Cordonnier et al., ICLR 2020, Theorem 1:
   one quadratic head per kernel offset) and run on a CIFAR-10 test image; the two outputs agree
   to rounding, measured in float64 and float32, and drawn side by side.
4. **The CIFAR-10 pipeline demo** (``structconv cifar demo``, cut to one epoch on 500 images):
   the three reduced models of the demo preset.  It checks that the study's pipeline runs end to
   end (data, training, checkpoints, figures); its accuracies are those of seconds of CPU
   training and say nothing about the paper's.

A summary table ends the run and is written to ``<out>/summary.md`` and ``<out>/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cifar.cli import DEFAULT_DATA
from .cifar.names import DATA_ENV
from .cli_common import ArgumentParser, did_you_mean, positive_int

DESCRIPTION = (
    "The library at work on real data: the framework's identities; GCN, ChebNet and GAT on Cora against "
    "the papers; convolution = attention on a CIFAR-10 image; the CIFAR-10 pipeline demo. A summary table "
    "ends the run and is written to <out>/summary.md."
)

#: Published Cora test accuracies (%) for the models the tour trains, with their sources.
PUBLISHED = {
    "gcn": (81.5, "Kipf & Welling 2017"),
    "cheb": (79.5, "Kipf & Welling 2017 (Chebyshev K=3)"),
    "gat": (83.0, "Veličković et al. 2018"),
}
MODEL_NAMES = {"gcn": "GCN", "cheb": "ChebNet", "gat": "GAT"}
#: How far (in accuracy points) a mean over seeds may lie from the published number and still
#: count as reproduced: the papers' own spread over seeds is 0.5-1 point, and two or three seeds
#: of ours move the mean by about as much again.
TOLERANCE = 3.0


@dataclass
class Row:
    """One line of the summary: what was run, our number, the published one, and the time it took."""

    part: str
    what: str
    ours: str
    reference: str
    seconds: float
    passed: bool | None = None  # None: a measurement, not a check
    detail: dict[str, Any] = field(default_factory=dict)


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def identities(*, cases: int, seed: int = 0) -> Row:
    """Part 1: the framework's identities on ``cases`` random cases per identity."""
    from ..theory.selfcheck import format_results, run_checks

    start = time.perf_counter()
    results = run_checks(seed=seed, cases=cases)
    print(format_results(results))
    failed = [r.name for r in results if not r.passed]
    return Row(
        "identities", f"{len(results)} identities x {cases} random cases (numpy, torch)",
        f"{len(results) - len(failed)} of {len(results)} hold", "all hold", time.perf_counter() - start,
        not failed, {"failed": failed},
    )  # fmt: skip


def planetoid(
    data_dir: Path, *, models: Sequence[str], seeds: int, progress: bool, epochs: int | None = None
) -> list[Row]:
    """Part 2: each model of ``models`` trained with ``seeds`` seeds on Cora's public split.

    ``epochs`` replaces the papers' epoch counts (:data:`structconv.experiments.planetoid.SETUPS`).
    """
    from ..data import load_planetoid
    from .planetoid import summarize, train

    data = load_planetoid(data_dir, "cora")
    print(f"{data!r}; test accuracy at the best validation epoch, seeds 0..{seeds - 1}", flush=True)
    rows = []
    results = []
    for model in models:
        runs = [train(model, data, seed, epochs, progress=progress) for seed in range(seeds)]
        results += runs
        accs = [100 * r.test_accuracy for r in runs]
        mean, spread = statistics.mean(accs), statistics.stdev(accs) if len(accs) > 1 else 0.0
        published, source = PUBLISHED[model]
        rows.append(
            Row(
                "planetoid",
                f"{MODEL_NAMES[model]} on Cora, test accuracy (%), {seeds} seeds",
                f"{mean:.1f} ± {spread:.1f}",
                f"{published:.1f} ± {TOLERANCE:g} ({source})",
                sum(r.seconds for r in runs),
                abs(mean - published) <= TOLERANCE,
                {"accuracies": accs, "published": published, "tolerance": TOLERANCE},
            )
        )
    print(summarize(results))
    return rows


#: The 3×3 filters of part 3, each reading the image's luminance: horizontal and vertical Sobel
#: edges and a Laplacian (three outputs, as many as the image's channels: the attention layer of
#: the theorem keeps its width).
FILTER_NAMES = ("Sobel x", "Sobel y", "Laplacian")


def _filters() -> Any:
    import torch

    sobel = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]])
    laplace = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]])
    grey = torch.tensor([0.299, 0.587, 0.114])  # ITU-R 601 luminance of the RGB channels
    return torch.stack([grey[:, None, None] * k for k in (sobel, sobel.T, laplace)])  # (3, 3, 3, 3)


def theorem_on_image(data_dir: Path, out: Path, *, cache: str | None, index: int = 0) -> Row:
    """Part 3: a convolution and the attention layer built from it, on CIFAR-10 test image ``index``."""
    import torch

    from ..data import load_cifar10
    from ..nn import PositionalAttention

    start = time.perf_counter()
    test = load_cifar10(data_dir, "test", cache_dir=cache)
    image = torch.from_numpy(test.images[index]).permute(2, 0, 1).to(torch.float64) / 255  # (3, 32, 32)
    errors, outputs, heads = {}, {}, 0
    for dtype in (torch.float64, torch.float32):
        conv = torch.nn.Conv2d(3, 3, 3, padding=1, bias=False, dtype=dtype)
        with torch.no_grad():
            conv.weight.copy_(_filters())
        attention = PositionalAttention.from_conv(conv, grid=(32, 32))
        heads = attention.num_heads
        x = image.to(dtype)[None]
        with torch.no_grad():
            y_conv = conv(x)
            y_att = attention(x.movedim(1, -1)).movedim(-1, 1)  # the layer reads pixels as tokens, channels last
        errors[str(dtype).removeprefix("torch.")] = float((y_att - y_conv).abs().max() / y_conv.abs().max())
        outputs[dtype] = (y_conv[0], y_att[0])
    figure = out / "theorem.png"
    label = test.classes[int(test.labels[index])]
    _draw_theorem(image, *outputs[torch.float64], figure, title=f"CIFAR-10 test image {index} ({label})")
    bound = {"float64": 1e-12, "float32": 1e-5}
    passed = all(errors[k] <= bound[k] for k in errors)
    print(
        f"Conv2d 3x3 (Sobel x, Sobel y, Laplacian) against PositionalAttention.from_conv ({heads} heads) on the "
        f"32x32 pixels of a CIFAR-10 '{label}'; max |difference| / max |conv|: "
        f"float64 {errors['float64']:.1e}, float32 {errors['float32']:.1e}; figure {figure}"
    )
    return Row(
        "theorem", f"conv 3x3 = attention ({heads} heads) on a CIFAR-10 image: max rel. difference",
        f"float64 {errors['float64']:.0e}, float32 {errors['float32']:.0e}",
        "equal up to rounding (Cordonnier et al. 2020, Thm. 1)", time.perf_counter() - start, passed,
        {"errors": errors, "bounds": bound, "figure": str(figure)},
    )  # fmt: skip


def _draw_theorem(image: Any, y_conv: Any, y_att: Any, path: Path, *, title: str) -> None:
    """The image, then per filter the convolution's output, the attention's and their difference."""
    from .cifar.figures.common import new_figure

    names = FILTER_NAMES
    fig = new_figure(11, 8)
    axes = fig.subplots(3, 1 + len(names))
    axes[0, 0].imshow(image.permute(1, 2, 0).clamp(0, 1).numpy())
    axes[0, 0].set_title("input")
    for ax in axes[1:, 0]:
        ax.axis("off")
    for j, name in enumerate(names):
        c, a = y_conv[j].numpy(), y_att[j].numpy()
        lim = float(abs(c).max())
        axes[0, j + 1].imshow(c, cmap="RdBu_r", vmin=-lim, vmax=lim)
        axes[0, j + 1].set_title(f"conv: {name}")
        axes[1, j + 1].imshow(a, cmap="RdBu_r", vmin=-lim, vmax=lim)
        axes[1, j + 1].set_title(f"attention: {name}")
        diff = abs(a - c)
        shown = axes[2, j + 1].imshow(diff, cmap="magma")
        axes[2, j + 1].set_title(f"|difference|, max {diff.max():.0e}")
        fig.colorbar(shown, ax=axes[2, j + 1], shrink=0.8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{title}: a 3x3 convolution and the self-attention layer built from it (float64)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def cifar_demo(data_dir: Path, out: Path, *, cache: str | None, progress: bool) -> Row:
    """Part 4: ``structconv cifar demo`` into ``out``; its table is reported as a pipeline check."""
    from .cifar.cli import add_parser, run

    parser = argparse.ArgumentParser(prog="structconv")
    add_parser(parser.add_subparsers(dest="command"))
    # One epoch on 500 images: the pipeline's every stage runs, in seconds rather than minutes.
    argv = ["cifar", "demo", "--data", str(data_dir), "--out", str(out)]
    argv += ["--epochs", "1", "--train-subset", "500", "--test-subset", "250"]
    argv += ["--cache", cache] if cache else []
    argv += [] if progress else ["--no-progress"]
    start = time.perf_counter()
    status = run(parser.parse_args(argv))
    table = (out / "results.md").read_text() if (out / "results.md").is_file() else ""
    return Row(
        "cifar demo", "CIFAR-10 pipeline: 3 reduced models, 1 epoch on 500 images (not the paper's results)",
        "ran end to end" if status == 0 else f"failed (status {status})", "runs, figures in " + str(out),
        time.perf_counter() - start, status == 0, {"results": table},
    )  # fmt: skip


def summary(rows: Sequence[Row], out: Path) -> str:
    """The summary table (Markdown), also written with the raw rows to ``out``."""
    lines = ["| part | what | ours | reference | s | status |", "|---|---|---|---|---:|---|"]
    for r in rows:
        status = "" if r.passed is None else ("ok" if r.passed else "FAILED")
        lines.append(f"| {r.part} | {r.what} | {r.ours} | {r.reference} | {r.seconds:.0f} | {status} |")
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return text


PARTS = ("identities", "planetoid", "theorem", "cifar")


def _check_data(data: Path, parts: Sequence[str]) -> None:
    """Refuse a data directory that lacks what the parts read, before any part runs."""
    from ..data.cifar import FOLDER, OFFICIAL  # imports torch: only once the tour runs

    cifar = (OFFICIAL, FOLDER)
    if "planetoid" in parts and not (data / "planetoid").is_dir():
        raise FileNotFoundError(f"--data {data}: no planetoid/ folder (the ind.cora.* files) in it")
    if {"theorem", "cifar"} & set(parts) and not any((data / name).is_file() for name in cifar):
        raise FileNotFoundError(f"--data {data}: no CIFAR-10 archive ({' or '.join(cifar)}) in it")


def run_tour(args: argparse.Namespace) -> int:
    """Run the parts named in ``args.parts``; print and write the summary; 1 if a check failed."""
    out, data = Path(args.out), Path(args.data or os.environ.get(DATA_ENV) or DEFAULT_DATA)
    _check_data(data, args.parts)
    start = time.perf_counter()
    steps: dict[str, tuple[str, Callable[[], Row | list[Row]]]] = {
        "identities": ("1. The framework's identities", lambda: identities(cases=args.cases)),
        "planetoid": (
            "2. Planetoid: Cora node classification against the papers",
            lambda: planetoid(data / "planetoid", models=args.model, seeds=args.seeds, progress=args.progress),
        ),
        "theorem": (
            "3. Convolution = attention on a real image",
            lambda: theorem_on_image(data, out, cache=args.cache),
        ),
        "cifar": (
            "4. The CIFAR-10 pipeline demo (a pipeline check, not the paper's results)",
            lambda: cifar_demo(data, out / "cifar-demo", cache=args.cache, progress=args.progress),
        ),
    }
    rows: list[Row] = []
    for part in args.parts:
        title, step = steps[part]
        _section(title)
        got = step()
        rows += got if isinstance(got, list) else [got]
    _section(f"Summary ({(time.perf_counter() - start) / 60:.1f} min; written to {out / 'summary.md'})")
    print(summary(rows, out))
    return 0 if all(r.passed is not False for r in rows) else 1


def _names(allowed: Sequence[str], what: str) -> Callable[[str], tuple[str, ...]]:
    """An ``argparse`` type: comma-separated names of ``allowed``, a near one suggested for a typo."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        for name in names:
            if name not in allowed:
                hint = did_you_mean(name, allowed) or f"expected some of {','.join(allowed)}"
                raise argparse.ArgumentTypeError(f"unknown {what} {name!r}; {hint}")
        if not names:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(allowed)}")
        return names

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``structconv tour``."""
    p.add_argument(
        "--data", default=None,
        help=f"data directory holding planetoid/ and a CIFAR-10 archive (default: ${DATA_ENV}, else {DEFAULT_DATA})",
    )  # fmt: skip
    p.add_argument("--cache", default=None, help="where decoded CIFAR-10 JPEGs are cached (default: the user cache)")
    p.add_argument("--out", default="runs/tour", help="where figures, runs and the summary are written")
    p.add_argument("--seeds", type=positive_int, default=2, help="Planetoid runs per model (seeds 0, 1, ...)")
    p.add_argument("--cases", type=positive_int, default=2, help="random cases per identity")
    p.add_argument(
        "--model", type=_names(tuple(PUBLISHED), "model"), default=",".join(PUBLISHED),
        help=f"Planetoid models, comma-separated, of {','.join(PUBLISHED)} (those with a published Cora number)",
    )  # fmt: skip
    p.add_argument(
        "--parts", type=_names(PARTS, "part"), default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}"
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``structconv tour`` from ``argv``."""
    parser = ArgumentParser(prog="structconv tour", description=DESCRIPTION)
    add_arguments(parser)
    return run_tour(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
