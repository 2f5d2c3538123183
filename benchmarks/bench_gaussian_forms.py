"""Gaussian heads' two forms: truncated to shift bases (the layer's ``threshold``) against the dense softmax.

``PositionalAttention((s, s), width, 9, encoding="gaussian")`` with ``threshold=1e-7`` (the
layer's default: ``"auto"`` takes the shift form when its kept offsets number under 1/40 of the
dense entries, see ``structures/positional.py``) against the same layer with ``threshold=None``
(the exact dense softmax), the same parameters, on ``(1, s, s, width)`` activations, float32,
CPU, every variant with subnormals flushed on every thread.  Two modes: forward + backward of
``y.sum()``, and inference under ``torch.no_grad()``; medians of interleaved repeats.  The form
the layer took is recorded per side.  The ratio is the dense form's time over the layer's.

    python -m benchmarks.bench_gaussian_forms                       # 16, 32 and 64 (about 3 min)
    python -m benchmarks.bench_gaussian_forms --sides 8 --width 16  # a smoke run
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, interleaved_times, progress, publish
from structconv.nn import PositionalAttention

OUT = Path(__file__).resolve().parents[1] / "docs" / "_static" / "positional"


def _layers(side: int, width: int) -> dict[str, PositionalAttention]:
    torch.manual_seed(0)
    layer = PositionalAttention((side, side), width, 9, encoding="gaussian", threshold=1e-7)
    dense = copy.deepcopy(layer)
    dense.threshold = None
    return {"threshold 1e-7": layer, "dense": dense}


def _call(layer: PositionalAttention, x: torch.Tensor, mode: str) -> Any:
    if mode == "inference":
        return lambda: layer(x.detach())
    return lambda: layer(x).sum().backward()


def measure(sides: list[int], width: int, repeats: int) -> list[Row]:
    rows = []
    for i, side in enumerate(sides):
        progress(i, len(sides), f"{side}x{side}")
        layers = _layers(side, width)
        x = torch.randn(1, side, side, width, requires_grad=True)
        form = type(layers["threshold 1e-7"].basis()).__name__
        with torch.no_grad():
            expected = layers["dense"](x)
            err = float((layers["threshold 1e-7"](x) - expected).norm() / expected.norm())

        for mode in ("fwd+bwd", "inference"):
            calls = {n: _call(layer, x, mode) for n, layer in layers.items()}
            with torch.no_grad() if mode == "inference" else torch.enable_grad():
                times = interleaved_times(calls, repeats=repeats, warmup=1)
            params = {"side": side, "mode": mode, "width": width}
            extra = {"form": form, "relative_difference": err}
            rows.append(Row(f"{side}x{side} {mode}", params, times, "dense", extra))
    progress(len(sides), len(sides), "done")
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'case':<22}{'form':<14}{'threshold 1e-7':>16}{'dense':>12}{'dense / layer':>15}{'rel. diff':>11}"]
    for r in rows:
        t = r.times
        lines.append(
            f"{r.case:<22}{r.extra['form']:<14}{t['threshold 1e-7'] * 1e3:>13.1f} ms{t['dense'] * 1e3:>9.1f} ms"
            f"{1 / r.ratio('threshold 1e-7'):>14.2f}x{r.extra['relative_difference']:>11.1e}"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r.case for r in rows]
    ax.bar(names, [1 / r.ratio("threshold 1e-7") for r in rows], color="tab:blue")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("dense time / layer time")
    ax.set_title("Gaussian heads: the layer's form against the dense softmax (CPU)")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--width", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    add_flush_option(parser)
    args = parser.parse_args(argv)
    fp_environment(flush=not args.no_flush)
    name = "gaussian_forms_cpu" + ("_unflushed" if args.no_flush else "")
    report = Report(name, measure(args.sides, args.width, args.repeats))
    publish(report, args.out, table(report.rows), plot)


if __name__ == "__main__":
    main()
