"""Does ``order="auto"`` pick a good side of the triangle?

For random (B, K, M, N, P, Q, density, representation) configurations, time each order
(``ax``, ``xtheta``, ``atheta``) and ``auto``; the peer is the fastest order measured in the same
run.  The target: auto within 1.2x of the best order in at least 95 % of configurations.

    python -m benchmarks.bench_orders --configs 60 --seed 0

Every order runs with subnormal numbers flushed to zero on every CPU thread
(:func:`benchmarks.harness.fp_environment`); ``--no-flush`` keeps them (``_unflushed`` record).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import Report, Row, add_flush_option, fp_environment, median_time, progress
from structconv import DenseBasis, SparseBasis, conv, explain

ORDERS = ("ax", "xtheta", "atheta")
#: Above this many elements the A.Theta-first tensor Phi (M*N*P*Q) is not timed: it would not fit
#: the machine's memory or time budget, and the planner's cost for it is correspondingly huge.
PHI_LIMIT = 3e7


def random_config(rng: np.random.Generator) -> dict[str, Any]:
    def logint(lo: int, hi: int) -> int:
        return round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))))

    return {
        "B": logint(1, 64),
        "K": logint(1, 27),
        "M": logint(4, 400),
        "N": logint(4, 400),
        "P": logint(1, 128),
        "Q": logint(1, 128),
        "density": float(rng.choice([0.01, 0.05, 0.2, 0.5, 1.0])),
        "representation": str(rng.choice(["dense", "sparse"])),
    }


def build(cfg: dict[str, Any], rng: np.random.Generator, device: str, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    shape = (cfg["K"], cfg["M"], cfg["N"])
    A = rng.normal(size=shape) * (rng.random(shape) < cfg["density"])
    A_t = torch.from_numpy(A).to(device=device, dtype=dtype)
    basis = DenseBasis(A_t) if cfg["representation"] == "dense" else SparseBasis.from_dense(A_t)
    x = torch.randn(cfg["B"], cfg["M"], cfg["P"], device=device, dtype=dtype)
    theta = torch.randn(cfg["K"], cfg["P"], cfg["Q"], device=device, dtype=dtype)
    return basis, x, theta


def time_orders(basis: Any, x: Any, theta: Any, cfg: dict[str, Any], repeats: int, device: str) -> dict[str, float]:
    """Median time of each order that fits in memory, and of ``auto``."""
    times: dict[str, float] = {}
    with torch.no_grad():
        for order in ORDERS:
            if order == "atheta" and cfg["M"] * cfg["N"] * cfg["P"] * cfg["Q"] > PHI_LIMIT:
                continue
            times[order] = median_time(lambda o=order: conv(basis, x, theta, order=o), repeats, 1, device)
        times["auto"] = median_time(lambda: conv(basis, x, theta), repeats, 1, device)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--goal", type=float, default=1.2, help="auto counts as good within this factor of the best")
    add_flush_option(parser)
    args = parser.parse_args(argv)
    fp = fp_environment(not args.no_flush)

    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    report = Report(f"orders_{args.device.split(':')[0]}{fp.suffix}")
    for i in range(args.configs):
        cfg = random_config(rng)
        progress(i + 1, args.configs, str({k: cfg[k] for k in ("B", "K", "M", "N", "P", "Q")}))
        basis, x, theta = build(cfg, rng, args.device, torch.float32)
        plan = explain(basis, x, theta)
        times = time_orders(basis, x, theta, cfg, args.repeats, args.device)
        best = min((o for o in ORDERS if o in times), key=times.__getitem__)
        times["best"] = times[best]
        costs = {c.order: {"flops": c.flops, "memory": c.memory, "irregular": c.irregular} for c in plan.candidates}
        report.rows.append(
            Row("sweep", cfg, times, "best", {"chosen": plan.chosen, "best_order": best, "costs": costs})
        )

    ratios = np.array([r.ratio("auto") for r in report.rows])
    good = float(np.mean(ratios <= args.goal))
    report.summary = {
        "configs": len(ratios),
        "goal": f"auto <= {args.goal}x best in >= 95% of configurations",
        "fraction_within_goal": good,
        "median_ratio": float(np.median(ratios)),
        "worst_ratio": float(ratios.max()),
        "chosen_is_fastest": float(np.mean([r.extra["chosen"] == r.extra["best_order"] for r in report.rows])),
    }
    lines = [
        f"{'B':>3} {'K':>3} {'M':>4} {'N':>4} {'P':>4} {'Q':>4} {'dens':>5} {'repr':>6} | "
        f"{'ax ms':>8} {'xtheta ms':>9} {'atheta ms':>9} {'auto ms':>8} | {'chosen':>7} {'best':>7} {'auto/best':>9}"
    ]
    for r in report.rows:
        p, t = r.params, r.times

        def ms(o: str, t: dict[str, float] = t) -> str:
            return f"{t[o] * 1e3:.3f}" if o in t else "-"

        lines.append(
            f"{p['B']:>3} {p['K']:>3} {p['M']:>4} {p['N']:>4} {p['P']:>4} {p['Q']:>4} {p['density']:>5} "
            f"{p['representation']:>6} | {ms('ax'):>8} {ms('xtheta'):>9} {ms('atheta'):>9} {ms('auto'):>8} | "
            f"{r.extra['chosen']:>7} {r.extra['best_order']:>7} {r.ratio('auto'):>9.2f}"
        )
    s = report.summary
    lines.append(
        f"auto within {args.goal}x of the best order in {good:.1%} of {s['configs']} configurations "
        f"(median ratio {s['median_ratio']:.2f}, worst {s['worst_ratio']:.2f}; "
        f"auto chose the fastest order in {s['chosen_is_fastest']:.0%})"
    )
    table = "\n".join(lines)
    js, txt = report.write(args.out, table)
    print(report.text(table))
    print(f"wrote {js} and {txt}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
