r"""structconv: every layer is :math:`y = \sum_k A_k^\top x \Theta_k`.

A basis :math:`\mathbf{A}` (``K`` weighted graphs from ``M`` input to ``N`` output entries)
and a parameter :math:`\Theta` (one ``P x Q`` channel map per basis member), contracted by one
engine, :func:`conv`.
"""

from .attention import AttentionBasis, BiAffine, Mechanism, attention_basis, masked_softmax
from .basis import Basis, Cost, as_basis
from .composite import ComposedBasis, ConcatBasis, SelectBasis, concat
from .contract import Candidate, Plan, conv, explain
from .dense import DenseBasis
from .edges import EdgeBasis
from .factor import LowRank, Separable
from .graph import PolynomialBasis, gcn_basis, graph_basis
from .grid import GridBasis, apply_shifts, avg_pool_basis, grid_basis, shift_matrix
from .positional import GaussianPosition, LearnedPosition, QuadraticPosition, RelativeAttention
from .sparse import SparseBasis
from .theory import combine, compose, decompose

__all__ = [
    "AttentionBasis",
    "Basis",
    "BiAffine",
    "Candidate",
    "ComposedBasis",
    "ConcatBasis",
    "Cost",
    "DenseBasis",
    "EdgeBasis",
    "GaussianPosition",
    "GridBasis",
    "LearnedPosition",
    "LowRank",
    "Mechanism",
    "Plan",
    "PolynomialBasis",
    "QuadraticPosition",
    "RelativeAttention",
    "SelectBasis",
    "Separable",
    "SparseBasis",
    "apply_shifts",
    "as_basis",
    "attention_basis",
    "avg_pool_basis",
    "combine",
    "compose",
    "concat",
    "conv",
    "decompose",
    "explain",
    "gcn_basis",
    "graph_basis",
    "grid_basis",
    "masked_softmax",
    "shift_matrix",
]

__version__ = "0.1.0"
