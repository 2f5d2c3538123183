"""Regenerate the architecture page's measured parts from the package's real imports.

``python docs/_ext/layers.py`` (from the repository root) rewrites

* ``docs/_static/architecture.png``: the layers as boxes, lowest at the bottom, each import
  between two layers an arrow (its width grows with the number of module imports), and beside
  it the matrix of those counts, importing layer by imported layer (an upward import would sit
  above the diagonal, in red);
* the two generated blocks of ``docs/architecture.rst``: the table of each layer's modules
  and the output of ``python -m structconv._layout``, its lines wrapped to :data:`WIDTH`.

The rest of the page is written by hand and kept as it is.

``python docs/_ext/layers.py --check`` rewrites nothing and exits with status 1 when the page's
generated blocks differ from what the tree gives now.  Everything is read by
:mod:`structconv._layout` from the source (nothing of the package is imported but that module).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from structconv import _layout  # noqa: E402  (after the path: run as a script from anywhere)

PAGE = ROOT / "docs" / "architecture.rst"
PNG = ROOT / "docs" / "_static" / "architecture.png"
BLOCKS = ("layer table", "layout report")
OUTSIDE = "outside"  # the facade, `python -m structconv` and the report: not a layer

#: Characters a line of the docs' code boxes holds (``LIMIT`` in ``tests/test_docs_layout.py``).
WIDTH = 88

#: Where each layer's box stands: (row from the bottom, left edge, width), in a 0..1 wide column.
PLACES = {
    "backend": (0, 0.0, 1.0),
    "bases": (1, 0.0, 1.0),
    "engine": (2, 0.0, 0.48),
    "structures": (2, 0.52, 0.48),
    "theory": (3, 0.0, 1.0),
    "nn": (4, 0.0, 1.0),
    "data": (5, 0.0, 1.0),
    "experiments": (6, 0.0, 1.0),
    "cli": (7, 0.0, 1.0),
}


def _part(name: str, known: dict[str, _layout.Module]) -> str:
    return OUTSIDE if name in _layout.FACADE else known[name].part


def layer_modules(known: dict[str, _layout.Module]) -> dict[str, list[str]]:
    """Each layer's modules (dotted names, sorted), lowest layer first, then those outside the layering."""
    out: dict[str, list[str]] = {part: [] for part in PLACES}
    out[OUTSIDE] = []
    for name in sorted(known):
        out[_part(name, known)].append(name)
    return out


def layer_imports(known: dict[str, _layout.Module]) -> Counter[tuple[str, str]]:
    """How many module imports go from each layer to each other layer (imports within a layer left out)."""
    counts: Counter[tuple[str, str]] = Counter()
    for src, targets in _layout.graph(known).items():
        for dst in targets:
            a, b = _part(src, known), _part(dst, known)
            if a != b and OUTSIDE not in (a, b):
                counts[a, b] += 1
    return counts


def table(known: dict[str, _layout.Module]) -> str:
    """The reST list-table of the layers: each one's rank and modules.

    Line counts are left out here (the diagram shows them): they change with nearly every
    commit, and the page should go stale only when the structure does.
    """
    rows = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 12 6 82",
        "",
        "   * - layer",
        "     - rank",
        "     - modules (``structconv.`` left out)",
    ]
    for part, names in layer_modules(known).items():
        rank = str(_layout.LAYERS[part]) if part in _layout.LAYERS else "--"
        shown = ", ".join(f"``{n.removeprefix('structconv.') or 'structconv'}``" for n in names)
        rows += [f"   * - {part}", f"     - {rank}", f"     - {shown}"]
    return "\n".join(rows)


def _wrap(line: str) -> list[str]:
    """``line`` broken at spaces into lines of at most :data:`WIDTH` characters.

    Continuation lines are indented four spaces past the line's own indentation; a word
    longer than a whole line is cut.
    """
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent + "    ", break_on_hyphens=False) or [""]


def report() -> str:
    """The output of ``python -m structconv._layout`` as an indented literal block, wrapped to fit."""
    lines = [part for line in _layout.report().splitlines() for part in _wrap(line)]
    return "::\n\n" + "\n".join(f"   {line}" if line else "" for line in lines)


