"""Reader for the Planetoid citation graphs (Cora, CiteSeer, PubMed) in their original split files.

The files ``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}`` are those of Yang et al. (2016),
"Revisiting Semi-Supervised Learning with Graph Embeddings", as used by Kipf & Welling (2017) and
distributed at https://github.com/kimiyoung/planetoid (``data/``):

* ``x``, ``tx``, ``allx``: ``scipy.sparse`` CSR feature matrices of the labelled training nodes, the
  test nodes, and all nodes that are not test nodes;
* ``y``, ``ty``, ``ally``: the matching one-hot label arrays;
* ``graph``: a dict from node id to the list of its neighbours;
* ``test.index``: the node ids of the rows of ``tx``, one integer per line, in no particular order.

All but ``test.index`` are pickles written by Python 2. Unpickling runs code named by the file, so
they are read with an unpickler that resolves only the handful of numpy, scipy and builtin globals
these files contain and refuses everything else.

The result equals what PyTorch Geometric's ``Planetoid`` dataset reads (node order, features,
labels, standard split and the order of ``edge_index``), with optional row normalisation of the
features as in the GCN paper.
"""

from __future__ import annotations

import collections
import importlib
import operator
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["ADMITTED_GLOBALS", "NAMES", "NUM_VAL", "Planetoid", "load_planetoid"]

NAMES: Final = ("cora", "citeseer", "pubmed")
"""The dataset names this reader knows."""

NUM_VAL: Final = 500
"""Size of the standard validation split: the nodes right after the training nodes."""

_SUFFIXES: Final = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
_FEATURES: Final = ("x", "tx", "allx")
_LABELS: Final = ("y", "ty", "ally")
_SOURCE: Final = "https://github.com/kimiyoung/planetoid (data/)"


# --- the planetoid container ----------------------------------------------------------------------
# eq=False: the generated __eq__ would compare tensors with ``==`` and fail on their ambiguous truth value.
@dataclass(frozen=True, eq=False, repr=False)
class Planetoid:
    """One Planetoid graph with its standard semi-supervised split.

    Attributes
    ----------
    name : str
        Lower-case dataset name, one of :data:`NAMES`.
    x : torch.Tensor
        Node features, shape ``(N, F)``, floating point.
    y : torch.Tensor
        Node labels, shape ``(N,)``, int64 in ``[0, num_classes)``. Nodes without a label (CiteSeer's
        isolated nodes, which sit among the test ids but are not test nodes) get label 0.
    edge_index : torch.Tensor
        Edges, shape ``(2, E)``, int64, PyTorch Geometric's convention: row 0 holds sources and row 1
        targets, every undirected edge appears in both directions, without duplicates or
        self-loops, sorted by target and then by source.
    train_mask, val_mask, test_mask : torch.Tensor
        Boolean masks of shape ``(N,)``: the labelled training nodes (the first ``len(y)`` nodes,
        20 per class), the next :data:`NUM_VAL` nodes, and the test nodes listed in ``test.index``.
    num_classes : int
        Number of classes, the width of the one-hot label arrays.
    """

    name: str
    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N``."""
        return int(self.x.shape[0])

    @property
    def num_features(self) -> int:
        """Number of features per node ``F``."""
        return int(self.x.shape[1])

    def __repr__(self) -> str:
        return (
            f"Planetoid(name={self.name!r}, num_nodes={self.num_nodes}, num_features={self.num_features}, "
            f"num_classes={self.num_classes}, num_edges={int(self.edge_index.shape[1])}, "
            f"train/val/test={int(self.train_mask.sum())}/{int(self.val_mask.sum())}/{int(self.test_mask.sum())})"
        )


# --- restricted unpickling ------------------------------------------------------------------------
def _numpy_reconstruct() -> Any:
    # numpy 2 renamed numpy.core to numpy._core and warns on imports under the old name.
    try:
        module = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # pragma: no cover - numpy < 2
        module = importlib.import_module("numpy.core.multiarray")
    return module._reconstruct


def _admitted_globals() -> dict[tuple[str, str], Any]:
    reconstruct = _numpy_reconstruct()
    return {
        # ndarray pickles as _reconstruct(ndarray, shape, dtype) followed by ndarray.__setstate__.
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): reconstruct,
        # The class moved from scipy.sparse.csr (the files' spelling) to scipy.sparse._csr in scipy 1.8.
        ("scipy.sparse.csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse._csr", "csr_matrix"): sp.csr_matrix,
        ("scipy.sparse", "csr_matrix"): sp.csr_matrix,
        # The graph is a defaultdict(list); Python 2 spelled the builtins module __builtin__.
        ("collections", "defaultdict"): collections.defaultdict,
        ("__builtin__", "list"): list,
        ("builtins", "list"): list,
    }


ADMITTED_GLOBALS: Final = _admitted_globals()
"""The ``(module, name)`` pairs the unpickler resolves; any other global is refused."""


class _RefusedGlobalError(pickle.UnpicklingError):
    # A subclass so that _read_pickle can tell a refusal (kept as is) from a corrupt stream (a ValueError).
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ADMITTED_GLOBALS`.

    Parameters
    ----------
    file : IO[bytes]
        The open pickle file.
    source : str
        What to call the file in error messages.
    """

    def __init__(
        self,
        file: IO[bytes],
        source: str,
        admitted: dict[tuple[str, str], Any] | None = None,
        needs: str = "numpy arrays, scipy CSR matrices, lists and a defaultdict",
        encoding: str = "latin1",
    ) -> None:
        # Python 2 pickled numpy buffers as str; latin-1 is the one codec that maps each byte to itself.
        super().__init__(file, encoding=encoding)
        self._source = source
        self._admitted = ADMITTED_GLOBALS if admitted is None else admitted
        self._needs = needs

    def find_class(self, module: str, name: str, /) -> Any:
        """Return the admitted global ``module.name``.

        Raises
        ------
        pickle.UnpicklingError
            If ``(module, name)`` is not in :data:`ADMITTED_GLOBALS`.
        """
        # Looked up by exact name and never imported: importing a module named by the file could itself run code.
        try:
            return self._admitted[(module, name)]
        except KeyError:
            raise _RefusedGlobalError(
                f"{self._source}: refused to unpickle global {module}.{name}; the file only needs {self._needs}"
            ) from None


