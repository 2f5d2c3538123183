r""":math:`\Theta` stored as torch stores a convolution's weight: ``(Q, P/G, *kernel)``.

``torch.nn.Conv{1,2,3}d`` keeps one tensor :math:`W` of shape ``(Q, P/G, k_1, ..., k_d)``, with
:math:`G` groups.  Read as a parameter of the formula, member :math:`k` (the kernel positions in
row-major order) is the block-diagonal map

.. math::

    \Theta_{k,\;gP' + i,\;hQ' + o} = \delta_{gh}\, W_{gQ' + o,\; i,\; k},
    \qquad P' = P/G,\ Q' = Q/G .

:class:`ConvWeight` names that reading, so that a convolution's weight reaches the engine as it
is stored: a native convolution order takes :math:`W` (and ``groups``) as they are, with no
transpose and no block-diagonal zeros; every other order forms :math:`\Theta` first (for one
group this is a view of :math:`W`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..backend import Array, device_of, einsum, of, shape_str
from ..backend.checks import check_array


def conv_weight_full(weight: Array, groups: int) -> Array:
    r"""The full :math:`\Theta` ``(K, P, Q)`` of a convolution weight ``(Q, P/G, *kernel)`` with :math:`G` groups."""
    Q, Pg = int(weight.shape[0]), int(weight.shape[1])
    w = weight.reshape(Q, Pg, -1)  # (Q, P', K)
    if groups == 1:
        return of(w).namespace().permute_dims(w, (2, 1, 0))
    K = int(w.shape[2])
    blocks = w.reshape(groups, Q // groups, Pg, K)  # (g, o, i, k)
    eye = of(weight).namespace().eye(groups, dtype=weight.dtype, device=device_of(weight))
    return einsum("goik,gh->kgiho", blocks, eye).reshape(K, groups * Pg, Q)


@dataclass(frozen=True, eq=False)
class ConvWeight:
    r"""A parameter :math:`\Theta` ``(K, P, Q)`` held as a convolution weight :math:`W` ``(Q, P/G, *kernel)``.

    Parameters
    ----------
    weight
        :math:`W`, shape ``(Q, P/G, k_1, ..., k_d)`` with :math:`d \ge 1`; ``K`` is
        :math:`\prod_i k_i` (the kernel positions, row-major, are the members).
    groups
        :math:`G`, as ``torch.nn.Conv{d}d``'s ``groups``: :math:`\Theta_k` is block diagonal with
        :math:`G` blocks of shape ``(P/G, Q/G)``.  ``Q`` must be a multiple of :math:`G`.

    Examples
    --------
    >>> import torch
    >>> from structconv import ConvWeight, conv, grid_basis
    >>> conv2d = torch.nn.Conv2d(4, 6, 3, padding=1, groups=2, bias=False)
    >>> theta = ConvWeight(conv2d.weight, groups=2)
    >>> theta.shape
    (9, 4, 6)
    >>> x = torch.randn(1, 4, 5, 5)
    >>> y = conv(grid_basis((5, 5), 3, padding=1), x.flatten(2).transpose(1, 2), theta)
    >>> torch.allclose(y.transpose(1, 2).reshape(1, 6, 5, 5), conv2d(x), atol=1e-5)
    True
    """

    weight: Array
    groups: int = 1

    def __post_init__(self) -> None:
        check_array(self.weight, "weight", tuple(range(3, 9)), ("(Q, P/G, k_1, ..., k_d)",))
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) or self.groups <= 0:
            raise ValueError(f"groups must be a positive integer, got {self.groups!r}")
        if int(self.weight.shape[0]) % self.groups:
            raise ValueError(
                f"weight has shape {shape_str(tuple(self.weight.shape))}: its Q={int(self.weight.shape[0])} "
                f"output channels must be divisible by groups={self.groups}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, P, Q)`` of the full parameter."""
        w = self.weight
        return (math.prod([int(s) for s in w.shape[2:]]), int(w.shape[1]) * self.groups, int(w.shape[0]))

    @property
    def rank(self) -> int:
        """:math:`G`, the number of diagonal blocks."""
        return self.groups

    def full(self) -> Array:
        """The full parameter of shape ``(K, P, Q)`` (a view of :attr:`weight` for one group)."""
        return conv_weight_full(self.weight, self.groups)


__all__ = ["ConvWeight", "conv_weight_full"]
