"""``structconv cifar train|eval|plot|bench|demo``: the CIFAR-10 study from the command line."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from ..cli_common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    device_name,
    did_you_mean,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)
from .names import DATA_ENV as ENV

DEFAULT_DATA = "../shared/data"
CIFAR10_TEST_IMAGES = 10_000  # the size of CIFAR-10's test split
CACHE_ENV = "STRUCTCONV_CACHE"  # the same as structconv.data.cifar.CACHE_ENV (tested)
_DEVICE_HELP = "auto or a torch device: cpu, cuda, cuda:N, mps, xpu, ..."


class UsageError(ValueError):
    """Bad command-line input found after parsing (an unknown model, a malformed key=value, ...): exit 2."""


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    module: Any = getattr(torch, kind, None)  # torch.cuda, torch.xpu, torch.mps, ...: is one here, how many
    if kind == "cpu" or not hasattr(module, "is_available"):
        return name
    if not module.is_available():
        raise UsageError(f"--device {name}: {kind.upper()} is not available on this machine")
    count = module.device_count() if hasattr(module, "device_count") else int(index or 0) + 1
    if index and int(index) >= count:
        raise UsageError(
            f"--device {name}: this machine has {count} {kind.upper()} device(s); expected {kind}:0 to "
            f"{kind}:{count - 1}"
        )
    return name


def _data_dir(arg: str | None) -> str:
    return arg or os.environ.get(ENV) or DEFAULT_DATA


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _options(pairs: list[str], flag: str = "--option") -> dict[str, Any]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(
                f"{flag} expects key=value (e.g. {'heads=16' if flag == '--option' else 'lr=0.1'}), got {pair!r}"
            )
        out[key] = _value(value)
    return out


def _models(arg: str) -> list[str]:
    from .names import MODEL_NAMES

    names = list(MODEL_NAMES) if arg == "all" else [m.strip() for m in arg.split(",") if m.strip()]
    expected = f"expected 'all' or comma-separated names of {', '.join(MODEL_NAMES)}"
    if not names:
        raise UsageError(f"--model: no model in {arg!r}; {expected}")
    for name in names:
        if name not in MODEL_NAMES:
            raise UsageError(f"--model: unknown model {name!r}; {did_you_mean(name, MODEL_NAMES) or expected}")
    return names


def model_options(model: str) -> tuple[str, ...]:
    """The keys ``--option`` takes for ``model``: its constructor's keyword parameters, less those the name fixes.

    Parameters
    ----------
    model : str
        One of :data:`~structconv.experiments.cifar.models.MODELS`.

    Returns
    -------
    tuple of str
        The parameter names in the constructor's order.  Read from its signature, so that a new
        parameter is an option without a list here to update.
    """
    import inspect

    from .models import MODELS

    entry = MODELS[model]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(entry.build).parameters.values()
    return tuple(p.name for p in parameters if p.kind in kinds and p.name not in entry.fixed)


def _check_options(models: list[str], options: dict[str, Any]) -> None:
    """Refuse ``--option`` keys a chosen model's constructor does not take, naming the near ones and all it takes."""
    from .models import MODELS

    for model in models:
        known = model_options(model)
        for key in options:
            if key in MODELS[model].fixed:  # e.g. encoding: another name is another model
                others = [m for m in MODELS if key in MODELS[m].fixed and m != model]
                raise UsageError(
                    f"--option {key}: model {model!r} fixes {key}={MODELS[model].fixed[key]!r}; "
                    f"choose another model instead ({', '.join(others)})"
                )
            if key not in known:
                hint = did_you_mean(key, known)
                raise UsageError(
                    f"--option {key}: model {model!r} takes no option {key!r} (its options: {', '.join(known)})"
                    + (f"; {hint}" if hint else "")
                )


def count_test_images(
    config: dict[str, Any], history: list[dict[str, Any]], test_split: int = CIFAR10_TEST_IMAGES
) -> int:
    """How many test images a run's accuracies were measured on.

    Parameters
    ----------
    config : dict
        The run's configuration (``metrics.json``'s ``config``).
    history : list of dict
        Its per-epoch rows; a ``test_images`` entry in the last, where present, is the count.
    test_split : int, default 10,000
        The size of the test split the run read (CIFAR-10's is 10,000).

    Returns
    -------
    int
        ``test_images`` of the last row, else the config's ``test_subset`` (at most
        ``test_split``), else ``test_split``.
    """
    if history and "test_images" in history[-1]:
        return int(history[-1]["test_images"])
    subset = config.get("test_subset")
    return test_split if subset is None else min(int(subset), test_split)


