r"""Batches of images on the training device: standard CIFAR augmentation and normalisation.

The whole split stays on the device as ``uint8`` (150 MB for CIFAR-10's training set), and each
batch is cropped, flipped and normalised there in a few tensor operations: on a GPU this keeps
the input pipeline far below a training step, with no worker processes.

Randomness comes from a generator seeded by ``(seed, epoch)`` alone, never from global state,
so an epoch's order and augmentation are the same whether it runs in one process or is split
across the ranks of a distributed run, and a run resumed at an epoch boundary sees exactly the
batches it would have seen without the interruption.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "NORMALIZATIONS", "Batches", "augment", "epoch_generator", "normalize"]

#: Per-channel mean and standard deviation of the official CIFAR-10 training images (RGB, in [0, 1]).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

#: Named ``(mean, std)`` pairs: ``"cifar10"`` the training set's own statistics; ``"paper-code"``
#: those of Cordonnier et al.'s code (and of many CIFAR training scripts), whose standard
#: deviations (0.2023, 0.1994, 0.2010) are not the pixel statistics but are what its runs used.
NORMALIZATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": (CIFAR10_MEAN, CIFAR10_STD),
    "paper-code": (CIFAR10_MEAN, (0.2023, 0.1994, 0.2010)),
}


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator that depends on ``(seed, epoch)`` only.

    Parameters
    ----------
    seed
        The run's seed.
    epoch
        The epoch, from 0.
    """
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) % (2**63 - 1))


