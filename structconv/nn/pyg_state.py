r"""PyTorch Geometric's checkpoints: the graph layers load a PyG ``state_dict`` and give one back.

structconv keeps each layer's :math:`\Theta` as the framework has it (``weight`` of shape
``(K, P, Q)``, GAT's ``weight`` of shape ``(P, H\cdot D)``), where PyG keeps ``torch.nn.Linear``
weights ``(Q, P)`` (``lin.weight``, ``lins.0.weight``, ...) and GAT's attention vectors as
``(1, H, D)``.  Every entry is a transpose, a stack or a reshape of the other, so nothing is
lost either way:

* ``layer.load_state_dict(pyg_layer.state_dict())`` (and a model holding such layers at any
  depth) reads PyG's keys: :meth:`PyGState._load_from_state_dict` rewrites them into the
  layer's own before torch copies them, so ``strict`` still reports keys that are genuinely
  missing (under PyG's names when the checkpoint is PyG's) or unexpected;
* :func:`pyg_state_dict` gives a module's ``state_dict`` with those entries under PyG's names
  and shapes, for PyG's ``load_state_dict``.

:class:`~structconv.nn.RGCNConv` needs neither: its parameters already have PyG's names and
shapes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._module import NotScriptable


@dataclass(frozen=True)
class PyGKey:
    """One parameter of ours, ``ours``, and the PyG entries ``theirs`` it is made of (relative names)."""

    ours: str
    theirs: tuple[str, ...]
    to_theirs: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    to_ours: Callable[[tuple[torch.Tensor, ...]], torch.Tensor]


def linear_key(ours: str, theirs: str) -> PyGKey:
    """Our ``(P, Q)`` matrix is the transpose of PyG's ``Linear`` weight ``(Q, P)``."""
    return PyGKey(ours, (theirs,), lambda w: (w.T,), lambda ws: ws[0].T)


def member_keys(ours: str, theirs: list[str]) -> PyGKey:
    """Our ``(K, P, Q)`` members, member ``k`` the transpose of PyG's ``Linear`` weight ``theirs[k]``."""
    return PyGKey(ours, tuple(theirs), lambda w: tuple(w.mT.unbind(0)), lambda ws: torch.stack(ws).mT)


def same_key(ours: str, theirs: str) -> PyGKey:
    """Our parameter is PyG's under another name."""
    return PyGKey(ours, (theirs,), lambda w: (w,), lambda ws: ws[0])


def heads_key(name: str) -> PyGKey:
    """Our ``(H, D)`` attention vector is PyG's ``(1, H, D)``."""
    return PyGKey(name, (name,), lambda a: (a[None],), lambda ws: ws[0].reshape(ws[0].shape[1:]))


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


class PyGState(NotScriptable, nn.Module):
    """A layer whose parameters :meth:`pyg_keys` relates to PyG's: it loads either ``state_dict``."""

    def pyg_keys(self) -> list[PyGKey]:
        """The parameters named or shaped otherwise than in PyG's layer (the rest coincide)."""
        return []

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # torch hands every module a copy of the whole state_dict and reads this module's entries
        # after this call, so translated entries are swapped in here, under our names.
        keys = self.pyg_keys()
        expected: dict[str, list[tuple[int, ...]]] = {}
        for key in keys:
            with torch.no_grad():
                expected[key.ours] = [_shape(t) for t in key.to_theirs(getattr(self, key.ours).detach())]

        def pyg_entry(key: PyGKey, name: str, shape: tuple[int, ...]) -> bool:
            """Whether ``state_dict`` holds PyG's entry ``name`` (one with our name tells by its shape)."""
            value = state_dict.get(prefix + name)
            if value is None:
                return False
            return key.theirs != (key.ours,) or _shape(value) == shape != _shape(getattr(self, key.ours))

        # A checkpoint of PyG's has its missing entries reported under PyG's names.
        theirs_given = any(pyg_entry(k, t, e) for k in keys for t, e in zip(k.theirs, expected[k.ours], strict=True))
        renamed: dict[str, list[str]] = {}  # our key: the PyG keys to report in its place when missing
        for key in keys:
            mine = prefix + key.ours
            names = [prefix + t for t in key.theirs]
            if key.theirs == (key.ours,):
                if pyg_entry(key, key.ours, expected[key.ours][0]):
                    state_dict[mine] = key.to_ours((state_dict[mine],)).contiguous()
                continue
            if mine in state_dict:  # our own format; PyG's entries, if any too, stay unexpected
                continue
            present = [n for n in names if n in state_dict]
            if len(present) < len(names):
                for n in present:  # part of PyG's set: loaded nowhere, so reported by the ones missing
                    del state_dict[n]
                if present or theirs_given:
                    renamed[mine] = [n for n in names if n not in present]
                continue
            given = [state_dict.pop(n) for n in names]
            shapes = zip(names, given, expected[key.ours], strict=True)
            wrong = [(n, _shape(v), e) for n, v, e in shapes if _shape(v) != e]
            for n, got, want in wrong:
                error_msgs.append(
                    f"size mismatch for {n}: copying a param with shape {got} from checkpoint, the shape in "
                    f"PyG's {type(self).__name__} matching this layer is {want}."
                )
            if wrong:
                renamed[mine] = []  # reported as a size mismatch, not as missing
                continue
            state_dict[mine] = key.to_ours(tuple(given)).contiguous()
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for mine, names in renamed.items():
            if mine in missing_keys:
                at = missing_keys.index(mine)
                missing_keys[at : at + 1] = names


def pyg_state_dict(module: nn.Module) -> OrderedDict[str, torch.Tensor]:
    """``module.state_dict()`` with every structconv graph layer's entries under PyG's names and shapes.

    ``module`` is one layer or a model holding them at any depth; the result loads into the same
    model built from PyG's layers (``pyg_model.load_state_dict(pyg_state_dict(model))``).  Other
    entries pass unchanged.  The tensors are detached copies where a transpose or reshape was
    needed, as ``state_dict``'s own entries are detached.

    Parameters
    ----------
    module
        A :class:`torch.nn.Module`; its structconv ``GCNConv``, ``SGConv``, ``TAGConv``,
        ``ChebConv`` and ``GATConv`` layers are translated.

    Returns
    -------
    collections.OrderedDict
        PyG's keys in place of each translated parameter, in the order of ``module.state_dict()``.
    """
    translate: dict[str, tuple[str, PyGKey]] = {}
    for name, layer in module.named_modules(remove_duplicate=False):
        if isinstance(layer, PyGState):
            prefix = f"{name}." if name else ""
            for key in layer.pyg_keys():
                translate[prefix + key.ours] = (prefix, key)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for full, value in module.state_dict().items():
        if full not in translate:
            out[full] = value
            continue
        prefix, key = translate[full]
        with torch.no_grad():
            for name, part in zip(key.theirs, key.to_theirs(value), strict=True):
                out[prefix + name] = part.contiguous()
    return out
