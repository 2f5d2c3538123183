"""Reading the Planetoid split files: each file's object, checked, and the files against each other.

:func:`read_pickle` unpickles one file with :func:`~structconv.data.unpickle.restricted_loads`,
which resolves only :data:`ADMITTED_GLOBALS`; ``as_features``, ``as_labels`` and ``as_edges``
check that the object is what the format says (and rebuild a CSR matrix from checked parts),
:func:`read_test_index` reads the plain-text ``test.index``, and :func:`check_consistent` checks
the files' row and column counts against each other.  Every failure is a ``ValueError`` naming
the file (a refused global, a ``pickle.UnpicklingError``); :mod:`structconv.data.planetoid`
builds the graph from what passes.

No size stated in a file is trusted: no length or memo index in a pickle stream may exceed what the
file holds, an array may hold no more bytes than its file, the adjacency lists no more ids than the
graph file has bytes, a test id must lie within twice the listed test ids of the last ``allx`` row,
and the dense feature matrix built from them at most :data:`MAX_DENSE_VALUES` values; each is
checked before anything of that size is allocated.
"""

from __future__ import annotations

import collections
import operator
import os
import reprlib
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import scipy.sparse as sp

from .unpickle import PickledArray, RefusedObjectError, numpy_reconstruct, restricted_loads

__all__ = [
    "ADMITTED_GLOBALS",
    "FEATURES",
    "LABELS",
    "MAX_DENSE_VALUES",
    "MAX_TEST_INDEX_BYTES",
    "NUM_VAL",
    "SUFFIXES",
    "as_edges",
    "as_features",
    "as_labels",
    "check_consistent",
    "locate",
    "read_pickle",
    "read_test_index",
]

NUM_VAL: Final = 500
"""Size of the standard validation split: the nodes right after the training nodes."""

MAX_DENSE_VALUES: Final = 2**27
"""The most values (nodes times features) of the dense feature matrix the reader builds: 1 GiB in float64,
ten times the largest standard split (CiteSeer's 3,327 x 3,703)."""

MAX_TEST_INDEX_BYTES: Final = 2**20
"""The largest ``test.index`` the reader reads: 1 MiB, about 170 times PubMed's (1,000 ids, about 6 KB)."""

SUFFIXES: Final = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
FEATURES: Final = ("x", "tx", "allx")
LABELS: Final = ("y", "ty", "ally")
_SOURCE: Final = "https://github.com/kimiyoung/planetoid (data/)"
_NEEDS: Final = "numpy arrays, scipy CSR matrices, lists and a defaultdict"
_T = TypeVar("_T")


# --- restricted unpickling ------------------------------------------------------------------------
class _PickledCSR(sp.csr_matrix):  # type: ignore[misc]  # scipy has no type hints
    """What the unpickler gives for ``csr_matrix``: created empty (``NEWOBJ``) and filled by its state, never called.

    Calling the class with a shape, ``csr_matrix((rows, cols))``, would allocate ``rows + 1`` index
    pointers for sizes the file states; the format's pickles never call it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RefusedObjectError("scipy.sparse.csr_matrix called with arguments; the format only restores its state")


def _empty_list(*args: Any) -> list[Any]:
    """``list`` as the graph's ``defaultdict`` factory: called without arguments only.

    ``list(iterable)`` would copy an object of the stream into one Python object per element.
    """
    if args:
        raise RefusedObjectError("list called with arguments; the format only uses it as the graph's default factory")
    return []


def _graph_dict(*args: Any) -> collections.defaultdict[Any, Any]:
    """``collections.defaultdict`` for the graph: ``defaultdict(list)``, filled by the stream's items."""
    if len(args) != 1 or args[0] is not _empty_list:
        raise RefusedObjectError("defaultdict called with arguments other than list; the graph is a defaultdict(list)")
    return collections.defaultdict(_empty_list)