def results_table(runs: list[Path], test_split: int = CIFAR10_TEST_IMAGES) -> str:
    """Markdown table of each run's final and best test accuracy, how many test images they were
    measured on (:func:`count_test_images`; ``test_split`` is the size of the test split read), device,
    epochs and wall time, and a note on the test images below it."""
    lines = [
        "| model | preset | epochs | final test acc | best test acc | test images | device | wall time |",
        "|---|---|---|---|---|---|---|---|",
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
            f"{count_test_images(cfg, hist, test_split):,} | {env['device']} | {wall / 60:.1f} min |"
        )
    lines.append("")
    lines.append(
        f"Each accuracy is measured on the number of test images in its *test images* column (of a test "
        f"split of {test_split:,}; a preset's test_subset takes a fixed subset)."
    )
    return "\n".join(lines)


def _train(args: argparse.Namespace) -> int:
    from .presets import config_for
    from .train import load_data, train

    models = _models(args.model)
    device = _device(args.device)
    overrides: dict[str, Any] = {k: v for k, v in _options(args.set, "--set").items()}
    options = _options(args.option)
    _check_options(models, options)
    for name in ("epochs", "batch_size", "lr", "seed", "train_subset", "test_subset"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    _check_settings(overrides)
    try:
        configs = [config_for(args.preset, m, model_options=options, **overrides) for m in models]
    except (TypeError, ValueError) as err:  # a --set or --option value the config refuses
        raise UsageError(str(err)) from err
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
        text = results_table(runs, test_split=len(data[1]))
        (root / "results.md").write_text(text + "\n")
        print(text)
        print(f"wrote {root / 'results.md'}")
    _leave_process_group()  # only after success: a failing rank must not wait for the others
    return 0


def _leave_process_group() -> None:
    """End a torchrun process group once every rank is done.

    A rank that tears its group down (or exits) while another still works makes gloo abort the
    process ("terminate called without an active exception"), so all ranks meet at a barrier
    after the last write, then leave together.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _check_settings(overrides: dict[str, Any]) -> None:
    """Refuse ``--set`` keys that are not training settings, naming the near ones."""
    import dataclasses

    from .presets import TrainConfig

    known = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in ("model", "preset", "model_options")]
    for key in overrides:
        if key not in known:
            hint = did_you_mean(key, known) or f"expected one of {', '.join(known)}"
            raise UsageError(f"--set got unknown setting {key!r}; {hint}")


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
    checkpoints = [_checkpoint(Path(run)) for run in args.runs]  # before the data: a typo fails at once
    test = load_cifar10(_data_dir(args.data), "test", cache_dir=args.cache)
    batches: dict[str, Batches] = {}  # per normalisation: built once for every run that uses it
    for ckpt in checkpoints:
        model, config, state = model_from_checkpoint(ckpt, device)
        if config.normalization not in batches:
            mean, std = NORMALIZATIONS[config.normalization]
            batches[config.normalization] = Batches.from_arrays(
                test.images, np.asarray(test.labels), 500, train=False, device=device, mean=mean, std=std
            )
        loss, acc = evaluate(model, batches[config.normalization], config, device)
        print(
            f"{ckpt}: {config.model} after epoch {state['epoch']}: test loss {loss:.4f}, "
            f"accuracy {100 * acc:.2f} % on {len(test):,} test images"
        )
    return 0


def _checkpoint(path: Path) -> Path:
    """The checkpoint of ``path``, a run directory or a checkpoint file; a missing one is a usage error."""
    from .train import CHECKPOINT

    if not path.exists():
        raise UsageError(f"{path}: no such run directory or checkpoint")
    ckpt = path / CHECKPOINT if path.is_dir() else path
    if not ckpt.is_file():
        raise UsageError(f"{path}: no {CHECKPOINT} in this directory")
    return ckpt


def _sample_images(data: str | None, cache: str | None, count: int) -> Any:
    """``count`` normalised test images (for attention maps of content models), or ``None`` without data."""
    try:
        from ...data.augment import CIFAR10_MEAN, CIFAR10_STD, normalize
        from ...data.cifar import load_cifar10

        test = load_cifar10(_data_dir(data), "test", cache_dir=cache)
    except (FileNotFoundError, PermissionError, ValueError):  # the figures simply go without
        return None
    import torch

    x = torch.from_numpy(test.images[:count]).permute(0, 3, 1, 2).contiguous()
    return normalize(x, CIFAR10_MEAN, CIFAR10_STD)


def _plot(args: argparse.Namespace) -> int:
    from .figures import make_figures
    from .train import iterate_runs

    root = Path(args.runs)
    if not root.is_dir():  # the same status as eval's missing run directory: the user named the wrong place
        raise UsageError(f"{root}: no such directory")
    if not any(iterate_runs(root)):
        raise UsageError(f"no run directories (holding a metrics.json) under {root}; give the folder that holds them")
    paths = make_figures(root, Path(args.out) if args.out else None, _sample_images(args.data, args.cache, 100))
    for p in paths:
        print(f"wrote {p}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .throughput import VARIANTS, measure, table

    device = _device(args.device)
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    if unknown := [n for n in only if n not in VARIANTS]:
        raise UsageError(f"--only got unknown variants {unknown}; expected some of {list(VARIANTS)}")
    from .presets import config_for

    sizes = {name: config_for(args.sizes, name).model_options for name in ("resnet18", "sa-quadratic")}
    _check_batch(args.batch, device)
    result = measure(
        device, batch=args.batch, steps=args.steps, rounds=args.rounds, only=only,
        log=lambda s: print(s, file=sys.stderr, flush=True), peak_tflops=args.peak_tflops,
        sa_options=sizes["sa-quadratic"], resnet_options=sizes["resnet18"], compile=args.compile, sizes=args.sizes,
        profile=args.profile, flush=False if args.no_flush else None,
    )  # fmt: skip
    text = table(result)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / (
            f"cifar_throughput_{device.split(':')[0]}{'_compiled' if args.compile else ''}"
            + ("_unflushed" if args.no_flush else "")
        )
        stem.with_suffix(".txt").write_text(text + "\n")
        stem.with_suffix(".json").write_text(json.dumps(result.__dict__, indent=2) + "\n")
        print(f"wrote {stem}.txt and {stem}.json")
    return 0


def _check_batch(batch: int, device: str) -> None:
    """Refuse a ``--batch`` whose input images alone (float32, 3x32x32) exceed the device's memory."""
    import torch

    from ...backend.checks import check_memory

    try:
        check_memory(batch * 3 * 32 * 32 * 4, torch.empty(0, device=device), f"--batch {batch}: the input images")
    except ValueError as err:
        raise UsageError(str(err)) from err


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
    p.add_argument("--device", type=device_name, default="auto" if not demo else "cpu", help=_DEVICE_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--compile", action="store_true", help="compile the whole training step (CUDA graphs on CUDA; see docs)"
    )
    p.add_argument(
        "--time-limit",
        type=nonnegative_float,
        default=None,
        metavar="SECONDS",
        help="stop at the epoch boundary before this many seconds; resume later (default: no limit)",
    )
    for name, kind, what in (
        ("epochs", positive_int, "epochs"),
        ("batch-size", positive_int, "batch size"),
        ("lr", positive_float, "peak learning rate"),
        ("seed", nonnegative_int, "random seed"),
    ):
        p.add_argument(f"--{name}", type=kind, default=None, help=f"the {what} (default: the preset's)")
    p.add_argument(
        "--train-subset", type=positive_int, default=None, help="train on this many images only (default: the preset's)"
    )
    p.add_argument(
        "--test-subset",
        type=positive_int,
        default=None,
        help="test on this many images only (default: the preset's, else all 10,000)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model option, repeatable (e.g. heads=16): a keyword of the model's constructor; a wrong key is "
        "answered with those it takes",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training setting, repeatable (e.g. warmup_epochs=2)",
    )


def _data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help=f"data directory, only read (default: ${ENV}, else {DEFAULT_DATA})")
    p.add_argument(
        "--cache",
        default=None,
        help=f"where to cache decoded JPEG archives (default: ${CACHE_ENV}, else the user cache directory, "
        "~/.cache/structconv on Linux; never the data directory)",
    )


