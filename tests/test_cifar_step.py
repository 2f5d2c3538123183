"""The compiled training step computes the eager one: loss, gradients and parameters after SGD.

:class:`~structconv.experiments.cifar.train.CompiledStep` is what a GPU lease runs (CUDA graphs
there); on a CPU the same class compiles with Inductor's C++ backend, and its results must equal
:func:`~structconv.experiments.cifar.train.train_step`'s from the same state.  Inductor draws
dropout masks with its own generator, so the comparison with dropout on asks it for eager's
(``fallback_random``); one case runs with dropout off and Inductor's own generator.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from structconv.experiments.cifar.models import build_model
from structconv.experiments.cifar.presets import config_for
from structconv.experiments.cifar.train import CompiledStep, _optimizer, make_step, train_step

_SMALL: dict[str, dict[str, Any]] = {
    "resnet18": {"width": 4},
    "sa-quadratic": {"width": 16, "depth": 1, "ffn": 16, "heads": 4},
    "sa-learned-content": {"width": 16, "depth": 1, "ffn": 16, "heads": 2},
}


def _pair(name: str, **options: Any) -> tuple[Any, ...]:
    config = config_for("smoke", name, model_options={**_SMALL[name], **options}, precision="fp32")
    torch.manual_seed(0)
    eager = build_model(name, **config.model_options).train()
    compiled = copy.deepcopy(eager)
    return config, eager, compiled, _optimizer(eager, config), _optimizer(compiled, config)


def _assert_near(a: torch.Tensor, b: torch.Tensor, tol: float, atol: float = 0.0) -> None:
    """Frobenius distance within ``atol + tol * |b|``: float32 sums taken in another order differ by rounding."""
    assert bool(torch.isfinite(a).all())
    assert float(torch.linalg.vector_norm(a - b)) <= atol + tol * float(torch.linalg.vector_norm(b))


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize(("name", "dropout"), [("resnet18", None), ("sa-quadratic", 0.1), ("sa-learned-content", 0.0)])
def test_the_compiled_step_computes_the_eager_step(name: str, dropout: float | None) -> None:
    options = {} if dropout is None else {"dropout": dropout, "attention_dropout": dropout}
    config, eager, compiled, opt_e, opt_c = _pair(name, **options)
    with torch._inductor.config.patch(fallback_random=bool(dropout)):
        _compare(config, eager, compiled, opt_e, opt_c)


def _compare(config: Any, eager: torch.nn.Module, compiled: torch.nn.Module, opt_e: Any, opt_c: Any) -> None:
    """Three steps of each from the same state and random seeds; everything after each step equal."""
    step = make_step(compiled, opt_c, config, "cpu", compile=True)
    assert isinstance(step, CompiledStep)
    g = torch.Generator().manual_seed(1)
    for k, lr in enumerate((0.05, 0.02, 0.01)):  # momentum from the second step; a new rate each step
        x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
        torch.manual_seed(10 + k)
        loss_e, logits_e = train_step(eager, opt_e, config, "cpu", x, y, lr)
        torch.manual_seed(10 + k)
        loss_c, logits_c = step(x, y, lr)
        _assert_near(loss_c, loss_e, 1e-5)
        _assert_near(logits_c, logits_e, 1e-5)
        grads = _grads(eager)
        assert len(grads) == len(list(eager.parameters()))
        largest = max(float(torch.linalg.vector_norm(g)) for g in grads)  # some true gradients are 0: rounding
        for a, b in zip(_grads(compiled), grads, strict=True):
            _assert_near(a, b, 1e-4, atol=1e-6 * largest)
        with torch.no_grad():  # the update's rounding, relative to the largest parameter
            scale = max(float(p.abs().max()) for p in eager.parameters())
            for a, b in zip(compiled.parameters(), eager.parameters(), strict=True):
                _assert_near(a, b, 1e-5, atol=1e-6 * scale)
    for a, b in zip(compiled.buffers(), eager.buffers(), strict=True):  # batch-norm statistics: the warm-up left none
        _assert_near(a.double(), b.double(), 1e-5)
    assert float(opt_c.param_groups[0]["lr"]) == pytest.approx(0.01)


def test_the_eager_step_is_train_step() -> None:
    config, model, _, optimizer, _ = _pair("resnet18")
    step = make_step(model, optimizer, config, "cpu")
    assert getattr(step, "func", None) is train_step
