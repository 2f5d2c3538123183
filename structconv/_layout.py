"""The package's layering, stated once and measured from the source (no import needed).

``python -m structconv._layout`` prints the report; ``tests/test_architecture.py`` holds the
rules.  The layers, lowest first, each importing only from layers below it::

    backend → bases → {engine, structures} → theory → nn → data → experiments → cli

``engine`` and ``structures`` stand beside each other: neither imports the other.  The
package's ``__init__`` (the public facade), ``__main__`` and the conformance kit
``structconv.testing`` may import any layer; no layer may import them.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

LAYERS: dict[str, int] = {
    "backend": 0,
    "bases": 1,
    "engine": 2,
    "structures": 2,
    "theory": 3,
    "nn": 4,
    "data": 5,
    "experiments": 6,
    "cli": 7,
}
"""Layer of each top-level part of the package."""

KIT = {
    "structconv.testing",
    "structconv.testing._values",
    "structconv.testing.basis",
    "structconv.testing.layer",
    "structconv.testing.meaning",
    "structconv.testing.peer",
}
"""The conformance kit (:mod:`structconv.testing`): above every layer (it checks the layers of
``nn`` against the engine), and imported by none of them."""

FACADE = {"structconv", "structconv.__main__", "structconv._layout", *KIT}
"""Modules outside the layering: the public re-exports, ``python -m structconv``, this report, the kit."""

MAX_LINES = 800
"""No module may be longer than this.

A module holds one concept; the bound catches a module that has started to hold two, not a
concept that needs the room (450 lines once forced splits by length that followed no concept).
"""

MAX_BACKEND_BRANCHES = 10
"""Branches on NumPy against torch allowed outside ``backend/``."""

_BRANCH_CALLS = {"backend_of", "is_tensor"}
_TORCH_ONLY = ("nn", "data", "experiments", "cli")


@dataclass(frozen=True)
class Module:
    """One module of the package: its dotted name, file and source."""

    name: str
    path: Path
    source: str

    @property
    def part(self) -> str:
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else ""

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def lines(self) -> int:
        return len(self.source.splitlines())


def modules(root: Path | None = None) -> dict[str, Module]:
    """Every module of the package, keyed by dotted name."""
    root = root or Path(__file__).resolve().parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        found[name] = Module(name, path, path.read_text())
    return found


def imports(module: Module, known: dict[str, Module]) -> set[str]:
    """The package modules ``module`` imports, at top level or inside functions."""
    package = module.name if module.is_package else module.name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(module.source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
        for target in targets:
            # ``from . import x`` names a module when x is one; otherwise its package.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module.name and target.startswith("structconv"):
                out.add(target)
    return out


def graph(known: dict[str, Module]) -> dict[str, set[str]]:
    """The import arrows between the package's modules."""
    return {name: imports(mod, known) for name, mod in known.items()}


def cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in arrows.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return found


def _rank(name: str, known: dict[str, Module]) -> int | None:
    if name in FACADE:
        return None
    return LAYERS.get(known[name].part)


def upward(arrows: dict[str, set[str]], known: dict[str, Module]) -> list[tuple[str, str]]:
    """Imports from a lower layer into a higher one, or across engine ↔ structures."""
    bad = []
    for src, targets in sorted(arrows.items()):
        rs = _rank(src, known)
        for dst in sorted(targets):
            rd = _rank(dst, known)
            if rs is None or rd is None:
                if rs is not None and dst in FACADE - {"structconv"}:
                    bad.append((src, dst))
                continue
            beside = rs == rd and known[src].part != known[dst].part
            if rd > rs or beside:
                bad.append((src, dst))
    return bad


def backend_branches(module: Module) -> list[int]:
    """Lines where ``module`` chooses between NumPy and torch.

    Counted: calls of the backend predicates (``backend_of``, ``torch.is_tensor``),
    ``isinstance`` against ``np.ndarray`` (or ``torch.Tensor`` in a module that serves both
    backends), and comparisons of a ``backend`` name with ``"torch"``/``"numpy"``.  A
    ``torch.Tensor`` check in a torch-only layer (nn, data, experiments, cli) validates an
    argument's type and chooses nothing, so it is not counted.
    """
    lines = []
    torch_only = module.part in _TORCH_ONLY
    for node in ast.walk(ast.parse(module.source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in _BRANCH_CALLS and not (torch_only and name == "is_tensor"):
                lines.append(node.lineno)
            elif name == "isinstance" and len(node.args) == 2:
                kinds = ast.unparse(node.args[1])
                if "ndarray" in kinds or ("Tensor" in kinds and not torch_only):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            text = ast.unparse(node)
            if "backend" in text and any(k in text for k in ("'torch'", "'numpy'")):
                lines.append(node.lineno)
    return sorted(set(lines))


def report() -> str:
    """The measurements, one line each, for the docs and for humans."""
    known = modules()
    arrows = graph(known)
    long = sorted((m.lines, n) for n, m in known.items() if m.lines > MAX_LINES)
    outside = {n: backend_branches(m) for n, m in known.items() if m.part != "backend" and n not in FACADE}
    count = sum(len(v) for v in outside.values())
    rows = [
        f"modules: {len(known)}, import arrows: {sum(len(v) for v in arrows.values())}",
        f"import cycles: {cycles(arrows)}",
        f"upward imports: {upward(arrows, known)}",
        f"modules over {MAX_LINES} lines: {long}",
        f"backend branches outside backend/: {count} (goal <= {MAX_BACKEND_BRANCHES})",
    ]
    rows += [f"  {n}: {len(v)} at {v}" for n, v in sorted(outside.items()) if v]
    return "\n".join(rows)


if __name__ == "__main__":
    print(report())
