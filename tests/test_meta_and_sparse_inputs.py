"""Meta-device and torch-sparse inputs: a right shape where no value is read, else an error naming the argument.

Meta tensors hold no values.  Where the package only places a result (a layer's ``x``, a
builder's ``like``) a meta array is accepted and the graph, which holds values, is read where it
is; where values are read (an ``edge_index``, ``edge_weight`` or ``edge_type``, a dense array
searched for its non-zero entries) a meta array is refused with its name, except a layer's
``edge_weight`` beside a meta ``x`` (as PyG's layers take it: only the output's values need it).  Torch sparse ``x`` or
``theta`` are refused by the engine's operand checks, while sparse bases and the graph layers'
sparse node features are still accepted.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from structconv import LowRank, SparseBasis, apply_shifts, conv, gcn_basis, graph_basis, grid_basis
from structconv import nn as snn
from structconv.structures.graph import (
    add_remaining_self_loops,
    as_edges,
    gcn_normalize,
    laplacian,
    remove_self_loops,
    walk_normalize,
)

EI = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 1, 3]])
N = 4
META = "meta"


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(*shape, device=META, dtype=dtype)


def _on_meta(y: Any, shape: tuple[int, ...]) -> None:
    assert isinstance(y, torch.Tensor)
    assert y.device.type == META
    assert tuple(y.shape) == shape


# --- A. the graph layers on the meta device --------------------------------------------------------------
LAYERS = {
    "GCNConv": lambda: snn.GCNConv(4, 2),
    "GCNConv-improved": lambda: snn.GCNConv(4, 2, improved=True),
    "GCNConv-unnormalised": lambda: snn.GCNConv(4, 2, normalize=False),
    "SGConv": lambda: snn.SGConv(4, 2, K=2),
    "TAGConv": lambda: snn.TAGConv(4, 2, K=3),
    "TAGConv-unnormalised": lambda: snn.TAGConv(4, 2, normalize=False),
    "ChebConv-sym": lambda: snn.ChebConv(4, 2, 3),
    "ChebConv-rw": lambda: snn.ChebConv(4, 2, 2, normalization="rw"),
    "GATConv": lambda: snn.GATConv(4, 2, heads=2),
    "GATConv-no-loops": lambda: snn.GATConv(4, 2, add_self_loops=False),
}


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("graph", ["edge_index", "adj_t"])
def test_graph_layer_runs_on_meta_beside_a_host_graph(name: str, graph: str) -> None:
    """Layer and x on meta, the graph on the CPU: normalised there, the output a meta tensor of the CPU run's shape."""
    g: Any = EI if graph == "edge_index" else torch.sparse_coo_tensor(EI.flip(0), torch.ones(EI.shape[1]), (N, N))
    layer = LAYERS[name]()
    expected = tuple(layer(torch.ones(N, 4), g).shape)
    _on_meta(layer.to(META)(_meta(N, 4), g), expected)


@pytest.mark.parametrize("heads", [1, 2])
def test_gat_with_few_channels_runs_on_meta(heads: int) -> None:
    """One channel in and out: the engine's pick (A·Θ first) would form the dense basis, which meta cannot."""
    layer = snn.GATConv(1, 1, heads=heads)
    expected = tuple(layer(torch.ones(N, 1), EI).shape)
    _on_meta(layer.to(META)(_meta(N, 1), EI), expected)


def test_rgcn_runs_on_meta_beside_a_host_graph() -> None:
    layer = snn.RGCNConv(4, 2, 2)
    edge_type = torch.tensor([0, 1, 0, 1, 1])
    expected = tuple(layer(torch.ones(N, 4), EI, edge_type).shape)
    _on_meta(layer.to(META)(_meta(N, 4), EI, edge_type), expected)


@pytest.mark.parametrize("name", list(LAYERS))
def test_graph_layer_names_x_on_another_device(name: str) -> None:
    """A meta x beside CPU parameters: a device mismatch naming x (it used to fail inside the normalisation)."""
    with pytest.raises(ValueError, match=r"x is on device meta but the layer's parameters are on cpu"):
        LAYERS[name]()(_meta(N, 4), EI)


