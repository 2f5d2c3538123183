"""Training throughput of the CIFAR study's models: JSON, table and PNG in benchmarks/results.

``sa-quadratic`` through structconv against the same model computed the paper's way (one dense
softmax and one dropout mask per layer and step, shared by the batch, then the value einsum per
image), and against ResNet18 of GridConv2d and of ``torch.nn.Conv2d`` layers.  On a CPU every
variant runs with subnormal numbers flushed to zero on every thread (as an expert sets a CPU up:
the dense twin's softmax tails would otherwise slow its products about tenfold); ``--no-flush``
keeps them, in a record whose name ends in ``_unflushed``.

    python -m benchmarks.bench_cifar                         # CPU, batch 16 (about 2 minutes on 2 cores)
    python -m benchmarks.bench_cifar --device cuda --batch 100
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, publish
from structconv.experiments.cifar.throughput import GOALS, measure, table


def plot(rows: list[Row], path: Path) -> None:
    """Images per second of every variant, one bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (row,) = rows
    names = list(row.times)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(
        range(len(names)), [1.0 / row.times[n] for n in names], color=["tab:green", "tab:gray", "tab:blue", "tab:gray"]
    )
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("training images / s")
    goal = GOALS["resnet18 / resnet18 torch"]
    ax.set_title(f"{row.case} (target: ResNet18 of GridConv2d >= {goal:g}x nn.Conv2d)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=None, help="default 16 on CPU, 100 on CUDA")
    parser.add_argument("--steps", type=int, default=None, help="steps per round (default 1 on CPU, 10 on CUDA)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    add_flush_option(parser)
    args = parser.parse_args(argv)
    fp = fp_environment(not args.no_flush)
    cuda = args.device.startswith("cuda")
    batch = args.batch or (100 if cuda else 16)
    steps = args.steps or (10 if cuda else 1)
    result = measure(args.device, batch=batch, steps=steps, rounds=args.rounds, flush=not args.no_flush)
    times = {name: 1.0 / ips for name, ips in result.images_per_second.items()}  # seconds per image
    row = Row(
        f"{result.device}, batch {batch}, {result.precision}", {"batch": batch}, times, "sa-quadratic paper-dense"
    )
    report = Report(f"cifar_{args.device.split(':')[0]}{fp.suffix}", [row])
    report.summary = {
        "sa_over_dense": result.ratio("sa-quadratic", "sa-quadratic paper-dense"),
        "grid_resnet_over_torch_resnet": result.ratio("resnet18", "resnet18 torch"),
        "gflop_per_image": {n: f / 1e9 for n, f in result.flops_per_image.items()},
        "flush_denormal": result.flush_denormal,
    }
    publish(report, args.out, table(result), plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
