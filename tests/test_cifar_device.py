"""The CIFAR study's GPU training step, checked without a GPU.

Two detectors watch one training step of every model, taken the way ``train()`` takes it:

* the ``meta`` device: its tensors hold no data, so reading a value back (``.item()``,
  ``bool``, ``float``, ``.tolist()``, ``.cpu()``, ``nonzero`` and boolean masks) raises, and so
  does mixing a host tensor of one element or more into a device operation;
* :class:`HostAudit`, a torch-function and a dispatch mode that record, with the line of the
  study's code responsible, what the meta device lets through or cannot see: host scalars mixed
  into device operations (accepted by meta as by CUDA), tensors made on the host and never
  mixed, host data copied to the device (a synchronous copy on CUDA, which waits for the
  queued kernels) and, on a CPU run, factories called without ``device=``, value reads and
  data-dependent shapes.

The meta run uses the paper's full sizes (no data, so they cost nothing); the CPU run uses
small ones, with bf16 autocast as on a GPU.  The first step of a run is a warm-up: tables the
layers cache per device are copied there once, so transfers are checked from the second step
on (value reads in every step).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from structconv.data.cifar import CLASSES, Cifar10
from structconv.experiments.cifar import train as train_module
from structconv.experiments.cifar.models import MODELS, build_model
from structconv.experiments.cifar.presets import TrainConfig, config_for, family
from structconv.experiments.cifar.train import (
    Dist,
    _batches,
    _LossReadout,
    _optimizer,
    _seed_dropout,
    _tally,
    learning_rate,
    make_step,
)

ROOT = Path(__file__).resolve().parents[1]
_OURS = (str(ROOT / "structconv"), str(ROOT / "tests"))

# --- the audit ---------------------------------------------------------------------------------

# Methods that hand a tensor's values to Python: on a GPU each waits for the queued kernels.
_READS = {
    getattr(torch.Tensor, name)
    for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__",
                 "__format__", "__repr__", "__array__")
}  # fmt: skip
# Constructors from Python or NumPy data: the dispatcher never sees their copy to the device.
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
_FACTORIES = _FROM_DATA | {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace, torch.logspace, torch.eye,
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.scalar_tensor, torch.empty_strided,
}  # fmt: skip
_aten = torch.ops.aten
# Tagged as data-dependent for their boolean-mask form only; integer indices are fine.
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class HostAudit:
    """Records what a training step must not do on an accelerator, each with the line responsible.

    ``device`` is the device the step runs on.  On an accelerator (``"meta"`` here) host
    tensors are told apart from device ones: creating one, mixing one into a device operation,
    or copying between the two is recorded.  On ``"cpu"`` that distinction does not exist, so
    tensor factories called without ``device=`` are recorded instead.  ``transfers=False``
    leaves both out, for a warm-up step that fills per-device caches.  Value reads and
    data-dependent output shapes are recorded always.
    """

    def __init__(self, device: str, transfers: bool = True) -> None:
        self.device = torch.device(device).type
        self.transfers = transfers
        self._found: dict[str, None] = {}
        self._modes = (_FunctionAudit(self), _DispatchAudit(self))

    @property
    def findings(self) -> list[str]:
        return list(self._found)

    def note(self, what: str) -> None:
        self._found[f"{what} at {_site()}"] = None

    def __enter__(self) -> HostAudit:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(kind, error, tb)
        if error is not None and self._found:
            error.add_note("host audit until then:\n" + "\n".join(self._found))

    def on_call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = getattr(func, "__name__", str(func))
        if func in _READS:
            self.note(f"reads a tensor's value back to the host (Tensor.{name})")
        elif func in _FACTORIES and self.transfers and self.device == "cpu":
            made_from_tensor = func in _FROM_DATA and args and isinstance(args[0], torch.Tensor)
            if "device" not in kwargs and not made_from_tensor:
                self.note(f"makes a tensor without device= (torch.{name}), on the CPU by default")
        elif func in _FROM_DATA and self.transfers and self.device != "cpu":
            data_on_device = args and isinstance(args[0], torch.Tensor) and args[0].device.type == self.device
            if isinstance(out, torch.Tensor) and out.device.type == self.device and not data_on_device:
                self.note(f"copies host data to the device (torch.{name}), a synchronous copy on CUDA")
            elif isinstance(out, torch.Tensor) and out.device.type == "cpu" and not data_on_device:
                self.note(f"makes a host tensor (torch.{name} without device=)")

    def before_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tags = getattr(func, "tags", ())
        if func in _INDEXING:
            if any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1:2])):
                self.note(f"indexes with a boolean mask ({func}): a data-dependent shape, read back on a GPU")
        elif torch.Tag.data_dependent_output in tags:
            self.note(f"reads a tensor's value back to the host ({func})")
        elif torch.Tag.dynamic_output_shape in tags:
            self.note(f"has a data-dependent output shape ({func}), read back on a GPU")
        if self.transfers and self.device != "cpu":
            # Checked before the call: meta refuses a mixed operation before returning.
            ins = _tensors((args, kwargs))
            host = [t for t in ins if t.device.type == "cpu"]
            if host and any(t.device.type == self.device for t in ins):
                kind = "a host scalar tensor used" if all(t.ndim == 0 for t in host) else "a host tensor used"
                self.note(f"{kind} in a device operation ({func}): a missing device=")

    def after_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if not self.transfers or self.device == "cpu":
            return
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        if not ins and any(t.device.type == "cpu" for t in outs):
            self.note(f"makes a host tensor ({func}): a factory without device=")
        elif ins and all(t.device.type == "cpu" for t in ins) and any(t.device.type == self.device for t in outs):
            self.note(f"copies a host tensor to the device ({func}), a synchronous copy on CUDA")
        elif ins and all(t.device.type == self.device for t in ins) and any(t.device.type == "cpu" for t in outs):
            self.note(f"copies device data to the host ({func})")


class _FunctionAudit(TorchFunctionMode):
    def __init__(self, audit: HostAudit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _READS:  # before the call: on meta the call raises
            self.audit.on_call(func, args, kwargs, None)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        self.audit.on_call(func, args, kwargs, out)
        return out


class _DispatchAudit(TorchDispatchMode):
    def __init__(self, audit: HostAudit) -> None:
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.audit.before_op(func, args, kwargs)
        out = func(*args, **kwargs)
        self.audit.after_op(func, args, kwargs, out)
        return out


def _site(depth: int = 6) -> str:
    """The innermost ``depth`` frames of the package and the tests outside the audit, innermost first.

    A read is usually made by a shared helper (a finiteness check), so its callers say which
    layer asked for it.
    """
    here = str(Path(__file__).resolve())
    frame: Any = sys._getframe(1)
    sites: list[str] = []
    while frame is not None and len(sites) < depth:
        code = frame.f_code
        ours = code.co_filename == here and code.co_qualname.startswith(_AUDIT_CLASSES)
        if not ours and code.co_filename.startswith(_OURS):
            sites.append(f"{Path(code.co_filename).relative_to(ROOT)}:{frame.f_lineno}")
        frame = frame.f_back
    return " <- ".join(sites) or "<outside structconv and its tests>"


_AUDIT_CLASSES = ("HostAudit.", "_FunctionAudit.", "_DispatchAudit.")


# --- the study's training step, as train() takes it ---------------------------------------------


def _fake_split(n: int) -> Cifar10:
    rng = np.random.default_rng(0)
    return Cifar10(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, n), CLASSES, "fake")


Watch = Callable[[int, str], contextlib.AbstractContextManager[Any]]


def study_steps(config: TrainConfig, device: str, count: int, watch: Watch) -> torch.Tensor:
    """``count`` training steps of epoch 0 as :func:`train` takes them (one process, no progress bar).

    ``watch(k, part)`` gives the context each part of step ``k`` runs in: ``"batch"`` (drawing
    and augmenting the batch) and ``"step"`` (the schedule, :func:`train_step` and the tally, as
    train()'s loop runs them).  Returns the epoch's device-side tally.
    """
    data = _fake_split(count * config.batch_size)
    torch.manual_seed(config.seed)
    model = build_model(config.model, **config.model_options).to(device)
    cuda = device.startswith("cuda")
    if family(config.model) == "resnet" and cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = _optimizer(model, config)
    step_model = model
    step = make_step(step_model, optimizer, config, device)
    train_batches, _ = _batches((data, data), config, device, Dist())
    epoch, steps = 0, len(train_batches)
    _seed_dropout(config, epoch, 0)
    step_model.train()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    batches = enumerate(train_batches.epoch(config.seed, epoch))
    for k in range(steps):
        with watch(k, "batch"):
            i, (x, y) = next(batches)
        with watch(k, "step"):
            lr = learning_rate(config, epoch * steps + i, steps)
            loss, logits = step(x, y, lr)
            totals += _tally(loss * len(y), logits, y)
    return totals


def test_train_takes_the_shared_step() -> None:
    # study_steps runs the step make_step builds, as train() does; a train() that stopped calling
    # it would leave the detectors checking a step nobody runs.
    source = inspect.getsource(train_module._train)  # train() holds the float setting around it
    assert "make_step(step_model, optimizer, config, device, compile=compile)" in source
    assert "loss, logits = step(x, y, lr)" in source


class Audits:
    """One :class:`HostAudit` per step and part; step 0 is the warm-up, checked for reads only."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.by: dict[tuple[int, str], HostAudit] = {}

    def __call__(self, step: int, part: str) -> HostAudit:
        audit = self.by[(step, part)] = HostAudit(self.device, transfers=step > 0)
        return audit

    def findings(self, part: str) -> list[str]:
        found = (f for (_, p), audit in sorted(self.by.items()) if p == part for f in audit.findings)
        return list(dict.fromkeys(found))


def _report(findings: list[str]) -> str:
    return "\n".join(["the training step would wait for the GPU or put tensors on the CPU:", *findings])


# --- every model, paper sizes, on meta -----------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_on_meta_stays_on_the_device_and_reads_nothing(name: str) -> None:
    config = config_for("paper", name)
    audits = Audits("meta")
    totals = study_steps(config, "meta", 2, audits)
    assert totals.device.type == "meta"
    assert not audits.findings("step"), _report(audits.findings("step"))


def test_batches_copy_nothing_to_the_device_per_step() -> None:
    audits = Audits("meta")
    study_steps(config_for("paper", "resnet18", model_options={"width": 2}), "meta", 2, audits)
    assert not audits.findings("batch"), _report(audits.findings("batch"))


# --- every model, small sizes, on the CPU with bf16 autocast -----------------------------------

_SMALL = {"resnet": {"width": 2}, "sa": {"width": 18, "depth": 1, "ffn": 16}}


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_in_bf16_on_the_cpu_reads_nothing_and_names_its_devices(name: str) -> None:
    config = config_for("paper", name, model_options=_SMALL[family(name)], batch_size=2, precision="bf16")
    audits = Audits("cpu")
    totals = study_steps(config, "cpu", 2, audits)
    assert bool(torch.isfinite(totals).all())
    assert not audits.findings("step"), _report(audits.findings("step"))


# --- the detectors catch what they are for --------------------------------------------------------

# Each on one line, so that a finding can be matched to it.
_PLANTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "nothing": lambda h: h,
    "item": lambda h: h if h.abs().max().item() < 1e6 else h.clamp(-1e6, 1e6),
    "float": lambda h: h / float(h.detach().abs().max() + 1),
    "tolist": lambda h: h * len(h.sum(0).tolist()),
    "cpu": lambda h: h if h.detach().cpu().abs().max() < 1e6 else h.clamp(-1e6, 1e6),
    "numpy": lambda h: h if np.isfinite(h.detach().numpy()).all() else h.nan_to_num(),
    "nonzero": lambda h: h + h[h > 0].sum(),
    "finiteness": lambda h: h if bool(torch.isfinite(h).all()) else h.nan_to_num(),
    "zeros": lambda h: h + torch.zeros(3),
    "numpy table": lambda h: h + torch.from_numpy(np.ones(3, dtype=np.float32)),
    "unused zeros": lambda h: (torch.zeros(3), h)[1],
    "host scalar": lambda h: h * torch.tensor(2.0),
    "host list": lambda h: h * torch.tensor([1.0, 2.0, 3.0], device=h.device),
}


