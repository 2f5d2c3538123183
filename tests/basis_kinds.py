"""The catalogue of basis kinds the public API builds, shared by the immutability and the device tests.

Each entry of :data:`KINDS` builds one kind of :class:`structconv.Basis` from fixed NumPy data
converted by ``cv`` (``numpy.asarray`` for a NumPy basis, ``torch.from_numpy`` for a torch one);
:func:`parameters` gives a full, a separable and a low-rank :math:`\\Theta` for any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import structconv as sc
from structconv.bases.kronecker import KroneckerBasis

Convert = Callable[[np.ndarray], Any]
_RNG = np.random.default_rng(0)
_DENSE = _RNG.normal(size=(3, 6, 5)) * (_RNG.random((3, 6, 5)) < 0.5)
_BATCHED = _RNG.normal(size=(2, 3, 6, 5)) * (_RNG.random((2, 3, 6, 5)) < 0.5)
_EDGES = _RNG.integers(0, 6, size=(2, 14))
_TOKENS = _RNG.normal(size=(2, 6, 4))
_EDGE_WEIGHTS = _RNG.uniform(0.5, 1.5, size=14)
_EDGE_VALUES = _RNG.normal(size=(14, 3))
_FACTORS = (_RNG.random((2, 2, 3)), _RNG.random((2, 3, 2)))
_BILINEAR = _RNG.normal(size=(2, 4, 4))


def _graph(kind: str) -> Callable[[Convert], Any]:
    def build(cv: Convert) -> Any:
        return sc.graph_basis(cv(_EDGES), kind, K=3, num_nodes=6, edge_weight=cv(_EDGE_WEIGHTS))

    return build


KINDS: dict[str, Callable[[Convert], Any]] = {
    "dense": lambda cv: sc.DenseBasis(cv(_DENSE)),
    "dense-batched": lambda cv: sc.DenseBasis(cv(_BATCHED)),
    "sparse": lambda cv: sc.SparseBasis.from_dense(cv(_DENSE)),
    "sparse-batched": lambda cv: sc.SparseBasis.from_dense(cv(_BATCHED)),
    "edges": lambda cv: sc.EdgeBasis(cv(_EDGES[0]), cv(_EDGES[1]), cv(_EDGE_VALUES), (6, 6)),
    "kronecker": lambda cv: KroneckerBasis([cv(f) for f in _FACTORS]),
    "concat": lambda cv: sc.ConcatBasis([sc.DenseBasis(cv(_DENSE[:1])), sc.SparseBasis.from_dense(cv(_DENSE[1:]))]),
    "composed": lambda cv: sc.ComposedBasis(
        sc.SparseBasis.from_dense(cv(_DENSE)), sc.DenseBasis(cv(_DENSE[:2, :5, :4]))
    ),
    "select": lambda cv: sc.SelectBasis(sc.SparseBasis.from_dense(cv(_DENSE)), [2, 0]),
    "grid": lambda cv: sc.grid_basis((4, 5), (3, 3), padding="same", like=cv(np.zeros(1))),
    "avg-pool": lambda cv: sc.avg_pool_basis((4, 4), 2, like=cv(np.zeros(1))),
    "graph-powers": _graph("powers"),
    "graph-chebyshev": _graph("chebyshev"),
    "attention": lambda cv: sc.attention_basis(cv(_TOKENS), mechanism=sc.BiAffine(bilinear=cv(_BILINEAR))),
    "positional": lambda cv: sc.quadratic_scores(
        (3, 3), cv(np.array([[0.0, 1.0], [1.0, -1.0]])), cv(np.array([1.0, 2.0]))
    ).basis(threshold=0.05),
    # torch only: its per-target maximum is a scatter-max that only the torch backend has
    "softmax-edges": lambda cv: sc.SoftmaxEdgeBasis(
        torch.from_numpy(_EDGES[0]), torch.from_numpy(_EDGES[1]), torch.from_numpy(_EDGE_VALUES), (6, 6)
    ),
}
TORCH_ONLY = {"softmax-edges"}


def parameters(basis: Any, cv: Convert) -> list[Any]:
    """A full, a separable and a low-rank parameter for ``basis``."""
    K, P, Q = basis.K, 3, 2
    rng = np.random.default_rng(1)
    return [
        cv(rng.normal(size=(K, P, Q))),
        sc.Separable(cv(rng.normal(size=(2, K))), cv(rng.normal(size=(2, P, Q)))),
        sc.LowRank(cv(rng.normal(size=(K, P, 2))), cv(rng.normal(size=(K, Q, 2)))),
    ]
