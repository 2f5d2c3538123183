"""Records shown as tables: GPU sessions, benchmark records, the host benchmark's record.

``.. gpu-sessions::`` and ``.. gpu-bench::`` show every recorded GPU session and every GPU benchmark
record; ``.. bench-record:: PATH`` one benchmark record (``structconv cifar bench --out``'s JSON),
``.. host-record:: PATH`` the record of ``benchmarks/bench_host.py``, paths relative to ``docs/``.

``bash scripts/gpu_session.sh --collect DIR`` puts each session's record in ``docs/_static/gpu/sessions``
as ``<UTC date and time>-<device>.json`` (with its figure, same name, ``.png``); ``gpu-sessions``
shows each, newest first (their names sort by time), or says that none has been recorded.
``gpu-bench`` shows the records of ``structconv cifar bench --out`` kept in ``docs/_static/gpu/bench``
(a benchmark run in a lease apart from its session's record), newest first.  Every number on the
page comes from the records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

GPU = Path(__file__).resolve().parents[1] / "_static" / "gpu"
SESSIONS = GPU / "sessions"
BENCH = GPU / "bench"


def _records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The JSON records of ``folder``, newest first."""
    return [(p, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"), reverse=True)]


def _rate(value: float | None) -> str:
    return "--" if value is None else f"{value:,.0f}"


def _lines(path: Path, record: dict[str, Any]) -> list[str]:
    """The record as reStructuredText."""
    tests = record.get("cuda_tests", {})
    head = (
        f"Session ``{path.stem}``: {record.get('device', '?')}, torch {record.get('torch', '?')} "
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


def _bench_lines(path: Path, record: dict[str, Any]) -> list[str]:
    """One benchmark record (``structconv cifar bench --out``) as reStructuredText."""
    mode = "compiled" if record.get("compiled") else "eager"
    flushed = {True: "subnormals flushed", False: "subnormals kept", None: "subnormal setting mixed or not recorded"}
    lines = [
        f"Benchmark ``{path.stem}``: {record.get('device', '?')}, batch {record.get('batch', '?')}, "
        f"{record.get('precision', '?')}, {mode}, {record.get('sizes', 'paper')} sizes, "
        f"{flushed[record.get('flush_denormal')]} on the host.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - variant",
        "     - images/s",
        "     - GFLOP per image",
        "     - share of the GEMM yardstick",
    ]
    share, flops = record.get("utilisation", {}), record.get("flops_per_image", {})
    for name, rate in record.get("images_per_second", {}).items():
        cell = f"{100 * share[name]:.1f} %" if name in share else "--"
        gflop = f"{flops[name] / 1e9:.2f}" if name in flops else "--"
        shown = f"{rate:,.1f}" if rate < 100 else _rate(rate)
        lines += [f"   * - {name}", f"     - {shown}", f"     - {gflop}", f"     - {cell}"]
    if record.get("gemm_shape") and record.get("gemm_tflops"):
        m, k, n = record["gemm_shape"]
        lines += ["", f"The GEMM yardstick: ``({m}, {k}) x ({k}, {n})`` in {record.get('gemm_dtype')}, the largest "
                  f"product of ``{record.get('gemm_source')}``'s step, at {1e3 * record['gemm_tflops']:,.1f} GFLOP/s."]  # fmt: skip
    return [*lines, ""]


class _Records(SphinxDirective):
    """The records of one folder, newest first, or a sentence saying there is none."""

    folder: Path = SESSIONS
    render = staticmethod(_lines)
    none = "No GPU session has been recorded yet (``docs/_static/gpu/sessions`` is empty)."

    def run(self) -> list[nodes.Node]:
        text: list[str] = []
        for path, record in _records(self.folder):
            self.env.note_dependency(str(path))
            text += self.render(path, record)
        container = nodes.container()
        self.state.nested_parse(StringList(text or [self.none], source=self.name), self.content_offset, container)
        return container.children


class GpuBench(_Records):
    folder = BENCH
    render = staticmethod(_bench_lines)
    none = "No GPU benchmark record is kept (``docs/_static/gpu/bench`` is empty)."


def _cell(value: float | None, key: str) -> str:
    if value is None:
        return "--"
    return f"{value:,.0f}" if key in ("aten", "aten_bf16", "calls", "host_us", "entries", "graphs", "breaks") else (
        f"{value:,.3g}"
    )


#: The host record's measures in the order its tables show them.
_HOST_METRICS = ("aten", "aten_bf16", "calls", "host_us", "compile_s", "guard_us", "entries", "graphs", "breaks")


def _host_lines(path: Path, record: dict[str, Any]) -> list[str]:
    """The host benchmark's record: per tree, every variant's measures, then each model's ratios against its targets."""
    lines: list[str] = []
    for label, rows in record["trees"].items():
        seen = {k for row in rows.values() for k in row}
        metrics = [m for m in _HOST_METRICS if m in seen] + sorted(seen - set(_HOST_METRICS))
        lines += [f"Tree ``{label}``:", "", ".. list-table::", "   :header-rows: 1", "", "   * - variant"]
        lines += [f"     - {m}" for m in metrics]
        for name, row in rows.items():
            lines += [f"   * - {name}"] + [f"     - {_cell(row.get(m), m)}" for m in metrics]
        lines.append("")
        for model, measured in record["ratios"][label].items():
            verdicts = record["verdicts"][label][model]
            parts = []
            for key, limit in record["targets"][model].items():
                if key in measured:
                    shown = f"{measured[key]:.0f}" if key == "entries" else f"{measured[key]:.2f}x"
                    parts.append(f"{key} {shown} (at most {limit:g}: {'met' if verdicts[key] else 'missed'})")
            lines.append(f"- {model} against its peer: " + "; ".join(parts))
        lines.append("")
    return lines


class _Record(SphinxDirective):
    """One record, named by the directive's argument (a path relative to ``docs/``)."""

    required_arguments = 1
    render = staticmethod(_bench_lines)

    def run(self) -> list[nodes.Node]:
        path = Path(self.env.srcdir) / self.arguments[0]
        self.env.note_dependency(str(path))
        container = nodes.container()
        text = self.render(path, json.loads(path.read_text()))
        self.state.nested_parse(StringList(text, source=self.name), self.content_offset, container)
        return container.children


class HostRecord(_Record):
    render = staticmethod(_host_lines)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("gpu-sessions", _Records)
    app.add_directive("gpu-bench", GpuBench)
    app.add_directive("bench-record", _Record)
    app.add_directive("host-record", HostRecord)
    return {"parallel_read_safe": True}
