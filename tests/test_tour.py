"""``structconv tour``, the main job: each part on real data, and a summary that tells a failed check."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from structconv.data.cifar import FOLDER, OFFICIAL
from structconv.experiments import tour

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_cora = pytest.mark.skipif(not (DATA / "planetoid").is_dir(), reason="needs ../shared/data/planetoid")
needs_cifar = pytest.mark.skipif(
    not any((DATA / name).is_file() for name in (OFFICIAL, FOLDER)), reason="needs a CIFAR-10 archive in ../shared/data"
)


def _args(tmp_path: Path, parts: tuple[str, ...], **kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tour.add_arguments(parser)
    argv = ["--data", str(DATA), "--out", str(tmp_path), "--parts", ",".join(parts), "--no-progress"]
    args = parser.parse_args(argv)
    for key, value in kw.items():
        setattr(args, key, value)
    return args


@needs_cifar
def test_the_theorem_part_holds_on_a_real_image_and_draws_it(tmp_path: Path) -> None:
    row = tour.theorem_on_image(DATA, tmp_path, cache=str(tmp_path / "cache"))
    assert row.passed
    assert row.detail["errors"]["float64"] <= 1e-12
    assert (tmp_path / "theorem.png").stat().st_size > 10_000


@needs_cora
def test_planetoid_rows_name_the_published_numbers_and_check_them(tmp_path: Path) -> None:
    rows = tour.planetoid(DATA / "planetoid", models=("gcn",), seeds=2, progress=False, epochs=5)
    (row,) = rows
    assert row.detail["published"] == 81.5
    assert len(row.detail["accuracies"]) == 2
    assert "Kipf & Welling" in row.reference
    assert row.passed is False  # 5 epochs are far from the paper: the row says so


def test_a_data_directory_without_the_data_is_refused_before_any_part_runs(tmp_path: Path) -> None:
    args = _args(tmp_path, ("identities", "planetoid"), data=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no planetoid/ folder"):
        tour.run_tour(args)
    assert not (tmp_path / "summary.md").exists()


def test_the_summary_is_written_and_a_failed_check_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        tour, "identities", lambda cases: tour.Row("identities", "laws", "1 of 2 hold", "all hold", 0.1, False)
    )
    assert tour.run_tour(_args(tmp_path, ("identities",))) == 1
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved[0]["passed"] is False
    assert "FAILED" in (tmp_path / "summary.md").read_text()


def test_the_identities_part_passes(tmp_path: Path) -> None:
    assert tour.run_tour(_args(tmp_path, ("identities",), cases=2)) == 0
    assert "| identities |" in (tmp_path / "summary.md").read_text()
