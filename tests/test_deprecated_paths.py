"""The flat module paths of 0.1 still import, warn, and forward to the new homes."""

from __future__ import annotations

import importlib

import pytest

import structconv
from structconv import _deprecated


@pytest.mark.parametrize("old", sorted(_deprecated.MOVED))
def test_every_old_path_imports_and_forwards_with_a_warning(old: str) -> None:
    module = importlib.import_module(f"structconv.{old}")
    home = importlib.import_module(_deprecated.MOVED[old][0])
    public = [n for n in dir(home) if not n.startswith("_") and getattr(home, n).__class__.__module__ != "typing"]
    name = public[0]
    with pytest.warns(DeprecationWarning, match=f"structconv.{old}.{name} moved to"):
        assert getattr(module, name) is getattr(home, name)


def test_a_name_that_never_existed_is_an_attribute_error() -> None:
    module = importlib.import_module("structconv.grid")
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = module.nothing_here


def test_the_public_api_reads_without_warnings(recwarn: pytest.WarningsRecorder) -> None:
    for name in structconv.__all__:
        getattr(structconv, name)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
