"""The kit checks meaning: a basis or layer that is consistent but means another thing fails, naming the cause.

Each case is one of the mistakes a new layer's author makes (found writing GIN, GraphSAGE-mean
and a dilated causal convolution from the docs alone): built with structconv's own builders, the
wrong basis passes the consistency checks (every order equals its own dense form) and fails
against a reference written apart from it, with the cause in the message.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from structconv import SparseBasis, conv, graph_basis, grid_basis
from structconv.nn import StructConv
from structconv.testing import MeaningUnchecked, check_basis, check_layer

D64 = torch.float64
EDGES = torch.tensor([[0, 1, 1, 2, 3, 3, 4, 0], [1, 2, 3, 3, 4, 0, 0, 2]])
N = 5


def _adjacency() -> torch.Tensor:
    """Entry (m, n) = 1 for the edge m -> n."""
    A = torch.zeros(N, N, dtype=D64)
    A[EDGES[0], EDGES[1]] = 1.0
    return A


def _tap(L: int, offset: int) -> torch.Tensor:
    """``(L, L)``: output ``n`` reads input ``n + offset`` (entry ``[n + offset, n]``), where it exists."""
    member = torch.zeros(L, L, dtype=D64)
    for n in range(L):
        if 0 <= n + offset < L:
            member[n + offset, n] = 1.0
    return member


def _basis(*members: torch.Tensor) -> SparseBasis:
    return SparseBasis.from_dense(torch.stack(members))


def _fails(basis: SparseBasis, reference: torch.Tensor, cause: str) -> None:
    check_basis(basis)  # consistent: every order equals its own dense form
    with pytest.raises(AssertionError, match=cause):
        check_basis(basis, reference=reference)


def test_gin_with_eps_where_one_plus_eps_is_meant() -> None:
    A, eps = _adjacency(), 0.1
    reference = torch.stack([(1 + eps) * torch.eye(N, dtype=D64), A])  # GIN: (1 + eps) x_i + sum_j x_j
    _fails(_basis(eps * torch.eye(N, dtype=D64), A), reference, r"member 0 is 0\.0909091 times the reference's")
    zero_eps = torch.stack([torch.eye(N, dtype=D64), A])
    _fails(_basis(torch.zeros(N, N, dtype=D64), A), zero_eps, "member 0 is zero where the reference's is not")
    check_basis(graph_basis(EDGES, "powers", K=1, normalization="none", like=A), reference=zero_eps)


def test_sage_mean_normalised_as_gcn() -> None:
    A = _adjacency()
    mean = A / A.sum(0).clamp(min=1)  # each node averages its in-neighbours
    gcn = A / (A.sum(1, keepdim=True).clamp(min=1) * A.sum(0).clamp(min=1)).sqrt()
    _fails(_basis(gcn), mean[None], r"another normalisation: the reference averages each output's inputs")


def test_mean_by_out_degree_where_in_degree_is_meant() -> None:
    A = _adjacency()
    mean_in = A / A.sum(0).clamp(min=1)
    mean_out = A / A.sum(1, keepdim=True).clamp(min=1)
    _fails(_basis(mean_out), mean_in[None], "normalised by out-degree instead of in-degree")


def test_the_two_maps_swapped() -> None:
    A = _adjacency()
    mean = A / A.sum(0).clamp(min=1)
    root = torch.eye(N, dtype=D64)
    _fails(_basis(root, mean), torch.stack([mean, root]), "member 0 is the reference's member 1")


def test_a_graph_read_the_other_way_round() -> None:
    A = _adjacency()
    _fails(_basis(A.T), A[None], "the reference's transpose")


def test_a_causal_convolution_padded_on_the_wrong_side() -> None:
    """WaveNet's dilated causal convolution: output t reads inputs t - 2d, t - d, t (padding before)."""
    L, d = 8, 2
    causal = grid_basis((L,), 3, dilation=d, padding=((4, 0),))
    reference = torch.stack([_tap(L, offset) for offset in (-4, -2, 0)])
    check_basis(causal, reference=reference)
    wrong = grid_basis((L,), 3, dilation=d, padding=((0, 4),))
    with pytest.raises(AssertionError, match=r"moved by -?4 (inputs|outputs): padding on the other side"):
        check_basis(wrong, reference=reference)


def test_a_flipped_kernel() -> None:
    L = 6
    reference = torch.stack([_tap(L, offset) for offset in (-1, 0, 1)])
    basis = grid_basis((L,), 3, padding=1)
    check_basis(basis, reference=reference)
    flipped = reference.flip(0)
    with pytest.raises(AssertionError, match="member 0 is the reference's member 2"):
        check_basis(basis, reference=flipped)


def test_a_shape_other_than_the_reference_is_named() -> None:
    A = _adjacency()
    with pytest.raises(AssertionError, match=r"1 member\(s\) fewer \(an identity or root member\?\)"):
        check_basis(_basis(A), reference=torch.stack([torch.eye(N, dtype=D64), A]))


class _BiasKeptApart(StructConv):
    """A layer that keeps its bias in a submodule, as PyG keeps lin.bias: the contract does not see it."""

    def __init__(self, basis: SparseBasis, P: int, Q: int) -> None:
        super().__init__(basis, P, Q, bias=False)
        self.shift = nn.Linear(1, Q, dtype=D64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.shift.bias


def test_a_bias_the_contract_does_not_see_is_named() -> None:
    torch.manual_seed(0)
    layer = _BiasKeptApart(_basis(_adjacency()), 3, 2).double()
    x = torch.randn(N, 3, dtype=D64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MeaningUnchecked)
        with pytest.raises(
            AssertionError, match=r"a bias added on one side only.*the contract adds `layer.bias` alone"
        ):
            check_layer(layer, x)


def test_a_layer_is_checked_against_what_it_means() -> None:
    torch.manual_seed(0)
    A = _adjacency()
    mean = A / A.sum(0).clamp(min=1)
    good, swapped = (
        StructConv(_basis(torch.eye(N, dtype=D64), mean), 3, 2),
        StructConv(_basis(mean, torch.eye(N, dtype=D64)), 3, 2),
    )
    swapped.load_state_dict(good.state_dict())
    x = torch.randn(N, 3, dtype=D64)

    def sage(x: torch.Tensor) -> torch.Tensor:  # root map first, then the mean of the in-neighbours
        return x @ good.weight[0] + mean.T @ x @ good.weight[1] + good.bias

    for layer in (good.double(), swapped.double()):
        with warnings.catch_warnings():
            warnings.simplefilter("error", MeaningUnchecked)  # a reference is given: no warning
            if layer is good:
                check_layer(layer, x, reference=sage)
            else:
                with pytest.raises(AssertionError, match="against the reference"):
                    check_layer(layer, x, reference=sage)
    with pytest.warns(MeaningUnchecked, match="pass reference="):
        check_layer(swapped, x)  # consistent with its own basis: only a reference sees the swap
    assert np.isfinite(conv(good.basis(x), x, good.theta()).detach().numpy()).all()
