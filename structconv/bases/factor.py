r"""Factorised parameters :math:`\Theta` that the engine contracts without forming them.

* :class:`Separable` (Andreoli §1.3, Eq. 9):
  :math:`\Theta = \Theta^{(\mathrm{basis})} \circ \Theta^{(\mathrm{channel})}`, i.e.
  :math:`\Theta_k = \sum_h c_{hk}\, \Theta^{(\mathrm{channel})}_h` with :math:`c` of shape
  ``(H, K)`` and :math:`\Theta^{(\mathrm{channel})}` of shape ``(H, P, Q)``.  ``H = 1`` is a
  depth-wise separable convolution.
* :class:`LowRank` (Eq. 13, multi-head attention):
  :math:`\Theta_k = \Theta^{(\mathrm{value})}_k \Theta^{(\mathrm{out})\top}_k` with value maps
  ``(K, P, D)`` and output maps ``(K, Q, D)``.
* :class:`Aggregation`: :math:`\Theta_k = c_k I`, one scalar per member and no channel map, so
  :math:`y = \sum_k c_k A_k^\top x` keeps the ``P`` channels of ``x`` (GIN's
  :math:`(1 + \epsilon)x_n + \sum_{m \to n} x_m` on the basis :math:`[I, A]`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backend import Array, device_of, einsum, namespace, shape_str
from ..backend.checks import check_array, check_same_placement
from .conv_weight import ConvWeight


@dataclass(frozen=True, eq=False)
class Separable:
    r"""A separable parameter :math:`\Theta_k = \sum_h c_{hk}\Theta^{(\mathrm{channel})}_h`.

    Parameters
    ----------
    basis_coef
        :math:`\Theta^{(\mathrm{basis})}`, shape ``(H, K)``.
    channel
        :math:`\Theta^{(\mathrm{channel})}`, shape ``(H, P, Q)``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import Separable
    >>> theta = Separable(np.ones((1, 9)), np.ones((1, 4, 8)))
    >>> theta.shape, theta.full().shape
    ((9, 4, 8), (9, 4, 8))
    """

    basis_coef: Array
    channel: Array

    def __post_init__(self) -> None:
        check_array(self.basis_coef, "basis_coef", (2,), ("(H, K)",))
        check_array(self.channel, "channel", (3,), ("(H, P, Q)",))
        check_same_placement({"basis_coef": self.basis_coef, "channel": self.channel})
        if self.basis_coef.shape[0] != self.channel.shape[0]:
            raise ValueError(
                f"basis_coef has shape {shape_str(tuple(self.basis_coef.shape))} and channel has shape "
                f"{shape_str(tuple(self.channel.shape))}: their first dimensions (H) must agree"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, P, Q)`` of the full parameter."""
        return (int(self.basis_coef.shape[1]), int(self.channel.shape[1]), int(self.channel.shape[2]))

    @property
    def rank(self) -> int:
        """``H``, the number of channel maps."""
        return int(self.basis_coef.shape[0])

    def full(self) -> Array:
        """The full parameter of shape ``(K, P, Q)``."""
        return einsum("hk,hpq->kpq", self.basis_coef, self.channel)


@dataclass(frozen=True, eq=False)
class LowRank:
    r"""A low-rank parameter :math:`\Theta_k = V_k O_k^\top` (Eq. 13 of Andreoli).

    Parameters
    ----------
    value
        :math:`V`, shape ``(K, P, D)`` (per-head value maps).
    out
        :math:`O`, shape ``(K, Q, D)`` (per-head blocks of the output projection).

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import LowRank
    >>> LowRank(np.ones((8, 16, 2)), np.ones((8, 16, 2))).shape
    (8, 16, 16)
    """

    value: Array
    out: Array

    def __post_init__(self) -> None:
        check_array(self.value, "value", (3,), ("(K, P, D)",))
        check_array(self.out, "out", (3,), ("(K, Q, D)",))
        check_same_placement({"value": self.value, "out": self.out})
        v, o = tuple(self.value.shape), tuple(self.out.shape)
        if v[0] != o[0] or v[2] != o[2]:
            raise ValueError(
                f"value has shape {shape_str(v)} and out has shape {shape_str(o)}: "
                "they must agree on K (first) and D (last)"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, P, Q)`` of the full parameter."""
        return (int(self.value.shape[0]), int(self.value.shape[1]), int(self.out.shape[1]))

    @property
    def rank(self) -> int:
        """``D``, the inner dimension of each head."""
        return int(self.value.shape[2])

    def full(self) -> Array:
        """The full parameter of shape ``(K, P, Q)``."""
        return einsum("kpd,kqd->kpq", self.value, self.out)


@dataclass(frozen=True, eq=False)
class Aggregation:
    r"""The members summed with one scalar each: :math:`\Theta_k = c_k I_P`.

    :math:`y = \sum_k c_k A_k^\top x` mixes no channels, so the engine never forms the
    identity maps (a full ``(K, P, P)`` :math:`\Theta` would cost :math:`P^2` per entry).

    Parameters
    ----------
    coef
        :math:`c`, shape ``(K,)``; a parameter or a function of one (GIN's trainable
        :math:`\epsilon` gives ``(1 + eps, 1)``).
    channels
        :math:`P`, the channels of ``x`` (and of ``y``).

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import Aggregation
    >>> theta = Aggregation(np.array([1.5, 1.0]), 3)
    >>> theta.shape, theta.full()[0]
    ((2, 3, 3), array([[1.5, 0. , 0. ],
           [0. , 1.5, 0. ],
           [0. , 0. , 1.5]]))
    """

    coef: Array
    channels: int

    def __post_init__(self) -> None:
        check_array(self.coef, "coef", (1,), ("(K,)",))
        if isinstance(self.channels, bool) or not isinstance(self.channels, int) or self.channels < 1:
            raise ValueError(f"channels must be a positive int (P, the channels of x), got {self.channels!r}")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(K, P, P)`` of the full parameter."""
        return (int(self.coef.shape[0]), self.channels, self.channels)

    @property
    def rank(self) -> int:
        """``P``: what the engine keeps beside the coefficients to rebuild the parameter."""
        return self.channels

    def full(self) -> Array:
        """The full parameter :math:`c_k I_P` of shape ``(K, P, P)``."""
        return aggregation_full(self.coef, self.channels)


def aggregation_full(coef: Array, channels: int) -> Array:
    """:math:`c_k I_P` as one ``(K, P, P)`` array, on ``coef``'s backend, dtype and device."""
    xp = namespace(coef)
    eye = xp.eye(channels, dtype=coef.dtype, device=device_of(coef))
    return coef[:, None, None] * eye


Theta = Array | Separable | LowRank | ConvWeight | Aggregation
"""What :func:`structconv.conv` accepts as :math:`\\Theta`."""
