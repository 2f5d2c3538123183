"""The last raw errors of issue 32: each bad input refused with one line naming the argument."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structconv import EdgeBasis, graph_basis
from structconv.cli import main
from structconv.data import load_planetoid


# --- EdgeBasis ----------------------------------------------------------------------------------------
def test_edge_basis_given_lists_names_the_argument() -> None:
    src, dst, weights = np.array([0, 1]), np.array([1, 0]), np.ones((2, 1))
    with pytest.raises(TypeError, match=r"^src must be a numpy.ndarray or a torch.Tensor of shape \(E,\), got list$"):
        EdgeBasis([0, 1], [1, 0], [[1.0], [1.0]], (2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^weights must be a numpy.ndarray or a torch.Tensor of shape \(E, K\)"):
        EdgeBasis(src, dst, [[1.0], [1.0]], (2, 2))  # type: ignore[arg-type]
    assert EdgeBasis(src, dst, weights, [2, 2]).shape == (1, 2, 2)  # a list of two sizes is a shape


@pytest.mark.parametrize("shape", [(1, 2, 2), (2,), 4, "22", (2, 2.0), (2, -1), (True, 2)])
def test_edge_basis_shape_must_be_two_sizes(shape: object) -> None:
    with pytest.raises(ValueError, match=r"^shape must be \(M, N\), two non-negative integers, got"):
        EdgeBasis(np.array([0, 1]), np.array([1, 0]), np.ones((2, 1)), shape)  # type: ignore[arg-type]


# --- graph_basis(..., "relational") ----------------------------------------------------------------------
def test_relational_basis_of_an_empty_graph_needs_num_relations() -> None:
    empty, types = np.zeros((2, 0), np.int64), np.zeros(0, np.int64)
    with pytest.raises(ValueError, match=r"^num_relations is needed for a graph without edges"):
        graph_basis(empty, "relational", num_nodes=3, edge_type=types)
    basis = graph_basis(empty, "relational", num_nodes=3, edge_type=types, num_relations=2)
    assert basis.shape == (2, 3, 3)
    assert not np.asarray(basis.to_dense()).any()


# --- load_planetoid ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("root", "kind"), [(None, "NoneType None"), (5, "int 5")])
def test_load_planetoid_root_must_be_a_path(root: object, kind: str) -> None:
    with pytest.raises(TypeError, match=rf"^root must be a str or os.PathLike .*, got {kind}$"):
        load_planetoid(root)  # type: ignore[arg-type]


# --- structconv planetoid --model ------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "entry"), [("gcn,,gat", 2), ("gcn,", 2), (",gcn", 1)])
def test_cli_empty_model_entry_names_model_and_entry(
    given: str, entry: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["planetoid", "--data", str(tmp_path / "absent"), "--model", given]) == 2
    err = capsys.readouterr().err
    assert f"--model: entry {entry} of {given!r} is empty" in err
    assert "absent" not in err and err.count("\n") == 1


# --- attention on NumPy arrays: no fused kernel, the dense scores refused before they are allocated ------
TOKENS = 40_000  # (40,000)^2 float64 scores: 12.8 GB a head and image, and as much again for the weights


@pytest.mark.parametrize("mechanism", ["transformer", "bilinear"])
@pytest.mark.parametrize(("batch", "capacity_gib"), [(1, 16.0), (64, None)])
def test_numpy_attention_scores_beyond_the_device_are_refused_before_allocating(
    mechanism: str, batch: int, capacity_gib: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import memory_budget

    from structconv import BiAffine, attention_basis, conv
    from structconv.backend import checks

    if capacity_gib is not None:  # a host of 16 GiB: the one image's 23.8 GiB of scores and weights cannot fit
        monkeypatch.setitem(checks._CAPACITY, "cpu", capacity_gib * 2**30)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, TOKENS, 2))
    if mechanism == "transformer":
        mech = BiAffine(key=rng.normal(size=(1, 2, 2)), query=rng.normal(size=(1, 2, 2)))
    else:
        mech = BiAffine(bilinear=rng.normal(size=(1, 2, 2)))
    need = rf"\({batch}, 1, 40000, 40000\) \(B, K, M, N\) would take " + re.escape(
        f"{2 * batch * TOKENS**2 * 8 / 2**30:.3g} GiB"
    )
    with (
        memory_budget(1.0),
        pytest.raises(ValueError, match=r"^attention of 40,000 inputs to 40,000 outputs: .*" + need),
    ):
        basis = attention_basis(x, mechanism=mech)  # the projections are kept; the bilinear scores refused here
        conv(basis, x, rng.normal(size=(1, 2, 3)))


# --- attention masks over the keys alone: torch's key_padding_mask shapes --------------------------------
def _key_padding_case(batched: bool) -> tuple[Any, ...]:
    import torch

    B, M, N, P, D, Q = 3, 5, 4, 3, 2, 2
    rng = np.random.default_rng(1)
    x, z = rng.normal(size=(B, M, P)), rng.normal(size=(B, N, P))
    key, query, theta = rng.normal(size=(1, P, D)), rng.normal(size=(1, P, D)), rng.normal(size=(1, P, Q))
    ignored = rng.random((B, M) if batched else (M,)) < 0.4  # torch's key_padding_mask: True = ignore the key
    ignored[..., 0] = False  # every query keeps a key (an all-ignored row is NaN in torch's kernel)
    additive = np.where(ignored, -np.inf, 0.0)
    return torch, x, z, key, query, theta, ignored, additive


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_an_additive_mask_over_the_keys_is_key_padding(batched: bool, backend: str) -> None:
    from structconv import BiAffine, attention_basis, conv

    torch, x, z, key, query, theta, ignored, additive = _key_padding_case(batched)
    # The dense reference: scores, the ignored keys (rows m) at -inf, softmax over m, A^T x theta.
    scores = np.einsum("bmd,bnd->bmn", x @ key[0], z @ query[0]) * 0.5
    allowed = ~np.broadcast_to(ignored[..., None] if batched else ignored[None, :, None], scores.shape)
    weights = np.exp(np.where(allowed, scores, -np.inf) - scores.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    reference = np.einsum("bmn,bmp,pq->bnq", weights, x, theta[0])
    # torch's fused attention with the equivalent mask: key_padding_mask's ignored keys at -inf.
    t = torch.from_numpy
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        t(z @ query[0])[:, None], t(x @ key[0])[:, None], t(x @ theta[0])[:, None],
        attn_mask=t(additive).reshape(-1 if batched else 1, 1, 1, additive.shape[-1]), scale=0.5,
    )[:, 0]  # fmt: skip
    np.testing.assert_allclose(sdpa.numpy(), reference, rtol=1e-10, atol=1e-12)

    cast = (lambda a: a) if backend == "numpy" else t
    mech = BiAffine(key=cast(key), query=cast(query), scale=0.5)
    basis = attention_basis(cast(x), cast(z), mechanism=mech, mask=cast(additive))
    orders = ["ax", "xtheta"] + (["sdpa"] if backend == "torch" else [])
    for order in orders:
        y = conv(basis, cast(x), cast(theta), order=order)
        np.testing.assert_allclose(np.asarray(y), reference, rtol=1e-10, atol=1e-12, err_msg=order)


@pytest.mark.parametrize("batched", [False, True])
def test_a_boolean_mask_over_the_keys_is_refused_naming_key_padding_mask(batched: bool) -> None:
    from structconv import BiAffine, attention_basis

    torch, x, z, key, query, _, ignored, _ = _key_padding_case(batched)
    mech = BiAffine(key=torch.from_numpy(key), query=torch.from_numpy(query))
    shape = r"\(3, 5\)" if batched else r"\(5,\)"
    with pytest.raises(ValueError, match=rf"^mask of shape {shape} is a boolean mask over the keys .*key_padding_mask"):
        attention_basis(torch.from_numpy(x), torch.from_numpy(z), mechanism=mech, mask=torch.from_numpy(ignored))
    # As the message says: the allowed keys, True = may attend, at (B, 1, M, 1) (or (M, 1)).
    allowed = torch.from_numpy(~ignored)
    mask = allowed[:, None, :, None] if batched else allowed[:, None]
    attention_basis(torch.from_numpy(x), torch.from_numpy(z), mechanism=mech, mask=mask)


def test_a_1d_mask_of_another_length_than_the_keys_is_refused() -> None:
    from structconv import BiAffine, attention_basis

    x = np.ones((2, 4, 3))
    with pytest.raises(ValueError, match=r"^mask of shape \(5,\): a 1-D mask is over the keys .* \(M,\) = \(4,\)$"):
        attention_basis(x, mechanism=BiAffine(bilinear=np.ones((1, 3, 3))), mask=np.zeros(5))
