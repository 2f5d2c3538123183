"""How large must alpha be for soft quadratic attention to reproduce a convolution?

Builds ``conv_to_attention`` heads for a random 3x3 kernel (8 -> 16 channels) on a 12x12
periodic grid and prints, for float32 and float64, the relative error against ``F.conv2d``
(circular padding) as alpha grows, next to ``attention_alpha_bound``.

    python -m benchmarks.alpha_scan
"""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812

from structconv import conv
from structconv.theory import attention_alpha_bound, conv_to_attention

ALPHAS = (5.0, 10.0, 15.0, 18.0, 20.0, 25.0, 30.0, 35.0, 40.0, 46.0)


def main() -> int:
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(4, 8, 12, 12, dtype=dtype)
        weight = torch.randn(16, 8, 3, 3, dtype=dtype) / 5
        ref = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="circular"), weight)
        print(f"{dtype}: attention_alpha_bound = {attention_alpha_bound(dtype):.1f}")
        for alpha in ALPHAS:
            basis, theta, _ = conv_to_attention(weight, (12, 12), alpha=alpha, padding_mode="circular")
            y = conv(basis, x.flatten(2).transpose(1, 2), theta).transpose(1, 2).reshape(ref.shape)
            err = float((y - ref).abs().max() / ref.abs().max())
            print(f"  alpha {alpha:5.1f}: relative error {err:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
