r"""The package on an accelerator: every path run on ``STRUCTCONV_TEST_DEVICE`` against float64 on the CPU.

``python -m pytest -m cuda tests/test_cuda.py`` on a machine with a GPU runs, on ``"cuda"`` (or
the device that ``STRUCTCONV_TEST_DEVICE`` names; every test is skipped, with the reason, where
it is missing):

1. every order :func:`structconv.explain` lists, and ``"auto"``, for every kind of basis of
   ``tests/basis_kinds.py`` and a full, a separable and a low-rank :math:`\Theta`, in float32
   and bfloat16, against :func:`structconv.testing.dense_reference` in float64 on the CPU;
2. every layer of ``structconv.nn`` (the cases of ``tests/layer_cases.py``), forward and
   backward, against the same layer in float64 on the CPU;
3. one float32 training step of every CIFAR model at small sizes (TF32 off) against the same
   step in float64 on the CPU (loss, logits, gradients, parameters and buffers after it), and
   one step of every model at the paper's sizes under bf16 autocast (CUDA only: minutes on a
   CPU);
4. (CUDA only) no host synchronisation in a training step at the paper's sizes, the batch's draw
   included: eager for every model, compiled (``make_step(..., compile=True)``) for ResNet18 and
   ``sa-quadratic``; ``torch.cuda.set_sync_debug_mode("error")`` raises at the first wait.
5. (CUDA only) the compiled step, CUDA graphs replayed, computes the eager step there (ResNet18
   and ``sa-quadratic`` at small sizes, four steps).

Closeness is the relative Frobenius norm :math:`\lVert a - e\rVert / \lVert e\rVert`, computed in
float64: at most :data:`TOLERANCE` (float32 :math:`2\cdot10^{-3}`, which leaves room for the TF32
products cuDNN may use for convolutions; bfloat16 :math:`3\cdot10^{-2}`).  ``NaN`` never passes.

``STRUCTCONV_TEST_DEVICE=cpu`` runs the same comparisons on the CPU (float32 and bfloat16 against
float64 there), which is how the suite is checked on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from basis_kinds import KINDS, parameters
from conftest import TEST_DEVICE, needs_device
from layer_cases import CASES
from torch import nn

import structconv as sc
from structconv.data.augment import Batches
from structconv.experiments.cifar.models import build_model
from structconv.experiments.cifar.names import MODEL_NAMES
from structconv.experiments.cifar.presets import TrainConfig, config_for, family
from structconv.experiments.cifar.train import _optimizer, _tally, make_step, train_step
from structconv.testing import dense_reference

DEVICE = TEST_DEVICE
ON_CUDA = torch.device(DEVICE).type == "cuda"
ON_CPU = torch.device(DEVICE).type == "cpu"

pytestmark = [pytest.mark.cuda, needs_device(DEVICE)]

#: Largest relative Frobenius error allowed, by the dtype computed on the device.
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 3e-2}
DTYPES = tuple(TOLERANCE)


def _cuda_only(why: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not ON_CUDA, reason=f"CUDA only ({why}); STRUCTCONV_TEST_DEVICE={DEVICE}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def relative_error(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float:
    r""":math:`\lVert a - e\rVert_F / \max(\lVert e\rVert_F, \mathrm{floor})` in float64 on the CPU.

    ``nan`` when either side holds a ``NaN`` or an infinity (so no comparison passes), 0 for
    equal tensors, ``inf`` for a difference from an exact zero below ``floor``.
    """
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    assert a.shape == e.shape, f"shape {tuple(a.shape)} where {tuple(e.shape)} was expected"
    if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
        return math.nan
    diff = float(torch.linalg.vector_norm(a - e))
    if diff == 0.0:
        return 0.0
    scale = max(float(torch.linalg.vector_norm(e)), floor)
    return diff / scale if scale > 0 else math.inf


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str, floor: float = 0.0) -> None:
    error = relative_error(actual, expected, floor)
    assert error <= tolerance, f"{what}: relative error {error:.3g} > {tolerance:.3g}"


def _on_device(t: torch.Tensor) -> bool:
    want = torch.device(DEVICE)
    return t.device.type == want.type and (want.index is None or t.device.index == want.index)


# --- 1. every order of every basis kind ---------------------------------------------------------
#: The parameters of :func:`basis_kinds.parameters`, in its order.
THETAS = ("full", "separable", "low-rank")


@functools.cache
def _float64(kind: str) -> tuple[Any, torch.Tensor, list[Any]]:
    """The basis ``kind``, an input and its three parameters in float64 on the CPU (as the immutability test's)."""
    basis = KINDS[kind](torch.from_numpy)
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(basis.batch or 2, basis.M, 3)))
    return basis, x, parameters(basis, torch.from_numpy)