def add_parser(sub: Any) -> None:
    """Register ``structconv cifar ...`` on the top-level subparsers ``sub``."""
    from .names import MODEL_NAMES, PRESET_DEVICES, PRESET_NAMES, PRESET_SUMMARIES

    cifar = sub.add_parser(
        "cifar",
        help="the CIFAR-10 study of Cordonnier et al. (train, eval, plot, bench, demo)",
        description="The CIFAR-10 study of Cordonnier et al.: train, evaluate, plot, benchmark, demonstrate.",
    )
    verbs = cifar.add_subparsers(dest="verb", required=True, title="commands")
    presets = "\n".join(f"  {n:6} {PRESET_DEVICES[n].upper()}: {PRESET_SUMMARIES[n]}" for n in PRESET_NAMES)
    train = verbs.add_parser(
        "train",
        help="train models with a preset; resumes from checkpoints",
        description="Train models with a preset; a run resumes from its checkpoint unless --restart.  It prints\n"
        "the model, its parameters, the device and the preset first, then, after the first steps, the\n"
        f"time an epoch and the run will take.\n\npresets (see docs/cifar.rst for their settings):\n{presets}",
    )
    train.add_argument("--model", default="resnet18", help=f"'all' or comma-separated of {', '.join(MODEL_NAMES)}")
    train.add_argument(
        "--preset",
        default="fast",
        choices=PRESET_NAMES,
        metavar="PRESET",
        help="one of the presets above: "
        + "; ".join(
            f"{', '.join(n for n in PRESET_NAMES if PRESET_DEVICES[n] == d)} ({d.upper()})" for d in ("gpu", "cpu")
        ),
    )
    train.add_argument("--restart", action="store_true", help="ignore existing checkpoints")
    train.add_argument("--download", action="store_true", help="fetch the official archive if none is present")
    _train_arguments(train)
    train.set_defaults(func=_train)
    ev = verbs.add_parser(
        "eval",
        help="test accuracy of trained checkpoints",
        description="Test loss and accuracy of trained checkpoints on the full CIFAR-10 test split.",
    )
    ev.add_argument("runs", nargs="+", help="run directories or checkpoint files")
    ev.add_argument("--device", type=device_name, default="auto", help=_DEVICE_HELP)
    _data_arguments(ev)
    ev.set_defaults(func=_eval)
    plot = verbs.add_parser(
        "plot", help="figures of the runs under a directory", description="Figures of the runs under a directory."
    )
    plot.add_argument("runs", help="directory holding run directories")
    plot.add_argument("--out", default=None, help="figure directory (default: <runs>/figures)")
    _data_arguments(plot)
    plot.set_defaults(func=_plot)
    bench = verbs.add_parser(
        "bench",
        help="training throughput, FLOPs and utilisation of every model and peer",
        description="Training throughput, FLOPs per image and utilisation of every model and its peers; on a CPU\n"
        "every variant runs with subnormal numbers flushed to zero (torch.set_flush_denormal on every thread).",
    )
    bench.add_argument("--device", type=device_name, default="auto", help=_DEVICE_HELP)
    bench.add_argument("--batch", type=positive_int, default=100, help="images per training step")
    bench.add_argument("--steps", type=positive_int, default=5, help="training steps per timed round")
    bench.add_argument("--rounds", type=positive_int, default=5, help="timed rounds (the median is reported)")
    bench.add_argument("--only", default="", help="comma-separated variants to run (default: all)")
    bench.add_argument(
        "--peak-tflops",
        type=positive_float,
        default=None,
        help="the device's peak TFLOP/s in this precision, for MFU (default: no MFU column)",
    )
    bench.add_argument(
        "--compile", action="store_true", help="compile every variant's whole step alike (CUDA graphs on CUDA)"
    )
    bench.add_argument(
        "--profile",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="after timing, profile each variant's step and keep its N costliest operators in the JSON",
    )
    bench.add_argument(
        "--sizes",
        default="paper",
        choices=("paper", "smoke"),
        help="the models' sizes: the paper's (default), or the smoke preset's tiny ones (a check that it runs)",
    )
    bench.add_argument(
        "--no-flush",
        action="store_true",
        help="keep subnormal numbers (on a CPU every variant runs with them flushed to zero otherwise); the "
        "record's name ends in _unflushed",
    )
    bench.add_argument("--out", default="benchmarks/results", help="where to write the table and JSON")
    bench.set_defaults(func=_bench)
    demo = verbs.add_parser(
        "demo",
        help="CPU demonstration: demo preset for three models, figures, results table",
        description=f"CPU demonstration: the demo preset for {DEMO_MODELS}, then figures and the results table.",
    )
    _train_arguments(demo, demo=True)
    demo.set_defaults(func=_demo)
    verbs.metavar = "{" + ",".join(verbs.choices) + "}"  # named so in "the following arguments are required"


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``cifar`` command; report a failure in one line and return its exit status.

    Usage errors (an unknown model, model option or setting, a malformed key=value, a missing data
    directory, archive, run directory or checkpoint) return 2; runtime failures (a corrupt or
    refused archive or checkpoint, a failed download, an unwritable cache) return 1.
    """
    from .checkpoint import CheckpointError

    try:
        status: int = args.func(args)
    except (UsageError, FileNotFoundError) as err:
        print(f"structconv cifar {args.verb}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (PermissionError, ConnectionError, CheckpointError, ValueError, pickle.UnpicklingError) as err:
        print(f"structconv cifar {args.verb}: {err}", file=sys.stderr)
        return EXIT_RUNTIME
    return status
