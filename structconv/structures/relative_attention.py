r"""Content and learned relative position together: Cordonnier et al.'s Eq. 5 (``LearnedHeads(relative_terms=True)``).

Three of its four terms are mechanisms of their own (content, and :func:`~structconv.learned_scores`);
this module adds the fourth, the query-position term, and their sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..backend import Array, einsum, namespace, shape_str
from ..backend.checks import check_array
from ..bases.grid import _grid
from .attention import BiAffine, Mechanism
from .positional import learned_scores
from .relative import RelativeOffsets, _check_tables, _split, check_positions, relative_offsets, table_on

__all__ = ["relative_attention"]

_SHAPES = {"key": "(K, P, D)", "query": "(K, P, D)", "rel_key": "(K, D_p, D)", "u": "(K, D)", "v": "(K, D)"}


def relative_attention(
    grid: Any,
    tables: Sequence[Array],
    *,
    key: Array,
    query: Array,
    rel_key: Array,
    u: Array,
    v: Array,
    boundary: str = "zero",
    scale: float = 1.0,
) -> Mechanism:
    r"""Content and learned relative position together, the four terms of Cordonnier et al.'s Eq. 5.

    .. math:: a_{hmn} = s\,\big(q_n\cdot k_m + q_n\cdot\hat r_{\delta_{mn}} + u_h\cdot k_m
              + v_h\cdot\hat r_{\delta_{mn}}\big),

    :math:`k_m = x_m W^k_h`, :math:`q_n = z_n W^q_h`, :math:`\hat r_\delta = \hat W_h^\top r_\delta`
    (:math:`r_\delta` from the per-axis ``tables``, as in :func:`learned_scores`).  The sum of
    three mechanisms: the content with :math:`u_h` as the queries' bias, :func:`learned_scores`
    with :math:`t_h = s\,\hat W_h v_h`, and the query-position term, computed per axis (never
    through ``(M, N, D)`` embeddings).

    Parameters
    ----------
    grid, tables, boundary
        As for :func:`learned_scores`.
    key, query
        :math:`W^k`, :math:`W^q`, ``(K, P, D)``.
    rel_key
        :math:`\hat W`, ``(K, D_p, D)``, :math:`D_p` the tables' summed widths.
    u, v
        ``(K, D)`` each.
    scale
        :math:`s`, e.g. :math:`1/\sqrt D`.
    """
    g = _grid(grid)
    arrays = {"key": key, "query": query, "rel_key": rel_key, "u": u, "v": v}
    for name, a in arrays.items():  # named as given: the mechanisms below know them by other names
        check_array(a, name, (2,) if name in ("u", "v") else (3,), (_SHAPES[name],))
    sizes = {name: (int(a.shape[0]), int(a.shape[-1])) for name, a in arrays.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"key, query, rel_key, u and v must share K heads of width D, got (K, D) = {sizes}")
    widths = _check_tables(tables, relative_offsets(g, boundary))
    if int(rel_key.shape[1]) != sum(widths):
        want = (sizes["query"][0], sum(widths), sizes["query"][1])
        raise ValueError(
            f"rel_key must have shape (K, D_p, D) = {want} (D_p: the tables' widths, K and D: the query's), "
            f"got {shape_str(tuple(rel_key.shape))}"
        )
    query_position = _QueryPosition(g, tuple(tables), query, rel_key, boundary, scale)
    content = BiAffine(key=key, query=query, query_bias=u, scale=scale)  # (k + 0)·(q + u): q·k + u·k
    position = learned_scores(g, tables, einsum("kpd,kd->kp", rel_key, v) * content.scale, boundary)
    return content + position + query_position


@dataclass(frozen=True, eq=False)
class _QueryPosition(Mechanism):
    r""":math:`s\,q_n\cdot\hat r_{\delta_{mn}}`, the query-position term of :func:`relative_attention`."""

    grid: tuple[int, ...]
    tables: tuple[Array, ...]
    query: Array
    rel_key: Array
    boundary: str
    scale: float

    @property
    def heads(self) -> int:
        return int(self.query.shape[0])

    @property
    def relative(self) -> RelativeOffsets:
        return relative_offsets(self.grid, self.boundary)

    def scores(self, x: Array, z: Array) -> Array:
        r"""``(B, K, M, N)``, one axis at a time.

        Axis :math:`i` scores each query against the :math:`L_i` offsets of the axis
        (``(B, K, N, L_i)``), picks for it the :math:`S_i` differences :math:`m_i - n_i` and
        broadcasts them over the keys' other coordinates: no ``(M, N)`` index is built.
        """
        rel, grid, d = self.relative, self.grid, len(self.grid)
        check_positions(rel, x, z, "relative_attention")
        queries = einsum("bnp,kpd->bknd", z, self.query)
        B, K = int(z.shape[0]), self.heads
        xp = namespace(queries)
        parts = _split(self.rel_key, tuple([int(t.shape[1]) for t in self.tables]))
        total: Any = None
        for i, (table, part) in enumerate(zip(self.tables, parts, strict=True)):
            per_offset = einsum("bknd,le,ked->bknl", queries, table, part).reshape(B, K, *grid, -1)
            index = table_on(rel, f"axis_index{i}", per_offset).swapaxes(0, 1)  # (n_i, m_i)
            shape = [1, 1] + [grid[j] if j == i else 1 for j in range(d)] + [grid[i]]
            target = xp.broadcast_to(index.reshape(shape), (B, K, *grid, grid[i]))
            picked = xp.take_along_axis(per_offset, target, axis=-1)
            # (B, K, n_1..n_d, m_i) -> (B, K, [m: m_i only], n_1..n_d): broadcast over the other m_j
            keys_first = xp.moveaxis(picked, -1, 2).reshape(B, K, *[grid[j] if j == i else 1 for j in range(d)], *grid)
            total = keys_first if total is None else total + keys_first
        out = xp.broadcast_to(total, (B, K, *grid, *grid)).reshape(B, K, rel.positions, rel.positions)
        return out * self.scale if self.scale != 1.0 else out
