"""The CIFAR models' attention encodings: configs of before (flat options), their checkpoints, resuming them."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from structconv.experiments.cifar.checkpoint import load_checkpoint, save_checkpoint
from structconv.experiments.cifar.models import SelfAttentionNet, attention_encodings, build_model
from structconv.experiments.cifar.presets import config_for
from structconv.experiments.cifar.train import _in_model_order, _optimizer, model_from_checkpoint
from structconv.nn import ContentHeads, GaussianHeads, LearnedHeads, QuadraticHeads

TINY = {"width": 16, "depth": 1, "ffn": 16, "heads": 4, "dropout": 0.0, "attention_dropout": 0.0}

#: The attention layer of a tiny ``sa-learned-content`` as a checkpoint of before held it: its flat
#: names in their order (content terms, the layer's own parameters then, before the tables), and shapes.
OLD_LEARNED_CONTENT = [
    ("theta", (4, 16, 16)),
    ("bias", (16,)),
    ("weight", (4, 32)),
    ("key", (4, 16, 16)),
    ("query", (4, 16, 16)),
    ("key_bias", (4, 16)),
    ("query_bias", (4, 16)),
    ("tables.0", (31, 16)),
    ("tables.1", (31, 16)),
]
#: The names of now of the same entries.
NEW_NAMES = {
    "weight": "heads.weight",
    "key": "content.key",
    "query": "content.query",
    "key_bias": "content.key_bias",
    "query_bias": "content.query_bias",
    "tables.0": "heads.tables.0",
    "tables.1": "heads.tables.1",
}


def _as_before(model: torch.nn.Module) -> OrderedDict[str, torch.Tensor]:
    """``model``'s state dict as a checkpoint of before holds it: the attention entries under flat names, in order."""
    state = model.state_dict()
    old: OrderedDict[str, torch.Tensor] = OrderedDict()
    for key, value in state.items():
        if key.startswith("blocks.0.attention."):
            if key == "blocks.0.attention.theta":  # the first entry of the layer: all of it, in the order of then
                for name, shape in OLD_LEARNED_CONTENT:
                    entry = state["blocks.0.attention." + NEW_NAMES.get(name, name)]
                    assert tuple(entry.shape) == shape
                    old["blocks.0.attention." + name] = entry.clone()
            continue
        old[key] = value.clone()
    return old


@pytest.mark.parametrize(
    ("model", "attention", "heads", "content"),
    [
        # width_noise never applied to exp widths: ignored, as the layer did when it took every option
        (
            "sa-quadratic",
            {"alpha": 0.3, "width": "exp", "width_noise": 0.5},
            QuadraticHeads(alpha=0.3, centre_var=4.0),
            None,
        ),
        ("sa-quadratic", {}, QuadraticHeads(alpha=0.5, width="spread", width_noise=0.01, centre_var=4.0), None),
        # an option of another encoding is ignored: one --option serves --model all
        (
            "sa-gaussian",
            {"width": "exp", "alpha": 0.2},
            GaussianHeads(alpha=0.2, width_noise=0.01, centre_var=4.0),
            None,
        ),
        ("sa-learned", {"relative_terms": True, "content_bias": False}, LearnedHeads(positional_dim=32), None),
        (
            "sa-learned-content",
            {"relative_terms": True, "content_bias": True},  # relative terms have no content biases
            LearnedHeads(positional_dim=32, relative_terms=True),
            ContentHeads(key_dim=16, bias=False),
        ),
        ("sa-learned-content", {}, LearnedHeads(positional_dim=32), ContentHeads(key_dim=16, bias=True)),
    ],
)
def test_flat_options_of_a_config_are_mapped_onto_the_encodings(
    model: str, attention: dict[str, Any], heads: Any, content: Any
) -> None:
    built = build_model(model, **{**TINY, "attention": {**attention, "dropout_shared": False}})
    layer = built.blocks[0].attention
    assert repr(layer.heads) == repr(heads)
    assert repr(layer.content) == repr(content)
    assert layer.dropout_shared is False  # a setting of the layer's own


