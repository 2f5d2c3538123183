"""Attention through the engine against its peers, forward and forward+backward.

Content attention: ``structconv.nn.MultiHeadSelfAttention`` (the engine's ``"sdpa"`` order)
against ``torch.nn.MultiheadAttention`` with the same weights (eval mode, so that its native
fast path runs in the forward; dropout 0), on T = 256 (width 400, 8 heads, batch 100) and
T = 1024 (width 512, 8 heads, batch 32).  Goal: <= 1.15x.

Positional attention: ``structconv.nn.PositionalAttention`` (quadratic heads, built once per
forward and shared by the batch) against a paper-faithful dense implementation written here:
scores from the relative encoding for every image, a per-image T x T softmax, the value einsum
and the output projection, on 16x16 tokens, 9 heads, width 400, batch 100.  Two head widths:
the paper's D_h = D_out (each head keeps all 400 input channels, then one 3600 -> 400 linear)
and D_h = 44 (value and output projections, as in a Transformer).  Outputs must agree to 1e-5
(relative to the largest output).  Goal: >= 3x faster.  The same rows also time a 3x3
convolution of the same channels (``F.conv2d``, width 400 to 400, on the 16x16 grid), the layer
the attention is meant to be able to replace; goal: at most 0.4x its time with D_h = 44 and
2.0x with D_h = D_out, against FLOP ratios of 0.29 and 1.64.

    python -m benchmarks.bench_attention                 # the full table (about 10 minutes on 2 cores)
    python -m benchmarks.bench_attention --scale 0.25    # batches scaled down, a quick look
    python -m benchmarks.bench_attention --device cuda   # the same on a GPU
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812

from benchmarks.harness import Report, Row, interleaved_times, progress, publish
from structconv.experiments.cifar.reference import paper_dense
from structconv.nn import MultiHeadSelfAttention, PositionalAttention

CONTENT = ((256, 400, 8, 100), (1024, 512, 8, 32))  # T, width, heads, batch
POSITIONAL = ((16, 400, 9, 100, None), (16, 400, 9, 100, 44))  # side, width, heads, batch, head_dim
GOAL_CONTENT, GOAL_POSITIONAL = 1.15, 3.0
GOAL_CONV3X3 = {False: 0.4, True: 2.0}  # positional layer / 3x3 conv of the same channels: D_h = 44, D_h = D_out


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


def positional_row(
    side: int, E: int, H: int, B: int, head_dim: int | None, backward: bool, repeats: int, device: str
) -> Row:
    torch.manual_seed(0)
    layer = PositionalAttention((side, side), E, H, head_dim=head_dim).to(device)
    x = torch.randn(B, side * side, E, device=device, requires_grad=backward)
    image = torch.randn(B, E, side, side, device=device, requires_grad=backward)
    kernel = torch.randn(E, E, 3, 3, device=device, requires_grad=backward)
    variants = {
        "paper dense": lambda: paper_dense(layer, x),
        "structconv": lambda: layer(x),
        "conv 3x3": lambda: F.conv2d(image, kernel, padding=1),
    }
    with torch.no_grad():
        err = _check("PositionalAttention", variants["structconv"](), variants["paper dense"](), 1e-5)
    leaves = [x, image, kernel, *layer.parameters()]
    times = interleaved_times(
        {n: _step(f, backward, leaves) for n, f in variants.items()}, repeats=repeats, warmup=1, device=device
    )
    mode = "fwd+bwd" if backward else "fwd"
    dh = "D_out" if head_dim is None else str(head_dim)
    params = {"side": side, "E": E, "heads": H, "B": B, "head_dim": dh, "pass": mode}
    basis = layer.basis()
    extra = {
        "max_rel_err": err,
        "basis": type(basis).__name__,
        "ratio_to_conv3x3": times["structconv"] / times["conv 3x3"],
        "flop_ratio_to_conv3x3": _flop_ratio(side * side, E, H, head_dim),
    }
    return Row(f"positional {side}x{side} D_h={dh} B={B} {mode}", params, times, "paper dense", extra)


def _flop_ratio(T: int, E: int, H: int, head_dim: int | None) -> float:
    """Multiply-adds of the attention layer (value and output maps, aggregation) over those of a 3x3 conv E -> E."""
    conv = 9 * T * E * E
    if head_dim is None:  # each head keeps E channels: H maps E x E, H aggregations of width E
        return (H * T * E * E + H * T * T * E) / conv
    return (2 * H * T * E * head_dim + H * T * T * head_dim) / conv


def table(rows: list[Row]) -> str:
    lines = ["times in ms; ratio = structconv / peer", f"{'case':<44}{'peer':>12}{'structconv':>12}{'ratio':>8}  check"]
    for r in rows:
        lines.append(
            f"{r.case:<44}{1e3 * r.times[r.peer]:>12.1f}{1e3 * r.times['structconv']:>12.1f}"
            f"{r.ratio('structconv'):>8.2f}  rel err {r.extra['max_rel_err']:.1e}"
        )
    content = [r.ratio("structconv") for r in rows if r.case.startswith("content")]
    positional = [1 / r.ratio("structconv") for r in rows if r.case.startswith("positional")]
    if content:
        lines.append(f"content: worst ratio {max(content):.2f} (target <= {GOAL_CONTENT})")
    if positional:
        lines.append(f"positional: smallest speed-up {min(positional):.2f}x (target >= {GOAL_POSITIONAL}x)")
    for r in rows:
        if "ratio_to_conv3x3" in r.extra:
            goal = GOAL_CONV3X3[r.params["head_dim"] == "D_out"]
            lines.append(
                f"{r.case}: {r.extra['ratio_to_conv3x3']:.2f}x the time of a 3x3 conv of the same channels "
                f"(FLOP ratio {r.extra['flop_ratio_to_conv3x3']:.2f}; target <= {goal})"
            )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    """Bar chart of structconv's time over the peer's for every case, with the goals drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(rows)), 4.5))
    colours = ["tab:blue" if r.case.startswith("content") else "tab:green" for r in rows]
    ax.bar(range(len(rows)), [r.ratio("structconv") for r in rows], color=colours)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(GOAL_CONTENT, color="tab:blue", linestyle="--", linewidth=0.8, label=f"content target {GOAL_CONTENT}x")
    ax.axhline(
        1 / GOAL_POSITIONAL,
        color="tab:green",
        linestyle="--",
        linewidth=0.8,
        label=f"positional target 1/{GOAL_POSITIONAL:g}",
    )
    ax.set_xticks(range(len(rows)), [r.case for r in rows], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("time / time of the peer")
    ax.set_title("Attention through structconv (median of interleaved runs)")
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
    args = parser.parse_args(argv)

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
    for side, E, H, B, hd in POSITIONAL:
        for bwd in (False, True):
            name = f"positional {side}x{side} D_h={hd or 'D_out'} B={batch(B)} {'fwd+bwd' if bwd else 'fwd'}"
            jobs.append(
                (
                    name,
                    lambda side=side, E=E, H=H, B=B, hd=hd, bwd=bwd: positional_row(
                        side, E, H, batch(B), hd, bwd, args.repeats, args.device
                    ),
                )
            )
    jobs = [j for j in jobs if args.only in j[0]]
    report = Report(f"attention_{args.device.split(':')[0]}")
    for i, (name, job) in enumerate(jobs, start=1):
        progress(i, len(jobs), name)
        report.rows.append(job())
    text = table(report.rows)
    content = [r.ratio("structconv") for r in report.rows if r.case.startswith("content")]
    positional = [1 / r.ratio("structconv") for r in report.rows if r.case.startswith("positional")]
    report.summary = {
        "worst_content_ratio": max(content) if content else None,
        "smallest_positional_speedup": min(positional) if positional else None,
    }
    publish(report, args.out, text, plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
