"""Chebyshev spectral convolution: the Chebyshev polynomials of the scaled Laplacian."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..backend import of
from ..backend.checks import positive_int
from ..bases.base import Basis
from ..structures.graph import PolynomialBasis, _largest_eigenvalue, laplacian
from .graph_common import _features, _GraphLayer, _read


class ChebConv(_GraphLayer):
    r"""Chebyshev spectral convolution (Defferrard et al.): one member per Chebyshev polynomial of the Laplacian.

    Basis: the Chebyshev polynomials :math:`T_0(\hat L) = I, \dots, T_{K-1}(\hat L)` of the scaled Laplacian
    :math:`\hat L = 2L/\lambda_{\max} - I`, a :class:`~structconv.PolynomialBasis` (K = ``K``)

    Θ: ``weight``, one channel map per polynomial, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math:: y = \sum_{k<K} T_k(\hat L)^\top x\,\Theta_k + \beta,
              \qquad T_0 = I,\ T_1 = \hat L,\ T_k = 2\hat L\,T_{k-1} - T_{k-2}.

    A drop-in for PyG's ``ChebConv``, derived and compared in ``docs/graph.rst``, which also says
    how :math:`\lambda_{\max}` is found.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    K : int
        The number of polynomials (members); :math:`K - 1` hops.
    normalization : {"sym", "rw", None}, default "sym"
        The Laplacian: :math:`I - D^{-1/2}AD^{-1/2}`, :math:`I - D^{-1}A` or :math:`D - A`.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    lambda_max : float or "auto", optional
        :math:`\lambda_{\max}` where ``forward`` gives none; ``"auto"``: the largest eigenvalue;
        ``None`` (the default): PyG's, twice the largest entry of :math:`L`.  Keyword-only.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)` or :math:`(B, N, P)`; ``edge_index`` :math:`(2, E)`, a
      sparse ``adj_t`` :math:`(N, N)` or a :class:`~structconv.Basis`; ``edge_weight`` :math:`(E,)`,
      ``batch`` :math:`(N,)`, ``lambda_max`` :math:`(G,)` for :math:`G` graphs (all optional)
    - **output:** :math:`(N, Q)` or :math:`(B, N, Q)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import ChebConv
    >>> x, layer = torch.randn(4, 3), ChebConv(3, 2, 2)
    >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    >>> A = torch.zeros(4, 4)
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> d = A.sum(0).rsqrt()
    >>> L_hat = -(d[:, None] * A * d)  # "sym", lambda_max = 2: L_hat = L - I
    >>> y = x @ layer.weight[0] + L_hat.T @ x @ layer.weight[1] + layer.bias
    >>> torch.allclose(layer(x, edge_index), y, atol=1e-6)
    True
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int,
        normalization: str | None = "sym",
        bias: bool = True,
        *,
        lambda_max: float | str | None = None,
    ) -> None:
        self.K = positive_int(K, "K", where="ChebConv")
        if normalization not in ("sym", "rw", None):
            raise ValueError(f"ChebConv: normalization must be 'sym', 'rw' or None, got {normalization!r}")
        if (
            lambda_max is not None
            and lambda_max != "auto"
            and (
                isinstance(lambda_max, bool) or not isinstance(lambda_max, int | float) or not 0 < lambda_max < math.inf
            )
        ):
            raise ValueError(f"ChebConv: lambda_max must be a positive number, 'auto' or None, got {lambda_max!r}")
        super().__init__(in_channels, out_channels, self.K, bias=bias, flow="source_to_target")
        self.normalization, self.lambda_max = normalization, lambda_max
        self.draw_as_built()
        self.reset_parameters()

    def forward(
        self,
        x: torch.Tensor,
        edge_index: Any,
        edge_weight: torch.Tensor | None = None,
        batch: torch.Tensor | None = None,
        lambda_max: torch.Tensor | float | None = None,
    ) -> torch.Tensor:
        """Apply the layer; ``batch`` (``(N,)`` graph of each node) goes with a per-graph ``lambda_max``."""
        _check_prebuilt(edge_index, batch, lambda_max)
        return self._run(x, edge_index, edge_weight, batch=batch, lambda_max=lambda_max)

    def basis(
        self,
        x: torch.Tensor,
        edge_index: Any,
        edge_weight: torch.Tensor | None = None,
        batch: torch.Tensor | None = None,
        lambda_max: torch.Tensor | float | None = None,
    ) -> Basis:
        """The Chebyshev basis :math:`T_k(\\hat L)`, :math:`k < K`, on ``edge_index`` (arguments as :meth:`forward`)."""
        _check_prebuilt(edge_index, batch, lambda_max)
        if isinstance(edge_index, Basis):
            return super().basis(x, edge_index, edge_weight)
        x = _features(x, self.in_channels, "ChebConv")
        return self._built(x, edge_index, edge_weight, batch=batch, lambda_max=lambda_max)

    def _basis(
        self,
        x: torch.Tensor,
        graph: Any,
        edge_weight: torch.Tensor | None,
        batch: torch.Tensor | None = None,
        lambda_max: torch.Tensor | float | None = None,
    ) -> Basis:
        lap = laplacian(_read(graph, x, edge_weight, "ChebConv"), self.normalization)
        w = lap.weight
        lam: Any = lambda_max if lambda_max is not None else self.lambda_max
        if lam is None:
            lam = 2.0 * w.max()  # PyG's default (differentiable, as PyG's)
            of(lam).check_all(
                lam.detach() > 0,
                "ChebConv: the default lambda_max, twice the largest entry of L, is 0 (normalization=None "
                "on a graph without edges); pass lambda_max",
            )
        elif isinstance(lam, str):
            lam = torch.tensor(_largest_eigenvalue(lap), dtype=w.dtype, device=w.device)
        else:
            lam = torch.as_tensor(lam, dtype=w.dtype, device=w.device)
            if lam.numel() > 1:
                N = int(x.shape[-2])
                if batch is None or tuple(batch.shape) != (N,):
                    raise ValueError(
                        f"ChebConv: lambda_max with {lam.numel()} values (one per graph) needs batch, the graph "
                        f"of each node, of shape ({N},)"
                    )
                lam = lam.reshape(-1).index_select(0, batch.long().index_select(0, lap.src))
            elif lam.numel() == 0:
                raise ValueError(f"ChebConv: lambda_max must be positive, got {lambda_max!r}")
            elif torch.compiler.is_compiling():  # checked in the graph, not read back
                of(lam).check_all(lam > 0, "ChebConv: lambda_max must be positive")
            elif float(lam.reshape(-1)[0]) <= 0:
                raise ValueError(f"ChebConv: lambda_max must be positive, got {lambda_max!r}")
        scaled = (2.0 * w) / lam
        scaled = scaled.masked_fill(scaled == math.inf, 0.0)
        # L's diagonal is its last N entries (laplacian); a compiled run keeps the input's loops, at weight 0.
        N = lap.num_nodes
        scaled = torch.cat([scaled[:-N], scaled[-N:] - 1.0])
        edges = lap.with_edges(lap.src, lap.dst, scaled)
        return PolynomialBasis(edges.to_basis(), range(self.K), "chebyshev")


def _check_prebuilt(edge_index: Any, batch: torch.Tensor | None, lambda_max: Any) -> None:
    """A prebuilt basis has its own scaling: ``batch`` and ``lambda_max`` belong to an ``edge_index``."""
    if isinstance(edge_index, Basis) and (batch is not None or lambda_max is not None):
        raise ValueError("ChebConv: batch and lambda_max go with an edge_index, not with a prebuilt basis")
