"""Training throughput (images per second) of the study's models, measured side by side.

Variants, each a full training step (forward, cross-entropy, backward, SGD step) on one batch of
CIFAR-shaped images already on the device, in training mode (dropout is on, attention dropout
included, drawn as the paper's code draws it: one mask per layer and step shared by the batch for
position-only heads, one per image for content heads), with the precision the training uses there
(bf16 autocast on CUDA, float32 on CPUs):

* ``sa-quadratic``, ``sa-gaussian``, ``sa-learned``, ``sa-learned-content`` — the self-attention
  models through structconv;
* ``sa-quadratic paper-dense`` — the *same* quadratic model (shared parameters) with every
  attention layer computed the paper's way: relative encodings, scores, dense softmax and one
  dropout mask per layer and step with no batch axis, then the value einsum over the images
  (:mod:`.reference`);
* ``resnet18`` — the baseline of GridConv2d layers, and ``resnet18 torch`` the same network of
  ``torch.nn.Conv2d`` layers.

Each variant's floating-point operations per training image (forward and backward, counted by
``torch.utils.flop_counter`` on one step) give its achieved FLOP/s and, with the device's peak
(``peak_tflops``), its model FLOP utilisation.  Timings are medians over rounds that visit the
variants in turn, so drifts in machine load hit all of them alike.  The goals are stated in
:data:`GOALS`: ratios within one run, and the images per second of ``sa-quadratic`` on one
H100/H200 at batch 100.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from .models import ResNet18, SelfAttentionNet, build_model
from .reference import dense_twin

__all__ = ["GOALS", "SA_VARIANTS", "Throughput", "measure", "table"]

SA_VARIANTS = ("sa-quadratic", "sa-gaussian", "sa-learned", "sa-learned-content")
#: Goals of the study's GPU runs: sa-quadratic images per second (one H100/H200, batch 100, bf16),
#: so that 300 epochs take about 21 minutes; ResNet18 of GridConv2d against nn.Conv2d.
GOALS = {"sa-quadratic images/s": 12_000.0, "resnet18 / resnet18 torch": 0.9}


@dataclass
class Throughput:
    """Median images per second of every variant, its FLOPs per training image, and the settings."""

    device: str
    batch: int
    precision: str
    images_per_second: dict[str, float]
    parameters: dict[str, int]
    flops_per_image: dict[str, float] = field(default_factory=dict)
    peak_tflops: float | None = None

    def tflops(self, name: str) -> float:
        """Achieved TFLOP/s of variant ``name``."""
        return self.images_per_second[name] * self.flops_per_image.get(name, math.nan) / 1e12

    def ratio(self, a: str, b: str) -> float | None:
        ips = self.images_per_second
        return ips[a] / ips[b] if a in ips and b in ips else None


def _variants(options: dict[str, Any], names: tuple[str, ...]) -> dict[str, nn.Module]:
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
        out["resnet18"] = ResNet18()
    if wanted("resnet18 torch"):
        out["resnet18 torch"] = ResNet18(conv=nn.Conv2d)
    return out


def _flops(step: Callable[[], None], batch: int) -> float:
    """Floating-point operations per image of one training step, as torch's FLOP counter counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops()) / batch


def _stepper(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step


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
) -> Throughput:
    """Median training images per second of each variant (see the module docstring)."""
    cuda = device.startswith("cuda")
    bf16 = precision == "bf16" or (precision == "auto" and cuda)
    known = (*SA_VARIANTS, "sa-quadratic paper-dense", "resnet18", "resnet18 torch")
    unknown = [n for n in only if n not in known]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; expected some of {list(known)}")
    models = _variants(sa_options or {}, only)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    steppers = {}
    flops: dict[str, float] = {}
    for name, model in models.items():
        model.to(device)
        xin = x
        if name.startswith("resnet") and cuda:
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            xin = x.contiguous(memory_format=torch.channels_last)
        steppers[name] = _stepper(model, xin, y, bf16)
        steppers[name]()  # warm-up: allocator, cuDNN autotuning, basis caches, plans
        flops[name] = _flops(steppers[name], batch)
    samples: dict[str, list[float]] = {name: [] for name in steppers}
    for r in range(rounds):
        for name, step in steppers.items():
            if cuda:
                torch.cuda.synchronize()
            tic = time.perf_counter()
            for _ in range(steps):
                step()
            if cuda:
                torch.cuda.synchronize()
            samples[name].append(batch * steps / (time.perf_counter() - tic))
        if log is not None:
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.0f} img/s" for n, v in samples.items()))
    return Throughput(
        device=torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)",
        batch=batch,
        precision="bf16 autocast" if bf16 else "float32",
        images_per_second={n: statistics.median(v) for n, v in samples.items()},
        parameters={n: sum(p.numel() for p in m.parameters()) for n, m in models.items()},
        flops_per_image=flops,
        peak_tflops=peak_tflops,
    )


def table(result: Throughput) -> str:
    """The measurements as a text table with FLOPs, utilisation and the target ratios."""
    ips = result.images_per_second
    peak = result.peak_tflops
    lines = [
        f"training throughput on {result.device}, batch {result.batch}, {result.precision}"
        + (f", peak {peak:g} TFLOP/s" if peak else ""),
        f"{'variant':<28}{'images/s':>11}{'parameters':>13}{'GFLOP/img':>11}{'TFLOP/s':>9}"
        + ("   MFU" if peak else ""),
    ]
    for n, v in ips.items():
        row = f"{n:<28}{v:>11.1f}{result.parameters[n]:>13,}"
        row += f"{result.flops_per_image.get(n, math.nan) / 1e9:>11.2f}{result.tflops(n):>9.3f}"
        if peak:
            row += f"{100 * result.tflops(n) / peak:>5.1f}%"
        lines.append(row)
    for a, b in (
        ("sa-quadratic", "sa-quadratic paper-dense"),
        ("sa-quadratic", "resnet18"),
        ("resnet18", "resnet18 torch"),
    ):
        r = result.ratio(a, b)
        if r is not None:
            goal = GOALS.get(f"{a} / {b}")
            lines.append(f"{a} / {b}: {r:.2f}x" + (f" (target >= {goal:g}x)" if goal else ""))
    if "sa-quadratic" in ips and result.device.startswith("NVIDIA") and result.batch == 100:
        goal = GOALS["sa-quadratic images/s"]
        lines.append(f"sa-quadratic: {ips['sa-quadratic']:.0f} img/s (target >= {goal:,.0f} on one H100/H200)")
    return "\n".join(lines)
