"""Positional builders refuse grids whose tables cannot fit, from the grid's size alone."""

from __future__ import annotations

import pytest
import torch
from conftest import memory_budget

from structconv import QuadraticPosition


def test_quadratic_heads_on_an_implausible_grid_are_refused_before_allocating() -> None:
    with memory_budget(0.5), pytest.raises(ValueError, match=r"grid \(10000, 10000\) has 100,000,000 positions"):
        QuadraticPosition((10**4, 10**4), torch.zeros(9, 2), torch.ones(9)).basis()