def _admitted_globals() -> dict[tuple[str, str], Any]:
    reconstruct = numpy_reconstruct()
    return {
        # ndarray pickles as _reconstruct(ndarray, shape, dtype) followed by ndarray.__setstate__; the
        # unpickler swaps these three for checked versions.
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): reconstruct,
        # The class moved from scipy.sparse.csr (the files' spelling) to scipy.sparse._csr in scipy 1.8.
        ("scipy.sparse.csr", "csr_matrix"): _PickledCSR,
        ("scipy.sparse._csr", "csr_matrix"): _PickledCSR,
        ("scipy.sparse", "csr_matrix"): _PickledCSR,
        # The graph is a defaultdict(list); Python 2 spelled the builtins module __builtin__.
        ("collections", "defaultdict"): _graph_dict,
        ("__builtin__", "list"): _empty_list,
        ("builtins", "list"): _empty_list,
    }


ADMITTED_GLOBALS: Final = _admitted_globals()
"""The ``(module, name)`` pairs the unpickler resolves; any other global is refused."""


def read_pickle(path: Path, expected: str) -> object:
    """Unpickle ``path``, admitting only :data:`ADMITTED_GLOBALS`; a corrupt stream is a ``ValueError``.

    The stream is checked first (:func:`~structconv.data.unpickle.check_stream`: no stated length or
    memo index beyond the file), and an array may hold no more bytes than the file has
    (:class:`~structconv.data.unpickle.RefusedObjectError`).
    """
    # Read whole: a buffered file's read(n) allocates the n a stream states before reading.
    data = path.read_bytes()
    corrupt = f"expected a pickle of {expected}, but it cannot be read (truncated or corrupt?)"
    return restricted_loads(data, str(path), ADMITTED_GLOBALS, _NEEDS, corrupt=corrupt)


# --- validation of the unpickled objects ----------------------------------------------------------
def _type_name(obj: object) -> str:
    kind: type = type(obj)
    if kind in (PickledArray, _PickledCSR):  # the checked stand-ins are named as the classes the file named
        kind = kind.__mro__[1]
    return f"{kind.__module__}.{kind.__qualname__}"


def _expect(obj: object, kind: type[_T], path: Path, expected: str) -> _T:
    """``obj`` if it is a ``kind``; else a ``ValueError`` naming the file and what it held instead."""
    # What the file holds, checked the same way for every object of the format; no array backend is chosen.
    if not isinstance(obj, kind):
        raise ValueError(f"{path}: expected {expected}, got {_type_name(obj)}")
    return obj


