"""The package's layering, measured from its source: the rules of the architecture page."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from structconv import _layout

KNOWN = _layout.modules()
ARROWS = _layout.graph(KNOWN)


def test_no_import_cycles() -> None:
    assert _layout.cycles(ARROWS) == []


def test_every_import_runs_downwards() -> None:
    assert _layout.upward(ARROWS, KNOWN) == []


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [n for n, m in KNOWN.items() if n not in _layout.FACADE and m.part not in _layout.LAYERS]
    assert unplaced == []


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_no_module_is_longer_than_the_limit(name: str) -> None:
    assert KNOWN[name].lines <= _layout.MAX_LINES


def test_backend_branches_stay_inside_the_backend() -> None:
    outside = {
        n: _layout.backend_branches(m) for n, m in KNOWN.items() if m.part != "backend" and n not in _layout.FACADE
    }
    found = {n: lines for n, lines in outside.items() if lines}
    assert sum(len(v) for v in found.values()) <= _layout.MAX_BACKEND_BRANCHES, found


def test_the_measures_can_fail() -> None:
    """Each rule flags a violation built for it, so a green run means something."""
    fake = {
        "structconv.bases.a": _layout.Module("structconv.bases.a", _layout.Path("a.py"), "from ..nn import x\n"),
        "structconv.nn": _layout.Module("structconv.nn", _layout.Path("nn/__init__.py"), "from ..bases import a\n"),
        "structconv.bases": _layout.Module("structconv.bases", _layout.Path("bases/__init__.py"), ""),
    }
    arrows = _layout.graph(fake)
    assert _layout.cycles(arrows) == [["structconv.bases.a", "structconv.nn"]]
    assert _layout.upward(arrows, fake) == [("structconv.bases.a", "structconv.nn")]
    branchy = _layout.Module(
        "structconv.bases.b",
        _layout.Path("b.py"),
        "def f(a):\n    if backend_of(a, 'a') == 'torch':\n        return 1\n    return isinstance(a, np.ndarray)\n",
    )
    assert _layout.backend_branches(branchy) == [2, 4]


def _calls_upward(run: object) -> list[tuple[str, str]]:
    """Run ``run()`` and list each call from a lower layer into a higher one (or sideways across)."""
    import sys

    def layer(module: str) -> tuple[int, str] | None:
        if not module.startswith("structconv.") or module in _layout.FACADE or module not in KNOWN:
            return None
        part = KNOWN[module].part
        return (_layout.LAYERS[part], part) if part in _layout.LAYERS else None

    bad: set[tuple[str, str]] = set()

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call" or frame.f_back is None:
            return
        callee = layer(frame.f_globals.get("__name__", ""))
        caller = layer(frame.f_back.f_globals.get("__name__", ""))
        if callee is None or caller is None:
            return
        if callee[0] > caller[0] or (callee[0] == caller[0] and callee[1] != caller[1]):
            bad.add((frame.f_back.f_globals["__name__"], f"{frame.f_globals['__name__']}.{frame.f_code.co_name}"))

    sys.setprofile(profile)
    try:
        run()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return sorted(bad)


def _conv_cases() -> dict[str, Callable[[], object]]:
    import numpy as np
    import torch

    import structconv as sc

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 16, 3))
    theta = rng.normal(size=(4, 3, 5))
    dense = rng.normal(size=(4, 16, 16))
    edge_index = np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    xt = torch.tensor(x, requires_grad=True)
    sparse = torch.tensor(dense * (rng.random(dense.shape) < 0.2)).to_sparse()
    tt = torch.tensor(theta)

    def grid(like: object) -> None:
        basis = sc.grid_basis((4, 4), 3, like=like)
        th = rng.normal(size=(9, 3, 5))
        sc.conv(basis, like, th if isinstance(like, np.ndarray) else torch.tensor(th))

    def attention() -> None:
        mech = sc.BiAffine(bilinear=torch.randn(2, 3, 3, dtype=torch.float64))
        basis = sc.attention_basis(xt, mechanism=mech)
        sc.conv(basis, xt, torch.randn(2, 3, 5, dtype=torch.float64)).sum().backward()

    def layer(build: Callable[[], torch.nn.Module], *inputs: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            torch.manual_seed(0)
            out = build()(*inputs)
            (out[0] if isinstance(out, tuple) else out).sum().backward()

        return run

    from structconv import nn as snn

    ei = torch.tensor(edge_index)
    feats = torch.randn(16, 3)
    seq = torch.randn(2, 5, 4)
    return {
        "nn GCNConv": layer(lambda: snn.GCNConv(3, 4), feats, ei),
        "nn GATConv": layer(lambda: snn.GATConv(3, 2, heads=2), feats, ei),
        "nn GridConv2d": layer(lambda: snn.GridConv2d(3, 4, 3, padding=1), torch.randn(2, 3, 6, 6)),
        "nn MultiHeadSelfAttention": layer(lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True), *[seq] * 3),
        "dense numpy": lambda: [sc.conv(dense, x, theta, order=o) for o in ("ax", "xtheta", "atheta")],
        "sparse torch": lambda: sc.conv(sc.as_basis(sparse), xt, tt).sum().backward(),
        "grid numpy": lambda: grid(x),
        "grid torch": lambda: grid(xt),
        "graph powers": lambda: sc.conv(sc.graph_basis(edge_index, num_nodes=16, kind="powers", K=3), x, theta),
        "attention": attention,
    }


@pytest.mark.parametrize("case", sorted(_conv_cases()))
def test_one_conv_call_reads_top_down(case: str) -> None:
    """Engine calls bases, bases call the backend; nothing calls back up while ``conv`` runs."""
    assert _calls_upward(_conv_cases()[case]) == []


def test_the_architecture_page_matches_the_tree() -> None:
    """docs/architecture.rst's generated blocks (module table, measurements) are up to date."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "docs" / "_ext" / "layers.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{done.stdout}{done.stderr} (regenerate with: python docs/_ext/layers.py)"
