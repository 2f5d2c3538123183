"""Old module paths, kept importable for one release with a :class:`DeprecationWarning`.

Before 0.2 the package was flat (``structconv.grid``, ``structconv.contract``, ...).  Each old
path is now a small stand-in module whose attributes are looked up, on first use, in the
modules that took over its contents; the warning names the new home of every name read.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any

MOVED: dict[str, tuple[str, ...]] = {
    "basis": ("structconv.bases.base", "structconv.bases.convert"),
    "dense": ("structconv.bases.dense",),
    "sparse": ("structconv.bases.sparse",),
    "kronecker": ("structconv.bases.kronecker",),
    "composite": ("structconv.bases.composite",),
    "factor": ("structconv.bases.factor",),
    "edges": ("structconv.bases.edges",),
    "contract": (
        "structconv.engine.contract",
        "structconv.engine.plan",
        "structconv.engine.orders",
        "structconv.engine.operands",
    ),
    "grid": ("structconv.structures.grid", "structconv.bases.grid"),
    "graph": (
        "structconv.structures.graph",
        "structconv.structures.edge_list",
        "structconv.structures.normalize",
        "structconv.bases.polynomial",
    ),
    "attention": ("structconv.structures.attention", "structconv.bases.attention"),
    "positional": ("structconv.structures.positional", "structconv.structures.relative"),
    "conv_attention": ("structconv.theory.conv_attention",),
    "selfcheck": ("structconv.theory.selfcheck",),
}
"""Old module name (under ``structconv``) → the modules searched, in order, for its names."""


class _MovedModule(types.ModuleType):
    """A stand-in for a removed module: reading a name warns and forwards to its new module."""

    def __init__(self, old: str, homes: tuple[str, ...]) -> None:
        super().__init__(old, f"Deprecated alias of {', '.join(homes)}.")
        self._homes = homes

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for home in self._homes:
            module = importlib.import_module(home)
            if hasattr(module, name):
                warnings.warn(
                    f"{self.__name__}.{name} moved to {home}.{name}; the old path goes in 0.3",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


def install(package: types.ModuleType) -> None:
    """Register every old path in ``sys.modules`` and as an attribute of ``package``."""
    for old, homes in MOVED.items():
        full = f"{package.__name__}.{old}"
        if full not in sys.modules:
            sys.modules[full] = _MovedModule(full, homes)