@functools.cache
def _expected(kind: str, theta: int) -> torch.Tensor:
    basis, x, thetas = _float64(kind)
    y: torch.Tensor = dense_reference(basis, x, thetas[theta])
    return y


def _cpu_orders(kind: str, theta: int) -> list[str]:
    basis, x, thetas = _float64(kind)
    return [c.order for c in sc.explain(basis, x, thetas[theta]).candidates]


def _order_cases() -> list[Any]:
    """``(kind, theta, order, dtype)`` for each order the planner lists on the CPU, and ``"auto"``."""
    return [
        pytest.param(kind, theta, order, dtype, id=f"{kind}-{theta}-{order}-{_dtype_name(dtype)}")
        for kind in sorted(KINDS)
        for theta in THETAS
        for order in ["auto", *_cpu_orders(kind, THETAS.index(theta))]
        for dtype in DTYPES
    ]


def _on_the_device(kind: str, dtype: torch.dtype) -> tuple[Any, torch.Tensor, list[Any]]:
    """The float64 operands of ``kind`` moved to the device and ``dtype`` (the basis by its own ``to``)."""
    basis, x, _ = _float64(kind)
    placed = basis.to(DEVICE, dtype)
    return placed, x.to(DEVICE, dtype), parameters(placed, lambda a: torch.from_numpy(a).to(DEVICE, dtype))


def _refused(error: Exception, order: str, dtype: torch.dtype) -> None:
    """Accept a refusal by design, a ``ValueError``/``TypeError`` that names the dtype; fail on any other.

    On the CPU the package refuses no order in float32 or bfloat16 (low-precision sparse products
    are widened there), so a refusal on the CPU fails, and so does one of ``"auto"`` anywhere:
    the planner must pick an order that runs.  An accepted refusal is reported as a warning.
    """
    name = _dtype_name(dtype)
    if ON_CPU or order == "auto":
        raise AssertionError(f"order {order!r} in {name} on {DEVICE} was refused: {error}") from error
    assert name in str(error), f"order {order!r} in {name} on {DEVICE}: a refusal must name {name}, got: {error}"
    warnings.warn(f"{DEVICE} refuses order {order!r} in {name}: {error}", UserWarning, stacklevel=2)


@pytest.mark.parametrize(("kind", "theta", "order", "dtype"), _order_cases())
def test_every_order_of_every_basis_equals_the_float64_reference(
    kind: str, theta: str, order: str, dtype: torch.dtype
) -> None:
    index = THETAS.index(theta)
    basis, x, thetas = _on_the_device(kind, dtype)
    try:
        y = sc.conv(basis, x, thetas[index], order=order)
    except (ValueError, TypeError) as error:
        _refused(error, order, dtype)
        return
    assert _on_device(y) and y.dtype == dtype, f"result on {y.device} in {y.dtype}, expected {DEVICE} {dtype}"
    assert_close(y, _expected(kind, index), TOLERANCE[dtype], f"{kind}, {theta} theta, order {order!r}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_name)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_planner_lists_the_same_orders_on_the_device(kind: str, dtype: torch.dtype) -> None:
    """So that the per-order test, which takes its orders from the CPU in float64, leaves none out."""
    basis, x, thetas = _on_the_device(kind, dtype)
    for index, theta in enumerate(THETAS):
        listed = [c.order for c in sc.explain(basis, x, thetas[index]).candidates]
        assert listed == _cpu_orders(kind, index), f"{theta} theta"


# --- 2. every layer, forward and backward --------------------------------------------------------
def _leaves(args: Sequence[Any], device: str, dtype: torch.dtype) -> list[Any]:
    """``args`` on ``device``: floating tensors as leaves of ``dtype`` that take gradients, one per distinct tensor.

    A tensor passed twice (self-attention's query, key and value) stays one tensor, so the
    layer takes the same path on both sides.  Floating values go through float32 first, so the
    device and the float64 reference start from the same numbers.
    """
    made: dict[int, torch.Tensor] = {}
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor) and id(a) not in made:
            if a.is_floating_point():
                made[id(a)] = a.detach().float().to(device, dtype).requires_grad_(True)
            else:
                made[id(a)] = a.to(device)
        out.append(made[id(a)] if isinstance(a, torch.Tensor) else a)
    return out


