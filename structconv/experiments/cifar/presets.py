"""Training configurations: the paper's recipe and shorter presets, as plain serialisable values.

=========  =================================================================================
preset     what it is
=========  =================================================================================
``paper``  Cordonnier et al.'s recipe, as their code runs it: SGD (lr 0.1, momentum 0.9),
           weight decay 1e-4 except on attention centres and widths, batch 100, 300 epochs, the
           learning rate set at the start of each epoch; self-attention: linear warm-up over 5 %
           of the steps (15 epochs) then cosine decay; ResNet18: x0.1 after epochs 79, 149 and
           249; the code's normalisation statistics; bf16 autocast on GPUs (theirs: float32).
           The models keep their defaults, the code's: dropout 0.1, and attention dropout with
           one mask per step shared by the batch for position-only heads, one per image with
           content (a test holds both).
``fast``   short GPU schedules chosen for accuracy per GPU-minute: ResNet18 30 epochs (batch
           512), self-attention 40 epochs (batch 256); warm-up then cosine, bf16 autocast on CUDA.
``demo``   a CPU demonstration in about a minute per model: reduced widths (ResNet width 16;
           attention width 64, 2 blocks, feed-forward 128, no attention dropout), 2,000 training
           and 1,000 test images, 3 epochs.  Numbers from it show the pipeline works, not what
           the models reach.
``smoke``  a check that the pipeline runs, in seconds on a CPU (the tests use it): tiny models
           (ResNet width 4; attention width 16, 1 block, 4 heads, feed-forward 16, no dropout),
           32 training and 16 test images, batch 8, 1 epoch.  Its accuracies mean nothing.
=========  =================================================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ...data.augment import NORMALIZATIONS
from .models import MODELS
from .names import PRESET_DEVICES, PRESET_NAMES, PRESET_SUMMARIES

__all__ = ["PRESETS", "TrainConfig", "config_for", "family"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run's trajectory (saved in, and checked against, checkpoints)."""

    model: str
    model_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 300
    batch_size: int = 100
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    schedule: str = "cosine"
    warmup_epochs: float = 0.0
    horizon_epochs: float | None = None
    lr_per_epoch: bool = False
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    label_smoothing: float = 0.0
    train_subset: int | None = None
    test_subset: int | None = None
    precision: str = "auto"
    normalization: str = "cifar10"
    seed: int = 0
    preset: str = ""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; expected one of {sorted(MODELS)}")
        if self.schedule not in ("cosine", "step"):
            raise ValueError(f"schedule must be 'cosine' or 'step', got {self.schedule!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {sorted(NORMALIZATIONS)}, got {self.normalization!r}")
        if self.horizon_epochs is not None and not self.horizon_epochs > self.warmup_epochs:
            raise ValueError(
                f"horizon_epochs must exceed warmup_epochs ({self.warmup_epochs}), got {self.horizon_epochs!r}"
            )
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise ValueError(
                f"seed must be an integer from 0 to 2**64 - 1 (torch.manual_seed's range), got {self.seed!r}"
            )
        for name in ("train_subset", "test_subset"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if not self.lr > 0 or self.weight_decay < 0 or not 0 <= self.warmup_epochs <= self.epochs:
            raise ValueError(
                f"need lr > 0, weight_decay >= 0 and 0 <= warmup_epochs <= epochs; got lr={self.lr}, "
                f"weight_decay={self.weight_decay}, warmup_epochs={self.warmup_epochs}, epochs={self.epochs}"
            )
        object.__setattr__(self, "milestones", tuple(int(m) for m in self.milestones))

    def as_dict(self) -> dict[str, Any]:
        """Plain values only (lists for tuples), as stored in checkpoints and metrics files."""
        d = asdict(self)
        d["milestones"] = list(self.milestones)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The inverse of :meth:`as_dict`; unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown training settings {sorted(unknown)}; expected some of {sorted(names)}")
        return cls(**{**d, "milestones": tuple(d.get("milestones", ()))})


def family(model: str) -> str:
    """``"resnet"`` or ``"sa"``: presets differ between the two."""
    return "resnet" if model.startswith("resnet") else "sa"


_TINY_SA = {"width": 16, "depth": 1, "ffn": 16, "heads": 4, "dropout": 0.0, "attention_dropout": 0.0}

# preset -> settings for every model, then per family, then per model (later ones win)
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "paper": {
        # Cordonnier et al.'s code: SGD, lr 0.1, momentum 0.9, weight decay 1e-4, batch 100, 300
        # epochs, the learning rate set once at the start of every epoch, its normalisation.
        "all": {
            "epochs": 300,
            "batch_size": 100,
            "lr": 0.1,
            "momentum": 0.9,
            "weight_decay": 1e-4,
            "lr_per_epoch": True,
            "normalization": "paper-code",
            "precision": "auto",
        },
        # Linear warm-up over 5 % of its step count, then cosine; it counts 501 steps an epoch for
        # 500 (batch 100), so warm-up ends at 7,515/500 epochs and the cosine at 150,300/500.
        "sa": {"schedule": "cosine", "warmup_epochs": 15.03, "horizon_epochs": 300.6},
        # MultiStepLR at [80, 150, 250], stepped at the start of every epoch: on torch >= 1.1 each
        # decay comes one epoch early, after epochs 79, 149 and 249.
        "resnet": {"schedule": "step", "milestones": (79, 149, 249), "gamma": 0.1},
    },
    "fast": {
        "all": {"batch_size": 256, "momentum": 0.9, "nesterov": True, "schedule": "cosine", "precision": "auto"},
        "resnet": {
            "epochs": 30,
            "batch_size": 512,
            "lr": 0.4,
            "weight_decay": 5e-4,
            "warmup_epochs": 2.0,
            "label_smoothing": 0.1,
        },
        "sa": {"epochs": 40, "lr": 0.1, "weight_decay": 1e-4, "warmup_epochs": 3.0},
    },
    "demo": {
        "all": {
            "epochs": 3,
            "batch_size": 50,
            "lr": 0.05,
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "schedule": "cosine",
            "warmup_epochs": 0.5,
            "train_subset": 2000,
            "test_subset": 1000,
        },
        "resnet": {"model_options": {"width": 16}},
        "sa": {"model_options": {"width": 64, "depth": 2, "ffn": 128, "attention_dropout": 0.0}},
    },
    "smoke": {
        "all": {"epochs": 1, "batch_size": 8, "lr": 0.05, "train_subset": 32, "test_subset": 16, "schedule": "cosine"},
        "resnet": {"model_options": {"width": 4}},
        "sa": {"model_options": _TINY_SA},
    },
}


assert tuple(PRESETS) == PRESET_NAMES, "names.PRESET_NAMES must list PRESETS"
assert set(PRESET_DEVICES) == set(PRESET_SUMMARIES) == set(PRESETS), "names.py must describe every preset"


def config_for(preset: str, model: str, **overrides: Any) -> TrainConfig:
    """The :class:`TrainConfig` of ``preset`` for ``model``, with ``overrides`` applied last.

    ``model_options`` given in ``overrides`` are merged into the preset's (e.g. ``heads=16``).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(MODELS)}")
    table = PRESETS[preset]
    settings: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for part in (table.get("all", {}), table.get(family(model), {}), table.get(model, {})):
        options.update(part.get("model_options", {}))
        settings.update({k: v for k, v in part.items() if k != "model_options"})
    options.update(overrides.pop("model_options", {}) or {})
    config = TrainConfig(model=model, model_options=options, preset=preset, **settings)
    return replace(config, **overrides) if overrides else config
