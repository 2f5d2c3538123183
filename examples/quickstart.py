"""structconv in a screenful: one formula, three representations, one engine.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import torch

from structconv import (
    ComposedBasis,
    DenseBasis,
    LowRank,
    SparseBasis,
    compose,
    concat,
    conv,
    explain,
)


def main() -> None:
    torch.manual_seed(0)
    B, M, N, P, Q = 8, 200, 150, 32, 64
    # A sparse basis: three random weighted graphs from 200 inputs to 150 outputs.
    mask = torch.rand(3, M, N) < 0.02
    A = SparseBasis.from_dense(torch.randn(3, M, N) * mask)
    x, theta = torch.randn(B, M, P), torch.randn(3, P, Q)

    y = conv(A, x, theta)
    reference = torch.einsum("kmn,bmp,kpq->bnq", A.to_dense(), x, theta)
    error = (y - reference).abs().max()
    print("y:", tuple(y.shape), "max |y - einsum|:", f"{error:.2e}")
    print(explain(A, x, theta))

    # More heads: concatenate with a dense member; low-rank (multi-head) parameter.
    heads = concat([A, DenseBasis(torch.eye(M, N)[None])])
    theta_lr = LowRank(torch.randn(heads.K, P, 16), torch.randn(heads.K, Q, 16))
    print("4 heads, low-rank parameter:", tuple(conv(heads, x, theta_lr).shape))

    # Proposition 3: two convolutions in sequence are one convolution with K = K'K''.
    A2 = SparseBasis.from_dense(torch.randn(2, N, N) * (torch.rand(2, N, N) < 0.02))
    theta2 = torch.randn(2, Q, Q)
    fused, fused_theta = compose(A, theta, A2, theta2)
    lazy = ComposedBasis(A, A2)
    sequence = conv(A2, conv(A, x, theta), theta2)
    for basis in (fused, lazy):
        fused_y = conv(basis, x, fused_theta)
        error = (fused_y - sequence).abs().max() / sequence.abs().max()
        print(f"{basis.representation} basis K={basis.K}: relative error {error:.1e}")


if __name__ == "__main__":
    main()
