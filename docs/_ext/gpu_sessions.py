"""``.. gpu-session::``: the newest GPU session's record (docs/_static/gpu/sessions) as text, tables and figure.

``bash scripts/gpu_session.sh --collect DIR`` puts each session's record there as
``<UTC date and time>-<device>.json`` (with its figure, same name, ``.png``); the directive shows
the newest (their names sort by time), or says that none has been recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

SESSIONS = Path(__file__).resolve().parents[1] / "_static" / "gpu" / "sessions"


def _newest() -> tuple[Path, dict[str, Any]] | None:
    records = sorted(SESSIONS.glob("*.json"))
    return (records[-1], json.loads(records[-1].read_text())) if records else None


def _rate(value: float | None) -> str:
    return "--" if value is None else f"{value:,.0f}"


def _lines(path: Path, record: dict[str, Any]) -> list[str]:
    """The record as reStructuredText."""
    tests = record.get("cuda_tests", {})
    head = (
        f"The newest session, ``{path.name}``: {record.get('device', '?')}, torch {record.get('torch', '?')} "
        f"(CUDA {record.get('cuda', '?')}, driver {record.get('driver', '?')}), commit "
        f"``{str(record.get('commit', '?'))[:12]}``, started {record.get('started', '?')}.  CUDA tests: "
        f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, {tests.get('skipped', 0)} skipped"
        + (f" (failing: {', '.join('``' + f + '``' for f in tests['failures'])})" if tests.get("failures") else "")
        + (
            f" before the step {tests['status']} after {tests.get('seconds', 0):.0f} s"
            if tests.get("status") == "timed out"
            else ""
        )
        + "."
    )
    lines = [head, ""]
    eager = record.get("bench", {}).get("images_per_second", {})
    compiled = record.get("bench_compiled", {}).get("images_per_second", {})
    if eager or compiled:
        batch = record.get("bench", record.get("bench_compiled", {})).get("batch")
        lines += [
            f"Training images per second at batch {batch}:",
            "",
            ".. list-table::",
            "   :header-rows: 1",
            "",
            "   * - variant",
            "     - eager",
            "     - compiled",
        ]
        for name in dict.fromkeys([*eager, *compiled]):
            lines += [f"   * - {name}", f"     - {_rate(eager.get(name))}", f"     - {_rate(compiled.get(name))}"]
        lines.append("")
        for key, what in (("bench", "eager"), ("bench_compiled", "compiled")):
            for t in record.get(key, {}).get("targets", []):
                verdict = "met" if t["met"] else f"missed by {100 * (1 - t['value'] / t['goal']):.0f} %"
                lines.append(f"- {what}: {t['name']}: {t['value']:,.2f} against {t['goal']:,.2f}, {verdict}")
        lines.append("")
    for run in record.get("runs", []):
        if run.get("status") == "not started":
            estimate = run.get("estimate_s")
            lines.append(
                f"Training: not started; the whole ``{run['model']}`` run with the ``{run['preset']}`` preset "
                + (f"would take about {estimate / 60:.0f} min." if estimate else "had no measured rate.")
            )
            lines.append("")
            continue
        acc = run.get("test_acc") or []
        state = "complete" if run.get("complete") else "partial, not a result"
        lines.append(
            f"Training: ``{run['model']}`` with the ``{run['preset']}`` preset, {run.get('epochs_done', 0)} of "
            f"{run.get('epochs_planned', '?')} epochs ({state})"
            + (f", last test accuracy {100 * acc[-1]:.2f} %, best {100 * max(acc):.2f} %" if acc else "")
            + (f", {_rate(run.get('images_per_second'))} training images per second" if acc else "")
            + "."
        )
        lines.append("")
    figure = path.with_suffix(".png")
    if figure.is_file():
        lines += [
            f".. figure:: /_static/gpu/sessions/{figure.name}",
            "   :width: 100%",
            "   :alt: training images per second of every variant, and test accuracy against epoch",
            "",
            "   The session's throughput (eager and compiled, targets dotted) and its training run.",
            "",
        ]
    return lines


class GpuSession(SphinxDirective):
    """The newest session record, or a sentence saying there is none."""

    def run(self) -> list[nodes.Node]:
        found = _newest()
        if found is None:
            text = ["No GPU session has been recorded yet (``docs/_static/gpu/sessions`` is empty)."]
        else:
            self.env.note_dependency(str(found[0]))
            text = _lines(*found)
        container = nodes.container()
        self.state.nested_parse(StringList(text, source="gpu-session"), self.content_offset, container)
        return container.children


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("gpu-session", GpuSession)
    return {"parallel_read_safe": True}