def _toy_step(device: str, plant: str, watch: contextlib.AbstractContextManager[Any] | None = None) -> None:
    """An SGD step of a small network on ``device`` with ``plant`` in its forward, run in ``watch``.

    The network, its input and a first step (which makes the momentum buffers) are set up first,
    outside ``watch``, as a training run does before its steady state.
    """
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 6, generator=g).to(device), torch.randint(0, 3, (4,), generator=g).to(device)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    with watch or contextlib.nullcontext():
        loss = F.cross_entropy(_PLANTS[plant](model(x)), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _plant_site(plant: str) -> str:
    return f"tests/{Path(__file__).name}:{_PLANTS[plant].__code__.co_firstlineno}"


_READ_PLANTS = ["item", "float", "tolist", "cpu", "numpy", "nonzero", "finiteness"]
_HOST_PLANTS = ["zeros", "numpy table", "unused zeros", "host scalar", "host list"]
# What the CPU cannot tell apart: a NumPy array taken as it is (torch.from_numpy is no torch
# function, and its tensor is where it belongs on the CPU), and data copied to device=h.device.
_CPU_BLIND = {"numpy table", "host list"}


@pytest.mark.parametrize("plant", [*_READ_PLANTS, "zeros", "numpy table"])
def test_meta_device_refuses_a_planted_read_or_host_tensor(plant: str) -> None:
    _toy_step("meta", "nothing")
    with pytest.raises((RuntimeError, NotImplementedError, TypeError), match="meta"):
        _toy_step("meta", plant)


@pytest.mark.parametrize("plant", ["unused zeros", "host scalar", "host list"])
def test_meta_device_lets_these_through_so_the_audit_watches_too(plant: str) -> None:
    _toy_step("meta", plant)  # a host scalar mixes in as it does on CUDA; the others never meet a device tensor


@pytest.mark.parametrize(
    ("plant", "device"),
    [(p, d) for p in _READ_PLANTS + _HOST_PLANTS for d in ("cpu", "meta") if not (d == "cpu" and p in _CPU_BLIND)],
)
def test_host_audit_names_the_line_of_a_planted_read_or_host_tensor(plant: str, device: str) -> None:
    audit = HostAudit(device)
    with contextlib.suppress(RuntimeError, NotImplementedError, TypeError):
        _toy_step(device, plant, audit)  # meta raises on a read, after the audit noted it
    assert any(f" at {_plant_site(plant)} <- " in f for f in audit.findings), audit.findings


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_host_audit_finds_nothing_in_a_clean_step(device: str) -> None:
    audit = HostAudit(device)
    _toy_step(device, "nothing", audit)
    assert audit.findings == []


# --- the progress bar's loss -------------------------------------------------------------------


class _Landed:
    """A stand-in for ``torch.cuda.Event``: whether the copy has landed is set by the test."""

    now = False

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return _Landed.now


class _CudaLoss:
    """A stand-in for a CUDA loss: it can be copied to the host asynchronously, never read in place."""

    is_cuda = True

    def __init__(self, value: float) -> None:
        self.value = value

    def detach(self) -> _CudaLoss:
        return self

    def to(self, device: str, non_blocking: bool = False) -> torch.Tensor:
        assert device == "cpu" and non_blocking, "a blocking copy waits for the queued kernels"
        return torch.tensor(self.value)

    def __float__(self) -> float:
        raise AssertionError("float() of a CUDA tensor waits for the queued kernels")


def test_progress_bar_shows_a_cuda_loss_once_its_copy_has_landed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _Landed)
    monkeypatch.setattr(_Landed, "now", False)
    readout = _LossReadout()
    assert readout(_CudaLoss(1.0)) == "..."  # type: ignore[arg-type]
    assert readout(_CudaLoss(2.0)) == "..."  # type: ignore[arg-type]  # still in flight: no second copy
    monkeypatch.setattr(_Landed, "now", True)
    assert readout(_CudaLoss(3.0)) == "1.000"  # type: ignore[arg-type]
    assert readout(_CudaLoss(4.0)) == "3.000"  # type: ignore[arg-type]
    assert _LossReadout()(torch.tensor(0.5)) == "0.500"  # elsewhere at once