def test_gat_names_each_input_and_edge_attr_on_another_device() -> None:
    layer = snn.GATConv((4, 3), 2)
    with pytest.raises(ValueError, match=r"x\[0\] is on device meta"):
        layer((_meta(N, 4), torch.ones(N, 3)), EI)
    with pytest.raises(ValueError, match=r"x\[1\] is on device meta"):
        layer((torch.ones(N, 4), _meta(N, 3)), EI)
    with pytest.raises(ValueError, match=r"edge_attr is on device meta"):
        snn.GATConv(4, 2, edge_dim=3)(torch.ones(N, 4), EI, _meta(EI.shape[1], 3))


def test_gat_on_meta_with_edge_features() -> None:
    """A numeric fill_value needs no values; a reduction of edge_attr by target is refused, naming fill_value."""
    attr = _meta(EI.shape[1], 3)
    layer = snn.GATConv(4, 2, edge_dim=3, fill_value=0.5).to(META)
    _on_meta(layer(_meta(N, 4), EI, attr), (N, 2))
    with pytest.raises(ValueError, match=r"x is on the meta device: fill_value='mean'"):
        snn.GATConv(4, 2, edge_dim=3).to(META)(_meta(N, 4), EI, attr)


@pytest.mark.parametrize("name", ["GCNConv", "GCNConv-improved", "SGConv", "TAGConv", "ChebConv-sym", "ChebConv-rw"])
def test_graph_layer_takes_meta_edge_weight_beside_meta_x(name: str) -> None:
    """Layer, x and edge_weight on meta, edge_index on the CPU: a meta output, as PyG's layers give.

    The weights' values would only reach the output's values, which meta holds none of.  Beside a
    CPU x a meta edge_weight is still refused, naming it (PyG fails there inside torch).
    """
    layer = LAYERS[name]()
    expected = tuple(layer(torch.ones(N, 4), EI, torch.ones(EI.shape[1])).shape)
    with pytest.raises(ValueError, match=r"edge_weight is on the meta device: .* reads its values"):
        layer(torch.ones(N, 4), EI, _meta(EI.shape[1]))
    _on_meta(layer.to(META)(_meta(N, 4), EI, _meta(EI.shape[1])), expected)


def test_rgcn_refuses_meta_edge_type() -> None:
    with pytest.raises(ValueError, match=r"edge_type is on the meta device: .* reads its values"):
        snn.RGCNConv(4, 2, 2).to(META)(_meta(N, 4), EI, torch.tensor([0, 1, 0, 1, 1], device=META))


# --- A. the graph builders ------------------------------------------------------------------------------
def test_builders_refuse_a_meta_graph_or_weights() -> None:
    like = _meta(1)
    with pytest.raises(ValueError, match=r"edge_index is on the meta device: reading the graph .* reads its values"):
        gcn_basis(EI.to(META), num_nodes=N, like=like)
    with pytest.raises(ValueError, match=r"graph is on the meta device"):
        gcn_basis(torch.ones(N, N, device=META), like=like)
    with pytest.raises(ValueError, match=r"edge_weight is on the meta device"):
        gcn_basis(EI, num_nodes=N, edge_weight=_meta(EI.shape[1]), like=torch.ones(1))
    with pytest.raises(ValueError, match=r"edge_type is on the meta device"):
        graph_basis(EI, "relational", edge_type=torch.tensor([0, 1, 0, 1, 1], device=META))


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_basis_with_a_meta_like_is_built_on_the_host_then_placed(weighted: bool) -> None:
    """``like`` on meta only places the basis (it used to fail copying CPU weights to meta, or reading them there)."""
    weight = torch.rand(EI.shape[1], dtype=torch.float64) + 0.5 if weighted else None
    basis = gcn_basis(EI, num_nodes=N, edge_weight=weight, like=_meta(1, dtype=torch.float64))
    host = gcn_basis(EI, num_nodes=N, edge_weight=weight, like=torch.ones(1, dtype=torch.float64))
    assert (basis.device, basis.dtype, basis.shape, basis.stored) == (META, torch.float64, host.shape, host.stored)
    y = conv(basis, _meta(N, 3, dtype=torch.float64), _meta(1, 3, 2, dtype=torch.float64))
    _on_meta(y, (N, 2))


