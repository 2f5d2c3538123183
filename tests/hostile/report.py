"""The suite's outputs: per-case JSON, the summary with its verdict, the table and the findings.

``cases.json.gz`` holds one record per case (entry point, input, expectation, outcome, cause, where
it was raised, message); ``summary.json`` the counts per entry point and outcome, the findings
(every case neither ``right`` nor ``clear``, grouped by cause) and the verdict that
``tests/test_hostile_suite.py`` asserts; ``table.csv`` and ``findings.inc`` are what
``docs/robustness.rst`` includes.  Nothing in them depends on the machine or the run but the
recorded wall time, so a regeneration changes them only where outcomes changed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import textwrap
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .allow import ALLOWED, Allow
from .spec import OUTCOMES

PROBLEMS = ("raw", "silent", "crash", "security", "harness")

#: Characters per line of the examples in ``findings.inc``: what a code box of the docs holds
#: (``LIMIT`` in ``tests/test_docs_layout.py``).
WIDTH = 88


def counts(records: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """``{entry: {outcome: n}}`` in the order entries first appear."""
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        table[r["entry"]][r["outcome"]] += 1
    columns = OUTCOMES + (("harness",) if any(c["harness"] for c in table.values()) else ())
    return {entry: {o: c[o] for o in columns} for entry, c in table.items()}


def findings(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cases neither ``right`` nor ``clear``, grouped by entry, outcome, cause and where; largest groups first."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["outcome"] in PROBLEMS:
            groups[(r["entry"], r["outcome"], r["cause"], r.get("where", ""))].append(r)
    out = []
    for (entry, outcome, cause, where), members in groups.items():
        example = min(members, key=lambda r: (len(r.get("input", "")), r["id"]))
        out.append(
            {
                "entry": entry,
                "outcome": outcome,
                "cause": cause,
                "where": where,
                "count": len(members),
                "example": {k: example.get(k, "") for k in ("id", "input", "message")},
                "ids": sorted(r["id"] for r in members),
            }
        )
    order = {o: i for i, o in enumerate(("security", "crash", "silent", "harness", "raw"))}
    return sorted(out, key=lambda g: (order[g["outcome"]], -g["count"], g["entry"], g["cause"]))


def verdict(records: list[dict[str, Any]], allowed: tuple[Allow, ...] = ALLOWED) -> dict[str, Any]:
    """What the test asserts: no silent, crash, security or harness case; every raw case allowed."""
    bad = {o: [r["id"] for r in records if r["outcome"] == o] for o in ("silent", "crash", "security", "harness")}
    raw = [r for r in records if r["outcome"] == "raw"]
    unallowed = [r["id"] for r in raw if not any(a.matches(r) for a in allowed)]
    stale = [a.reason for a in allowed if not any(a.matches(r) for r in raw)]
    passed = not any(bad.values()) and not unallowed
    return {"passed": passed, **bad, "raw_not_allowed": unallowed, "allow_entries_unused": stale}


def table_csv(table: dict[str, dict[str, int]]) -> str:
    """The counts as CSV (entry point, one column per outcome, total), with a total row."""
    columns = list(next(iter(table.values())).keys()) if table else list(OUTCOMES)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["entry point", *columns, "total"])
    totals = Counter[str]()
    for entry, row in table.items():
        writer.writerow([entry, *(row[c] for c in columns), sum(row.values())])
        totals.update(row)
    writer.writerow(["total", *(totals[c] for c in columns), sum(totals.values())])
    return buffer.getvalue()


def _wrap(text: str) -> list[str]:
    """``text`` broken at spaces into lines of at most :data:`WIDTH` characters.

    Continuation lines are indented four spaces; a word longer than a whole line is cut.
    """
    return textwrap.wrap(text, WIDTH, subsequent_indent="    ", break_on_hyphens=False) or [""]


def findings_rst(groups: list[dict[str, Any]]) -> str:
    """The findings as a reStructuredText fragment: one item per group, its example in a literal block.

    The example's input and message are wrapped to :data:`WIDTH` characters a line, each line
    of them on its own.
    """
    if not groups:
        return "No case ended ``raw``, ``silent``, ``crash`` or ``security``.\n"
    lines = []
    for g in groups:
        cause = g["cause"].replace("`", "'").replace("*", "\\*")
        where = f" at ``{g['where']}``" if g["where"] else ""
        cases = f"{g['count']} case{'s' if g['count'] != 1 else ''}"
        lines.append(f"* **{g['outcome']}**, ``{g['entry']}`` ({cases}): {cause}{where}; e.g.")
        lines.append("")
        lines.append("  ::")
        lines.append("")
        example = g["example"]
        for text in (example["input"], example["message"]):
            for line in str(text).splitlines() or [""]:
                lines.extend("     " + part for part in _wrap(line))
        lines.append("")
    return "\n".join(lines)


def write(out: Path, records: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Write the four files into ``out``; return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    kept = [{k: v for k, v in r.items() if k != "seconds"} for r in records]
    text = "[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in kept) + "\n]\n"
    # gzip without a timestamp: the same records give the same bytes (and a tenth of the size in git)
    with gzip.GzipFile(out / "cases.json.gz", "wb", compresslevel=9, mtime=0) as f:
        f.write(text.encode())
    table = counts(records)
    groups = findings(records)
    summary = {**meta, "counts": table, "verdict": verdict(records), "findings": groups}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "table.csv").write_text(table_csv(table))
    (out / "findings.inc").write_text(findings_rst(groups))
    return summary


def text_table(table: dict[str, dict[str, int]]) -> str:
    """The counts as a plain-text table, for the terminal."""
    rows = list(csv.reader(io.StringIO(table_csv(table))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    )
