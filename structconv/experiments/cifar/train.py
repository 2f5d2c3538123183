r"""Training and evaluation of the CIFAR-10 models: one process, or many through ``torchrun``.

One epoch is a pass over the (optionally subsetted) training set in global batches of
``batch_size`` images, drawn and augmented by :class:`~structconv.data.augment.Batches` from a
generator seeded by ``(seed, epoch)``; dropout is reseeded from ``(seed, epoch, rank)`` at every
epoch.  So an epoch is a function of the state at its start alone, and:

* a run killed at any moment resumes from its last finished epoch (checkpoints are written
  atomically after every epoch) and ends with the same parameters as a run never interrupted;
* ``torchrun --nproc_per_node W`` splits every global batch into ``W`` equal shares and
  averages the gradients (DDP), so it follows the same trajectory as one process, up to the
  order of floating-point sums (batch normalisation is synchronised across GPUs; on CPUs it is
  per process, as torch offers no synchronised CPU version).

Every epoch appends a row to ``metrics.csv`` and rewrites ``metrics.json`` in the output
directory, and replaces ``checkpoint.pt``.  Before the first epoch a header names the model, its
parameters, the device and the preset; after the first few steps the time an epoch and the
rest of the run will take is estimated from those steps (with a warning when a preset meant for
a GPU runs on a CPU).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ... import __version__
from ...backend.subnormals import subnormals_flushed
from ...data import Cifar10, load_cifar10
from ...data.atomic import atomic_write
from ...data.augment import NORMALIZATIONS, Batches
from .checkpoint import RESUMABLE_CHANGES, load_checkpoint, save_checkpoint
from .models import build_model, no_decay_parameters
from .names import CPU_PRESET, PRESET_DEVICES, PRESET_SUMMARIES
from .presets import TrainConfig, family

__all__ = [
    "RESUMABLE_CHANGES",
    "CompiledStep",
    "Dist",
    "Step",
    "device_label",
    "evaluate",
    "iterate_runs",
    "learning_rate",
    "load_data",
    "make_step",
    "model_from_checkpoint",
    "train",
]

CHECKPOINT = "checkpoint.pt"
_UNTIMED_STEPS = 1  # see _StepClock
_TIMED_STEPS = 5
_TIMED_SECONDS = 5.0


@dataclass(frozen=True)
class Dist:
    """This process's place in a distributed run (``rank`` 0 of 1 when alone)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: str) -> Dist:
        """Join the process group that ``torchrun`` describes in the environment, if any."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the processes (identity when alone)."""
        if self.world > 1:
            import torch.distributed as dist

            values = values.clone()
            dist.all_reduce(values)
        return values


def load_data(
    data_dir: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Cifar10, Cifar10]:
    """The training and test splits (see :func:`structconv.data.load_cifar10`)."""
    return load_cifar10(data_dir, "train", cache_dir=cache_dir), load_cifar10(data_dir, "test", cache_dir=cache_dir)


