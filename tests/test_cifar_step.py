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
from structconv.experiments.cifar.names import MODEL_NAMES
from structconv.experiments.cifar.presets import config_for
from structconv.experiments.cifar.train import CompiledStep, _optimizer, make_step, train_step

_SMALL: dict[str, dict[str, Any]] = {
    "resnet18": {"width": 4},
    "sa-quadratic": {"width": 16, "depth": 1, "ffn": 16, "heads": 4},
    "sa-gaussian": {"width": 16, "depth": 1, "ffn": 16, "heads": 4},
    "sa-learned": {"width": 16, "depth": 1, "ffn": 16, "heads": 4},
    "sa-learned-content": {"width": 16, "depth": 1, "ffn": 16, "heads": 2},
}


def _pair(name: str, device: str = "cpu", **options: Any) -> tuple[Any, ...]:
    """Two copies of a small model on ``device`` with their optimizers, the training settings in float32."""
    config = config_for("smoke", name, model_options={**_SMALL[name], **options}, precision="fp32")
    torch.manual_seed(0)
    eager = build_model(name, **config.model_options).to(device).train()
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
        compare(config, eager, compiled, opt_e, opt_c)


def compare(
    config: Any,
    eager: torch.nn.Module,
    compiled: torch.nn.Module,
    opt_e: Any,
    opt_c: Any,
    device: str = "cpu",
    slack: float = 1.0,
) -> None:
    """Four steps of each from the same state and random seeds; everything after each step equal.

    Four: on CUDA the first compiled call warms up, the second records the graphs and the next
    replay them.  ``slack`` widens the tolerances (another device's kernels round otherwise).
    """
    step = make_step(compiled, opt_c, config, device, compile=True)
    assert isinstance(step, CompiledStep)
    g = torch.Generator().manual_seed(1)
    for k, lr in enumerate((0.05, 0.02, 0.01, 0.005)):  # momentum from the second step; a new rate each step
        x, y = torch.randn(8, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (8,), generator=g).to(device)
        torch.manual_seed(10 + k)
        loss_e, logits_e = train_step(eager, opt_e, config, device, x, y, lr)
        torch.manual_seed(10 + k)
        loss_c, logits_c = step(x, y, lr)
        _assert_near(loss_c, loss_e, 1e-5 * slack)
        _assert_near(logits_c, logits_e, 1e-5 * slack)
        grads = _grads(eager)
        assert len(grads) == len(list(eager.parameters()))
        largest = max(float(torch.linalg.vector_norm(g)) for g in grads)  # some true gradients are 0: rounding
        for a, b in zip(_grads(compiled), grads, strict=True):
            _assert_near(a, b, 1e-4 * slack, atol=1e-6 * slack * largest)
        with torch.no_grad():  # the update's rounding, relative to the largest parameter
            scale = max(float(p.abs().max()) for p in eager.parameters())
            for a, b in zip(compiled.parameters(), eager.parameters(), strict=True):
                _assert_near(a, b, 1e-5 * slack, atol=1e-6 * slack * scale)
    for a, b in zip(compiled.buffers(), eager.buffers(), strict=True):  # batch-norm statistics: the warm-up left none
        _assert_near(a.double(), b.double(), 1e-5 * slack)
    assert float(opt_c.param_groups[0]["lr"]) == pytest.approx(0.005)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "paper-dropout"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_compiled_forward_is_one_graph_for_every_model(name: str, dropout: float) -> None:
    """No graph break in the region CompiledStep compiles: a break would leave part of the step eager."""
    import torch._dynamo as dynamo

    options = {} if name == "resnet18" else {"depth": 2, "dropout": dropout, "attention_dropout": dropout}
    config, model, _, optimizer, _ = _pair(name, **options)
    step = CompiledStep(model, optimizer, config, "cpu")
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    step._warm_up(x)
    dynamo.reset()
    explanation = dynamo.explain(step._forward)(x, y)
    assert explanation.graph_break_count == 0, [str(b.reason)[:300] for b in explanation.break_reasons]
    assert explanation.graph_count == 1


def test_the_eager_step_is_train_step() -> None:
    config, model, _, optimizer, _ = _pair("resnet18")
    step = make_step(model, optimizer, config, "cpu")
    assert getattr(step, "func", None) is train_step
