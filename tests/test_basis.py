"""Basis values: dense/sparse agreement, transpose, selection, concatenation, moves."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch
from conftest import as_numpy, problems
from hypothesis import given
from hypothesis import strategies as st

from structconv import ConcatBasis, DenseBasis, SparseBasis, as_basis, concat, conv
from structconv.testing import check_basis


@given(problem=problems())
def test_representations_agree_on_the_dense_tensor(problem):
    A = problem["A"]
    for basis in (DenseBasis(A), SparseBasis.from_dense(A), SparseBasis.from_dense(torch.from_numpy(A))):
        np.testing.assert_array_equal(as_numpy(basis.to_dense()), A)
        assert basis.shape == A.shape


@given(problem=problems())
def test_transpose_swaps_input_and_output_entries(problem):
    A = problem["A"]
    for basis in (DenseBasis(A), SparseBasis.from_dense(A), ConcatBasis([SparseBasis.from_dense(A)])):
        np.testing.assert_array_equal(as_numpy(basis.T.to_dense()), np.swapaxes(A, -1, -2))
        np.testing.assert_array_equal(as_numpy(basis.T.T.to_dense()), A)
        # and the transposed value contracts as its dense form, in every order
        check_basis(basis.T, dense=np.swapaxes(A, -1, -2), gradients=False, seed=int(problem["rng"].integers(2**31)))


@given(problem=problems(), data=st.data())
def test_select_restricts_members_in_order(problem, data):
    A = problem["A"]
    K = A.shape[-3]
    members = data.draw(st.lists(st.integers(0, K - 1), min_size=1, max_size=4))
    expected = A[:, members] if A.ndim == 4 else A[members]
    for basis in (DenseBasis(A), SparseBasis.from_dense(A), ConcatBasis([DenseBasis(A)])):
        np.testing.assert_array_equal(as_numpy(basis.select(members).to_dense()), expected)
        np.testing.assert_array_equal(as_numpy(basis[members].to_dense()), expected)
        # Every order of the selection, repeated members included (a member may be selected twice).
        check_basis(basis.select(members), dense=expected, gradients=False)


def test_getitem_accepts_int_slice_and_negative_and_rejects_out_of_range():
    A = np.arange(24.0).reshape(4, 2, 3)
    b = SparseBasis.from_dense(A)
    np.testing.assert_array_equal(b[-1].to_dense(), A[[3]])
    np.testing.assert_array_equal(b[1:3].to_dense(), A[1:3])
    with pytest.raises(IndexError, match="out of range for K=4"):
        b[4]


def test_concat_keeps_representation_and_stacks_members():
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 3, 4))
    expected = np.concatenate([A1, A2])
    assert isinstance(concat([DenseBasis(A1), DenseBasis(A2)]), DenseBasis)
    sp = concat([SparseBasis.from_dense(A1), SparseBasis.from_dense(A2)])
    assert isinstance(sp, SparseBasis)
    mixed = concat([DenseBasis(A1), SparseBasis.from_dense(A2)])
    assert isinstance(mixed, ConcatBasis)
    for b in (sp, mixed, concat([mixed, DenseBasis(A1)])[:5]):
        np.testing.assert_array_equal(b.to_dense(), expected)
        check_basis(b, dense=expected)  # every order of the concatenation


def test_sparse_duplicates_are_summed_and_constructors_agree():
    idx = np.array([[0, 0, 1], [1, 1, 0], [2, 2, 2]])
    b = SparseBasis(idx, np.array([1.0, 2.5, -1.0]), (2, 3, 3))
    assert b.nnz == 2
    assert b.to_dense()[0, 1, 2] == 3.5
    from_scipy = SparseBasis.from_scipy([scipy.sparse.coo_array(m) for m in b.to_dense()])
    np.testing.assert_array_equal(from_scipy.to_dense(), b.to_dense())
    from_torch = as_basis(torch.from_numpy(b.to_dense()).to_sparse())
    assert isinstance(from_torch, SparseBasis)
    np.testing.assert_array_equal(from_torch.to_dense().numpy(), b.to_dense())


def test_dtype_moves_and_numpy_device_errors():
    A = np.ones((1, 2, 2))
    for b in (DenseBasis(A), SparseBasis.from_dense(A)):
        assert b.to(dtype=np.float32).dtype == np.float32
        with pytest.raises(ValueError, match="lives on the CPU"):
            b.to(device="cuda")
    t = SparseBasis.from_dense(torch.ones(1, 2, 2))
    assert t.to(dtype=torch.float64).dtype == torch.float64
    assert t.to(device="cpu").device == "cpu"


def test_energy_is_mean_squared_column_norm():
    A = np.zeros((2, 3, 3))
    A[0] = np.eye(3)
    A[1, 0, 1] = 2.0
    for b in (DenseBasis(A), SparseBasis.from_dense(A), ConcatBasis([DenseBasis(A[:1]), DenseBasis(A[1:])])):
        assert b.energy() == pytest.approx((3 + 4) / 3)


def test_sparse_layouts_are_not_cached_when_values_require_grad():
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    basis = SparseBasis(torch.tensor([[0, 0], [0, 1], [1, 0]]), values, (1, 2, 2))
    x = torch.ones(1, 2, 1)
    for _ in range(2):  # a cached graph would fail on the second backward
        conv(basis, x, torch.ones(1, 1, 1)).sum().backward()
    assert values.grad is not None
    assert values.grad.tolist() == [2.0, 2.0]


# --- inputs refused rather than silently changed ----------------------------------------------------
_ONE_ENTRY = (np.array([[0], [0], [0]]), np.array([1.0]))


@pytest.mark.parametrize("size", [2.5, 2.0, np.float64(2.0), True, np.bool_(True), "2"])
def test_sparse_shape_refuses_sizes_that_are_not_integers(size):
    with pytest.raises(TypeError, match=r"shape must hold integer sizes, got .* in \(1, "):
        SparseBasis(*_ONE_ENTRY, (1, size, 2))


@pytest.mark.parametrize("shape", [(1, np.int64(2), 2), torch.Size([1, 2, 2]), (1, torch.tensor(2), 2)])
def test_sparse_shape_accepts_integers_of_any_kind(shape):
    assert SparseBasis(*_ONE_ENTRY, shape).shape == (1, 2, 2)


COMPLEX_BASES = {
    "sparse values": lambda: SparseBasis(np.array([[0], [0], [0]]), np.array([1.0 + 1j]), (1, 2, 2)),
    "sparse from torch": lambda: SparseBasis.from_torch(torch.ones(1, 2, 2, dtype=torch.complex64).to_sparse()),
    "sparse from scipy": lambda: SparseBasis.from_scipy([scipy.sparse.csr_array(np.eye(2) * (1 + 1j))]),
    "dense numpy": lambda: DenseBasis(np.ones((1, 2, 2)) * 1j),
    "dense torch": lambda: as_basis(torch.ones(1, 2, 2, dtype=torch.complex128)),
}


@pytest.mark.parametrize("case", sorted(COMPLEX_BASES))
def test_bases_refuse_complex_entries(case):
    with pytest.raises(TypeError, match=r"matrices must hold real numbers|must hold floating-point numbers"):
        COMPLEX_BASES[case]()


_EDGE_INDEX = np.array([[0, 1, 2], [1, 2, 0]])
COMPLEX_GRAPHS = {
    "edge_weight numpy": ({"edge_weight": np.ones(3) * (1 + 1j)}, "edge_weight"),
    "edge_weight torch": ({"edge_weight": torch.ones(3, dtype=torch.complex64)}, "edge_weight"),
    "edge_weight numpy, like torch": ({"edge_weight": np.ones(3) * 1j, "like": torch.zeros(1)}, "edge_weight"),
    "edge_weight list": ({"edge_weight": [1 + 1j, 1.0, 1.0]}, "edge_weight"),
    "like": ({"like": torch.zeros(1, dtype=torch.complex64)}, "like"),
    "dense numpy": ({"graph": np.eye(3) * (1 + 1j)}, "graph"),
    "dense torch": ({"graph": torch.eye(3, dtype=torch.complex64)}, "graph"),
    "torch sparse": ({"graph": torch.eye(3, dtype=torch.complex64).to_sparse()}, "graph"),
    "scipy.sparse": ({"graph": scipy.sparse.csr_array(np.eye(3) * (1 + 1j))}, "graph"),
}


@pytest.mark.parametrize("builder", ["gcn", "powers", "adjacency"])
@pytest.mark.parametrize("case", sorted(COMPLEX_GRAPHS))
def test_graph_builders_refuse_complex_weights_instead_of_dropping_the_imaginary_part(case, builder):
    from structconv import gcn_basis, graph_basis

    given, name = COMPLEX_GRAPHS[case]
    kwargs = dict(given)
    graph = kwargs.pop("graph", _EDGE_INDEX)
    with pytest.raises(TypeError, match=f"^{name} must hold real numbers, got .*imaginary part would be lost"):
        gcn_basis(graph, **kwargs) if builder == "gcn" else graph_basis(graph, builder, **kwargs)


@pytest.mark.parametrize("kind", ["gcn", "powers", "chebyshev", "diffusion", "adjacency"])
def test_graph_builders_refuse_an_implausible_inferred_node_count_before_allocating(kind):
    from structconv import gcn_basis, graph_basis

    stray = np.array([[0, 1, 2**40], [1, 2, 0]])
    message = r"refers to node 1099511627776, so the graph would have 1099511627777 nodes for only 3 edges \(8\.8e\+03"
    with pytest.raises(ValueError, match=message):
        graph_basis(stray, kind, K=2)
    with pytest.raises(ValueError, match=message):
        gcn_basis(torch.from_numpy(stray))
    with pytest.raises(ValueError, match=r"refers to node 1099511627776 but num_nodes=3"):
        graph_basis(stray, kind, K=2, num_nodes=3)


def test_an_inferred_node_count_with_isolated_nodes_is_still_accepted():
    from structconv import gcn_basis

    assert gcn_basis(np.array([[0], [100_000]])).shape == (1, 100_001, 100_001)  # under the floor of 2**20
    assert gcn_basis(np.array([[0, 1], [2**21, 1]]), num_nodes=2**21 + 1).N == 2**21 + 1  # given: as meant


@pytest.mark.parametrize("num_nodes", [2**40, 10**10, 2**64])
def test_a_given_node_count_beyond_int64_positions_is_refused_before_allocating(num_nodes):
    from structconv import gcn_basis

    with pytest.raises(ValueError, match=f"num_nodes={num_nodes} is too large: an adjacency of {num_nodes} x"):
        gcn_basis(_EDGE_INDEX, num_nodes=num_nodes)
    with pytest.raises(ValueError, match=r"shape \(1, 1099511627776, 1099511627776\) has 1208925819614629174706176"):
        SparseBasis(*_ONE_ENTRY, (1, 2**40, 2**40))
    assert SparseBasis(*_ONE_ENTRY, (1, 2**20, 2**20)).nnz == 1  # 2**40 entries, held lazily: fine


def test_from_scipy_names_a_matrix_that_is_not_scipy_sparse():
    with pytest.raises(TypeError, match=r"matrices must be scipy\.sparse matrices, but matrix 1 is a list"):
        SparseBasis.from_scipy([scipy.sparse.eye_array(2), [[1.0, 0.0], [0.0, 1.0]]])


@pytest.mark.parametrize("array", [np.ones((1, 2, 2)), np.ones((2, 1, 2, 2)), [[[1.0, 0.0], [0.0, 1.0]]]])
def test_from_torch_refuses_what_is_not_a_torch_tensor(array):
    with pytest.raises(TypeError, match=r"tensor must be a torch tensor, got (ndarray|list)"):
        SparseBasis.from_torch(array)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_a_scipy_graph_keeps_its_floating_dtype(dtype):
    from structconv import gcn_basis

    adjacency = scipy.sparse.csr_array(np.ones((3, 3), dtype=dtype))
    assert gcn_basis(adjacency).dtype == (np.float64 if dtype is np.int64 else dtype)


@pytest.mark.parametrize("lambda_max", [float("inf"), float("nan"), 0.0, -1.0])
def test_chebyshev_refuses_a_lambda_max_that_is_not_positive_and_finite(lambda_max):
    from structconv import graph_basis

    with pytest.raises(ValueError, match=r"lambda_max must be a positive number \(finite\)"):
        graph_basis(_EDGE_INDEX, "chebyshev", K=2, lambda_max=lambda_max)


@pytest.mark.parametrize("num_targets", [2.5, True, -1, "3"])
def test_a_bipartite_target_count_must_be_an_integer(num_targets):
    from structconv.structures.edge_list import as_edges

    with pytest.raises(ValueError, match=f"num_targets must be a non-negative integer, got {num_targets!r}"):
        as_edges(_EDGE_INDEX, 3, num_targets=num_targets)
