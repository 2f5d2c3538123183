"""The last raw errors of issue 32: each bad input refused with one line naming the argument."""

from __future__ import annotations

import re
from pathlib import Path

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
    from structconv.bases import attention as attention_module

    if capacity_gib is not None:  # a host of 16 GiB: the one image's 23.8 GiB of scores and weights cannot fit
        monkeypatch.setitem(attention_module._CAPACITY, "cpu", capacity_gib * 2**30)
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
