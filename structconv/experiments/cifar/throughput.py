r"""Training throughput (images per second) of the study's models, measured side by side.

Variants, each a full training step (forward, cross-entropy, backward, SGD step) on one batch of
CIFAR-shaped images already on the device, in training mode, with the precision the training
uses there (bf16 autocast on CUDA, float32 on CPUs):

* ``sa-quadratic``, ``sa-gaussian``, ``sa-learned``, ``sa-learned-content`` — the self-attention
  models through structconv;
* ``sa-quadratic paper-dense`` — the *same* quadratic model (shared parameters) with every
  attention layer computed the paper's way (:mod:`.reference`);
* ``resnet18`` — the baseline of GridConv2d layers, and ``resnet18 torch`` the same network of
  ``torch.nn.Conv2d`` layers.

Each variant's FLOPs per training image (``torch.utils.flop_counter``) give its achieved FLOP/s,
its model FLOP utilisation against ``peak_tflops``, and its share of the GEMM yardstick: the
largest matrix product of the step, timed alone with ``torch.mm`` or ``torch.bmm``.  Timings
are medians over rounds that visit the variants in turn; the goals are :data:`GOALS`.  How the
yardstick is chosen and timed, and the models measured with no ``sa_options``, are in
docs/cifar.rst ("Training throughput").
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ...backend.subnormals import set_subnormal_flush, subnormals_flushed, thread_flushes
from .models import ResNet18, SelfAttentionNet, build_model
from .presets import TrainConfig, family
from .reference import dense_twin
from .train import (
    _optimizer,
    device_label,
    make_step,
    train_step,
)

__all__ = [
    "GOALS",
    "SA_VARIANTS",
    "Gemm",
    "Target",
    "Throughput",
    "largest_gemm",
    "measure",
    "profile_step",
    "subnormals_stated",
    "table",
    "targets",
]

SA_VARIANTS = ("sa-quadratic", "sa-gaussian", "sa-learned", "sa-learned-content")
#: Every variant :func:`measure` can time (its ``only`` picks among them).
VARIANTS = (*SA_VARIANTS, "sa-quadratic paper-dense", "resnet18", "resnet18 torch")
#: Goals of the study's GPU runs: sa-quadratic images per second (one H100/H200, batch 100, bf16),
#: so that 300 epochs take about 21 minutes; ResNet18 of GridConv2d against nn.Conv2d; on CPUs,
#: the paper's sa-quadratic step at batch 100 reaching half the FLOP/s of its own largest GEMM.
GOALS = {
    "sa-quadratic images/s": 12_000.0,
    "sa-quadratic / sa-quadratic paper-dense": 1.0,
    "sa-quadratic GFLOP/s / GEMM GFLOP/s on GPUs": 0.4,
    "resnet18 images/s": 40_000.0,
    "resnet18 / resnet18 torch": 0.9,
    "sa-quadratic GFLOP/s / GEMM GFLOP/s": 0.5,
}
#: How long each round's timing of the GEMM yardstick lasts at least, in seconds: one product of a
#: small shape takes microseconds, too short to time alone against the clock and synchronisation.
GEMM_SECONDS = 0.2


@dataclass
class Throughput:
    """Median images per second of every variant, its FLOPs per training image, and the settings.

    ``gemm_shape`` ``(M, K, N)``, ``gemm_batch`` (1 for ``torch.mm``, the number of products of a
    ``torch.bmm``), ``gemm_dtype`` and ``gemm_source`` (the variant whose step it came from)
    describe the GEMM yardstick; ``gemm_tflops`` is its median achieved TFLOP/s and
    ``utilisation`` each variant's achieved TFLOP/s over it.  All are ``None`` (``utilisation``
    empty) when no measured step multiplies matrices.  ``flush_denormal`` is whether every CPU
    thread flushed subnormal numbers to zero while every variant was timed (``None``: only some
    did, or a record from before it was kept), ``flush_denormal_supported`` whether the CPU can.
    """

    device: str
    batch: int
    precision: str
    images_per_second: dict[str, float]
    parameters: dict[str, int]
    flops_per_image: dict[str, float] = field(default_factory=dict)
    peak_tflops: float | None = None
    gemm_shape: tuple[int, int, int] | None = None
    gemm_batch: int = 1
    gemm_dtype: str | None = None
    gemm_source: str | None = None
    gemm_tflops: float | None = None
    utilisation: dict[str, float] = field(default_factory=dict)
    compiled: bool = False
    sizes: str = "paper"
    profile: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)
    flush_denormal: bool | None = None
    flush_denormal_supported: bool | None = None

    def tflops(self, name: str) -> float:
        """Achieved TFLOP/s of variant ``name``."""
        return self.images_per_second[name] * self.flops_per_image.get(name, math.nan) / 1e12

    def ratio(self, a: str, b: str) -> float | None:
        ips = self.images_per_second
        return ips[a] / ips[b] if a in ips and b in ips else None

    def yardstick(self) -> str | None:
        """The GEMM yardstick in words, e.g. ``torch.mm (25600, 400) x (400, 512) float32``."""
        if self.gemm_shape is None:
            return None
        m, k, n = self.gemm_shape
        op = "torch.mm" if self.gemm_batch == 1 else f"torch.bmm {self.gemm_batch} x"
        return f"{op} ({m}, {k}) x ({k}, {n}) {self.gemm_dtype}"


def _variants(
    options: dict[str, Any], names: tuple[str, ...], resnet_options: dict[str, Any] | None = None
) -> dict[str, nn.Module]:
    """The variants named (all when ``names`` is empty), built with the same seed."""

    def wanted(name: str) -> bool:
        return not names or name in names

    out: dict[str, nn.Module] = {}
    for name in SA_VARIANTS:
        if wanted(name) or (name == "sa-quadratic" and wanted("sa-quadratic paper-dense")):
            torch.manual_seed(0)
            out[name] = build_model(name, **options)
    if wanted("sa-quadratic paper-dense"):
        sa = out["sa-quadratic"]
        assert isinstance(sa, SelfAttentionNet)
        out["sa-quadratic paper-dense"] = dense_twin(sa)
        if not wanted("sa-quadratic"):
            del out["sa-quadratic"]
    if wanted("resnet18"):
        out["resnet18"] = ResNet18(**(resnet_options or {}))
    if wanted("resnet18 torch"):
        out["resnet18 torch"] = ResNet18(conv=nn.Conv2d, **(resnet_options or {}))
    return out


@dataclass(frozen=True)
class Gemm:
    """One matrix product: ``batch`` products of ``(m, k) x (k, n)`` in ``dtype``."""

    batch: int
    m: int
    k: int
    n: int
    dtype: torch.dtype

    @property
    def flops(self) -> int:
        """Floating-point operations of the product (a multiply and an add per term)."""
        return 2 * self.batch * self.m * self.k * self.n


_GEMM_OPS = {
    torch.ops.aten.mm: 0,
    torch.ops.aten.bmm: 0,
    torch.ops.aten.addmm: 1,
    torch.ops.aten.baddbmm: 1,
}


class _GemmRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every matrix product dispatched while it is active, backward included."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.gemms: list[Gemm] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        first = _GEMM_OPS.get(func.overloadpacket)
        if first is not None:
            a, b = args[first], args[first + 1]
            batch = int(a.shape[0]) if a.ndim == 3 else 1
            self.gemms.append(Gemm(batch, int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1]), a.dtype))
        elif func.overloadpacket is torch.ops.aten.convolution and not args[6]:  # not transposed
            # A convolution is the product of its unfolded input (one row per output position)
            # with its weight, one per group: ResNet's largest products are convolutions.
            weight, groups = args[1], int(args[8])
            positions = out.numel() // out.shape[1]
            self.gemms.append(Gemm(groups, positions, weight[0].numel(), int(weight.shape[0]) // groups, out.dtype))
        return out


def largest_gemm(gemms: list[Gemm]) -> Gemm | None:
    """The product with the most FLOPs (the first of equals: forward before its backward twins)."""
    return max(gemms, key=lambda g: g.flops, default=None)


def _count(step: Callable[[], object], batch: int) -> tuple[float, list[Gemm]]:
    """FLOPs per image of one training step (torch's FLOP counter) and the matrix products it dispatched."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    recorder = _GemmRecorder()
    with counter, recorder:
        step()
    return float(counter.get_total_flops()) / batch, recorder.gemms


def _gemm_timer(gemm: Gemm, device: str, steps: int) -> Callable[[], float]:
    """A function that times ``gemm`` for at least :data:`GEMM_SECONDS` and returns its TFLOP/s."""
    cuda = device.startswith("cuda")
    g = torch.Generator().manual_seed(1)
    shape = (gemm.batch,) if gemm.batch > 1 else ()
    a = torch.randn(*shape, gemm.m, gemm.k, generator=g).to(device, gemm.dtype)
    b = torch.randn(*shape, gemm.k, gemm.n, generator=g).to(device, gemm.dtype)
    out = torch.empty(*shape, gemm.m, gemm.n, device=device, dtype=gemm.dtype)
    product = torch.mm if gemm.batch == 1 else torch.bmm

    def run(reps: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        tic = time.perf_counter()
        for _ in range(reps):
            product(a, b, out=out)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - tic

    # A fresh output per call would time the allocator and the first touch of its pages as well.
    run(3)  # warm-up: library handles, kernel choice, first touch of the output's pages
    reps = max(steps, math.ceil(GEMM_SECONDS / max(run(3) / 3, 1e-9)))

    def sample() -> float:
        return gemm.flops * reps / run(reps) / 1e12

    return sample


def _config(name: str, bf16: bool) -> TrainConfig:
    """The training settings a variant's step takes: its base model's (for the layout) and the precision."""
    base = "resnet18" if family(name) == "resnet" else "sa-quadratic"
    return TrainConfig(model=base, precision="bf16" if bf16 else "fp32")


def measure(
    device: str = "cpu",
    batch: int = 100,
    steps: int = 5,
    rounds: int = 5,
    precision: str = "auto",
    only: tuple[str, ...] = (),
    sa_options: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    peak_tflops: float | None = None,
    resnet_options: dict[str, Any] | None = None,
    compile: bool = False,
    sizes: str = "paper",
    profile: int = 0,
    flush: bool | None = None,
) -> Throughput:
    """Median training images per second of each variant and of the GEMM yardstick (see the module docstring).

    Every variant's step is the training step :func:`~.train.make_step` builds (the study's
    optimizer, fused on CUDA); with ``compile`` every variant, peers included, is compiled alike
    (:class:`~.train.CompiledStep`: CUDA graphs on CUDA), and its compilation happens before the
    timed rounds.  FLOPs are counted on one eager step.  ``sa_options`` and ``resnet_options`` are
    the models' options (``sizes`` names them in the record, e.g. ``"smoke"``).  With ``profile``
    (a number of operators), each variant's step is profiled after the timing (:func:`profile_step`),
    so that a missed target comes with where the step's time goes.

    Every variant runs in one floating-point environment: on a CPU every thread flushes
    subnormal numbers to zero (the first thing an expert sets on a CPU where a softmax feeds a
    product; ``flush=False`` keeps them, for the figures without it), elsewhere the host's
    setting stays as it is unless ``flush`` is given (:func:`~.train.subnormals_flushed`; the
    former setting returns afterwards).  The record's ``flush_denormal`` says what held.
    """
    cpu = torch.device(device).type == "cpu"
    with subnormals_flushed(True if flush is None and cpu else flush) as floats:
        result = _measure(
            device, batch, steps, rounds, precision, only, sa_options, log, peak_tflops, resnet_options, compile,
            sizes, profile,
        )  # fmt: skip
    result.flush_denormal = floats["flush_denormal"]
    result.flush_denormal_supported = floats["flush_denormal_supported"]
    return result


def _measure(
    device: str,
    batch: int,
    steps: int,
    rounds: int,
    precision: str,
    only: tuple[str, ...],
    sa_options: dict[str, Any] | None,
    log: Callable[[str], None] | None,
    peak_tflops: float | None,
    resnet_options: dict[str, Any] | None,
    compile: bool,
    sizes: str,
    profile: int,
) -> Throughput:
    """:func:`measure` inside its floating-point environment, which it holds before every timed variant."""
    held = thread_flushes()

    def hold() -> None:  # before each timed part: if anything changed the setting, every part still runs under one
        if thread_flushes() != held:
            set_subnormal_flush(held)

    cuda = device.startswith("cuda")
    bf16 = precision == "bf16" or (precision == "auto" and cuda)
    unknown = [n for n in only if n not in VARIANTS]
    if unknown:
        raise ValueError(f"only: unknown variants {unknown}; expected some of {list(VARIANTS)}")
    models = _variants(sa_options or {}, only, resnet_options)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    steppers = {}
    flops: dict[str, float] = {}
    largest: dict[str, Gemm] = {}
    for name, model in models.items():
        model.to(device).train()
        if name.startswith("resnet") and cuda:
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        config = _config(name, bf16)
        optimizer = _optimizer(model, config, fused=cuda and not compile)

        eager = functools.partial(train_step, model, optimizer, config, device, x, y, 1e-3)
        eager()  # warm-up: allocator, cuDNN autotuning, basis caches, plans
        flops[name], gemms = _count(eager, batch)
        found = largest_gemm(gemms)
        if found is not None:
            largest[name] = found
        step = make_step(model, optimizer, config, device, compile=compile)
        steppers[name] = functools.partial(step, x, y, 1e-3)
        if compile:  # compilation, then the optimizer's second graph (once momentum exists), before any timing
            steppers[name]()
            steppers[name]()
    # The yardstick is sa-quadratic's own largest product; other selections take the
    # largest of what they run rather than paying for a step of a model they did not ask for.
    source = "sa-quadratic" if "sa-quadratic" in largest else max(largest, key=lambda n: largest[n].flops, default=None)
    gemm = largest[source] if source is not None else None
    gemm_sample = _gemm_timer(gemm, device, steps) if gemm is not None else None
    samples: dict[str, list[float]] = {name: [] for name in steppers}
    gemm_samples: list[float] = []
    for r in range(rounds):
        for name, step in steppers.items():
            hold()
            if cuda:
                torch.cuda.synchronize()
            tic = time.perf_counter()
            for _ in range(steps):
                step()
            if cuda:
                torch.cuda.synchronize()
            samples[name].append(batch * steps / (time.perf_counter() - tic))
        if gemm_sample is not None:
            hold()
            gemm_samples.append(gemm_sample())
        if log is not None:
            rates = [f"{n} {v[-1]:.1f} img/s" for n, v in samples.items()]
            rates += [f"GEMM {1e3 * gemm_samples[-1]:.1f} GFLOP/s"] if gemm_samples else []
            log(f"round {r + 1}/{rounds}: " + ", ".join(rates))
    profiles = {name: profile_step(step, cuda, profile) for name, step in steppers.items()} if profile else {}
    result = Throughput(
        device=device_label(device),
        batch=batch,
        precision="bf16 autocast" if bf16 else "float32",
        images_per_second={n: statistics.median(v) for n, v in samples.items()},
        parameters={n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
        flops_per_image=flops,
        peak_tflops=peak_tflops,
        compiled=compile,
        sizes=sizes,
        profile=profiles,
    )
    if gemm is not None:
        result.gemm_shape = (gemm.m, gemm.k, gemm.n)
        result.gemm_batch = gemm.batch
        result.gemm_dtype = str(gemm.dtype).removeprefix("torch.")
        result.gemm_source = source
        result.gemm_tflops = statistics.median(gemm_samples)
        result.utilisation = {n: result.tflops(n) / result.gemm_tflops for n in result.images_per_second}
    return result


def profile_step(step: Callable[[], object], cuda: bool, top: int, steps: int = 3) -> list[tuple[str, float, float]]:
    """Where a training step's time goes: the ``top`` operators by their own time, over ``steps`` steps.

    Rows of ``(operator, milliseconds per step, share of the step)``, by GPU kernel time on CUDA
    (``torch.profiler``'s device time, the kernels an operator launched, its children's not
    counted), by CPU time elsewhere.
    """
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profiler(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()

    def own(event: Any) -> float:  # microseconds
        return float(event.self_device_time_total if cuda else event.self_cpu_time_total)

    total = sum(own(e) for e in events) or 1.0
    ranked = sorted(events, key=own, reverse=True)[:top]
    return [(e.key, round(own(e) / steps / 1e3, 3), round(own(e) / total, 4)) for e in ranked]


@dataclass(frozen=True)
class Target:
    """One goal of :data:`GOALS` checked on a measurement: ``value`` against ``goal`` (met when at least it)."""

    name: str
    value: float
    goal: float

    @property
    def met(self) -> bool:
        return self.value >= self.goal

    def line(self) -> str:
        """E.g. ``resnet18 / resnet18 torch: 0.84x (target >= 0.9x): missed by 7 %``."""
        verdict = "met" if self.met else f"missed by {100 * (1 - self.value / self.goal):.0f} %"
        if self.goal >= 100:  # images per second
            return f"{self.name}: {self.value:,.0f} (target >= {self.goal:,.0f}): {verdict}"
        unit = "" if "GFLOP" in self.name else "x"  # a share of the yardstick, or a ratio of two variants
        return f"{self.name}: {self.value:.2f}{unit} (target >= {self.goal:g}{unit}): {verdict}"


def targets(result: Throughput) -> list[Target]:
    """The goals of :data:`GOALS` that apply to ``result``, each with its measured value.

    Images per second and the GPU share of the GEMM yardstick apply to a CUDA run of the paper's
    sizes at the paper's batch (100); the CPU share to a CPU run of the paper's sizes; the ratios
    to any run that measured both variants.
    """
    ips = result.images_per_second
    gpu = not result.device.startswith("CPU")
    paper = result.sizes == "paper" and result.batch == 100
    found: list[Target] = []
    for a, b in (("sa-quadratic", "sa-quadratic paper-dense"), ("resnet18", "resnet18 torch")):
        r = result.ratio(a, b)
        if r is not None:
            found.append(Target(f"{a} / {b}", r, GOALS[f"{a} / {b}"]))
    if gpu and paper:
        for name in ("sa-quadratic", "resnet18"):
            if name in ips:
                found.append(Target(f"{name} images/s", ips[name], GOALS[f"{name} images/s"]))
    share = result.utilisation.get("sa-quadratic")
    if share is not None and result.sizes == "paper" and (paper or not gpu):
        key = "sa-quadratic GFLOP/s / GEMM GFLOP/s" + (" on GPUs" if gpu else "")
        found.append(Target(key, share, GOALS[key]))
    return found


def subnormals_stated(result: Throughput) -> str:
    """What the record says of subnormal numbers, e.g. ``subnormals flushed for every variant`` ("" if not recorded)."""
    where = "" if result.device.startswith("CPU") else "on the host, "
    if result.flush_denormal is None:
        return "" if result.flush_denormal_supported is None else f"{where}subnormals flushed on some CPU threads only"
    said = f"{where}subnormals {'flushed' if result.flush_denormal else 'unflushed'} for every variant"
    return said + ("" if result.flush_denormal_supported is not False else " (this CPU cannot flush them)")


def table(result: Throughput) -> str:
    """The measurements as a text table with FLOPs, utilisation (of the peak, of the GEMM) and the targets."""
    ips = result.images_per_second
    peak = result.peak_tflops
    gemm = result.yardstick()
    lines = [
        f"training throughput on {result.device}, batch {result.batch}, {result.precision}"
        + (", compiled" if result.compiled else ", eager")
        + (f", {result.sizes} sizes" if result.sizes != "paper" else "")
        + (f", peak {peak:g} TFLOP/s" if peak else "")
        + (f"; {floats}" if (floats := subnormals_stated(result)) else ""),
        f"{'variant':<28}{'images/s':>11}{'parameters':>13}{'GFLOP/img':>11}{'TFLOP/s':>9}"
        + ("   MFU" if peak else "")
        + (" of GEMM" if gemm else ""),
    ]
    for n, v in ips.items():
        row = f"{n:<28}{v:>11.1f}{result.parameters[n]:>13,}"
        row += f"{result.flops_per_image.get(n, math.nan) / 1e9:>11.2f}{result.tflops(n):>9.3f}"
        if peak:
            row += f"{100 * result.tflops(n) / peak:>5.1f}%"
        if gemm:
            row += f"{100 * result.utilisation.get(n, math.nan):>7.1f}%"
        lines.append(row)
    if gemm and result.gemm_tflops is not None:
        lines.append(
            f"GEMM yardstick: {gemm} (the largest product of {result.gemm_source}'s step): "
            f"{1e3 * result.gemm_tflops:.1f} GFLOP/s; 'of GEMM' is each variant's achieved GFLOP/s as a share of it"
        )
    r = result.ratio("sa-quadratic", "resnet18")
    if r is not None:
        lines.append(f"sa-quadratic / resnet18: {r:.2f}x")
    lines += [t.line() for t in targets(result)]
    return "\n".join(lines)
