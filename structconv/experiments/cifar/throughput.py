"""Training throughput (images per second) of the study's models, measured side by side.

Variants, each a full training step (forward, cross-entropy, backward, SGD step) on one batch of
CIFAR-shaped images already on the device, with the precision the training uses there (bf16
autocast on CUDA, float32 on CPUs):

* ``sa-quadratic`` — the self-attention model through structconv (heads built once per forward
  and shared by the batch);
* ``sa-quadratic paper-dense`` — the *same* model (shared parameters) with every attention layer
  computed the paper's way: per-image relative encodings, scores and dense softmax
  (:mod:`.reference`);
* ``resnet18`` — the baseline of GridConv2d layers, and ``resnet18 torch`` the same network of
  ``torch.nn.Conv2d`` layers.

Timings are medians over rounds that visit the variants in turn, so drifts in machine load hit
all of them alike; the goals are ratios within one run: sa-quadratic at least 3x the paper-dense
implementation and at least 0.5x ResNet18.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from .models import ResNet18, SelfAttentionNet, build_model
from .reference import dense_twin

__all__ = ["GOAL_DENSE", "GOAL_RESNET", "Throughput", "measure", "table"]

GOAL_DENSE, GOAL_RESNET = 3.0, 0.5


@dataclass
class Throughput:
    """Median images per second of every variant, and the settings they were measured with."""

    device: str
    batch: int
    precision: str
    images_per_second: dict[str, float]
    parameters: dict[str, int]

    @property
    def speedup_over_dense(self) -> float:
        return self.images_per_second["sa-quadratic"] / self.images_per_second["sa-quadratic paper-dense"]

    @property
    def ratio_to_resnet(self) -> float:
        return self.images_per_second["sa-quadratic"] / self.images_per_second["resnet18"]


def _variants(options: dict[str, Any]) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    sa = build_model("sa-quadratic", **options)
    assert isinstance(sa, SelfAttentionNet)
    return {
        "sa-quadratic": sa,
        "sa-quadratic paper-dense": dense_twin(sa),
        "resnet18": ResNet18(),
        "resnet18 torch": ResNet18(conv=nn.Conv2d),
    }


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
) -> Throughput:
    """Median training images per second of each variant (see the module docstring)."""
    cuda = device.startswith("cuda")
    bf16 = precision == "bf16" or (precision == "auto" and cuda)
    models = {k: v for k, v in _variants(sa_options or {}).items() if not only or k in only}
    if not models:
        raise ValueError(f"--only matched no variant; expected some of {list(_variants(sa_options or {}))}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    steppers = {}
    for name, model in models.items():
        model.to(device)
        xin = x
        if name.startswith("resnet") and cuda:
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            xin = x.contiguous(memory_format=torch.channels_last)
        steppers[name] = _stepper(model, xin, y, bf16)
        steppers[name]()  # warm-up: allocator, cuDNN autotuning, basis caches
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
    )


def table(result: Throughput) -> str:
    """The measurements as a text table with the goal ratios."""
    ips = result.images_per_second
    lines = [
        f"training throughput on {result.device}, batch {result.batch}, {result.precision}",
        f"{'variant':<28}{'images/s':>12}{'parameters':>14}",
    ]
    lines += [f"{n:<28}{v:>12.1f}{result.parameters[n]:>14,}" for n, v in ips.items()]
    if "sa-quadratic" in ips and "sa-quadratic paper-dense" in ips:
        lines.append(f"sa-quadratic / paper-dense: {result.speedup_over_dense:.2f}x (goal >= {GOAL_DENSE:g}x)")
    if "sa-quadratic" in ips and "resnet18" in ips:
        lines.append(f"sa-quadratic / resnet18:    {result.ratio_to_resnet:.2f}x (goal >= {GOAL_RESNET:g}x)")
    if "resnet18" in ips and "resnet18 torch" in ips:
        lines.append(f"resnet18 GridConv2d / nn.Conv2d: {ips['resnet18'] / ips['resnet18 torch']:.2f}x")
    return "\n".join(lines)
