"""Grid convolution through the engine against ``F.conv2d`` on CIFAR-like shapes.

For each shape (batch 128; 32x32 with 64 channels, 16x16 with 128 and with 400 channels;
3x3 and 5x5 kernels, "same" padding) and for forward and forward+backward, it times in one run:

* ``F.conv2d`` on an NCHW tensor (the peer),
* ``default``: ``structconv.nn.GridConv2d`` on the same tensor (``order="auto"``),
* ``shift-gemm`` and ``gemm-shift``: ``conv()`` forced onto the generic structured orders
  ``"ax"`` (shift x, then one GEMM per tap on contiguous rows) and ``"xtheta"`` (one GEMM,
  then shift-and-add), which never call a native convolution,

and reports medians and ratios to the peer, plus the bytes held by the grid basis against
what the dense ``(K, M, N)`` basis would need.  Goals: default <= 1.10x, best generic <= 2.5x.

    python -m benchmarks.bench_grid                  # full table (several minutes on 2 cores)
    python -m benchmarks.bench_grid --batch 16 --repeats 3   # a quick look
    python -m benchmarks.bench_grid --device cuda    # the same table against cuDNN

Every variant runs with subnormal numbers flushed to zero on every CPU thread
(:func:`benchmarks.harness.fp_environment`); ``--no-flush`` keeps them (``_unflushed`` record).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, median_time, progress, publish
from structconv import conv, grid_basis
from structconv.nn import GridConv2d

SHAPES = ((32, 64), (16, 128), (16, 400))
KERNELS = (3, 5)
GENERIC = {"shift-gemm": "ax", "gemm-shift": "xtheta"}
GOAL_DEFAULT, GOAL_GENERIC = 1.10, 2.5


def _timer(fn: Any, backward: bool, grad: torch.Tensor, leaves: list[torch.Tensor]) -> Any:
    def run() -> None:
        y = fn()
        if backward:
            y.backward(grad)
            for t in leaves:
                t.grad = None

    return run


def measure(batch: int, size: int, channels: int, k: int, backward: bool, repeats: int, device: str) -> Row:
    x = torch.randn(batch, channels, size, size, device=device, requires_grad=backward)
    layer = GridConv2d(channels, channels, k, padding=k // 2, bias=False, device=device)
    weight = layer.weight
    grad = torch.randn(batch, channels, size, size, device=device)
    basis = grid_basis((size, size), k, padding=k // 2, like=x)
    leaves = [x, weight]

    def generic(order: str) -> Any:
        def run() -> torch.Tensor:
            xb = x.flatten(2).transpose(1, 2)
            theta = weight.flatten(2).permute(2, 1, 0)
            y = conv(basis, xb, theta, order=order)
            return y.transpose(1, 2).reshape(batch, channels, size, size)

        return run

    variants: dict[str, Any] = {
        "F.conv2d": lambda: F.conv2d(x, weight, padding=k // 2),
        "default": lambda: layer(x),
    }
    variants.update({name: generic(order) for name, order in GENERIC.items()})
    with torch.no_grad():
        reference = variants["F.conv2d"]()
        for name, fn in variants.items():
            err = float((fn() - reference).abs().max())
            if err > 1e-3 * float(reference.abs().max()):
                raise AssertionError(f"{name} disagrees with F.conv2d by {err}")
    times = {}
    for name, fn in variants.items():
        timed = _timer(fn, backward, grad, leaves)
        times[name] = median_time(timed, repeats=repeats, warmup=1, device=device)
    dense_bytes = basis.K * basis.M * basis.N * x.element_size()
    params = {"B": batch, "size": size, "C": channels, "kernel": k, "pass": "fwd+bwd" if backward else "fwd"}
    extra = {"basis_bytes": basis.nbytes(), "dense_basis_bytes": dense_bytes}
    return Row(f"{size}x{size}x{channels} k{k} {params['pass']}", params, times, "F.conv2d", extra)


def table(rows: list[Row]) -> str:
    names = list(rows[0].times)
    head = f"{'case':<28}" + "".join(f"{n:>13}" for n in names) + f"{'basis bytes':>13}{'dense bytes':>14}"
    lines = ["times in ms (ratio to F.conv2d)", head]
    for r in rows:
        cells = "".join(f"{1e3 * r.times[n]:7.1f}({r.ratio(n):4.2f})" for n in names)
        lines.append(f"{r.case:<28}{cells}{r.extra['basis_bytes']:>13}{r.extra['dense_basis_bytes']:>14.3g}")
    worst_default = max(r.ratio("default") for r in rows)
    worst_generic = max(min(r.ratio(n) for n in GENERIC) for r in rows)
    lines.append(f"worst default ratio {worst_default:.2f} (target <= {GOAL_DEFAULT})")
    lines.append(f"worst best-generic ratio {worst_generic:.2f} (target <= {GOAL_GENERIC})")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    """Bar chart of every variant's ratio to F.conv2d per case, with the two goals drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in rows[0].times if n != rows[0].peer]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r.ratio(name) for r in rows], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(GOAL_DEFAULT, color="tab:blue", linestyle="--", linewidth=0.8, label=f"target default {GOAL_DEFAULT}x")
    ax.axhline(GOAL_GENERIC, color="tab:orange", linestyle="--", linewidth=0.8, label=f"target generic {GOAL_GENERIC}x")
    ax.set_xticks(range(len(rows)), [r.case for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("time / time of F.conv2d")
    ax.set_title(f"Grid convolution through structconv, batch {rows[0].params['B']} (median of runs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    add_flush_option(parser)
    args = parser.parse_args(argv)
    fp = fp_environment(not args.no_flush)
    cases = [(s, c, k, b) for s, c in SHAPES for k in KERNELS for b in (False, True)]
    cases = [c for c in cases if args.only in f"{c[0]}x{c[0]}x{c[1]} k{c[2]} {'fwd+bwd' if c[3] else 'fwd'}"]
    report = Report(f"grid_{args.device.split(':')[0]}{fp.suffix}")
    for i, (size, channels, k, backward) in enumerate(cases, start=1):
        progress(i, len(cases), f"{size}x{size}x{channels} k{k} {'fwd+bwd' if backward else 'fwd'}")
        report.rows.append(measure(args.batch, size, channels, k, backward, args.repeats, args.device))
    text = table(report.rows)
    report.summary = {
        "worst_default": max(r.ratio("default") for r in report.rows),
        "worst_best_generic": max(min(r.ratio(n) for n in GENERIC) for r in report.rows),
        "geomean_default": math.exp(sum(math.log(r.ratio("default")) for r in report.rows) / len(report.rows)),
    }
    publish(report, args.out, text, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
