"""The last raw errors of issue 32: each bad input refused with one line naming the argument."""

from __future__ import annotations

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