@pytest.mark.parametrize("kind", ["adjacency", "gcn", "powers", "chebyshev", "diffusion", "relational"])
def test_graph_basis_with_a_meta_like(kind: str) -> None:
    extra: dict[str, Any] = {}
    if kind == "relational":
        extra = {"edge_type": torch.tensor([0, 1, 0, 1, 1]), "walks": [[0, 1]]}
    basis = graph_basis(EI, kind, K=2, like=_meta(1), **extra)
    assert basis.shape == graph_basis(EI, kind, K=2, like=torch.ones(1), **extra).shape
    assert basis.device == META
    _on_meta(conv(basis, _meta(N, 3), _meta(basis.K, 3, 2), order="ax"), (N, 2))


@pytest.mark.parametrize(
    "normalise", [gcn_normalize, add_remaining_self_loops, remove_self_loops, laplacian, walk_normalize]
)
def test_normalisations_refuse_meta_edges(normalise: Any) -> None:
    """Edges placed on meta (as_edges with a meta like) cannot be normalised: a clear error, not ``.item()``."""
    edges = as_edges(EI, N, like=_meta(1))
    with pytest.raises(ValueError, match=r"the graph's edges are on the meta device .* reads their values"):
        normalise(edges)


# --- A. sparse bases on meta -----------------------------------------------------------------------------
def test_sparse_basis_from_meta_arrays_is_refused() -> None:
    with pytest.raises(ValueError, match=r"array is on the meta device: SparseBasis.from_dense .* reads its values"):
        SparseBasis.from_dense(torch.ones(1, 2, 2, device=META))
    with pytest.raises(ValueError, match=r"tensor is on the meta device: SparseBasis.from_torch"):
        SparseBasis.from_torch(torch.ones(1, 2, 2).to_sparse().to(META))
    with pytest.raises(ValueError, match=r"values is on the meta device: .* reads its values"):
        SparseBasis(torch.zeros(3, 1, dtype=torch.int64), _meta(1), (1, 2, 2))


@pytest.mark.parametrize("order", ["auto", "ax", "xtheta"])
def test_conv_over_a_sparse_basis_moved_to_meta(order: str) -> None:
    """The product kernel skips its CSR build (a bincount of the rows) on meta: ``GCNConv(normalize=False)``'s path."""
    basis = gcn_basis(EI, num_nodes=N).to(META)
    assert basis.device == META
    _on_meta(conv(basis, _meta(N, 3), _meta(1, 3, 2), order=order), (N, 2))


def test_atheta_over_a_meta_sparse_basis_names_the_basis() -> None:
    basis = gcn_basis(EI, num_nodes=N).to(META)
    with pytest.raises(ValueError, match=r"the basis is on the meta device: order='atheta'"):
        conv(basis, _meta(N, 3), _meta(1, 3, 2), order="atheta")


# --- A. pooling and shifts on meta ------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [True, False])
def test_avg_pool_of_a_meta_input(d: int, count_include_pad: bool, ceil_mode: bool) -> None:
    """torch's AvgPool takes a meta input; so does ours, with the column scale formed on the host."""
    kwargs = {"kernel_size": 1 if d == 3 else 2, "stride": 2, "ceil_mode": ceil_mode}
    kwargs["count_include_pad"] = count_include_pad
    shape = (1, 2, 5, 5, 2)[: 2 + d]
    ours, theirs = getattr(snn, f"AvgPool{d}d")(**kwargs), getattr(torch.nn, f"AvgPool{d}d")(**kwargs)
    x = torch.rand(*shape, dtype=torch.float64)
    _on_meta(ours(x.to(META)), tuple(theirs(x.to(META)).shape))
    torch.testing.assert_close(ours(x), theirs(x))  # the host path is untouched


def test_avg_pool_with_divisor_override_on_meta() -> None:
    x = torch.rand(1, 2, 5, 5)
    layer = snn.AvgPool2d(2, stride=2, ceil_mode=True, divisor_override=3)
    _on_meta(layer(x.to(META)), tuple(torch.nn.AvgPool2d(2, 2, ceil_mode=True, divisor_override=3)(x).shape))


def test_apply_shifts_of_a_meta_input() -> None:
    """The native kernel compares the tap weights to pick avg_pool; on meta it takes the depthwise convolution."""
    _on_meta(apply_shifts(grid_basis((4,), (1,)), _meta(2, 4, 3), order="native"), (2, 1, 4, 3))
    basis = grid_basis((4,), (3,))
    _on_meta(apply_shifts(basis, _meta(2, 4, 3)), tuple(apply_shifts(basis, torch.ones(2, 4, 3)).shape))


