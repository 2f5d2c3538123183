"""Positional builders refuse grids whose tables cannot fit, from the grid's size alone."""

from __future__ import annotations

import pytest
import torch
from conftest import memory_budget

from structconv import quadratic_scores


def test_quadratic_heads_on_an_implausible_grid_are_refused_before_allocating() -> None:
    # Per-axis forms make 10^8 positions plausible (their factors are K S^2 per axis); 10^12 are not.
    with memory_budget(0.5), pytest.raises(ValueError, match=r"grid \(1000000, 1000000\) has 1,000,000,000,000 pos"):
        quadratic_scores((10**6, 10**6), torch.zeros(9, 2), torch.ones(9)).basis()