def test_a_model_takes_encodings_as_objects() -> None:
    torch.manual_seed(0)
    model = SelfAttentionNet(encoding=GaussianHeads(alpha=2.0), content=ContentHeads(key_dim=4), **TINY)
    layer = model.attention_layers()[0]
    assert repr(layer.heads) == "GaussianHeads(alpha=2.0)"
    assert repr(layer.content) == "ContentHeads(key_dim=4, bias=False)"
    with pytest.raises(ValueError, match=r"is given as an object: set \['alpha'\] in it"):
        SelfAttentionNet(encoding=QuadraticHeads(), attention={"alpha": 0.3}, **TINY)
    with pytest.raises(ValueError, match=r"set key_dim and bias in it"):
        SelfAttentionNet(content=ContentHeads(), key_dim=8, **TINY)
    with pytest.raises(ValueError, match=r"encoding must be one of \['gaussian', 'learned', 'quadratic'\]"):
        attention_encodings("sinusoidal", False, 16, 2)


def test_a_checkpoint_of_before_loads_its_parameters_under_the_names_of_now(tmp_path: Path) -> None:
    config = config_for("smoke", "sa-learned-content", model_options={"attention": {"content_bias": True}})
    torch.manual_seed(0)
    model = build_model(config.model, **config.model_options)
    assert config.model_options["depth"] == 1 and config.model_options["width"] == 16
    old = _as_before(model)
    save_checkpoint(tmp_path / "checkpoint.pt", {"epoch": 0, "history": [], "config": config.as_dict(), "model": old})
    state = load_checkpoint(tmp_path / "checkpoint.pt", config.as_dict())
    assert set(state["model"]) == set(model.state_dict())
    assert list(state["model"])[2:11] == [  # renamed where they stood
        "blocks.0.attention." + NEW_NAMES.get(name, name) for name, _ in OLD_LEARNED_CONTENT
    ]
    loaded, _, _ = model_from_checkpoint(tmp_path / "checkpoint.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    fresh = build_model(config.model, **config.model_options)
    fresh.load_state_dict(old)  # the layer maps the names itself too
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in model.state_dict().items())


def test_resuming_a_checkpoint_of_before_gives_each_parameter_its_own_optimizer_state() -> None:
    config = config_for("smoke", "sa-learned-content")
    torch.manual_seed(0)
    model = build_model(config.model, **config.model_options)
    optimizer = _optimizer(model, config)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    saved = optimizer.state_dict()
    names = {id(p): n for n, p in model.named_parameters()}
    now = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    assert len(optimizer.param_groups) == 1  # learned heads have no centres or widths to exempt
    to_old = {f"blocks.0.attention.{NEW_NAMES.get(n, n)}": f"blocks.0.attention.{n}" for n, _ in OLD_LEARNED_CONTENT}
    then = [k for k in _as_before(model) if k in {to_old.get(n, n) for n in now}]  # the parameters in the order of then
    assert then != [to_old.get(n, n) for n in now]
    # torch numbered the state of a checkpoint of before in that order
    position = {n: i for i, n in enumerate(then)}
    before = {**saved, "state": {position[to_old.get(n, n)]: saved["state"][i] for i, n in enumerate(now)}}
    to_new = {v: k for k, v in to_old.items()}
    stored = [to_new.get(k, k) for k in _as_before(model)]  # as load_checkpoint gives it: names of now, order of then
    moved = _in_model_order(before, optimizer, model, stored)
    assert moved["state"].keys() == saved["state"].keys()
    for i, s in saved["state"].items():
        assert torch.equal(moved["state"][i]["momentum_buffer"], s["momentum_buffer"]), now[i]
    assert _in_model_order(saved, optimizer, model, list(model.state_dict())) is saved  # the same order: untouched