def _subset(data: Cifar10, size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A fixed class-balanced-in-expectation subset: the first ``size`` images of one seeded permutation."""
    if size is None or size >= len(data):
        return data.images, data.labels
    keep = np.sort(np.random.default_rng(0).permutation(len(data))[:size])
    return data.images[keep], data.labels[keep]


def learning_rate(config: TrainConfig, step: int, steps_per_epoch: int) -> float:
    r"""The learning rate of global step ``step``: linear warm-up, then cosine decay to 0 or steps.

    With :math:`e` the fractional epoch, :math:`w` the warm-up length and :math:`T` the horizon
    (``horizon_epochs``, else the number of epochs): :math:`\eta\,(s+1)/(w S)` during warm-up,
    then :math:`\tfrac{\eta}{2}(1 + \cos\pi\tfrac{e - w}{T - w})` (cosine) or
    :math:`\eta\,\gamma^{\#\{m \le e\}}` (step decay at the milestones).  With
    ``lr_per_epoch`` the rate is set once at the start of every epoch, as schedulers stepped per
    epoch do: :math:`e` is the whole epoch and the warm-up is :math:`\eta\,e/w` (0 in the first
    epoch).
    """
    per_epoch = config.lr_per_epoch
    epoch = float(step // steps_per_epoch) if per_epoch else step / steps_per_epoch
    warm = config.warmup_epochs
    if warm > 0 and epoch < warm:
        return config.lr * (epoch / warm if per_epoch else (step + 1) / (warm * steps_per_epoch))
    if config.schedule == "cosine":
        horizon = config.horizon_epochs if config.horizon_epochs is not None else config.epochs
        t = (epoch - warm) / max(horizon - warm, 1e-12)
        return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(t, 1.0)))
    return config.lr * config.gamma ** sum(epoch >= m for m in config.milestones)


def _optimizer(model: nn.Module, config: TrainConfig, fused: bool = False) -> torch.optim.SGD:
    """SGD with the config's settings; centres and widths exempt from weight decay.

    ``fused`` asks for torch's fused CUDA kernel (one launch updates every parameter); a compiled
    step (:class:`CompiledStep`) leaves it off, as the compiler fuses the update itself.
    """
    exempt = {id(p) for p in no_decay_parameters(model)}
    decay = [p for p in model.parameters() if id(p) not in exempt]
    groups = [{"params": decay, "weight_decay": config.weight_decay}]
    if exempt:
        groups.append({"params": [p for p in model.parameters() if id(p) in exempt], "weight_decay": 0.0})
    return torch.optim.SGD(
        groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov, fused=fused or None
    )


def _autocast(config: TrainConfig, device: str) -> contextlib.AbstractContextManager[Any]:
    cuda = device.startswith("cuda")
    if config.precision == "bf16" or (config.precision == "auto" and cuda):
        return torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _seed_dropout(config: TrainConfig, epoch: int, rank: int) -> None:
    torch.manual_seed((config.seed * 7919 + epoch * 104729 + rank) % (2**63 - 1))


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``torch.no_grad()`` with ``model`` in eval mode, its previous mode restored on exit."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was)


def evaluate(
    model: nn.Module, batches: Batches, config: TrainConfig, device: str, dist: Dist | None = None
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``batches`` (summed over all processes)."""
    dist = dist or Dist()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    with _evaluating(model), _autocast(config, device):
        for x, y in batches.epoch(config.seed, 0):
            if len(y) == 0:
                continue
            logits = model(_layout(x, config)).float()
            totals += _tally(F.cross_entropy(logits, y, reduction="sum"), logits, y)
    loss, correct, count = dist.all_sum(totals).tolist()
    return loss / count, correct / count


def _tally(loss_sum: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(summed loss, correct, count)`` of a batch as float64 on its device (no host sync)."""
    return torch.stack(
        [
            loss_sum.double(),
            (logits.argmax(1) == y).sum().double(),
            torch.full((), len(y), dtype=torch.float64, device=y.device),
        ]
    )


def _layout(x: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """Channels-last images for the convolutional model on GPUs (cuDNN's fastest layout)."""
    if family(config.model) == "resnet" and x.is_cuda:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    # In a log file (no terminal) every redraw is kept, so redraw rarely there.
    every = 0.1 if sys.stderr.isatty() else 15.0
    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr, dynamic_ncols=True, mininterval=every)


class _LossReadout:
    """The training loss for the progress bar, read without stalling a GPU.

    ``float(loss)`` on a CUDA tensor waits for every kernel queued so far, so the host stops
    running ahead of the device and the GPU idles while the next kernels are launched.  Here the
    loss is copied into pinned host memory asynchronously and shown once an event says the copy
    has landed (usually by the next refresh); on other devices the value is read at once.
    """

    def __init__(self) -> None:
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self.text = "..."

    def __call__(self, loss: torch.Tensor) -> str:
        if not loss.is_cuda:
            self.text = f"{float(loss):.3f}"
            return self.text
        if self._pending is not None and self._pending[1].query():  # type: ignore[no-untyped-call]
            self.text = f"{float(self._pending[0]):.3f}"
            self._pending = None
        if self._pending is None:
            host = loss.detach().to("cpu", non_blocking=True)
            landed = torch.cuda.Event()  # type: ignore[no-untyped-call]
            landed.record()
            self._pending = (host, landed)
        return self.text


def _write_atomic(path: Path, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)


def _write_metrics(out: Path, config: TrainConfig, history: list[dict[str, Any]], environment: dict[str, Any]) -> None:
    payload = {"config": config.as_dict(), "environment": environment, "history": history}
    _write_atomic(out / "metrics.json", json.dumps(payload, indent=2) + "\n")
    if history:
        lines = [",".join(history[0])] + [",".join(str(row[k]) for k in history[0]) for row in history]
        _write_atomic(out / "metrics.csv", "\n".join(lines) + "\n")


def device_label(device: str) -> str:
    """The device in a record: the GPU's name (``"NVIDIA H200"``), else ``"CPU (N threads)"``."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({torch.get_num_threads()} threads)"


def _environment(device: str, dist: Dist, compiled: bool, floats: dict[str, Any]) -> dict[str, Any]:
    return {"device": device_label(device), "processes": dist.world, "torch": torch.__version__,
            "structconv": __version__, "compiled": compiled, **floats}  # fmt: skip


def _duration(seconds: float) -> str:
    """``seconds`` as a person reads a duration: ``"0.42 s"``, ``"42 s"``, ``"7.5 min"``, ``"3.1 h"``, ``"12 days"``."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.2g} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.2g} h"
    return f"{seconds / 86400:.3g} days"


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _header(config: TrainConfig, model: nn.Module, device: str, environment: dict[str, Any], steps: int) -> str:
    """The line printed before training: model, parameters, device, preset and the run's length."""
    parameters = sum(p.numel() for p in model.parameters())
    return (
        f"{config.model}: {parameters:,} parameters | device {device}, {environment['device']} | "
        f"preset {config.preset or '(none)'}: {_plural(config.epochs, 'epoch')} of {_plural(steps, 'step')}, "
        f"batch {config.batch_size}"
    )


class _StepClock:
    """Times real training steps at the start of a run for :func:`_estimate`: no extra passes.

    The first step is left out, as it pays for allocations, cuDNN's autotuning and compilation;
    the next :data:`_TIMED_STEPS` are timed, fewer when they take more than :data:`_TIMED_SECONDS`
    (full models on a CPU), so the estimate comes within seconds.  A first step slower than that
    is timed alone, unless the model is compiled: its overhead is then small against its work,
    and the estimate comes a (long) step sooner.  All steps are timed when there are too few to
    leave the first out.
    """

    def __init__(self, steps: int, device: str, compiled: bool) -> None:
        first = _UNTIMED_STEPS if steps > _UNTIMED_STEPS else 0
        self.timed = range(first, min(_UNTIMED_STEPS + _TIMED_STEPS, steps))
        self.device, self.compiled = device, compiled
        self.begin = time.perf_counter()  # before the first batch is drawn: drawing is part of a step

    def after(self, step: int) -> tuple[float, range] | None:
        """Call after step ``step`` (from 0); once enough are timed: the seconds a step and the steps timed."""
        done = step + 1
        if done < self.timed.start:
            return None
        if done == self.timed.start:
            _synchronize(self.device)  # twice a run: a GPU's queue must be empty for the clock to mean anything
            now = time.perf_counter()
            if self.compiled or now - self.begin <= _TIMED_SECONDS:
                self.begin = now
                return None
            timed = range(done)
        elif done == self.timed.stop or time.perf_counter() - self.begin > _TIMED_SECONDS:
            _synchronize(self.device)
            timed = range(self.timed.start, done)
        else:
            return None
        return (time.perf_counter() - self.begin) / len(timed), timed


def _estimate(
    config: TrainConfig, device: str, step_seconds: float, timed: range, steps: int, test_images: int, epochs_left: int
) -> list[str]:
    """The lines printed after the timed steps: the time an epoch and the run take, and a CPU warning.

    Evaluation is counted at a third of a training step per image: a forward pass without the
    backward, which costs about twice the forward.
    """
    epoch = step_seconds * (steps + test_images / (3 * config.batch_size))
    over = f"step {timed.stop}" if len(timed) == 1 else f"steps {timed.start + 1}-{timed.stop}"
    lines = [
        f"{config.model}: about {_duration(epoch)} an epoch, {_duration(epoch * epochs_left)} for the "
        f"{_plural(epochs_left, 'epoch')} to go ({_duration(step_seconds)} a step, timed over {over})"
    ]
    if device.split(":")[0] == "cpu" and PRESET_DEVICES.get(config.preset) == "gpu":
        lines.append(
            f"{config.model}: the {config.preset} preset is meant for a GPU: at this speed it would take about "
            f"{_duration(epoch * epochs_left)} on this CPU. --preset {CPU_PRESET} is meant for a CPU "
            f"({PRESET_SUMMARIES[CPU_PRESET]}); carrying on as asked."
        )
    return lines


def _synchronize(device: str) -> None:
    """Wait for the device's queued work, so that a clock reading includes it (torch.cuda, torch.mps, ...)."""
    module: Any = getattr(torch, device.split(":")[0], None)
    if hasattr(module, "synchronize"):
        module.synchronize()


def _out_of_time(
    start: float, epoch_times: list[float], limit: float, dist: Dist, device: str, compiled: bool = False
) -> bool:
    """Whether the next epoch would end past ``limit`` seconds; any process's "yes" stops all of them.

    The next epoch is predicted by the longest so far; a compiled run's first epoch, which
    compiled the step, is left out once there is another.
    """
    seen = epoch_times[1:] if compiled and len(epoch_times) > 1 else epoch_times
    late = bool(seen) and time.perf_counter() - start + max(seen) > limit
    return bool(dist.all_sum(torch.tensor([float(late)], device=device)).item() > 0)


def _batches(data: tuple[Cifar10, Cifar10], config: TrainConfig, device: str, dist: Dist) -> tuple[Batches, Batches]:
    train_x, train_y = _subset(data[0], config.train_subset)
    test_x, test_y = _subset(data[1], config.test_subset)
    mean, std = NORMALIZATIONS[config.normalization]
    kw = {"rank": dist.rank, "world": dist.world, "mean": mean, "std": std}
    return (
        Batches.from_arrays(train_x, train_y, config.batch_size, train=True, device=device, **kw),
        Batches.from_arrays(test_x, test_y, max(config.batch_size, 500 * dist.world), train=False, device=device, **kw),
    )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    device: str,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step of the study: the learning rate, the forward under autocast, cross-entropy, backward, update.

    Returns the loss and logits, detached and on the device: nothing is read back to the host, so
    on a GPU the step queues without waiting (``tests/test_cifar_device.py`` holds this on the
    ``meta`` device).
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    with _autocast(config, device):
        logits = model(_layout(x, config))
        loss = F.cross_entropy(logits.float(), y, label_smoothing=config.label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return loss.detach(), logits.detach()


#: A training step as :func:`train` takes it: ``step(images, labels, lr) -> (loss, logits)``.
Step = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


class CompiledStep:
    r"""The study's training step compiled: forward and loss, their backward, and the SGD update.

    Computes what :func:`train_step` computes (a test holds loss and gradients equal on a CPU) in
    two compiled regions: the forward with the loss under autocast, whose backward the compiler
    derives and compiles with it, and the optimizer's update.  On CUDA (one process) the first is
    compiled in ``"reduce-overhead"`` mode, so both passes replay as CUDA graphs (one launch each instead of
    hundreds of kernels); the update becomes a few fused kernels.  The learning rate lives in one
    device tensor shared by the parameter groups and is written in place, so a new rate neither
    recompiles nor reads anything back to the host.

    The first call runs the model once eagerly (in training mode, without gradients, the random
    state and the buffers restored afterwards) before compiling: the layers build their plans and
    caches on the host there, outside the traced region.  Shapes are static (``dynamic=False``):
    every training batch of a run has the same size.

    Parameters
    ----------
    model : torch.nn.Module
        The model in training mode (possibly wrapped in ``DistributedDataParallel``).
    optimizer : torch.optim.Optimizer
        Its optimizer; its groups' ``lr`` become the shared tensor.
    config : TrainConfig
        Precision and label smoothing.
    device : str
        Where the model lives.
    backend : str, default "inductor"
        ``torch.compile``'s backend (``"eager"``: dynamo's graphs run as they are, for checks of them).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: TrainConfig,
        device: str,
        backend: str = "inductor",
    ) -> None:
        self.model, self.optimizer, self.config, self.device = model, optimizer, config, device
        self.cuda = device.startswith("cuda")
        self.lr = torch.tensor(float(optimizer.param_groups[0]["lr"]), device=device)
        for group in optimizer.param_groups:
            group["lr"] = self.lr
        # CUDA graphs cannot hold DistributedDataParallel's all-reduces, which run from autograd hooks.
        from torch.nn.parallel import DistributedDataParallel

        graphs = self.cuda and not isinstance(model, DistributedDataParallel)
        mode = "reduce-overhead" if graphs and backend == "inductor" else None
        self._loss = torch.compile(self._forward, mode=mode, dynamic=False, backend=backend)
        self._update = torch.compile(optimizer.step, dynamic=False, backend=backend)
        self._warm = False

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with _autocast(self.config, self.device):
            logits = self.model(_layout(x, self.config))
            loss = F.cross_entropy(logits.float(), y, label_smoothing=self.config.label_smoothing)
        return loss, logits

    def _warm_up(self, x: torch.Tensor) -> None:
        """One eager forward for the layers' host-side plans, leaving the random state and buffers as they were."""
        buffers = [b.clone() for b in self.model.buffers()]
        with torch.random.fork_rng(devices=[torch.device(self.device)] if self.cuda else []), torch.no_grad():
            with _autocast(self.config, self.device):
                self.model(_layout(x, self.config))
            for b, saved in zip(self.model.buffers(), buffers, strict=True):
                b.copy_(saved)
        self._warm = True

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One step at learning rate ``lr``; returns the loss and logits, detached copies on the device."""
        if not self._warm:
            self._warm_up(x)
        if self.cuda:  # a new iteration: the graphs' previous outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        self.lr.fill_(lr)
        loss, logits = self._loss(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        self._update()
        # Copies: a replayed graph writes its outputs into the same memory at the next step.
        return loss.detach().clone(), logits.detach().clone()


def make_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig, device: str, *, compile: bool = False
) -> Step:
    """The training step :func:`train` runs: :func:`train_step` eagerly, or a :class:`CompiledStep`.

    Parameters
    ----------
    model, optimizer, config, device
        As for :func:`train_step`.
    compile : bool, default False
        Compile the whole step (:class:`CompiledStep`).

    Returns
    -------
    Step
        ``step(images, labels, lr) -> (loss, logits)``.
    """
    if compile:
        return CompiledStep(model, optimizer, config, device)
    return functools.partial(train_step, model, optimizer, config, device)


def train(
    config: TrainConfig,
    out: str | os.PathLike[str],
    data: tuple[Cifar10, Cifar10],
    device: str = "cpu",
    resume: bool = True,
    time_limit: float | None = None,
    progress: bool = True,
    compile: bool = False,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Train ``config`` on ``data`` (train, test), writing metrics and checkpoints into ``out``.

    Resumes from ``out/checkpoint.pt`` when ``resume`` and it exists (its settings must match
    ``config``).  Stops after the last epoch, or earlier, at an epoch boundary, when the next
    epoch would not finish within ``time_limit`` seconds of the start (resume it later).
    Returns the per-epoch metrics.  Under ``torchrun`` every process calls this function; only
    rank 0 writes files.  On a CPU every thread flushes subnormal numbers to zero for the run
    (:func:`~structconv.backend.subnormals.subnormals_flushed`; the former setting returns after
    it); ``metrics.json``'s environment records the setting (``flush_denormal``; on other devices
    the host's, as it was).
    """
    cpu = torch.device(device).type == "cpu"
    with subnormals_flushed(True if cpu else None) as floats:
        return _train(config, Path(out), data, device, resume, time_limit, progress, compile, log, floats)


def _train(
    config: TrainConfig,
    out_dir: Path,
    data: tuple[Cifar10, Cifar10],
    device: str,
    resume: bool,
    time_limit: float | None,
    progress: bool,
    compile: bool,
    log: Any,
    floats: dict[str, Any],
) -> list[dict[str, Any]]:
    """:func:`train` under its floating-point setting (``floats``: the record of it)."""
    start = time.perf_counter()
    dist = Dist.from_environment(device)
    if device.startswith("cuda") and dist.world > 1:
        device = f"cuda:{dist.local_rank}"
        torch.cuda.set_device(device)
    if dist.main:
        out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)  # the same initial parameters in every process
    model = build_model(config.model, **config.model_options).to(device)
    cuda = device.startswith("cuda")
    if family(config.model) == "resnet" and cuda:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        if dist.world > 1:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
    optimizer = _optimizer(model, config, fused=cuda and not compile)
    history: list[dict[str, Any]] = []
    first = 0
    ckpt = out_dir / CHECKPOINT
    if resume and ckpt.is_file():
        state = load_checkpoint(ckpt, config.as_dict())
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ValueError(f"{ckpt}: parameters do not fit model {config.model!r}: {err}") from err
        first, history = int(state["epoch"]), list(state["history"])
        if dist.main:
            log(f"resumed {ckpt} after epoch {first} of {config.epochs}")
    step_model: nn.Module = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model, device_ids=[dist.local_rank] if cuda else None)
    step = make_step(step_model, optimizer, config, device, compile=compile)
    train_batches, test_batches = _batches(data, config, device, dist)
    steps = len(train_batches)
    environment = _environment(device, dist, compile, floats)
    if dist.main:
        log(_header(config, model, device, environment, steps))
    epoch_times: list[float] = []
    for epoch in range(first, config.epochs):
        if time_limit is not None and _out_of_time(start, epoch_times, time_limit, dist, device, compile):
            if dist.main:
                log(f"stopping after epoch {epoch} of {config.epochs}: the next would pass the time limit")
            break
        tic = time.perf_counter()
        _seed_dropout(config, epoch, dist.rank)
        step_model.train()
        totals = torch.zeros(3, dtype=torch.float64, device=device)
        bar = _progress(steps, f"{config.model} epoch {epoch + 1}/{config.epochs}", progress and dist.main)
        readout = _LossReadout()
        clock = _StepClock(steps, device, compile) if dist.main and epoch == first else None
        for i, (x, y) in enumerate(train_batches.epoch(config.seed, epoch)):
            lr = learning_rate(config, epoch * steps + i, steps)
            loss, logits = step(x, y, lr)
            totals += _tally(loss * len(y), logits, y)
            if bar is not None:
                bar.update(1)
                if i % 20 == 0:
                    bar.set_postfix(loss=readout(loss), lr=f"{lr:.4f}")
            measured = clock.after(i) if clock is not None else None
            if measured is not None:
                lines = _estimate(config, device, *measured, steps, len(test_batches.labels), config.epochs - epoch)
                with bar.external_write_mode() if bar is not None else contextlib.nullcontext():
                    for line in lines:
                        log(line)
                clock = None
        if bar is not None:
            bar.close()
        if cuda:
            torch.cuda.synchronize()
        train_time = time.perf_counter() - tic
        loss_sum, correct, count = dist.all_sum(totals).tolist()
        test_loss, test_acc = evaluate(model, test_batches, config, device, dist)
        epoch_times.append(time.perf_counter() - tic)
        row = {
            "epoch": epoch + 1, "lr": round(learning_rate(config, (epoch + 1) * steps - 1, steps), 8),
            "train_loss": round(loss_sum / count, 6), "train_acc": round(correct / count, 6),
            "test_loss": round(test_loss, 6), "test_acc": round(test_acc, 6),
            "test_images": len(test_batches.labels),
            "epoch_seconds": round(epoch_times[-1], 3), "train_images_per_second": round(count / train_time, 1),
        }  # fmt: skip
        history.append(row)
        if dist.main:
            save_checkpoint(
                ckpt,
                {
                    "config": config.as_dict(), "epoch": epoch + 1, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "history": history, "structconv": __version__,
                },
            )  # fmt: skip
            _write_metrics(out_dir, config, history, environment)
            log(
                f"{config.model} epoch {epoch + 1}/{config.epochs}: train loss {row['train_loss']:.4f} "
                f"acc {row['train_acc']:.4f} | test loss {row['test_loss']:.4f} acc {row['test_acc']:.4f} | "
                f"{row['epoch_seconds']:.1f} s, {row['train_images_per_second']:.0f} img/s"
            )
    if dist.main and not history:
        _write_metrics(out_dir, config, history, environment)
    return history


def model_from_checkpoint(
    path: str | os.PathLike[str], device: str = "cpu"
) -> tuple[nn.Module, TrainConfig, dict[str, Any]]:
    """The trained model of a run's checkpoint (in eval mode), its configuration and the checkpoint."""
    state = load_checkpoint(Path(path))
    config = TrainConfig.from_dict(dict(state["config"]))
    model = build_model(config.model, **config.model_options)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise ValueError(f"{path}: parameters do not fit model {config.model!r}: {err}") from err
    return model.to(device).eval(), config, state


def iterate_runs(root: Path) -> Iterator[Path]:
    """Run directories below ``root`` (those holding a ``metrics.json``), sorted."""
    yield from sorted(p.parent for p in Path(root).glob("*/metrics.json"))
