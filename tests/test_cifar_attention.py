"""The CIFAR models' attention encodings: flat options of a config, and encodings given as objects."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from structconv.experiments.cifar.models import SelfAttentionNet, attention_encodings, build_model
from structconv.nn import ContentHeads, GaussianHeads, LearnedHeads, QuadraticHeads

TINY = {"width": 16, "depth": 1, "ffn": 16, "heads": 4, "dropout": 0.0, "attention_dropout": 0.0}


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
    assert repr(layer.encoding) == repr(heads)
    assert repr(layer.content) == repr(content)
    assert layer.dropout_shared is False  # a setting of the layer's own


def test_a_model_takes_encodings_as_objects() -> None:
    torch.manual_seed(0)
    model = SelfAttentionNet(encoding=GaussianHeads(alpha=2.0), content=ContentHeads(key_dim=4), **TINY)
    layer = model.attention_layers()[0]
    assert repr(layer.encoding) == "GaussianHeads(alpha=2.0)"
    assert repr(layer.content) == "ContentHeads(key_dim=4, bias=False)"
    with pytest.raises(ValueError, match=r"is given as an object: set \['alpha'\] in it"):
        SelfAttentionNet(encoding=QuadraticHeads(), attention={"alpha": 0.3}, **TINY)
    with pytest.raises(ValueError, match=r"set key_dim and bias in it"):
        SelfAttentionNet(content=ContentHeads(), key_dim=8, **TINY)
    with pytest.raises(ValueError, match=r"encoding must be one of \['gaussian', 'learned', 'quadratic'\]"):
        attention_encodings("sinusoidal", False, 16, 2)
