"""``structconv cifar train|eval|plot|bench|demo``: the CIFAR-10 study from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .names import DATA_ENV as ENV

DEFAULT_DATA = "../shared/data"


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return name


def _data_dir(arg: str | None) -> str:
    return arg or os.environ.get(ENV) or DEFAULT_DATA


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _options(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option expects key=value (e.g. heads=16), got {pair!r}")
        out[key] = _value(value)
    return out


def _models(arg: str) -> list[str]:
    from .models import MODELS

    names = list(MODELS) if arg == "all" else [m.strip() for m in arg.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        raise ValueError(f"--model got {unknown or arg!r}; expected 'all' or comma-separated names of {sorted(MODELS)}")
    return names


def results_table(runs: list[Path]) -> str:
    """Markdown table of each run's final and best test accuracy, device, epochs and wall time."""
    lines = [
        "| model | preset | epochs | final test acc | best test acc | device | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        meta = json.loads((run / "metrics.json").read_text())
        hist, cfg, env = meta["history"], meta["config"], meta["environment"]
        if not hist:
            continue
        wall = sum(r["epoch_seconds"] for r in hist)
        lines.append(
            f"| {cfg['model']} | {cfg['preset']} | {hist[-1]['epoch']}/{cfg['epochs']} | "
            f"{100 * hist[-1]['test_acc']:.2f} % | {100 * max(r['test_acc'] for r in hist):.2f} % | "
            f"{env['device']} | {wall / 60:.1f} min |"
        )
    return "\n".join(lines)


def _train(args: argparse.Namespace) -> int:
    from .presets import config_for
    from .train import load_data, train

    models = _models(args.model)
    device = _device(args.device)
    overrides: dict[str, Any] = {k: v for k, v in _options(args.set).items()}
    options = _options(args.option)
    for name in ("epochs", "batch_size", "lr", "seed", "train_subset", "test_subset"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    configs = [config_for(args.preset, m, model_options=options, **overrides) for m in models]
    data_dir = _data_dir(args.data)
    if getattr(args, "download", False):
        _ensure_archive(data_dir)
    data = load_data(data_dir, args.cache)
    root = Path(args.out)
    runs = []
    for config in configs:
        run = root / f"{config.model}-{config.preset}"
        history = train(
            config, run, data, device=device, resume=not args.restart, time_limit=args.time_limit,
            progress=not args.no_progress, compile=args.compile,
        )  # fmt: skip
        if history:
            runs.append(run)
    if runs and int(os.environ.get("RANK", "0")) == 0:
        text = results_table(runs)
        (root / "results.md").write_text(text + "\n")
        print(text)
        print(f"wrote {root / 'results.md'}")
    return 0


def _ensure_archive(data_dir: str) -> None:
    """Download the official archive into ``data_dir`` unless an archive is already there."""
    from ...data.cifar import FOLDER, OFFICIAL, download_cifar10

    if not any((Path(data_dir) / name).is_file() for name in (OFFICIAL, FOLDER)):
        print(f"downloading CIFAR-10 into {data_dir} ...", file=sys.stderr, flush=True)
        download_cifar10(data_dir)


def _eval(args: argparse.Namespace) -> int:
    import numpy as np

    from ...data.augment import NORMALIZATIONS, Batches
    from ...data.cifar import load_cifar10
    from .train import evaluate, model_from_checkpoint

    device = _device(args.device)
    test = load_cifar10(_data_dir(args.data), "test", args.cache)
    batches: dict[str, Batches] = {}  # per normalisation: built once for every run that uses it
    for run in args.runs:
        path = Path(run)
        ckpt = path / "checkpoint.pt" if path.is_dir() else path
        model, config, state = model_from_checkpoint(ckpt, device)
        if config.normalization not in batches:
            mean, std = NORMALIZATIONS[config.normalization]
            batches[config.normalization] = Batches.from_arrays(
                test.images, np.asarray(test.labels), 500, False, device, mean=mean, std=std
            )
        loss, acc = evaluate(model, batches[config.normalization], config, device)
        print(f"{ckpt}: {config.model} after epoch {state['epoch']}: test loss {loss:.4f}, accuracy {100 * acc:.2f} %")
    return 0


def _sample_images(data: str | None, cache: str | None, count: int) -> Any:
    """``count`` normalised test images (for attention maps of content models), or ``None`` without data."""
    try:
        from ...data.augment import CIFAR10_MEAN, CIFAR10_STD, normalize
        from ...data.cifar import load_cifar10

        test = load_cifar10(_data_dir(data), "test", cache)
    except (FileNotFoundError, ValueError):
        return None
    import torch

    x = torch.from_numpy(test.images[:count]).permute(0, 3, 1, 2).contiguous()
    return normalize(x, CIFAR10_MEAN, CIFAR10_STD)


def _plot(args: argparse.Namespace) -> int:
    from .figures import make_figures

    paths = make_figures(
        Path(args.runs), Path(args.out) if args.out else None, _sample_images(args.data, args.cache, 100)
    )
    for p in paths:
        print(f"wrote {p}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .throughput import measure, table

    device = _device(args.device)
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    result = measure(
        device, batch=args.batch, steps=args.steps, rounds=args.rounds, only=only,
        log=lambda s: print(s, file=sys.stderr, flush=True), peak_tflops=args.peak_tflops,
    )  # fmt: skip
    text = table(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"cifar_throughput_{device.split(':')[0]}"
        stem.with_suffix(".txt").write_text(text + "\n")
        stem.with_suffix(".json").write_text(json.dumps(result.__dict__, indent=2) + "\n")
        print(f"wrote {stem}.txt and {stem}.json")
    return 0


DEMO_MODELS = "resnet18,sa-quadratic,sa-learned"


def _demo(args: argparse.Namespace) -> int:
    """Train the ``demo`` preset for three models, then draw the figures and print the results table."""
    start = time.perf_counter()
    args.model, args.preset = DEMO_MODELS, "demo"
    args.restart = True
    status = _train(args)
    if status:
        return status
    args.runs = args.out
    args.out = None
    status = _plot(args)
    print(f"demo finished in {(time.perf_counter() - start) / 60:.1f} min (reduced models and subsets: see the docs)")
    return status


def _train_arguments(p: argparse.ArgumentParser, demo: bool = False) -> None:
    _data_arguments(p)
    p.add_argument("--out", default="runs/cifar" if not demo else "runs/cifar-demo", help="root of the run directories")
    p.add_argument("--device", default="auto" if not demo else "cpu", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--time-limit", type=float, default=None, help="stop at the epoch boundary before this many s")
    for name, kind in (("epochs", int), ("batch-size", int), ("lr", float), ("seed", int)):
        p.add_argument(f"--{name}", type=kind, default=None, help=f"override the preset's {name}")
    p.add_argument("--train-subset", type=int, default=None, help="train on this many images only")
    p.add_argument("--test-subset", type=int, default=None, help="test on this many images only")
    p.add_argument("--option", action="append", default=[], help="model option key=value (e.g. heads=16)")
    p.add_argument("--set", action="append", default=[], help="training setting key=value (e.g. warmup_epochs=2)")


def _data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help=f"data directory (default ${ENV}, else {DEFAULT_DATA})")
    p.add_argument("--cache", default=None, help="where to cache decoded JPEG archives (default: beside them)")


def add_parser(sub: Any) -> None:
    """Register ``structconv cifar ...`` on the top-level subparsers ``sub``."""
    from .names import MODEL_NAMES, PRESET_NAMES

    cifar = sub.add_parser("cifar", help="the CIFAR-10 study of Cordonnier et al. (train, eval, plot, bench, demo)")
    verbs = cifar.add_subparsers(dest="verb", required=True)
    train = verbs.add_parser("train", help="train models with a preset; resumes from checkpoints")
    train.add_argument("--model", default="resnet18", help=f"'all' or comma-separated of {', '.join(MODEL_NAMES)}")
    train.add_argument("--preset", default="fast", help=f"one of {', '.join(PRESET_NAMES)}")
    train.add_argument("--restart", action="store_true", help="ignore existing checkpoints")
    train.add_argument("--download", action="store_true", help="fetch the official archive if none is present")
    _train_arguments(train)
    train.set_defaults(func=_train)
    ev = verbs.add_parser("eval", help="test accuracy of trained checkpoints")
    ev.add_argument("runs", nargs="+", help="run directories or checkpoint files")
    ev.add_argument("--device", default="auto")
    _data_arguments(ev)
    ev.set_defaults(func=_eval)
    plot = verbs.add_parser("plot", help="figures of the runs under a directory")
    plot.add_argument("runs", help="directory holding run directories")
    plot.add_argument("--out", default=None, help="figure directory (default <runs>/figures)")
    _data_arguments(plot)
    plot.set_defaults(func=_plot)
    bench = verbs.add_parser("bench", help="training throughput, FLOPs and utilisation of every model and peer")
    bench.add_argument("--device", default="auto")
    bench.add_argument("--batch", type=int, default=100)
    bench.add_argument("--steps", type=int, default=5, help="training steps per timed round")
    bench.add_argument("--rounds", type=int, default=5)
    bench.add_argument("--only", default="", help="comma-separated variants to run")
    bench.add_argument(
        "--peak-tflops", type=float, default=None, help="the device's peak TFLOP/s in this precision, for MFU"
    )
    bench.add_argument("--out", default="benchmarks/results", help="where to write the table and JSON")
    bench.set_defaults(func=_bench)
    demo = verbs.add_parser("demo", help="CPU demonstration: demo preset for three models, figures, results table")
    _train_arguments(demo, demo=True)
    demo.set_defaults(func=_demo)


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``cifar`` command, turning bad input into a message and exit status 2."""
    from .checkpoint import CheckpointError

    try:
        status: int = args.func(args)
    except (FileNotFoundError, PermissionError, ConnectionError, CheckpointError, ValueError) as err:
        print(f"structconv cifar {args.verb}: {err}", file=sys.stderr)
        return 2
    return status