def as_features(obj: object, path: Path) -> sp.csr_matrix:
    """The feature matrix unpickled from ``path``, rebuilt from its checked parts."""
    expected = "a scipy.sparse CSR matrix of node features"
    given = _expect(obj, sp.csr_matrix, path, expected)
    # Rebuilt from its parts and fully checked: the unpickled object's state came from the file, unvalidated,
    # and scipy's kernels index with it unchecked.
    try:
        data, indices, indptr = (np.asarray(part) for part in (given.data, given.indices, given.indptr))
        if data.dtype.kind not in "biuf" or indices.dtype.kind not in "iu" or indptr.dtype.kind not in "iu":
            raise ValueError(f"bad dtypes data={data.dtype}, indices={indices.dtype}, indptr={indptr.dtype}")
        rows, cols = (operator.index(n) for n in given.shape)
        if cols > MAX_DENSE_VALUES:  # the dense copy is what costs: its rows are bounded by indptr, held in the file
            raise ValueError(
                f"it declares {cols:,} feature columns, more than the {MAX_DENSE_VALUES:,} values this reader's "
                "dense feature matrix may hold"
            )
        matrix = sp.csr_matrix((data, indices, indptr), shape=(rows, cols))
        matrix.check_format(full_check=True)
    except (AttributeError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueError(f"{path}: expected {expected}, got a malformed one: {exc}") from exc
    if not np.isfinite(matrix.data).all():
        raise ValueError(f"{path}: expected {expected}, but it holds non-finite values")
    return matrix


def as_labels(obj: object, path: Path) -> np.ndarray[Any, np.dtype[Any]]:
    """The one-hot label array unpickled from ``path``, checked: 2-D, numeric and finite."""
    expected = "a 2-D numpy array of one-hot labels"
    labels = np.asarray(_expect(obj, np.ndarray, path, expected))
    if labels.ndim != 2 or labels.dtype.kind not in "biuf":
        raise ValueError(f"{path}: expected {expected}, got an array of shape {labels.shape} and dtype {labels.dtype}")
    if not np.isfinite(labels).all():
        raise ValueError(f"{path}: expected {expected}, but it holds non-finite values")
    return labels


def _node_id(value: Any, node: object, path: Path, num_nodes: int) -> int:
    try:
        index = operator.index(value)
    except TypeError as exc:
        raise ValueError(
            f"{path}: expected a dict mapping each node id to a list of neighbour ids, got a non-integer id at node "
            f"{reprlib.repr(node)}: {exc}"
        ) from exc
    if not 0 <= index < num_nodes:
        raise ValueError(f"{path}: node id {index} is out of range for a graph of {num_nodes} nodes")
    return index


def as_edges(obj: object, path: Path, num_nodes: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Read the adjacency-list dict as ``(source, target)`` arrays, as listed (one direction, duplicates kept).

    The lists may hold no more ids in all than the file has bytes: each id costs the pickle at least one
    opcode byte unless lists are shared between nodes, which the format never does and which would let
    a small file list any number of edges.
    """
    expected = "a dict mapping each node id to a list of neighbour ids"
    graph = _expect(obj, dict, path, expected)
    total = 0
    for node, neighbours in graph.items():
        if not isinstance(neighbours, list | tuple):
            raise ValueError(f"{path}: expected {expected}, got {_type_name(neighbours)} for node {reprlib.repr(node)}")
        total += len(neighbours)
    budget = path.stat().st_size
    if total > budget:
        raise ValueError(
            f"{path}: the adjacency lists hold {total:,} ids in all, more than the {budget:,} bytes of the file "
            "could list one by one (lists shared between nodes?); refused before building the edge arrays"
        )
    src = np.empty(total, dtype=np.int64)
    dst = np.empty(total, dtype=np.int64)
    start = 0
    for node, neighbours in graph.items():
        if neighbours:  # a node listed without neighbours adds no edge, whatever its id
            end = start + len(neighbours)
            src[start:end] = _node_id(node, node, path, num_nodes)
            dst[start:end] = [_node_id(n, node, path, num_nodes) for n in neighbours]
            start = end
    return src, dst


def read_test_index(path: Path) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The distinct node ids of ``test.index``, one integer a line (blank lines skipped).

    A file over :data:`MAX_TEST_INDEX_BYTES` is refused before it is read.
    """
    expected = "one integer node id per line"
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        raw = file.read(MAX_TEST_INDEX_BYTES + 1) if size <= MAX_TEST_INDEX_BYTES else b""
    if max(size, len(raw)) > MAX_TEST_INDEX_BYTES:  # the file may grow between the check and the read
        raise ValueError(
            f"{path}: the file has {max(size, len(raw)):,} bytes, more than the {MAX_TEST_INDEX_BYTES:,} a list of "
            "test node ids may take (PubMed's has about 6 KB); refused before reading it"
        )
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: expected {expected}, got non-ASCII bytes: {exc}") from exc
    ids: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = int(line)
        except ValueError:
            raise ValueError(f"{path}, line {lineno}: expected {expected}, got {reprlib.repr(line)}") from None
        # Every node takes a row of the dense feature matrix, so no id can reach its budget.
        if not 0 <= value < MAX_DENSE_VALUES:
            raise ValueError(
                f"{path}, line {lineno}: node id {value} is out of range; expected 0 <= id < {MAX_DENSE_VALUES:,} "
                "(each node takes a row of the dense feature matrix)"
            )
        ids.append(value)
    if not ids:
        raise ValueError(f"{path}: expected {expected}, but the file is empty")
    index = np.asarray(ids, dtype=np.int64)
    if np.unique(index).size != index.size:
        raise ValueError(f"{path}: expected distinct node ids, but some repeat")
    return index


def _check_rows(path: Path, rows: int, other: Path, other_rows: int, why: str) -> None:
    if rows != other_rows:
        raise ValueError(f"{path} has {rows} rows but {other.name} has {other_rows}; expected equal counts ({why})")


def _check_cols(path: Path, cols: int, other: Path, other_cols: int, what: str) -> None:
    if cols != other_cols:
        raise ValueError(f"{path} has {cols} columns but {other.name} has {other_cols}; expected the same {what}")


# --- the files together --------------------------------------------------------------------------
def locate(root: Path, name: str) -> dict[str, Path]:
    """The eight files of dataset ``name`` under ``root``, by suffix; ``FileNotFoundError`` names the missing."""
    pattern = f"ind.{name}.{{{','.join(SUFFIXES)}}}"
    if not root.is_dir():
        raise FileNotFoundError(
            f"Planetoid directory {root} not found: put the split files {pattern} (from {_SOURCE}) in {root}"
        )
    paths = {suffix: root / f"ind.{name}.{suffix}" for suffix in SUFFIXES}
    missing = [path.name for path in paths.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"Planetoid file(s) {', '.join(missing)} not found in {root}: put the split files {pattern} "
            f"(from {_SOURCE}) in {root}"
        )
    return paths


def check_consistent(
    paths: dict[str, Path],
    features: dict[str, sp.csr_matrix],
    labels: dict[str, np.ndarray[Any, Any]],
    test_index: np.ndarray[Any, Any],
) -> None:
    """Check the files against each other: one label row per feature row, equal widths, test ids after ``allx``.

    Also that the test ids stay within twice their number of the last ``allx`` row and that the dense
    feature matrix fits :data:`MAX_DENSE_VALUES`: both bound what :mod:`~structconv.data.planetoid` allocates.
    """
    for feature, label, why in (
        ("x", "y", "one label row per training node"),
        ("tx", "ty", "one label row per test node"),
        ("allx", "ally", "one label row per non-test node"),
    ):
        _check_rows(paths[label], labels[label].shape[0], paths[feature], features[feature].shape[0], why)
    _check_rows(paths["test.index"], test_index.size, paths["tx"], features["tx"].shape[0], "one id per test node")
    for feature in ("x", "tx"):
        _check_cols(paths[feature], features[feature].shape[1], paths["allx"], features["allx"].shape[1], "features")
    for label in ("y", "ty"):
        _check_cols(paths[label], labels[label].shape[1], paths["ally"], labels["ally"].shape[1], "classes")

    num_known = features["allx"].shape[0]
    # The format numbers the test nodes after the allx nodes; anything else would scramble the reordering below.
    if int(test_index.min()) != num_known:
        raise ValueError(
            f"{paths['test.index']}: expected the test node ids to start right after the {num_known} rows of "
            f"{paths['allx'].name}, at {num_known}, but the smallest is {int(test_index.min())}"
        )
    # Ids in the test range that test.index skips become zero rows (CiteSeer's 15 isolated nodes); more of those
    # than listed test nodes would be rows that no file describes.
    largest, listed = int(test_index.max()), int(test_index.size)
    if largest - num_known + 1 > 2 * listed:
        raise ValueError(
            f"{paths['test.index']}: node id {largest} is far beyond the {num_known + listed:,} nodes the files "
            f"describe ({num_known:,} rows of {paths['allx'].name} and {listed:,} test ids); expected the test ids "
            f"below {num_known + 2 * listed:,}"
        )
    num_nodes, num_features = largest + 1, int(features["allx"].shape[1])
    if num_nodes * num_features > MAX_DENSE_VALUES:
        raise ValueError(
            f"{paths['allx']}: {num_nodes:,} nodes times {num_features:,} feature columns make a dense feature "
            f"matrix of {num_nodes * num_features:,} values, more than the {MAX_DENSE_VALUES:,} this reader allows"
        )
    num_train = labels["y"].shape[0]
    if num_train + NUM_VAL > num_known:
        raise ValueError(
            f"{paths['y']}: {num_train} training nodes and {NUM_VAL} validation nodes do not fit in the "
            f"{num_known} rows of {paths['allx'].name}"
        )
