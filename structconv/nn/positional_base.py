"""What the encodings of :class:`~structconv.nn.PositionalAttention` share: small modules configured by their options.

An encoding (:class:`~structconv.nn.QuadraticHeads`, :class:`~structconv.nn.ContentHeads`, ...)
is built from its options alone, holds no parameter, and serves as a template: a layer binds it
to its grid and sizes, which gives a new module of the same class with every size-dependent
default resolved and its parameters created at their initial values.  The template itself is
never changed, so one encoding can configure many layers.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from torch import nn

from ..backend.checks import positive_int
from ._module import NotScriptable

__all__ = ["Encoding"]


def optional_positive_int(owner: str, name: str, value: Any) -> int | None:
    """``None``, or ``value`` checked by :func:`~structconv.backend.checks.positive_int`."""
    return None if value is None else positive_int(value, name, where=owner)


def real(owner: str, name: str, value: Any, *, positive: bool) -> float:
    """``value`` as a finite ``float``, positive or at least zero; a clear error naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{owner}: {name} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        wanted = "positive" if positive else ">= 0"
        raise ValueError(f"{owner}: {name} must be finite and {wanted}, got {value!r}")
    return number


def flag(owner: str, name: str, value: Any) -> bool:
    """``value`` if it is a ``bool`` (an option that is on or off, never a number or a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return value


class Encoding(NotScriptable, nn.Module):
    """A module configured by the keyword options of its constructor, bound later to a layer's sizes.

    Subclasses store their options and return them from :meth:`options`; :meth:`extra_repr`
    shows them (those that differ from the constructor's defaults, and :attr:`shown` always);
    a binding starts from a new encoding of the same options.
    """

    #: Options the representation always shows, even at their defaults.
    shown: tuple[str, ...] = ()

    def options(self) -> dict[str, Any]:
        """The constructor's keyword arguments that give this encoding (after binding: with defaults resolved)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        defaults = {
            name: p.default
            for name, p in inspect.signature(type(self)).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        options = self.options()
        shown = [k for k, v in options.items() if k in self.shown or k not in defaults or defaults[k] != v]
        return ", ".join(f"{k}={options[k]!r}" for k in shown)

    def __repr__(self) -> str:
        # One line: the options say everything (the parameters' shapes follow from the layer's sizes).
        return f"{type(self).__name__}({self.extra_repr()})"
