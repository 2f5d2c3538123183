"""The rows of a peer table: each comparison test registers itself as one row of a docs fragment.

A module of ``tests/peers`` builds one :class:`PeerTable`, decorates each test with
:meth:`PeerTable.case`, and renders ``docs/peers/<name>.rst`` from the rows; its
``test_fragment_is_current`` compares the committed fragment with :meth:`PeerTable.render`, so
the docs cannot drift from the tests.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

EQUAL, REFUSED, NA = "equal", "refused", "n.a."
STATUSES = (EQUAL, REFUSED, NA)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "peers"


def case_name() -> str:
    """The running test's id (``test_conv_stride[dtype1]``), the case a comparison's messages name."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit("::", 1)[-1].removesuffix(" (call)") or "a peer comparison"


class PeerTable:
    """One fragment: a title, an introduction, and a row per registered test.

    ``columns`` are the table's headings and ``widths`` their relative widths; a row holds one
    cell per column, one of which (``status_column``) is :data:`EQUAL`, :data:`REFUSED` or
    :data:`NA`.
    """

    def __init__(
        self, name: str, module: str, title: str, intro: str, columns: tuple[str, ...], widths: tuple[int, ...]
    ) -> None:
        self.name, self.module, self.title, self.intro = name, module, title, intro
        self.columns, self.widths = columns, widths
        self.status_column = columns.index("result")
        self.rows: dict[str, tuple[str, ...]] = {}

    @property
    def fragment(self) -> Path:
        return DOCS / f"{self.name}.rst"

    def case(self, *cells: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
        """Register the decorated test as a row (``cells`` in column order; the note may be left out)."""
        row = cells + ("",) * (len(self.columns) - len(cells))
        if len(row) != len(self.columns) or row[self.status_column] not in STATUSES:
            raise ValueError(f"a row needs {self.columns} with a result among {STATUSES}, got {cells}")

        def register(fn: Callable[..., None]) -> Callable[..., None]:
            self.rows[fn.__name__] = row
            return fn

        return register

    def render(self, version: str) -> str:
        """The fragment's reStructuredText: title, introduction, counts, the commands and the table."""
        counts = {s: sum(1 for row in self.rows.values() if row[self.status_column] == s) for s in STATUSES}
        lines = [
            self.title,
            "=" * len(self.title),
            "",
            *textwrap.wrap(self.intro.format(version=version), 96),
            "",
            f"Counts: {counts[EQUAL]} equal, {counts[REFUSED]} refused, {counts[NA]} n.a.  Produced by::",
            "",
            f"    .venv/bin/python -m pytest -q tests/peers/{self.module}.py",
            f"    .venv/bin/python tests/peers/{self.module}.py > docs/peers/{self.name}.rst",
            "",
            ".. list-table::",
            "   :header-rows: 1",
            f"   :widths: {' '.join(map(str, self.widths))}",
            "",
        ]
        for row in (self.columns, *self.rows.values()):
            lines += [f"   * - {row[0]}"] + [f"     - {cell}" if cell else "     -" for cell in row[1:]]
        return "\n".join(lines) + "\n"
