r"""What a basis or a layer means, told apart from what it computes: diagnoses of a difference.

A basis can be consistent (every order of :func:`structconv.conv` equal to its own dense form)
and still mean another thing than its author meant: a member scaled by :math:`\epsilon` where
:math:`1 + \epsilon` was meant, an adjacency normalised over the other axis, members in another
order, a grid padded on the other side.  Compared with a *reference*, a dense statement of what
the basis should be written independently of it, such a basis fails; these functions then say
which of the usual mistakes its difference looks like, so that the failure points at the cause
rather than at the engine.

Conventions: a basis is ``(K, M, N)``, member :math:`k` carrying input :math:`m` to output
:math:`n` as entry ``[k, m, n]`` (an edge :math:`m \to n` of a graph, the input pixel a kernel tap
reads for output pixel :math:`n`).
"""

from __future__ import annotations

import numpy as np


def _close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and bool(
        np.allclose(a, b, rtol=rtol, atol=atol * max(1.0, float(np.abs(b).max(initial=0))))
    )


def _sums(a: np.ndarray, axis: int) -> str:
    """The range of ``a``'s sums along ``axis`` over its non-empty lines, as ``"lo to hi"``."""
    sums = a.sum(axis=axis)
    used = (a != 0).any(axis=axis)
    if not used.any():
        return "nothing"
    lo, hi = float(sums[used].min()), float(sums[used].max())
    return f"{lo:.3g}" if np.isclose(lo, hi) else f"{lo:.3g} to {hi:.3g}"


def _ones(a: np.ndarray, axis: int) -> bool:
    """Whether every non-empty line of ``a`` along ``axis`` sums to 1 (a mean over it)."""
    used = (a != 0).any(axis=axis)
    return bool(used.any()) and bool(np.allclose(a.sum(axis=axis)[used], 1.0))