def draw(known: dict[str, _layout.Module], path: Path) -> Path:
    """Draw the layer diagram and the matrix of imports between layers as a PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    modules = layer_modules(known)
    counts = layer_imports(known)
    fig = Figure(figsize=(13.0, 7.0), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1.0]})

    # Left: one box per layer, and an arc per pair of layers with imports between them.  Arcs run
    # outside the column (structures' on the right, all others on the left) and nest by length;
    # each end sits at a height within its box set by the other layer's rank, so arcs part.
    height, gap = 0.62, 0.38
    bottoms: dict[str, float] = {}
    for part, (row, x0, width) in PLACES.items():
        y0 = bottoms[part] = row * (height + gap)
        upward = any(_layout.LAYERS[b] > _layout.LAYERS[part] for (a, b) in counts if a == part)
        box = FancyBboxPatch(
            (x0, y0), width, height, boxstyle="round,pad=0.02,rounding_size=0.05",
            facecolor="#fde0dd" if upward else "#e8eef7", edgecolor="#33415c", linewidth=1.2, zorder=2,
        )  # fmt: skip
        left.add_patch(box)
        lines, count = sum(known[n].lines for n in modules[part]), len(modules[part])
        left.text(x0 + width / 2, y0 + 0.68 * height, part, va="center", ha="center", fontsize=10, weight="bold")
        left.text(
            x0 + width / 2, y0 + 0.3 * height, f"{count} module{'' if count == 1 else 's'}, {lines:,} lines",
            va="center", ha="center", fontsize=6.5 if width < 1 else 8, color="#33415c",
        )  # fmt: skip
    top = max(row for row, _, _ in PLACES.values()) * (height + gap) + height
    most = max(counts.values(), default=1)
    last = max(_layout.LAYERS.values())
    for (a, b), n in sorted(counts.items()):
        right_side = "structures" in (a, b)
        x = 1.02 if right_side else -0.02
        start = (x, bottoms[a] + height * (0.12 + 0.76 * _layout.LAYERS[b] / last))
        end = (x, bottoms[b] + height * (0.12 + 0.76 * _layout.LAYERS[a] / last))
        down = _layout.LAYERS[b] < _layout.LAYERS[a]
        # arc3 bends to the left of the direction of travel for a positive rad: going down on the
        # right side, or up on the left, that is outwards.
        span = abs(end[1] - start[1])
        rad = -(0.1 + 0.45 / span) if down == right_side else 0.1 + 0.45 / span
        arrow = FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=9, linewidth=0.5 + 2.5 * n / most,
            connectionstyle=f"arc3,rad={rad}", color="#33415c" if down else "#c0392b",
            alpha=0.6, shrinkA=0, shrinkB=0, zorder=1,
        )  # fmt: skip
        left.add_patch(arrow)
    left.set_xlim(-1.2, 2.0)
    left.set_ylim(-0.25, top + 0.25)
    left.set_axis_off()
    left.set_title("layers (lowest at the bottom); arcs: imports, wider for more modules", fontsize=10)

    # Right: the counts, importing layer (rows) by imported layer (columns).
    parts = list(PLACES)
    grid = [[counts.get((a, b), 0) for b in parts] for a in parts]
    right.imshow([[min(v, most) for v in row] for row in grid], cmap="Blues", vmin=0, vmax=most)
    for i, a in enumerate(parts):
        for j, b in enumerate(parts):
            value = grid[i][j]
            if value:
                up = _layout.LAYERS[b] > _layout.LAYERS[a] or (i != j and _layout.LAYERS[a] == _layout.LAYERS[b])
                colour = "#c0392b" if up else ("white" if value > most / 2 else "black")
                right.text(j, i, str(value), ha="center", va="center", fontsize=8, color=colour)
    right.set_xticks(range(len(parts)), parts, rotation=45, ha="right", fontsize=8)
    right.set_yticks(range(len(parts)), parts, fontsize=8)
    right.set_xlabel("imported layer")
    right.set_ylabel("importing layer")
    right.set_title("module imports between layers (red: upward or sideways)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    return path


def _replace(text: str, block: str, body: str) -> str:
    begin, end = f".. begin generated: {block}\n", f".. end generated: {block}\n"
    i, j = text.index(begin) + len(begin), text.index(end)
    return text[:i] + "\n" + body + "\n\n" + text[j:]


def page(text: str, known: dict[str, _layout.Module]) -> str:
    """``text`` (the architecture page) with its generated blocks made from the tree as it is."""
    text = _replace(text, BLOCKS[0], table(known))
    return _replace(text, BLOCKS[1], report())


def main(argv: list[str] | None = None) -> int:
    """Regenerate the page's blocks and the PNG, or with ``--check`` only compare the blocks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when the page is stale")
    args = parser.parse_args(argv)
    known = _layout.modules()
    text = PAGE.read_text()
    new = page(text, known)
    if args.check:
        if new != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python docs/_ext/layers.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    print(f"wrote {PAGE.relative_to(ROOT)} and {draw(known, PNG).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
