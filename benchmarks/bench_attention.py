"""Content attention through the engine against torch's, forward and forward+backward.

``structconv.nn.MultiHeadSelfAttention`` (the engine's ``"sdpa"`` order) against
``torch.nn.MultiheadAttention`` with the same weights (eval mode, so that its native fast path
runs in the forward; dropout 0), on T = 256 (width 400, 8 heads, batch 100) and T = 1024
(width 512, 8 heads, batch 32).  Goal: <= 1.15x.

Position-only attention (``structconv.nn.PositionalAttention``) is timed by
``benchmarks/bench_positional.py``, against the paper's dense computation, SDPA, Flex attention,
NATTEN and a 3x3 convolution, on 16x16 to 64x64 grids.

    python -m benchmarks.bench_attention                 # the full table
    python -m benchmarks.bench_attention --scale 0.25    # batches scaled down, a quick look
    python -m benchmarks.bench_attention --device cuda   # the same on a GPU

Every variant runs with subnormal numbers flushed to zero on every CPU thread
(:func:`benchmarks.harness.fp_environment`); ``--no-flush`` keeps them (``_unflushed`` record).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, interleaved_times, progress, publish
from structconv.nn import MultiHeadSelfAttention

CONTENT = ((256, 400, 8, 100), (1024, 512, 8, 32))  # T, width, heads, batch
GOAL_CONTENT = 1.15


def _step(fn: Any, backward: bool, leaves: list[torch.Tensor]) -> Any:
    def run() -> None:
        if not backward:
            with torch.no_grad():
                fn()
            return
        y = fn()
        y.backward(torch.ones_like(y))
        for t in leaves:
            t.grad = None

    return run


def _check(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    err = float((got - ref).abs().max()) / float(ref.abs().max())
    if err > tol:
        raise AssertionError(f"{name} disagrees with the peer: relative error {err:.2e} > {tol:g}")
    return err


def content_row(T: int, E: int, H: int, B: int, backward: bool, repeats: int, device: str) -> Row:
    torch.manual_seed(0)
    peer = torch.nn.MultiheadAttention(E, H, batch_first=True, device=device)
    torch.nn.init.normal_(peer.in_proj_bias, std=0.02)
    ours = MultiHeadSelfAttention(E, H, batch_first=True, device=device)
    ours.load_state_dict(peer.state_dict())
    peer.train(backward)  # eval: torch's native fast path in the forward
    x = torch.randn(B, T, E, device=device, requires_grad=backward)
    variants = {
        "torch MHA": lambda: peer(x, x, x, need_weights=False)[0],
        "structconv": lambda: ours(x, x, x, need_weights=False)[0],
    }
    with torch.no_grad():
        err = _check("MultiHeadSelfAttention", variants["structconv"](), variants["torch MHA"](), 1e-4)
    leaves = [x, *ours.parameters(), *peer.parameters()]
    times = interleaved_times(
        {n: _step(f, backward, leaves) for n, f in variants.items()}, repeats=repeats, warmup=1, device=device
    )
    mode = "fwd+bwd" if backward else "fwd"
    params = {"T": T, "E": E, "heads": H, "B": B, "pass": mode}
    return Row(f"content T={T} E={E} B={B} {mode}", params, times, "torch MHA", {"max_rel_err": err})


def table(rows: list[Row]) -> str:
    lines = ["times in ms; ratio = structconv / peer", f"{'case':<44}{'peer':>12}{'structconv':>12}{'ratio':>8}  check"]
    for r in rows:
        lines.append(
            f"{r.case:<44}{1e3 * r.times[r.peer]:>12.1f}{1e3 * r.times['structconv']:>12.1f}"
            f"{r.ratio('structconv'):>8.2f}  rel err {r.extra['max_rel_err']:.1e}"
        )
    content = [r.ratio("structconv") for r in rows]
    if content:
        lines.append(f"content: worst ratio {max(content):.2f} (target <= {GOAL_CONTENT})")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    """Bar chart of structconv's time over the peer's for every case, with the goals drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(rows)), 4.5))
    ax.bar(range(len(rows)), [r.ratio("structconv") for r in rows], color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(GOAL_CONTENT, color="tab:blue", linestyle="--", linewidth=0.8, label=f"content target {GOAL_CONTENT}x")
    ax.set_xticks(range(len(rows)), [r.case for r in rows], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("time / time of the peer")
    ax.set_title("Content attention through structconv (median of interleaved runs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every batch size (e.g. 0.25)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    add_flush_option(parser)
    args = parser.parse_args(argv)
    fp = fp_environment(not args.no_flush)

    def batch(b: int) -> int:
        return max(1, round(b * args.scale))

    jobs: list[tuple[str, Any]] = []
    for T, E, H, B in CONTENT:
        for bwd in (False, True):
            name = f"content T={T} E={E} B={batch(B)} {'fwd+bwd' if bwd else 'fwd'}"
            jobs.append(
                (
                    name,
                    lambda T=T, E=E, H=H, B=B, bwd=bwd: content_row(T, E, H, batch(B), bwd, args.repeats, args.device),
                )
            )
    jobs = [j for j in jobs if args.only in j[0]]
    report = Report(f"attention_{args.device.split(':')[0]}{fp.suffix}")
    for i, (name, job) in enumerate(jobs, start=1):
        progress(i, len(jobs), name)
        report.rows.append(job())
    text = table(report.rows)
    content = [r.ratio("structconv") for r in report.rows]
    report.summary = {"worst_content_ratio": max(content) if content else None}
    publish(report, args.out, text, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
