r"""How positional self-attention grows with the token grid: time and peak memory against tokens.

The layer is ``structconv.nn.PositionalAttention((s, s), 400, 9)`` (9 quadratic heads, width
400, the layer's defaults otherwise: the paper's D_h = D_out, ``threshold=1e-7``), float32, CPU,
batch 1, on grids of ``--sides`` (default 16, 32, 64, 128, 256: 256 to 65,536 tokens), in two
modes: ``inference`` (forward under ``torch.no_grad()``) and ``training`` (forward + backward of
``y.sum()``, gradients to the input and every parameter).  The order ``structconv.explain`` reports is
recorded per side.

Variants, each on the same ``(1, s, s, 400)`` activations:

``structconv``
    The layer itself.
``paper dense``, ``sdpa``, ``sdpa qk``, ``flex``, ``natten``
    The peers of :mod:`benchmarks.bench_positional`, which compute the same function through an
    ``(H, N, N)`` softmax (torch ops, SDPA with a float mask, SDPA on positional queries and keys),
    compiled FlexAttention (forward only on the CPU) and NATTEN where it is found.  A peer runs
    only where it fits: its memory is estimated from ``(H, N, N)`` and ``(H, N, E)`` before it
    runs (:func:`estimate_bytes`; one float32 ``(H, N, N)`` is 9.7 GB at 128x128), and above
    ``--memory-budget-gb`` it is skipped with the reason recorded; so is a peer whose time per
    call, extrapolated quadratically in the tokens from the previous side, exceeds
    ``--time-budget-s``.  Each peer's relative difference from structconv
    is recorded (inference).
``conv 3x3``
    The yardstick, not the same function: ``torch.nn.Conv2d(400, 400, 3, padding=1)`` on
    ``x.permute(0, 3, 1, 2)`` (channels-last, as the layer's input is).

Measured per (variant, side, mode): the median of ``--repeats`` timed runs after one warm-up,
the variants interleaved in each round (their order reversed every other round), and the peak
memory of one more run: the growth of the process' peak RSS (``VmHWM`` after the run, reset
through ``/proc/self/clear_refs``, less ``VmRSS`` before it), or, where ``clear_refs`` cannot be
written, the same growth in a fresh subprocess.  Per side also the time and peak of building the
heads on a fresh layer (``layer.basis()``, the first build on that grid).  Derived: each
variant's time over the conv's (same side, mode and run), and structconv's per-token time growth
from 32x32 to the largest side.  Goal ("done when"), at the largest side: structconv's training
peak <= 8 GB and its time <= 3x the conv's (in both modes).  Memory is in MB and GB (10^6, 10^9
bytes).

    python -m benchmarks.bench_positional_scaling                                   # 16 .. 256
    python -m benchmarks.bench_positional_scaling --sides 16 32 64 --repeats 1 --out /tmp/scaling_try
    python -m benchmarks.bench_positional_scaling --skip flex natten --no-progress

Every variant runs with subnormal numbers flushed to zero on every thread
(:func:`benchmarks.harness.fp_environment`); ``--no-flush`` keeps them (``PREFIX`` then ends in
``_unflushed``).

Writes ``PREFIX.json`` (the rows, the heads' builds, the derived figures and a header naming the
torch version, threads, the floating-point environment, date and command), ``PREFIX.txt`` (the
printed table) and ``PREFIX.png`` (time and peak memory against tokens, log-log, inference and
training), ``PREFIX`` = ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import structconv
from benchmarks import bench_positional as bp
from benchmarks.harness import (
    Report,
    add_flush_option,
    current_environment,
    fp_environment,
    interleaved_times,
    timed_label,
)
from structconv.nn import PositionalAttention

Peer = Callable[[PositionalAttention, torch.Tensor], torch.Tensor]

MODES = ("inference", "training")
CONV = "conv 3x3"
VARIANTS = ("structconv", *bp.PEERS, CONV)
SIDES = (16, 32, 64, 128, 256)
GROWTH_FROM = 32
GOAL_PEAK_GB, GOAL_CONV = 8.0, 3.0
MB, GB = 1e6, 1e9
_MODULE = "benchmarks.bench_positional_scaling"
_ROOT = Path(__file__).resolve().parents[1]

# Float32 copies of (H, N, N) alive at a peer's peak, (inference, training): the peak measured at
# 64x64 (width 400, 9 heads) over one copy, rounded up, so that a peer is skipped before it would
# swap rather than after.  Compiled Flex on the CPU holds score blocks as large as the eager
# peers' (2.5 GB at 64x64); it and NATTEN have no CPU backward, so their training entry is unused.
FOOTPRINT: dict[str, tuple[int, int]] = {
    "paper dense": (3, 5),
    "sdpa": (4, 4),
    "sdpa qk": (3, 4),
    "flex": (5, 5),
    "natten": (4, 4),
}
VALUE_COPIES = 2  # and of (H, N, E): the values each head averages and its output


def estimate_bytes(peer: str, heads: int, tokens: int, width: int, training: bool) -> float:
    """Bytes a peer holds at its peak: float32 copies of ``(H, N, N)`` (:data:`FOOTPRINT`) and ``(H, N, E)``.

    Parameters
    ----------
    peer : str
        One of :data:`benchmarks.bench_positional.PEERS`.
    heads, tokens, width : int
        H, N and E.
    training : bool
        Forward + backward (the saved tensors and their gradients) or forward alone.

    Returns
    -------
    float
        The estimate in bytes.
    """
    scores = FOOTPRINT[peer][training] * heads * tokens * tokens
    return 4.0 * (scores + VALUE_COPIES * heads * tokens * width)


# ---------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------


def peer_functions(natten: bp.Natten | None) -> dict[str, Peer]:
    """The peers of :mod:`benchmarks.bench_positional` by name (NATTEN only where it was found)."""
    peers: dict[str, Peer] = {"paper dense": bp.paper_dense, "sdpa": bp.sdpa_masked, "sdpa qk": bp.sdpa_qk}
    peers["flex"] = bp.flex_peer
    if natten is not None:
        peers["natten"] = natten
    return peers


def fresh_layer(side: int, width: int, heads: int) -> PositionalAttention:
    """The layer on a ``side`` x ``side`` grid, drawn from seed 0 (the same parameters in every process)."""
    torch.manual_seed(0)
    return PositionalAttention((side, side), width, heads)


@dataclass
class Case:
    """The layer, the conv and the input of one side and mode; :meth:`step` runs a variant once."""

    layer: PositionalAttention
    conv: torch.nn.Conv2d
    x: torch.Tensor
    training: bool

    @classmethod
    def make(cls, side: int, width: int, heads: int, training: bool) -> Case:
        """The case of ``side`` and mode (``training``: the input and the parameters require grad)."""
        layer = fresh_layer(side, width, heads)
        conv = torch.nn.Conv2d(width, width, 3, padding=1)
        x = torch.randn(1, side, side, width).requires_grad_(training)
        return cls(layer, conv, x, training)

    def forward(self, variant: str, peers: dict[str, Peer]) -> Callable[[], torch.Tensor]:
        """The variant's forward on this case's input."""
        layer, conv, x = self.layer, self.conv, self.x
        if variant == "structconv":
            return lambda: layer(x)
        if variant == CONV:
            return lambda: torch.as_tensor(conv(x.permute(0, 3, 1, 2)))
        peer = peers[variant]
        return lambda: peer(layer, x.reshape(1, -1, x.shape[-1]))

    def step(self, variant: str, peers: dict[str, Peer]) -> Callable[[], None]:
        """One call: the forward under ``no_grad``, or forward + backward of ``y.sum()`` (gradients cleared)."""
        leaves = [self.x, *self.layer.parameters(), *self.conv.parameters()]
        return bp._step(self.forward(variant, peers), self.training, leaves)


# ---------------------------------------------------------------------------------------------
# Peak memory
# ---------------------------------------------------------------------------------------------


def can_reset_peak() -> bool:
    """Whether this process may reset its peak RSS (``/proc/self/clear_refs`` is writable: Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_mb(run: Callable[[], Any], child: Sequence[str], in_process: bool) -> float | None:
    """Growth of the peak RSS during one ``run()``, MB; in a subprocess (``child``, arguments) where it cannot be reset.

    In process this is :func:`benchmarks.bench_positional.peak_memory_mib` (blocks above 64 KiB
    mapped from the system for the call, so that the RSS follows the live tensors).
    """
    if in_process:
        mib = bp.peak_memory_mib(run)
        if mib is not None:
            return mib * 2**20 / MB
    return peak_in_subprocess(child)


def peak_in_subprocess(child: Sequence[str]) -> float | None:
    """Run ``python -m benchmarks.bench_positional_scaling --peak-child ...`` and read the peak it prints (MB)."""
    if not current_environment().measured:  # the child runs in this process's floating-point environment
        child = [*child, "--no-flush"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", _MODULE, *child], cwd=_ROOT, env=env, capture_output=True, text=True, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        print(f"peak in a subprocess failed: {done.stderr.strip()[-400:]}", file=sys.stderr)
        return None
    value = json.loads(lines[-1])["peak_mb"]
    return None if value is None else float(value)


def child_peak(variant: str, mode: str, side: int, width: int, heads: int) -> float | None:
    """In a fresh process, where the peak cannot be reset: the peak RSS after one call less the RSS before it, MB.

    The process has done nothing larger than importing torch and building the inputs, so its
    peak so far is about its RSS.  ``variant="build"`` builds the heads of a fresh layer.
    """
    if variant == "build":
        layer = fresh_layer(side, width, heads)
        run: Callable[[], Any] = layer.basis
    else:
        natten = bp.load_natten()[0] if variant == "natten" else None
        run = Case.make(side, width, heads, mode == "training").step(variant, peer_functions(natten))
    try:
        before = bp._status_kib("VmRSS")
        run()
        return (bp._status_kib("VmHWM") - before) * 1024 / MB
    except (OSError, KeyError):  # no /proc: not Linux
        return None


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One (variant, side, mode): its times, peak and ratio to the conv, or why it was not run."""

    side: int
    tokens: int
    variant: str
    mode: str
    median_s: float | None = None
    times: list[float] = field(default_factory=list)
    peak_mb: float | None = None
    order: str | None = None
    skipped: str | None = None
    ratio_to_conv: float | None = None
    error_vs_structconv: float | None = None
    estimate_gb: float | None = None


@dataclass
class Build:
    """The first build of the heads on a grid: ``layer.basis()`` on a fresh layer."""

    side: int
    tokens: int
    seconds: float
    peak_mb: float | None
    basis: str


@dataclass
class Settings:
    """What every side is measured with."""

    width: int
    heads: int
    repeats: int
    memory_budget_gb: float
    time_budget_s: float
    skip: Sequence[str]
    peers: dict[str, Peer]
    unavailable: dict[str, str]
    in_process_peak: bool


@dataclass
class History:
    """What the smaller sides showed: the peers that failed in training, each peer's last time per mode."""

    refused: dict[str, str] = field(default_factory=dict)
    last: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)  # (peer, mode) -> (tokens, s)


class Recorder:
    """A variant's step that times itself, and stops (keeping the error) once it has failed.

    :func:`benchmarks.harness.interleaved_times` gives medians only; the samples are kept here.
    One variant that fails (a backward the CPU refuses, memory running out) is dropped without
    losing the others.
    """

    def __init__(self, step: Callable[[], None]) -> None:
        self.step = step
        self.samples: list[float] = []
        self.error = ""

    def __call__(self) -> None:
        if self.error:
            return
        start = time.perf_counter()
        try:
            self.step()
        except Exception as err:  # whatever a peer raises: recorded with the row, the run goes on
            self.error = bp._short(err)
            return
        self.samples.append(time.perf_counter() - start)


def measure_build(side: int, s: Settings) -> Build:
    """Time the first build of the heads on this grid, then the peak of a build on another fresh layer.

    The first build fills the grid's offset caches, which are O(side) per axis (nothing of size
    N^2), so the second build's peak stands for the first's.
    """
    layer = fresh_layer(side, s.width, s.heads)
    start = time.perf_counter()
    basis = layer.basis()
    seconds = time.perf_counter() - start
    again = fresh_layer(side, s.width, s.heads)
    child = ["--peak-child", "build", "inference", str(side), "--width", str(s.width), "--heads", str(s.heads)]
    peak = peak_mb(again.basis, child, s.in_process_peak)
    return Build(side, side * side, seconds, peak, type(basis).__name__)


def why_not(peer: str, side: int, mode: str, s: Settings, seen: History) -> tuple[str | None, float]:
    """Why ``peer`` does not run at this side and mode (``None``: it runs), and its memory estimate in GB."""
    tokens, training = side * side, mode == "training"
    need = estimate_bytes(peer, s.heads, tokens, s.width, training) / GB
    if peer in s.unavailable:
        return f"skipped: {s.unavailable[peer]}", need
    if peer in s.skip:
        return "skipped (--skip)", need
    if need > s.memory_budget_gb:
        return f"skipped: needs {need:.1f} GB (estimated) > budget {s.memory_budget_gb:g} GB", need
    if training and peer in seen.refused:
        return f"skipped: {seen.refused[peer]}", need
    if (peer, mode) in seen.last:
        before, seconds = seen.last[peer, mode]
        guess = seconds * (tokens / before) ** 2  # attention over every pair: quadratic in the tokens
        if guess > s.time_budget_s:
            return f"skipped: ~{guess:.0f} s per call (extrapolated from {before} tokens) > {s.time_budget_s:g} s", need
    return None, need


def measure_side(side: int, mode: str, s: Settings, seen: History) -> list[Measurement]:
    """Every variant at one side and mode: the peers that fit checked, then all timed interleaved, then peaks.

    A peer that fails in training (Flex has no backward on the CPU) is not tried again at a larger side.
    """
    tokens, training = side * side, mode == "training"
    case = Case.make(side, s.width, s.heads, training)
    out = {v: Measurement(side, tokens, v, mode) for v in VARIANTS}
    order = structconv.explain(case.layer.basis(), case.x.detach().reshape(1, -1, s.width), case.layer.theta())
    out["structconv"].order = order.chosen
    with torch.no_grad():
        reference = case.layer(case.x)
    running = ["structconv"]
    for peer in bp.PEERS:
        reason, need = why_not(peer, side, mode, s, seen)
        out[peer].estimate_gb = need
        if reason is None and not training:
            reason = check(peer, case, s.peers, reference, out[peer])
        if reason is None:
            running.append(peer)
        else:
            out[peer].skipped = reason
    running.append(CONV)
    recorders = {v: Recorder(case.step(v, s.peers)) for v in running}
    # The samples are the recorders' own (after the warm-up): the harness gives the interleaving.
    interleaved_times(dict(recorders), repeats=s.repeats, warmup=1)
    for v, rec in recorders.items():
        row = out[v]
        if rec.error:
            row.skipped = f"failed: {rec.error}"
            if training and v in bp.PEERS:
                seen.refused[v] = f"failed in training at {side}x{side}: {rec.error}"
            continue
        row.times = rec.samples[1:]
        row.median_s = statistics.median(row.times)
        if v in bp.PEERS:
            seen.last[v, mode] = (tokens, row.median_s)
        child = ["--peak-child", v, mode, str(side), "--width", str(s.width), "--heads", str(s.heads)]
        row.peak_mb = peak_mb(rec.step, child, s.in_process_peak)
    conv_s = out[CONV].median_s
    for row in out.values():
        if row.median_s is not None and conv_s:
            row.ratio_to_conv = row.median_s / conv_s
    return list(out.values())


def check(peer: str, case: Case, peers: dict[str, Peer], reference: torch.Tensor, row: Measurement) -> str | None:
    """Run a peer once before timing it (which compiles Flex for this grid): its difference from structconv.

    Returns why it cannot be timed, or ``None``.
    """
    try:
        with torch.no_grad():
            got = case.forward(peer, peers)()
    except Exception as err:  # a peer that cannot run is recorded, not fatal: the others still run
        return f"failed: {bp._short(err)}"
    row.error_vs_structconv = bp.relative_error(got.reshape(reference.shape), reference)
    return None


# ---------------------------------------------------------------------------------------------
# Derived figures and the table
# ---------------------------------------------------------------------------------------------


def _find(rows: Sequence[Measurement], side: int, variant: str, mode: str) -> Measurement | None:
    return next((r for r in rows if (r.side, r.variant, r.mode) == (side, variant, mode)), None)


def growth(rows: Sequence[Measurement], mode: str) -> float | None:
    """structconv's time per token at the largest side over its time per token at 32x32 (``None``: not measured)."""
    largest = max(r.side for r in rows)
    first, last = _find(rows, GROWTH_FROM, "structconv", mode), _find(rows, largest, "structconv", mode)
    if largest <= GROWTH_FROM or first is None or last is None or first.median_s is None or last.median_s is None:
        return None
    return (last.median_s / last.tokens) / (first.median_s / first.tokens)


def done_when(rows: Sequence[Measurement]) -> dict[str, Any]:
    """The goal at the largest side: structconv's training peak <= 8 GB and time <= 3x the conv in each mode."""
    largest = max(r.side for r in rows)
    train, infer = _find(rows, largest, "structconv", "training"), _find(rows, largest, "structconv", "inference")
    peak = None if train is None or train.peak_mb is None else train.peak_mb * MB / GB
    ratios = {m: None if r is None else r.ratio_to_conv for m, r in (("inference", infer), ("training", train))}
    checks = [peak is not None and peak <= GOAL_PEAK_GB]
    checks += [ratio is not None and ratio <= GOAL_CONV for ratio in ratios.values()]
    return {"side": largest, "training_peak_gb": peak, "ratio_to_conv": ratios, "met": all(checks)}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _time_cell(r: Measurement | None) -> str:
    if r is None or r.median_s is None or r.ratio_to_conv is None:
        return "-"
    return f"{1e3 * r.median_s:.1f} ({r.ratio_to_conv:.2f}x)"


def done_line(done: dict[str, Any]) -> str:
    """The one-line verdict on :func:`done_when`."""
    ratios = done["ratio_to_conv"]
    return (
        f"done when (side {done['side']}): training peak {_fmt(done['training_peak_gb'], '.2f')} GB <= "
        f"{GOAL_PEAK_GB:g} GB and time <= {GOAL_CONV:g}x conv (inference {_fmt(ratios['inference'], '.2f')}x, "
        f"training {_fmt(ratios['training'], '.2f')}x): {'DONE' if done['met'] else 'NOT YET'}"
    )


def table(rows: Sequence[Measurement], builds: Sequence[Build], header: Sequence[str]) -> str:
    """Times (and their ratio to the conv), peaks, the heads' builds, the skips and the derived lines."""
    shown = [v for v in VARIANTS if any(r.variant == v for r in rows)]
    keys = sorted({(r.side, MODES.index(r.mode)) for r in rows})
    lead = f"{'side':>5}{'tokens':>8}  {'mode':<10}{'order':<8}"
    out = [*header, "", "median ms per call (x conv 3x3); - : not run, see below"]
    out.append(lead + "".join(f"{v:>19}" for v in shown))
    for side, m in keys:
        cells = [_time_cell(_find(rows, side, v, MODES[m])) for v in shown]
        own = _find(rows, side, "structconv", MODES[m])
        order = own.order if own and own.order else "-"
        out.append(f"{side:>5}{side * side:>8}  {MODES[m]:<10}{order:<8}" + "".join(f"{c:>19}" for c in cells))
    out += ["", "peak memory of one call, MB (growth of the process' peak RSS)"]
    out.append(lead + "".join(f"{v:>19}" for v in shown))
    for side, m in keys:
        peaks = [_find(rows, side, v, MODES[m]) for v in shown]
        cells = [_fmt(None if r is None else r.peak_mb, ".0f") for r in peaks]
        out.append(f"{side:>5}{side * side:>8}  {MODES[m]:<10}{'':<8}" + "".join(f"{c:>19}" for c in cells))
    out += ["", "building the heads (first layer.basis() on each grid): seconds, peak MB, basis"]
    out += [f"{b.side:>5}{b.tokens:>8}  {b.seconds:8.3f} s {_fmt(b.peak_mb, '8.1f')} MB  {b.basis}" for b in builds]
    skips: dict[str, list[str]] = {}
    for r in rows:
        if r.skipped:
            skips.setdefault(r.skipped, []).append(f"{r.variant} {r.side} {r.mode}")
    if skips:
        out += ["", "not run"]
        out += [f"- {why}\n    ({', '.join(where)})" for why, where in skips.items()]
    errors = [f"{r.variant} {r.side}: {r.error_vs_structconv:.1e}" for r in rows if r.error_vs_structconv is not None]
    if errors:
        out += ["", "max relative difference from structconv (inference, float32): " + ", ".join(errors)]
    out.append("")
    for mode in MODES:
        g = growth(rows, mode)
        largest = max(r.side for r in rows)
        out.append(
            f"structconv {mode}: time per token at {largest}x{largest} / at {GROWTH_FROM}x{GROWTH_FROM} = "
            + ("- (needs 32 and a larger side)" if g is None else f"{g:.2f}")
        )
    out.append(done_line(done_when(rows)))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------------------------


def plot(rows: Sequence[Measurement], path: Path, title: str) -> None:
    """2x2 panels, log-log: time and peak memory (rows) against tokens, inference and training (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5), squeeze=False)
    tokens = sorted({r.tokens for r in rows})
    for j, mode in enumerate(MODES):
        for i, (what, unit) in enumerate((("median_s", "time per call, ms"), ("peak_mb", "peak memory, MB"))):
            ax = axes[i][j]
            for v in VARIANTS:
                pts = [(r.tokens, getattr(r, what)) for r in rows if r.variant == v and r.mode == mode]
                pts = [(n, 1e3 * y if what == "median_s" else y) for n, y in pts if y is not None and y > 0]
                if pts:
                    colour, marker, style = bp.STYLE[v]
                    ax.plot(*zip(*sorted(pts), strict=True), color=colour, marker=marker, linestyle=style, label=v)
            own = sorted((r.tokens, r.median_s) for r in rows if r.variant == "structconv" and r.mode == mode)
            anchor = [(n, 1e3 * t) for n, t in own if t]
            if what == "median_s" and anchor:  # linear in the tokens through structconv's first point: its bend shows
                ref = [anchor[0][1] * n / anchor[0][0] for n in tokens]
                ax.plot(tokens, ref, color="black", linestyle="--", linewidth=0.8, label="slope 1 (time ∝ tokens)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(tokens, [f"{n}\n({math.isqrt(n)}²)" for n in tokens], fontsize=7)
            ax.minorticks_off()
            ax.grid(True, which="major", linewidth=0.3)
            ax.set_title(f"{unit.split(',')[0]}, {mode}", fontsize=10)
            ax.set_xlabel("tokens (grid)", fontsize=8)
            ax.set_ylabel(f"{unit} (log)", fontsize=8)
            ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", type=int, nargs="+", default=list(SIDES), help="grid sides (default 16 .. 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per variant after one warm-up (default 3)")
    parser.add_argument("--memory-budget-gb", type=float, default=6.0, help="skip a peer estimated above it (6)")
    parser.add_argument("--time-budget-s", type=float, default=60.0, help="skip a peer extrapolated above it (60)")
    parser.add_argument("--width", type=int, default=bp.WIDTH, help=f"embedding width E (default {bp.WIDTH})")
    parser.add_argument("--heads", type=int, default=bp.HEADS, help=f"quadratic heads H (default {bp.HEADS})")
    parser.add_argument("--skip", nargs="*", default=[], choices=bp.PEERS, help="peers not to run")
    parser.add_argument("--out", default="docs/_static/positional/scaling_cpu", help="prefix of the .json/.txt/.png")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_flush_option(parser)
    parser.add_argument("--peak-child", nargs=3, metavar=("VARIANT", "MODE", "SIDE"), help=argparse.SUPPRESS)
    return parser


def _progress(total: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, disable=not enabled, file=sys.stderr, dynamic_ncols=True, leave=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the table and the verdict, write ``--out`` .json, .txt and .png."""
    args = _parser().parse_args(argv)
    fp = fp_environment(not args.no_flush)
    if args.peak_child:  # the subprocess of peak_in_subprocess
        variant, mode, side = args.peak_child
        print(json.dumps({"peak_mb": child_peak(variant, mode, int(side), args.width, args.heads)}))
        return 0
    bp.steady_allocator()  # every timed call under one allocator policy (the peak measurement changes it)
    if "flex" not in args.skip:  # importing dynamo alone takes seconds
        torch._dynamo.config.recompile_limit = 64  # Flex compiles once per grid
    natten, natten_note = bp.load_natten() if "natten" not in args.skip else (None, "skipped")
    settings = Settings(
        width=args.width,
        heads=args.heads,
        repeats=args.repeats,
        memory_budget_gb=args.memory_budget_gb,
        time_budget_s=args.time_budget_s,
        skip=args.skip,
        peers=peer_functions(natten),
        unavailable={} if natten is not None or "natten" in args.skip else {"natten": natten_note},
        in_process_peak=can_reset_peak(),
    )
    sides = sorted(set(args.sides))
    rows: list[Measurement] = []
    builds: list[Build] = []
    seen = History()
    started = time.perf_counter()
    bar = _progress(len(sides) * (1 + len(MODES)), not args.no_progress)
    for side in sides:
        bar.set_description(f"{side}x{side} heads")
        builds.append(measure_build(side, settings))
        bar.update()
        for mode in MODES:
            bar.set_description(f"{side}x{side} {mode}")
            rows += measure_side(side, mode, settings, seen)
            bar.update()
    bar.close()
    elapsed = time.perf_counter() - started

    threads = torch.get_num_threads()
    command = shlex.join(["python", "-m", _MODULE, *(sys.argv[1:] if argv is None else argv)])
    title = (
        f"PositionalAttention: width {args.width}, {args.heads} quadratic heads, batch 1 "
        f"(float32, CPU, {threads} threads), against peers and a 3x3 conv"
    )
    header = {
        **Report(_MODULE).environment(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "width": args.width,
        "heads": args.heads,
        "batch": 1,
        "repeats": args.repeats,
        "memory_budget_gb": args.memory_budget_gb,
        "time_budget_s": args.time_budget_s,
        "peak_memory": "in process (clear_refs)" if settings.in_process_peak else "subprocess",
        "natten": natten_note,
        "seconds": elapsed,
    }
    derived = {"growth_per_token": {m: growth(rows, m) for m in MODES}, "done_when": done_when(rows)}
    lines = [
        fp.sentence(timed_label()),
        f"{title}; torch {torch.__version__}; {args.repeats} interleaved repeat(s); {elapsed / 60:.1f} min",
        f"NATTEN: {natten_note}",
    ]
    text = table(rows, builds, lines)
    prefix = Path(args.out + fp.suffix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    js, txt, png = (prefix.with_name(prefix.name + ext) for ext in (".json", ".txt", ".png"))
    payload = {"header": header, "rows": [asdict(r) for r in rows], "builds": [asdict(b) for b in builds]}
    js.write_text(json.dumps(payload | {"derived": derived}, indent=2))
    txt.write_text(text + "\n")
    plot(rows, png, title)
    print(text)
    print(f"wrote {js}, {txt} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
