"""The conformance kit itself (:mod:`structconv.testing`): each check passes on the package's own
bases and layers, and fails, naming what and by how much, on one built wrong on purpose."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import structconv as sc
from structconv import nn as snn
from structconv.testing import (
    Link,
    assert_unchanged,
    check_basis,
    check_layer,
    compare_to_peer,
    contract_for,
    dense_reference,
    node_contract,
    random_operands,
    snapshot,
)

D64 = torch.float64
_RNG = np.random.default_rng(0)
_DENSE = _RNG.normal(size=(3, 6, 5)) * (_RNG.random((3, 6, 5)) < 0.6)


# --- dense_reference ------------------------------------------------------------------------------
def test_dense_reference_is_the_formula() -> None:
    A, x, theta = _DENSE, _RNG.normal(size=(2, 6, 3)), _RNG.normal(size=(3, 3, 2))
    loops = np.zeros((2, 5, 2))
    for b in range(2):
        for k in range(3):
            loops[b] += A[k].T @ x[b] @ theta[k]
    np.testing.assert_allclose(dense_reference(A, x, theta), loops, rtol=1e-12)
    np.testing.assert_allclose(dense_reference(sc.SparseBasis.from_dense(A), x[0], theta), loops[0], rtol=1e-12)
    per_instance = np.stack([A, 2 * A])
    np.testing.assert_allclose(dense_reference(per_instance, x, theta), loops * [[[1.0]], [[2.0]]], rtol=1e-12)
    coef, chan = _RNG.normal(size=(2, 3)), _RNG.normal(size=(2, 3, 2))
    np.testing.assert_allclose(
        dense_reference(A, x, sc.Separable(coef, chan)), dense_reference(A, x, np.einsum("hk,hpq->kpq", coef, chan))
    )
    value, out = torch.randn(3, 3, 2, dtype=D64), torch.randn(3, 2, 2, dtype=D64)
    y = dense_reference(torch.from_numpy(A), torch.from_numpy(x), sc.LowRank(value, out))
    torch.testing.assert_close(
        y, torch.einsum("kmn,bmp,kpd,kqd->bnq", torch.from_numpy(A), torch.from_numpy(x), value, out)
    )


# --- check_basis ----------------------------------------------------------------------------------
BASES: dict[str, Any] = {
    "dense numpy": lambda: sc.DenseBasis(_DENSE),
    "sparse torch": lambda: sc.SparseBasis.from_dense(torch.from_numpy(_DENSE)),
    "grid numpy": lambda: sc.grid_basis((4, 5), 3, padding="same"),
    "grid torch": lambda: sc.grid_basis((4, 3), (2, 3), stride=2, padding=1, like=torch.zeros(1, dtype=D64)),
    "graph torch": lambda: sc.graph_basis(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), "chebyshev", K=3),
    "attention torch": lambda: sc.attention_basis(
        torch.randn(2, 5, 4, dtype=D64), mechanism=sc.BiAffine(bilinear=torch.randn(2, 4, 4, dtype=D64))
    ),
}


@pytest.mark.parametrize("name", sorted(BASES))
def test_check_basis_passes_on_the_packages_bases(name: str) -> None:
    orders = check_basis(BASES[name](), fast=True)  # gradcheck by projections: the full one is test_gradcheck's
    assert {"ax", "xtheta", "auto"} <= set(orders) and orders[-1] == "auto"


def test_check_basis_takes_given_and_factorised_operands() -> None:
    basis = sc.SparseBasis.from_dense(torch.from_numpy(_DENSE))
    x = torch.randn(6, 3, dtype=D64)  # a 2-D input
    theta = sc.LowRank(torch.randn(3, 3, 2, dtype=D64), torch.randn(3, 4, 2, dtype=D64))
    assert "xtheta+full" in check_basis(basis, x=x, theta=theta, dense=torch.from_numpy(_DENSE), fast=True)


def test_random_operands_follow_the_basis() -> None:
    x, theta = random_operands(sc.SparseBasis.from_dense(torch.from_numpy(_DENSE).float()), channels=(4, 7))
    assert (x.shape, theta.shape, x.dtype, theta.dtype) == ((2, 6, 4), (3, 4, 7), torch.float32, torch.float32)
    x, _ = random_operands(sc.DenseBasis(np.stack([_DENSE] * 3)))
    assert isinstance(x, np.ndarray) and x.shape == (3, 6, 3)


class _OffByOne(sc.SparseBasis):
    """A basis whose A·x-first order is off by 1e-3 (the others are right)."""

    def apply_each(self, x: Any) -> Any:
        return super().apply_each(x) + 1e-3


class _Detached(sc.SparseBasis):
    """A basis whose A·x-first order is right but cuts the gradient to x."""

    def apply_each(self, x: Any) -> Any:
        return super().apply_each(x.detach())


class _Counting(sc.SparseBasis):
    """A basis that records its calls: new state on a value that must not change."""

    def apply_each(self, x: Any) -> Any:
        self.calls = getattr(self, "calls", 0) + 1
        return super().apply_each(x)


class _Copying(sc.SparseBasis):
    """A basis that swaps its stored values for an equal copy when applied."""

    def apply_each(self, x: Any) -> Any:
        self._values = self._values.clone()
        return super().apply_each(x)


def _as(klass: type, dense: Any) -> Any:
    pattern = sc.SparseBasis.from_dense(dense)
    return klass(pattern.indices, pattern.values, pattern.shape)


def test_check_basis_fails_on_a_wrong_order() -> None:
    with pytest.raises(
        AssertionError, match=r"order 'ax' against dense_reference: max \|difference\| = 0\.00\d+ at index"
    ):
        check_basis(_as(_OffByOne, _DENSE))
    with pytest.raises(
        AssertionError, match=r"order 'ax' against dense_reference: max \|difference\| = 0\.00\d+ at index"
    ):
        check_basis(_as(_OffByOne, torch.from_numpy(_DENSE)))


def test_check_basis_fails_on_a_wrong_gradient() -> None:
    basis = _as(_Detached, torch.from_numpy(_DENSE))
    check_basis(basis, gradients=False)  # the values are right
    with pytest.raises(AssertionError, match=r"order 'ax': gradcheck of \(x, theta\) failed: max .* = \d"):
        check_basis(basis)


def test_check_basis_fails_on_a_basis_that_changes() -> None:
    with pytest.raises(AssertionError, match=r"basis changed its state: added \['basis.calls'\]"):
        check_basis(_as(_Counting, _DENSE))
    with pytest.raises(AssertionError, match=r"basis._values: the array object was replaced"):
        check_basis(_as(_Copying, torch.from_numpy(_DENSE)), gradients=False)
    values = torch.from_numpy(_DENSE.copy())
    basis = sc.DenseBasis(values)
    before = snapshot(basis)
    values.mul_(1.5)  # what a hook writing into its input would do
    with pytest.raises(AssertionError, match=r"basis._array: the array's values changed \(max \|change\| = "):
        assert_unchanged(before, snapshot(basis))


def test_check_basis_fails_on_a_wrong_dense_form() -> None:
    with pytest.raises(AssertionError, match=r"order 'ax' against dense_reference"):
        check_basis(sc.DenseBasis(_DENSE), dense=_DENSE * 1.001)


# --- check_layer ----------------------------------------------------------------------------------
class _Shifted(snn.GCNConv):
    """GCNConv whose forward adds 1e-3."""

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, edge_index, edge_weight) + 1e-3


class _FrozenInput(snn.GCNConv):
    """GCNConv whose forward is right but does not differentiate its input."""

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x.detach(), edge_index, edge_weight)


_EDGES = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])


def test_check_layer_passes_on_the_packages_layers() -> None:
    torch.manual_seed(0)
    check_layer(snn.GCNConv(3, 4).double(), torch.randn(5, 3, dtype=D64), _EDGES)
    check_layer(snn.GridConv2d(2, 3, 3, padding=1).double(), torch.randn(2, 2, 5, 4, dtype=D64))
    x = torch.randn(2, 4, 4, dtype=D64)
    check_layer(snn.MultiHeadSelfAttention(4, 2, batch_first=True).double().eval(), x, x, x)
    check_layer(snn.GridConv1d(2, 3, 3, padding=1).float(), torch.randn(2, 2, 6))  # float32: its tolerances


@pytest.mark.parametrize(
    "build",
    [
        lambda: snn.GridConv2d(2, 3, 3, padding=1, padding_mode="reflect"),
        lambda: snn.GridConv2d(2, 3, (2, 3), padding="same", padding_mode="replicate"),
        lambda: snn.GridConv1d(2, 3, 3, padding=((2, 1),), padding_mode="replicate"),
    ],
)
def test_check_layer_frames_the_input_as_torch_does(build: Any) -> None:
    torch.manual_seed(0)
    layer = build().double()
    check_layer(layer, torch.randn(2, 2, *([5, 4][: len(layer.kernel_size)]), dtype=D64))
    check_layer(layer, torch.randn(2, *([5, 4][: len(layer.kernel_size)]), dtype=D64))  # unbatched


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("extras", [{}, {"add_bias_kv": True}, {"add_zero_attn": True, "kdim": 3, "vdim": 2}])
def test_check_layer_moves_attention_to_the_engines_layout(batch_first: bool, extras: dict[str, Any]) -> None:
    torch.manual_seed(0)
    layer = snn.MultiHeadSelfAttention(4, 2, batch_first=batch_first, **extras).double().eval()
    q = torch.randn(2, 3, 4, dtype=D64)
    k, v = torch.randn(2, 5, extras.get("kdim", 4), dtype=D64), torch.randn(2, 5, extras.get("vdim", 4), dtype=D64)
    inputs = (q, k, v) if batch_first else tuple(t.transpose(0, 1) for t in (q, k, v))
    check_layer(layer, *inputs)
    check_layer(layer, q[0], k[0], v[0])  # unbatched


def test_check_layer_fails_on_a_shifted_output() -> None:
    layer = _Shifted(3, 4).double()
    with pytest.raises(AssertionError, match=r"_Shifted: output against the contract: max \|difference\| = 0\.001"):
        check_layer(layer, torch.randn(5, 3, dtype=D64), _EDGES)


def test_check_layer_fails_on_a_wrong_gradient() -> None:
    layer = _FrozenInput(3, 4).double()
    with pytest.raises(AssertionError, match=r"_FrozenInput: gradient of input 0 against the contract"):
        check_layer(layer, torch.randn(5, 3, dtype=D64), _EDGES)
    check_layer(layer, torch.randn(5, 3, dtype=D64), _EDGES, gradients=False)


class _Own(torch.nn.Module):
    """A user's layer: a fixed basis and a parameter, with a layout of its own (channels first)."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.randn(3, 2, 4, dtype=D64))
        self.fixed = sc.SparseBasis.from_dense(torch.from_numpy(_DENSE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sc.conv(self.fixed, x.transpose(1, 2), self.theta).transpose(1, 2)


def test_check_layer_takes_a_users_contract() -> None:
    layer, x = _Own(), torch.randn(2, 2, 6, dtype=D64)
    with pytest.raises(TypeError, match="_Own has no basis\\(\\) and theta\\(\\): pass contract="):
        check_layer(layer, x)
    check_layer(layer, x, contract=lambda m, x: sc.conv(m.fixed, x.transpose(1, 2), m.theta).transpose(1, 2))
    with pytest.raises(AssertionError, match="output against the contract"):
        check_layer(layer, x, contract=lambda m, x: sc.conv(m.fixed, x.transpose(1, 2), 2 * m.theta).transpose(1, 2))
    assert contract_for(snn.StructConv(sc.SparseBasis.from_dense(torch.from_numpy(_DENSE)), 2, 4)) is node_contract


# --- compare_to_peer ------------------------------------------------------------------------------
def test_compare_to_peer_passes_on_torchs_layers() -> None:
    torch.manual_seed(0)
    ours, peer = snn.GridConv2d(2, 3, 3, padding=1, dtype=D64), torch.nn.Conv2d(2, 3, 3, padding=1, dtype=D64)
    compare_to_peer(ours, peer, torch.randn(2, 2, 5, 5, dtype=D64), name="conv2d")
    ours_a = snn.MultiHeadSelfAttention(4, 2, batch_first=True, dtype=D64)
    peer_a = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=D64)
    x = torch.randn(2, 3, 4, dtype=D64)
    y, w = compare_to_peer(ours_a, peer_a, x, x, x, kwargs={"need_weights": True}, name="mha")
    assert y[1] is not None and w[1] is not None  # the raw results come back


def test_compare_to_peer_fails_on_a_changed_layer_naming_the_case() -> None:
    peer = torch.nn.Conv1d(2, 3, 3, dtype=D64)
    ours = snn.GridConv1d(2, 3, 3, dtype=D64)

    class Off(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.bias = ours.weight, ours.bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ours(x) + 1e-3

    class Frozen(Off):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ours(x.detach())  # the right output, and no gradient to the input

    x = torch.randn(2, 2, 7, dtype=D64)
    with pytest.raises(AssertionError, match=r"^shifted: output differs: max \|ours - peer\| = 0\.001 \(allowed"):
        compare_to_peer(Off(), peer, x, name="shifted")
    with pytest.raises(AssertionError, match=r"^frozen: input differs: max \|ours - peer\| = "):
        compare_to_peer(Frozen(), peer, x, name="frozen")
    compare_to_peer(Frozen(), peer, x, gradients=False)


def test_compare_to_peer_maps_parameters_through_links() -> None:
    torch.manual_seed(0)
    peer = torch.nn.Linear(3, 4, dtype=D64)
    ours = snn.StructConv(sc.SparseBasis.from_dense(torch.eye(5, dtype=D64)[None]), 3, 4, dtype=D64)
    links = [Link(ours.weight, [peer.weight], lambda w: w.T[None]), Link(ours.bias, [peer.bias])]
    compare_to_peer(ours, peer, torch.randn(2, 5, 3, dtype=D64), parameters_from=links, name="linear")
    with pytest.raises(AssertionError, match=r"parameters of ours without a Link: \['bias'\]"):
        compare_to_peer(ours, peer, torch.randn(2, 5, 3, dtype=D64), parameters_from=links[:1])


def test_compare_to_peer_in_low_precision_measures_both_against_exact() -> None:
    import copy

    torch.manual_seed(0)
    peer = torch.nn.Conv2d(2, 3, 3, padding=1, dtype=D64)
    ours = snn.GridConv2d(2, 3, 3, padding=1, dtype=D64)
    exact = copy.deepcopy(peer)
    ours, peer = ours.to(torch.bfloat16), peer.to(torch.bfloat16)
    x = torch.randn(2, 2, 6, 6, dtype=D64)
    compare_to_peer(ours, peer, x, dtype=torch.bfloat16, atol=5e-2, exact=exact, name="bf16")
    with pytest.raises(AssertionError, match=r"^bf16: output: error .* from the exact result > .*the peer's own"):
        compare_to_peer(
            ours, peer, x, dtype=torch.bfloat16, exact=exact, slack=lambda key, truth: 0.0, peer_factor=0.0, name="bf16"
        )