def _shift(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[int, int] | None:
    """``(axis, s)`` with ``got`` equal to ``want`` moved by ``s`` along axis 0 (inputs) or 1 (outputs), if any."""
    for axis in (0, 1):
        size = got.shape[axis]
        for s in sorted(range(1 - size, size), key=abs):
            if s == 0:
                continue
            kept = np.roll(want, s, axis=axis)
            rest = [slice(None), slice(None)]
            rest[axis] = slice(None, s) if s > 0 else slice(s, None)
            kept[tuple(rest)] = 0.0  # what rolled in from the other end is not there
            if (want != 0).any() and _close(got, kept, rtol, atol) and (got != 0).any():
                return axis, s
    return None


def member_diagnosis(got: np.ndarray, want: np.ndarray, k: int, whole: np.ndarray, *, rtol: float, atol: float) -> str:
    """Why member ``k`` of a basis (``got``, ``(M, N)``) differs from the reference's (``want``): one sentence.

    ``whole`` is the reference's every member, ``(K, M, N)``, to recognise a member of another
    position.  The sentence names the first explanation that holds exactly (within ``rtol`` and
    ``atol``): the reference's transpose, another of its members, a multiple of it, another
    normalisation of the same pattern, a shift, and otherwise the largest difference.
    """
    transposed = got.shape == want.T.shape and _close(got, want.T, rtol, atol)
    others = [j for j in range(whole.shape[0]) if j != k and _close(got, whole[j], rtol, atol)]
    if others:
        also = " (and its own transpose: a symmetric stencil)" if transposed else ""
        return (
            f"member {k} is the reference's member {others[0]}{also}: the members are in another order, so each "
            f"Theta_k meets another member's graph (maps swapped, or a kernel flipped)"
        )
    if transposed:
        return (
            f"member {k} is the reference's transpose: entry [m, n] carries input m to output n (an edge m -> n); "
            "the graph is read the other way round (edge_index rows, flow, or an adjacency taken as adj_t)"
        )
    if not (got != 0).any():
        return f"member {k} is zero where the reference's is not (a scale of 0: eps where 1 + eps is meant?)"
    if not (want != 0).any():
        return f"member {k} is not zero, and the reference's is"
    pattern = (got != 0) == (want != 0)
    if pattern.all():
        ratio = got[want != 0] / want[want != 0]
        if np.allclose(ratio, ratio[0], rtol=max(rtol, 1e-9), atol=0.0):
            return (
                f"member {k} is {float(ratio[0]):.6g} times the reference's: a scale (eps where 1 + eps is meant, "
                "a missing or extra factor)"
            )
        if _ones(want, 0) and _ones(got, 1):
            return (
                f"member {k} averages over each input's outputs (its rows sum to 1) where the reference averages "
                "over each output's inputs (its columns sum to 1): normalised by out-degree instead of in-degree"
            )
        if _ones(want, 1) and _ones(got, 0):
            return (
                f"member {k} averages over each output's inputs (its columns sum to 1) where the reference averages "
                "over each input's outputs (its rows sum to 1): normalised by in-degree instead of out-degree"
            )
        if _ones(want, 0):
            return (
                f"member {k} has the reference's pattern but another normalisation: the reference averages each "
                f"output's inputs (columns sum to 1), the member's columns sum to {_sums(got, 0)} (symmetric, as "
                "GCN's D^-1/2 A D^-1/2?)"
            )
        return (
            f"member {k} has the reference's pattern with other values: its columns sum to {_sums(got, 0)}, the "
            f"reference's to {_sums(want, 0)}; its rows to {_sums(got, 1)}, the reference's to {_sums(want, 1)}"
        )
    moved = _shift(got, want, rtol, atol)
    if moved is not None:
        axis, s = moved
        what = "inputs" if axis == 0 else "outputs"
        return (
            f"member {k} is the reference's moved by {s} {what}: padding on the other side, or offsets counted "
            "from the other end"
        )
    diff = np.abs(got - want)
    m, n = (int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    return (
        f"member {k} differs from the reference by up to {float(diff[m, n]):.3g}, at input {m}, output {n} "
        f"(basis {got[m, n]:.6g}, reference {want[m, n]:.6g}); {int((diff > atol).sum())} of {diff.size} entries"
    )


def basis_diagnosis(got: np.ndarray, want: np.ndarray, *, rtol: float, atol: float) -> list[str]:
    """Every way a basis' dense form ``got`` differs from the reference ``want`` (both ``(K, M, N)``); empty if none.

    Per-instance bases ``(B, K, M, N)`` are read as ``B K`` members.
    """
    if got.ndim == 4:
        got = got.reshape(-1, *got.shape[2:])
    if want.ndim == 4:
        want = want.reshape(-1, *want.shape[2:])
    if got.shape != want.shape:
        K, M, N = got.shape
        k, m, n = want.shape
        hints = []
        if (n, m) == (M, N) and M != N:
            hints.append("inputs and outputs the other way round")
        if k != K:
            hints.append(f"{abs(K - k)} member(s) {'more' if k < K else 'fewer'} (an identity or root member?)")
        return [
            f"the basis is ({K}, {M}, {N}) but the reference ({k}, {m}, {n})"
            + (f": {'; '.join(hints)}" if hints else "")
        ]
    return [
        member_diagnosis(got[k], want[k], k, want, rtol=rtol, atol=atol)
        for k in range(got.shape[0])
        if not _close(got[k], want[k], rtol, atol)
    ]


def output_diagnosis(got: np.ndarray, want: np.ndarray, *, rtol: float, atol: float) -> str:
    """Why a layer's output ``got`` differs from ``want``: a bias, the layout, a scale, or the largest difference."""
    if got.shape != want.shape:
        if got.size == want.size and got.ndim == want.ndim == 2 and _close(got.T, want, rtol, atol):
            return f"the output is the expected one transposed ({got.shape} for {want.shape}): another layout"
        return f"the output has shape {got.shape}, the expected {want.shape}: another layout"
    diff = (got - want).reshape(-1, got.shape[-1])
    if diff.shape[0] > 1 and np.allclose(diff, diff[0], rtol=0.0, atol=atol * max(1.0, float(np.abs(want).max()))):
        return (
            f"the difference is the same at every node or position (up to {float(np.abs(diff[0]).max()):.3g} per "
            "channel): a bias added on one side only (one the layer keeps where `layer.bias` does not show it?)"
        )
    mask = want != 0
    if mask.any():
        ratio = got[mask] / want[mask]
        if np.allclose(ratio, ratio.flat[0], rtol=max(rtol, 1e-9), atol=0.0):
            return f"the output is {float(ratio.flat[0]):.6g} times the expected: a scale"
    flat = np.abs(got - want)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(flat)), flat.shape))
    return (
        f"the output differs by up to {float(flat[where]):.3g} at {where} (got {got[where]:.6g}, expected "
        f"{want[where]:.6g})"
    )


__all__ = ["basis_diagnosis", "member_diagnosis", "output_diagnosis"]