_CORRUPT_PICKLE = (
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
    KeyError,
    OverflowError,
)


def _read_pickle(path: Path, expected: str) -> object:
    with path.open("rb") as file:
        try:
            return _RestrictedUnpickler(file, str(path)).load()
        except _RefusedGlobalError:
            raise
        except _CORRUPT_PICKLE as exc:
            raise ValueError(
                f"{path}: expected a pickle of {expected}, but it cannot be read (truncated or corrupt?): "
                f"{type(exc).__name__}: {exc}"
            ) from exc


# --- validation of the unpickled objects ----------------------------------------------------------
def _type_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _as_features(obj: object, path: Path) -> sp.csr_matrix:
    expected = "a scipy.sparse CSR matrix of node features"
    if not isinstance(obj, sp.csr_matrix):
        raise ValueError(f"{path}: expected {expected}, got {_type_name(obj)}")
    # Rebuilt from its parts and fully checked: the unpickled object's state came from the file, unvalidated,
    # and scipy's kernels index with it unchecked.
    try:
        data, indices, indptr = (np.asarray(part) for part in (obj.data, obj.indices, obj.indptr))
        if data.dtype.kind not in "biuf" or indices.dtype.kind not in "iu" or indptr.dtype.kind not in "iu":
            raise ValueError(f"bad dtypes data={data.dtype}, indices={indices.dtype}, indptr={indptr.dtype}")
        rows, cols = (operator.index(n) for n in obj.shape)
        matrix = sp.csr_matrix((data, indices, indptr), shape=(rows, cols))
        matrix.check_format(full_check=True)
    except (AttributeError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueError(f"{path}: expected {expected}, got a malformed one: {exc}") from exc
    if not np.isfinite(matrix.data).all():
        raise ValueError(f"{path}: expected {expected}, but it holds non-finite values")
    return matrix


def _as_labels(obj: object, path: Path) -> np.ndarray[Any, np.dtype[Any]]:
    expected = "a 2-D numpy array of one-hot labels"
    if not isinstance(obj, np.ndarray):
        raise ValueError(f"{path}: expected {expected}, got {_type_name(obj)}")
    if obj.ndim != 2 or obj.dtype.kind not in "biuf":
        raise ValueError(f"{path}: expected {expected}, got an array of shape {obj.shape} and dtype {obj.dtype}")
    if not np.isfinite(obj).all():
        raise ValueError(f"{path}: expected {expected}, but it holds non-finite values")
    return obj


def _as_edges(obj: object, path: Path, num_nodes: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Read the adjacency-list dict as ``(source, target)`` arrays, as listed (one direction, duplicates kept)."""
    expected = "a dict mapping each node id to a list of neighbour ids"
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected {expected}, got {_type_name(obj)}")
    sources: list[int] = []
    targets: list[int] = []
    for node, neighbours in obj.items():
        if not isinstance(neighbours, list | tuple):
            raise ValueError(f"{path}: expected {expected}, got {_type_name(neighbours)} for node {node!r}")
        try:
            ids = [operator.index(n) for n in neighbours]
            sources.extend([operator.index(node)] * len(ids))
        except TypeError as exc:
            raise ValueError(f"{path}: expected {expected}, got a non-integer id at node {node!r}: {exc}") from exc
        targets.extend(ids)
    src = np.asarray(sources, dtype=np.int64)
    dst = np.asarray(targets, dtype=np.int64)
    for ends in (src, dst):
        bad = ends[(ends < 0) | (ends >= num_nodes)]
        if bad.size:
            raise ValueError(f"{path}: node id {int(bad[0])} is out of range for a graph of {num_nodes} nodes")
    return src, dst


def _read_test_index(path: Path) -> np.ndarray[Any, np.dtype[np.int64]]:
    expected = "one integer node id per line"
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: expected {expected}, got non-ASCII bytes: {exc}") from exc
    ids: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            ids.append(int(line))
        except ValueError:
            raise ValueError(f"{path}, line {lineno}: expected {expected}, got {line!r}") from None
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


# --- the reader -----------------------------------------------------------------------------------
def _locate(root: Path, name: str) -> dict[str, Path]:
    pattern = f"ind.{name}.{{{','.join(_SUFFIXES)}}}"
    if not root.is_dir():
        raise FileNotFoundError(
            f"Planetoid directory {root} not found: put the split files {pattern} (from {_SOURCE}) in {root}"
        )
    paths = {suffix: root / f"ind.{name}.{suffix}" for suffix in _SUFFIXES}
    missing = [path.name for path in paths.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"Planetoid file(s) {', '.join(missing)} not found in {root}: put the split files {pattern} "
            f"(from {_SOURCE}) in {root}"
        )
    return paths


def load_planetoid(
    root: str | os.PathLike[str],
    name: str = "cora",
    normalize_features: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Planetoid:
    """Load a Planetoid graph (Cora, CiteSeer or PubMed) with its standard split.

    Parameters
    ----------
    root : str or os.PathLike
        Directory holding ``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``.
    name : str, default "cora"
        Dataset name, case-insensitive: one of :data:`NAMES`.
    normalize_features : bool, default True
        Divide each feature row by its sum, as in the GCN paper; all-zero rows stay zero.
    dtype : torch.dtype, default torch.float32
        Floating-point dtype of the features.

    Returns
    -------
    Planetoid
        Features, labels, ``edge_index`` and split masks, equal to those of
        ``torch_geometric.datasets.Planetoid(root, name)`` (whose ``NormalizeFeatures`` transform
        gives the same normalised rows for these non-negative features).

    Raises
    ------
    FileNotFoundError
        If ``root`` or one of the eight files is missing.
    pickle.UnpicklingError
        If a pickle names a global outside :data:`ADMITTED_GLOBALS`: nothing it names is run.
    ValueError
        If ``name`` or ``dtype`` is not supported, or a file is malformed: truncated, holding the
        wrong kind of object, or disagreeing with the others in its row or column counts.

    Notes
    -----
    The reading follows the procedure of Kipf & Welling's and PyTorch Geometric's readers:

    1. Nodes are numbered as the rows of ``allx`` followed by the test nodes; ``test.index`` gives
       the test node of each row of ``tx`` and ``ty``.
    2. The rows of ``tx``/``ty`` are placed in sorted test-index order after ``allx``/``ally``, with
       zero rows for ids in the test range that are not test nodes (CiteSeer's isolated nodes),
       and then moved from the sorted positions to the listed ones.
    3. Labels are the argmax of the one-hot rows (an all-zero row gives class 0).
    4. Edges of the adjacency lists are made undirected (both directions), and self-loops and
       duplicates are dropped.

    Examples
    --------
    >>> cora = load_planetoid("data/planetoid", "cora")  # doctest: +SKIP
    >>> cora.num_nodes, cora.num_features, cora.num_classes, cora.edge_index.shape[1]  # doctest: +SKIP
    (2708, 1433, 7, 10556)
    """
    key = name.lower()
    if key not in NAMES:
        raise ValueError(f"name={name!r} is not a Planetoid dataset this reader knows; expected one of {NAMES}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype}")
    paths = _locate(Path(root), key)

    features = {s: _as_features(_read_pickle(paths[s], "a scipy.sparse CSR matrix"), paths[s]) for s in _FEATURES}
    labels = {s: _as_labels(_read_pickle(paths[s], "a numpy array"), paths[s]) for s in _LABELS}
    graph = _read_pickle(paths["graph"], "a dict of adjacency lists")
    test_index = _read_test_index(paths["test.index"])
    _check_consistent(paths, features, labels, test_index)

    x, y = _node_tables(features["allx"], features["tx"], labels["ally"], labels["ty"], test_index)
    num_nodes = x.shape[0]
    if normalize_features:
        sums = x.sum(axis=1, keepdims=True)
        np.divide(x, sums, out=x, where=sums != 0)
    src, dst = _as_edges(graph, paths["graph"], num_nodes)

    num_train = labels["y"].shape[0]
    train_mask = torch.zeros(num_nodes, dtype=torch.bool)
    train_mask[:num_train] = True
    val_mask = torch.zeros(num_nodes, dtype=torch.bool)
    val_mask[num_train : num_train + NUM_VAL] = True
    test_mask = torch.zeros(num_nodes, dtype=torch.bool)
    test_mask[torch.from_numpy(test_index)] = True
    return Planetoid(
        name=key,
        x=torch.from_numpy(x).to(dtype),
        y=torch.from_numpy(y),
        edge_index=torch.from_numpy(_undirected_edge_index(src, dst, num_nodes)),
        train_mask=train_mask,
        val_mask=val_mask,
        test_mask=test_mask,
        num_classes=int(labels["ally"].shape[1]),
    )


def _check_consistent(
    paths: dict[str, Path],
    features: dict[str, sp.csr_matrix],
    labels: dict[str, np.ndarray[Any, Any]],
    test_index: np.ndarray[Any, Any],
) -> None:
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
    num_train = labels["y"].shape[0]
    if num_train + NUM_VAL > num_known:
        raise ValueError(
            f"{paths['y']}: {num_train} training nodes and {NUM_VAL} validation nodes do not fit in the "
            f"{num_known} rows of {paths['allx'].name}"
        )


def _node_tables(
    allx: sp.csr_matrix,
    tx: sp.csr_matrix,
    ally: np.ndarray[Any, Any],
    ty: np.ndarray[Any, Any],
    test_index: np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, np.dtype[np.float64]], np.ndarray[Any, np.dtype[np.int64]]]:
    """Features ``(N, F)`` (float64) and labels ``(N,)`` (int64) in node order, by the standard procedure."""
    sorted_index = np.sort(test_index)
    # CiteSeer's test ids skip its isolated nodes, which are in no file: they get zero features and labels.
    # For contiguous ids (Cora, PubMed) the padding adds nothing and this is the plain procedure.
    span = int(sorted_index[-1] - sorted_index[0]) + 1
    slots = sorted_index - sorted_index[0]
    test_x = np.zeros((span, tx.shape[1]))
    test_x[slots] = tx.toarray()
    test_y = np.zeros((span, ty.shape[1]))
    test_y[slots] = ty

    x = np.concatenate([allx.toarray().astype(np.float64), test_x])
    y = np.concatenate([ally.astype(np.float64), test_y]).argmax(axis=1).astype(np.int64)
    # The rows of tx were laid out in sorted order above, but row i belongs to node test_index[i]; numpy
    # evaluates the right side into a copy first, so this is a permutation of the test rows.
    x[test_index] = x[sorted_index]
    y[test_index] = y[sorted_index]
    return x, y


def _undirected_edge_index(
    src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any], num_nodes: int
) -> np.ndarray[Any, Any]:
    """Both directions of every edge, without self-loops or duplicates, sorted by target then source."""
    loops = src == dst
    src, dst = src[~loops], dst[~loops]
    sources = np.concatenate([src, dst])
    targets = np.concatenate([dst, src])
    # One int64 key per edge (N^2 < 2^63 for any graph that fits in memory) dedups and sorts in one pass; the
    # target-major order is the one PyTorch Geometric's coalesce(sort_by_row=False) gives its Planetoid edges.
    keys = np.unique(targets * num_nodes + sources)
    return np.stack([keys % num_nodes, keys // num_nodes]).astype(np.int64)
