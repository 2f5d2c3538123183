r"""structconv: every layer is :math:`y = \sum_k A_k^\top x \Theta_k`.

A basis :math:`\mathbf{A}` (``K`` weighted graphs from ``M`` input to ``N`` output entries)
and a parameter :math:`\Theta` (one ``P x Q`` channel map per basis member), contracted by one
engine, :func:`conv`.
"""

from .bases.base import Basis, Cost
from .bases.composite import ComposedBasis, ConcatBasis, SelectBasis, concat
from .bases.conv_weight import ConvWeight
from .bases.convert import as_basis
from .bases.dense import DenseBasis
from .bases.edges import EdgeBasis
from .bases.factor import Aggregation, LowRank, Separable
from .bases.grid import GridBasis
from .bases.softmax_edges import SoftmaxEdgeBasis
from .bases.sparse import SparseBasis
from .engine.compiled import Contraction, contraction
from .engine.contract import Candidate, Plan, conv, explain
from .structures.attention import AttentionBasis, BiAffine, Mechanism, attention_basis, masked_softmax
from .structures.graph import PolynomialBasis, gcn_basis, graph_basis
from .structures.grid import apply_shifts, avg_pool_basis, grid_basis, shift_matrix
from .structures.positional import (
    PositionScores,
    gaussian_scores,
    learned_scores,
    quadratic_scores,
)
from .structures.relative_attention import relative_attention
from .theory.algebra import combine, compose, decompose

__all__ = [
    "Aggregation",
    "AttentionBasis",
    "Basis",
    "BiAffine",
    "Candidate",
    "ComposedBasis",
    "ConcatBasis",
    "Contraction",
    "ConvWeight",
    "Cost",
    "DenseBasis",
    "EdgeBasis",
    "GridBasis",
    "LowRank",
    "Mechanism",
    "Plan",
    "PolynomialBasis",
    "PositionScores",
    "SelectBasis",
    "Separable",
    "SoftmaxEdgeBasis",
    "SparseBasis",
    "apply_shifts",
    "as_basis",
    "attention_basis",
    "avg_pool_basis",
    "combine",
    "compose",
    "concat",
    "contraction",
    "conv",
    "decompose",
    "explain",
    "gaussian_scores",
    "gcn_basis",
    "graph_basis",
    "grid_basis",
    "learned_scores",
    "masked_softmax",
    "quadratic_scores",
    "relative_attention",
    "shift_matrix",
]

__version__ = "0.1.0"
