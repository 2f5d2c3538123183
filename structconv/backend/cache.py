"""The one cache of the package: a bounded map from value keys to what is built from them.

Plans, opt_einsum expressions, relative-offset tables and their device copies, a layer's bases
per input grid and its compiled runs are each kept in a :class:`BoundedCache`.  Keys are values
(shapes, names, dtypes, devices), never array identities, so equal operands share an entry and
the cache keeps nothing alive by identity.  The caller builds what is missing (``find``, then
``put``), so the cache, in the lowest layer, calls nothing above it.  An ordered dictionary rather
than ``functools.lru_cache``: ``torch.compile`` guards on a dictionary lookup, but would trace
into an ``lru_cache`` and through the construction behind it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

#: Whether the code runs under a tracer (``torch.compile``): set by the torch backend when it is
#: loaded, so that a NumPy-only program never imports torch.
tracing: Callable[[], bool] = bool  # bool() is False: untraced until the torch backend says


class BoundedCache(Generic[V]):
    """A map of at most ``size`` entries that forgets the least recently used one first.

    Parameters
    ----------
    size
        The most entries kept.

    Examples
    --------
    >>> cache = BoundedCache[int](size=2)
    >>> cache.put("a", 1), cache.put("b", 2), cache.find("a")
    (1, 2, 1)
    >>> cache.put("c", 3); "b" in cache, len(cache), cache.find("b")
    3
    (False, 2, None)
    """

    __slots__ = ("_items", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict[Hashable, V] = OrderedDict()

    def find(self, key: Hashable) -> V | None:
        """The entry under ``key`` (now the most recently used, except under ``torch.compile``), or ``None``.

        Traced, the order is left alone: a reordered dictionary is a side effect that the compiled
        code would replay, rebuilding the dictionary, on every call.
        """
        found = self._items.get(key)
        if found is not None and not tracing():
            self._items.move_to_end(key)
        return found

    def put(self, key: Hashable, value: V) -> V:
        """Keep ``value`` under ``key``, forgetting the least recently used entry beyond :attr:`size`; return it."""
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def values(self) -> list[V]:
        """The entries, the least recently used first."""
        return list(self._items.values())

    def clear(self) -> None:
        """Forget every entry."""
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items
