"""Public constructors and builders: options past the essential arguments are keyword-only; no positional booleans.

A law over the public surface (``structconv.__all__``, ``structconv.nn.__all__``): a parameter
with a default that is a ``bool`` is keyword-only, and every layer refuses an option given by
position with Python's own ``TypeError`` naming the layer.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import structconv as sc
from structconv import nn as snn


def _callables() -> list[tuple[str, Any]]:
    found = []
    for module, names in ((sc, sc.__all__), (snn, snn.__all__)):
        for name in names:
            obj = getattr(module, name)
            if callable(obj):
                found.append((f"{module.__name__}.{name}", obj))
    return found


@pytest.mark.parametrize(("name", "obj"), _callables(), ids=[n for n, _ in _callables()])
def test_no_boolean_is_positional(name: str, obj: Any) -> None:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        pytest.skip(f"{name} has no inspectable signature")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    flags = [p.name for p in signature.parameters.values() if p.kind in positional and isinstance(p.default, bool)]
    assert not flags, f"{name}: boolean options {flags} may be given by position"


LAYERS = {
    "GridConv2d": (lambda *a: snn.GridConv2d(*a), (3, 8, 3, 1)),  # torch would read the 4th as stride
    "AvgPool2d": (lambda *a: snn.AvgPool2d(*a), (3, 2)),
    "GCNConv": (lambda *a: snn.GCNConv(*a), (4, 2, True)),
    "ChebConv": (lambda *a: snn.ChebConv(*a), (4, 2, 3, "sym")),
    "MultiHeadSelfAttention": (lambda *a: snn.MultiHeadSelfAttention(*a), (8, 2, 0.1)),
    "PositionalAttention": (lambda *a: snn.PositionalAttention(*a), ((4, 4), 8, 2, "quadratic")),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_an_option_by_position_is_refused_naming_the_layer(layer: str) -> None:
    build, args = LAYERS[layer]
    with pytest.raises(TypeError, match=rf"{layer}.*positional argument"):
        build(*args)