def _differentiable(args: Sequence[Any]) -> list[torch.Tensor]:
    """The distinct leaves of ``args`` that take gradients, in order."""
    found = {id(a): a for a in args if isinstance(a, torch.Tensor) and a.requires_grad}
    return list(found.values())


def _tensors(output: Any) -> list[torch.Tensor]:
    items = output if isinstance(output, tuple | list) else (output,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _gradient_floor(reference: Sequence[torch.Tensor | None], share: float = 1e-3) -> float:
    """The scale below which a gradient's error is measured against the others' size.

    A gradient that is zero in exact arithmetic (a key bias before a softmax, whose rows it
    shifts by a constant) comes out as rounding noise of the size of the others: it is judged
    against ``share`` of the norm of all the reference's gradients together (a thousandth in
    float32; bfloat16's rounding is about 30 times coarser).
    """
    norms = [float(torch.linalg.vector_norm(g.detach().double())) for g in reference if g is not None]
    return share * math.sqrt(sum(n * n for n in norms))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_layer_forward_and_backward_equal_the_float64_layer_on_the_cpu(name: str) -> None:
    _check_layer(name, autocast=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_layer_under_bf16_autocast_follows_the_float64_layer_on_the_cpu(name: str) -> None:
    """The second call under autocast too: a compiled contraction runs its cast twin from then on."""
    _check_layer(name, autocast=True)


def _check_layer(name: str, autocast: bool) -> None:
    build, inputs = CASES[name]
    torch.manual_seed(0)
    layer = build().float().eval()
    torch.manual_seed(1)
    args = inputs()
    reference = copy.deepcopy(layer).double()
    placed = copy.deepcopy(layer).to(DEVICE)
    ref_args, dev_args = _leaves(args, "cpu", torch.float64), _leaves(args, DEVICE, torch.float32)
    expected = _tensors(reference(*ref_args))
    tolerance = TOLERANCE[torch.bfloat16 if autocast else torch.float32]
    kind = torch.device(DEVICE).type
    context = torch.autocast(kind, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        if autocast:
            with torch.no_grad():
                placed(*dev_args)  # the first call checks and compiles; the one below runs what it bound
        actual = _tensors(placed(*dev_args))
    assert len(actual) == len(expected) > 0
    for i, (y, e) in enumerate(zip(actual, expected, strict=True)):
        assert _on_device(y), f"output {i} on {y.device}"
        assert autocast or y.dtype == torch.float32, f"output {i} in {y.dtype}"
        assert_close(y.float(), e, tolerance, f"output {i}")

    generator = torch.Generator().manual_seed(2)
    cotangents = [torch.randn(e.shape, generator=generator, dtype=torch.float64) for e in expected]
    torch.autograd.backward(expected, cotangents)
    torch.autograd.backward(actual, [c.to(DEVICE, y.dtype) for c, y in zip(cotangents, actual, strict=True)])

    ref_inputs, dev_inputs = _differentiable(ref_args), _differentiable(dev_args)
    ref_named = dict(reference.named_parameters())
    floor = _gradient_floor(
        [p.grad for p in ref_named.values()] + [a.grad for a in ref_inputs], 3e-2 if autocast else 1e-3
    )
    for key, p in placed.named_parameters():
        e_grad, a_grad = ref_named[key].grad, p.grad
        assert (a_grad is None) == (e_grad is None), f"gradient of {key}: {a_grad is None=} {e_grad is None=}"
        if a_grad is not None and e_grad is not None:
            assert_close(a_grad, e_grad, tolerance, f"gradient of {key}", floor)
    for i, (a, e) in enumerate(zip(dev_inputs, ref_inputs, strict=True)):
        assert a.grad is not None and e.grad is not None, f"input {i} has no gradient"
        assert_close(a.grad, e.grad, tolerance, f"gradient of input {i}", floor)


# --- 3. one training step of every CIFAR model ----------------------------------------------------
_SMALL_SA = {"width": 16, "depth": 2, "ffn": 16, "heads": 4, "dropout": 0.0, "attention_dropout": 0.0}
#: Small sizes of every model (those of tests/test_cifar_train.py; no dropout, so both sides draw nothing).
SMALL = {name: ({"width": 4} if family(name) == "resnet" else _SMALL_SA) for name in MODEL_NAMES}
#: The paper's batch.
FULL_BATCH = 100


def _placed(model: nn.Module, name: str, device: str) -> nn.Module:
    """``model`` on ``device`` as ``train()`` places it: the ResNet channels-last on CUDA."""
    model = model.to(device)
    if family(name) == "resnet" and torch.device(device).type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


@contextlib.contextmanager
def _exact_float32() -> Iterator[None]:
    """TF32 off in cuDNN and cuBLAS for the block (flags that only CUDA reads).

    A float32 step through a ResNet compounds TF32's 10-bit products layer by layer; the step
    compared here is float32's (TF32 is within the per-order and per-layer tolerances).
    """
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _step(model: nn.Module, config: TrainConfig, device: str, x: torch.Tensor, y: torch.Tensor) -> Any:
    optimizer = _optimizer(model, config)
    return train_step(model, optimizer, config, device, x.to(device), y.to(device), config.lr)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_one_float32_training_step_equals_the_float64_step_on_the_cpu(name: str) -> None:
    """Loss, logits, gradients, then parameters and buffers: the step of ``train()`` on both sides."""
    config = config_for("smoke", name, precision="fp32", model_options=SMALL[name])
    torch.manual_seed(0)
    model = build_model(name, **config.model_options)
    before = {key: p.detach().double().clone() for key, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(config.batch_size, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (config.batch_size,), generator=generator)
    reference = copy.deepcopy(model).double()
    placed = _placed(copy.deepcopy(model), name, DEVICE)
    ref_loss, ref_logits = _step(reference, config, "cpu", x.double(), y)
    with _exact_float32():
        loss, logits = _step(placed, config, DEVICE, x, y)

    tol = TOLERANCE[torch.float32]
    assert _on_device(loss) and loss.dtype == torch.float32
    assert_close(loss, ref_loss, tol, "loss")
    assert_close(logits, ref_logits, tol, "logits")
    ref_named = dict(reference.named_parameters())
    floor = _gradient_floor([p.grad for p in ref_named.values()])
    for key, p in placed.named_parameters():
        e = ref_named[key]
        assert p.grad is not None and e.grad is not None, f"{key} has no gradient"
        assert_close(p.grad, e.grad, tol, f"gradient of {key}", floor)
        # The update is compared, not the parameter (which it barely moves), up to the rounding
        # of the float32 parameter it is added to: half a unit in the last place of each entry.
        update = float(torch.linalg.vector_norm(e.detach() - before[key]))
        allowed = tol * update + 2.0**-24 * float(torch.linalg.vector_norm(e.detach()))
        error = float(torch.linalg.vector_norm(p.detach().to("cpu", torch.float64) - e.detach()))
        assert error <= allowed, f"{key} after the step: error {error:.3g} > {allowed:.3g} (update {update:.3g})"
    ref_buffers = dict(reference.named_buffers())
    for key, b in placed.named_buffers():
        if b.is_floating_point():
            assert_close(b, ref_buffers[key], tol, f"buffer {key}")
        else:
            assert torch.equal(b.cpu(), ref_buffers[key]), f"buffer {key}"


def _full_size(name: str) -> tuple[nn.Module, TrainConfig]:
    """The model at its paper's sizes on the device, and the paper's batch under autocast (bf16 on CUDA)."""
    config = config_for("paper", name, batch_size=FULL_BATCH, precision="auto")
    torch.manual_seed(0)
    return _placed(build_model(name), name, DEVICE), config


@_cuda_only("the paper's sizes take minutes a step on a CPU")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_one_autocast_step_of_every_full_size_model_is_finite(name: str) -> None:
    model, config = _full_size(name)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(FULL_BATCH, 3, 32, 32, generator=generator)
    y = torch.randint(0, 10, (FULL_BATCH,), generator=generator)
    loss, logits = _step(model, config, DEVICE, x, y)
    assert logits.shape == (FULL_BATCH, 10) and _on_device(logits)
    assert torch.isfinite(loss), f"loss {float(loss)}"
    assert torch.isfinite(logits).all()
    for key, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"gradient of {key}"
        assert torch.isfinite(p).all(), f"{key} after the step"


# --- 4. no host synchronisation in a training step -----------------------------------------------
@contextlib.contextmanager
def _waits_are_errors() -> Iterator[None]:
    """Inside the block every operation that makes the host wait for the GPU raises ``RuntimeError``."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _random_batches(device: str, count: int) -> Batches:
    """``count`` batches of the paper's size from random CIFAR-shaped images, augmented, on ``device``."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(count * FULL_BATCH, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, count * FULL_BATCH)
    return Batches.from_arrays(images, labels, FULL_BATCH, train=True, device=device)


@_cuda_only("torch.cuda.set_sync_debug_mode watches CUDA's synchronisations")
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_training_step_never_waits_for_the_gpu(name: str) -> None:
    """The second step of ``train()``'s loop, from drawing the batch to the tally, queues without a wait.

    The first batch and step run outside the check: an epoch's order and crops are copied to the
    device at its first batch, and the layers fill their per-device caches in their first call.
    """
    model, config = _full_size(name)
    optimizer = _optimizer(model, config, fused=True)  # as train() builds it for an eager CUDA run
    draws = iter(_random_batches(DEVICE, 2).epoch(0, 0))
    x, y = next(draws)
    train_step(model, optimizer, config, DEVICE, x, y, config.lr)
    torch.cuda.synchronize()
    with _waits_are_errors():
        x, y = next(draws)
        loss, logits = train_step(model, optimizer, config, DEVICE, x, y, config.lr)
        totals = _tally(loss * len(y), logits, y)
    torch.cuda.synchronize()
    assert torch.isfinite(loss) and torch.isfinite(totals).all()


@_cuda_only("torch.cuda.set_sync_debug_mode watches CUDA's synchronisations")
@pytest.mark.parametrize("name", ["resnet18", "sa-quadratic"])
def test_a_compiled_training_step_never_waits_for_the_gpu(name: str) -> None:
    """``make_step(..., compile=True)``, as ``train(compile=True)`` takes it: its third call queues without a wait.

    The first call runs the model eagerly once and compiles; on CUDA the compiled forward and
    backward are CUDA graphs, recorded at the second call and replayed from the third.  The two
    models a lease benchmarks compiled and trains: compiling every model would take minutes of
    the lease (Inductor's on-disk cache then serves the benchmark's compilations of the same graphs).
    """
    torch._dynamo.reset()  # every model compiles afresh, below the recompilation limit
    model, config = _full_size(name)
    step = make_step(model, _optimizer(model, config), config, DEVICE, compile=True)
    draws = iter(_random_batches(DEVICE, 3).epoch(0, 0))
    for _ in range(2):
        x, y = next(draws)
        step(x, y, config.lr)
    torch.cuda.synchronize()
    with _waits_are_errors():
        x, y = next(draws)
        loss, logits = step(x, y, config.lr)
        totals = _tally(loss * len(y), logits, y)
    torch.cuda.synchronize()
    assert torch.isfinite(loss) and torch.isfinite(totals).all()


@_cuda_only("the CPU run of the same comparison is tests/test_cifar_step.py")
@pytest.mark.parametrize("name", ["resnet18", "sa-quadratic"])
def test_the_compiled_step_computes_the_eager_step_on_the_device(name: str) -> None:
    """:class:`CompiledStep` on the device (CUDA graphs recorded, then replayed) against the eager step there.

    Small models in float32 without dropout (Inductor draws its own masks), TF32 off; four steps, so
    that graphs are replayed with a new learning rate written into their tensor each time.
    """
    from test_cifar_step import _pair, compare

    torch._dynamo.reset()
    options = {} if family(name) == "resnet" else {"dropout": 0.0, "attention_dropout": 0.0}
    config, eager, compiled, opt_e, opt_c = _pair(name, DEVICE, **options)
    with _exact_float32():
        compare(config, eager, compiled, opt_e, opt_c, DEVICE, slack=10.0)