# --- A. multi-head attention on meta ----------------------------------------------------------------------
MHA_MASKS = {
    "attn_mask bool": lambda m: {"attn_mask": m},
    "attn_mask float": lambda m: {"attn_mask": torch.zeros(6, 6).masked_fill(m, float("-inf")).add(m.float() * 0.5)},
    "key_padding_mask": lambda m: {"key_padding_mask": m[:2]},
    "both": lambda m: {"attn_mask": m, "key_padding_mask": m[:2]},
    "is_causal": lambda m: {"attn_mask": m, "is_causal": True, "need_weights": False},
}


@pytest.mark.parametrize("masks", list(MHA_MASKS))
@pytest.mark.parametrize("extras", [False, True])
def test_attention_on_meta_beside_host_masks(masks: str, extras: bool) -> None:
    """torch's MultiheadAttention on meta takes masks on the host; ours reads them there and places the result."""
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(0)) < 0.3
    kwargs = MHA_MASKS[masks](mask)
    options = {"add_bias_kv": extras, "add_zero_attn": extras}
    ours = snn.MultiHeadSelfAttention(4, 2, **options).to(META).eval()
    theirs = torch.nn.MultiheadAttention(4, 2, **options).to(META).eval()
    x = _meta(6, 2, 4)
    y, w = ours(x, x, x, **kwargs)
    y_ref, w_ref = theirs(x, x, x, **kwargs)
    _on_meta(y, tuple(y_ref.shape))
    if w_ref is None:
        assert w is None
    else:
        _on_meta(w, tuple(w_ref.shape))


@pytest.mark.parametrize("name", ["attn_mask", "key_padding_mask"])
def test_attention_refuses_a_meta_mask(name: str) -> None:
    """A mask's values are read (checked, folded into the scores): a meta mask is refused with its name."""
    shape = (6, 6) if name == "attn_mask" else (2, 6)
    layer = snn.MultiHeadSelfAttention(4, 2).to(META)
    x = _meta(6, 2, 4)
    with pytest.raises(ValueError, match=rf"{name} is on the meta device: .* reads its values"):
        layer(x, x, x, **{name: torch.zeros(*shape, dtype=torch.bool, device=META)})


# --- B. torch sparse operands ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_conv_refuses_sparse_x_and_theta(layout: str) -> None:
    def sparse(t: torch.Tensor) -> torch.Tensor:
        return t.to_sparse() if layout == "coo" else t.to_sparse_csr()

    a, x, theta = torch.rand(2, 3, 4), torch.rand(5, 3, 6), torch.rand(2, 6, 7)
    with pytest.raises(
        TypeError, match=r"x must be a dense \(strided\) array, got layout torch\.sparse_.*x\.to_dense\(\)"
    ):
        conv(a, sparse(x), theta)
    with pytest.raises(TypeError, match=r"theta must be a dense \(strided\) array, got layout .*theta\.to_dense\(\)"):
        conv(a, x, sparse(theta) if layout == "coo" else theta.to_sparse())
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) array"):
        conv(a, sparse(x[0]), theta)


def test_sparse_factors_and_shift_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match=r"value must be a dense \(strided\) array"):
        LowRank(torch.rand(2, 6, 1).to_sparse(), torch.rand(2, 7, 1))
    with pytest.raises(TypeError, match=r"x must be a dense \(strided\) array"):
        apply_shifts(grid_basis((4,), (3,)), torch.rand(2, 4, 3).to_sparse())


def test_sparse_bases_and_sparse_node_features_are_still_accepted() -> None:
    """A sparse ``a`` is a SparseBasis; the graph layers densify sparse node features as PyG's Linear does."""
    a, x, theta = torch.rand(2, 3, 4), torch.rand(5, 3, 6), torch.rand(2, 6, 7)
    torch.testing.assert_close(conv(a.to_sparse(), x, theta), conv(a, x, theta))
    layer = snn.GCNConv(4, 2)
    feats = torch.rand(N, 4)
    torch.testing.assert_close(layer(feats.to_sparse(), EI), layer(feats, EI))