#: The normalisation constants on each device, built once: a host-to-device copy per batch would
#: make the host wait for the GPU's queue to drain.
_CONSTANTS: dict[tuple[tuple[float, ...], tuple[float, ...], torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    r"""``uint8`` ``(B, C, H, W)`` to float :math:`(x/255 - \mu_c)/\sigma_c` (float32).

    Parameters
    ----------
    images
        ``uint8`` ``(B, C, H, W)``.
    mean, std
        :math:`\mu_c` and :math:`\sigma_c`, one per channel, for pixels in :math:`[0, 1]`
        (e.g. :data:`NORMALIZATIONS` ``["cifar10"]``).

    Returns
    -------
    torch.Tensor
        float32 ``(B, C, H, W)`` on the device of ``images``.
    """
    key = (tuple(mean), tuple(std), images.device)
    found = _CONSTANTS.get(key)
    if found is None:
        found = _CONSTANTS[key] = (
            torch.tensor(mean, device=images.device).view(1, -1, 1, 1),
            torch.tensor(std, device=images.device).view(1, -1, 1, 1),
        )
    m, s = found
    return (images.float().div_(255.0) - m) / s


def augment(
    images: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, flip: torch.Tensor, *, pad: int
) -> torch.Tensor:
    """Random crop after zero padding by ``pad`` pixels, then horizontal flip, for a whole batch.

    The random draws are arguments, so that the caller's generator alone decides them.

    Parameters
    ----------
    images
        ``(B, C, H, W)``.
    rows, cols
        ``(B,)`` integers in ``[0, 2 pad]``: the crops' top-left corners in the padded image.
    flip
        ``(B,)`` booleans: which images are mirrored.
    pad
        The zero padding on every side, in pixels.

    Returns
    -------
    torch.Tensor
        ``(B, C, H, W)``, the dtype and device of ``images``.
    """
    B, _, H, W = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    device = images.device
    r = rows.to(device)[:, None] + torch.arange(H, device=device)  # (B, H)
    c = cols.to(device)[:, None] + torch.arange(W, device=device)  # (B, W)
    c = torch.where(flip.to(device)[:, None], c.flip(1), c)
    b = torch.arange(B, device=device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, r[:, :, None], c[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2)


@dataclass
class Batches:
    r"""Mini-batches of a labelled image set, optionally augmented, for one rank of ``world`` ranks.

    Parameters
    ----------
    images
        ``uint8`` ``(N, H, W, C)`` as the readers return them (moved to ``device`` once).
    labels
        ``(N,)`` integer labels.
    batch_size
        The *global* batch: every rank takes its ``batch_size / world`` share of each one, so a
        distributed step sees the same images as a single process would.
    train
        Shuffle, crop (padding ``pad``) and flip when ``True``; fixed order, no augmentation
        otherwise.  A training epoch drops the last incomplete batch (all ranks stay in step).
    mean, std
        The normalisation (:func:`normalize`).
    pad
        The padding of the random crops.
    rank, world
        This process's rank among ``world`` processes.

    Everything after ``batch_size`` is a keyword.
    """

    images: torch.Tensor
    labels: torch.Tensor
    batch_size: int
    _: KW_ONLY
    train: bool
    mean: tuple[float, ...] = CIFAR10_MEAN
    std: tuple[float, ...] = CIFAR10_STD
    pad: int = 4
    rank: int = 0
    world: int = 1

    @classmethod
    def from_arrays(
        cls,
        images: np.ndarray,
        labels: np.ndarray,
        batch_size: int,
        *,
        train: bool,
        device: str | torch.device,
        **kw: Any,
    ) -> Batches:
        """Move ``(N, H, W, C)`` ``uint8`` images and their labels to ``device`` once.

        Parameters
        ----------
        images
            ``uint8`` ``(N, H, W, C)``, as the readers return them.
        labels
            ``(N,)`` integers.
        batch_size, train
            As for :class:`Batches`.
        device
            Where the images and labels are kept.
        **kw
            The other fields of :class:`Batches` (``mean``, ``std``, ``pad``, ``rank``, ``world``).

        Raises
        ------
        ValueError
            If ``images`` is not ``uint8`` of rank 4, or ``labels`` does not have one entry per image.
        """
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 of shape (N, H, W, C), got {images.dtype} {images.shape}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must have shape ({images.shape[0]},), got {labels.shape}")
        x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).contiguous().to(device)
        y = torch.from_numpy(labels.astype(np.int64)).to(device)
        return cls(x, y, batch_size, train=train, **kw)

    def __post_init__(self) -> None:
        if self.batch_size <= 0 or self.batch_size % self.world:
            raise ValueError(
                f"batch_size={self.batch_size} must be a positive multiple of the number of processes ({self.world})"
            )
        if self.train and self.batch_size > len(self.labels):
            raise ValueError(f"batch_size={self.batch_size} exceeds the {len(self.labels)} training images")

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def epoch(self, seed: int, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's ``(images, labels)`` batches of one epoch (normalised float32, NCHW).

        Parameters
        ----------
        seed, epoch
            What the order and the augmentation depend on (:func:`epoch_generator`), alone.
        """
        n, B = len(self.labels), self.batch_size
        share = B // self.world
        if self.train:
            g = epoch_generator(seed, epoch)
            order = torch.randperm(n, generator=g)
            rows = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
            cols = torch.randint(0, 2 * self.pad + 1, (n,), generator=g)
            flip = torch.rand(n, generator=g) < 0.5
            # Drawn on the host (the generator is), copied to the device once per epoch: a copy per
            # batch would make the host wait for the GPU's queue to drain at every step.
            device = self.images.device
            order, rows, cols, flip = (t.to(device) for t in (order, rows, cols, flip))
        for i in range(len(self)):
            if self.train:
                idx = order[i * B : (i + 1) * B][self.rank * share : (self.rank + 1) * share]
                x = augment(self.images[idx], rows[idx], cols[idx], flip[idx], pad=self.pad)
                yield normalize(x, self.mean, self.std), self.labels[idx]
            else:
                lo, hi = i * B, min(n, (i + 1) * B)
                span = hi - lo
                part = -(-span // self.world)
                a, b = lo + min(span, self.rank * part), lo + min(span, (self.rank + 1) * part)
                yield normalize(self.images[a:b], self.mean, self.std), self.labels[a:b]
