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
these files contain and refuses everything else (:mod:`structconv.data.planetoid_files` reads and
checks the files; this module builds the graph and its split from them).

The result equals what PyTorch Geometric's ``Planetoid`` dataset reads (node order, features,
labels, standard split and the order of ``edge_index``), with optional row normalisation of the
features as in the GCN paper.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import scipy.sparse as sp
import torch

from .planetoid_files import (
    ADMITTED_GLOBALS,
    FEATURES,
    LABELS,
    NUM_VAL,
    as_edges,
    as_features,
    as_labels,
    check_consistent,
    locate,
    read_pickle,
    read_test_index,
)

__all__ = ["ADMITTED_GLOBALS", "NAMES", "NUM_VAL", "Planetoid", "load_planetoid"]

NAMES: Final = ("cora", "citeseer", "pubmed")
"""The dataset names this reader knows."""


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


# --- the reader -----------------------------------------------------------------------------------
def _float_dtype(dtype: object) -> torch.dtype:
    """``dtype`` if it is a floating-point torch dtype; a name such as ``"float32"`` is refused, as torch refuses it."""
    if not isinstance(dtype, torch.dtype):
        hint = (
            f" (torch.{dtype}?)"
            if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype)
            else ""
        )
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float32, got {dtype!r}{hint}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype}")
    return dtype


def load_planetoid(
    root: str | os.PathLike[str],
    name: str = "cora",
    *,
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
    TypeError
        If ``root`` is not a path (``None`` or a number, say), or ``dtype`` is not a ``torch.dtype``
        (a name such as ``"float32"`` included).
    FileNotFoundError
        If ``root`` or one of the eight files is missing.
    pickle.UnpicklingError
        If a pickle names a global outside :data:`ADMITTED_GLOBALS`: nothing it names is run (the
        error is a ``ValueError`` too).
    ValueError
        If ``name`` or ``dtype`` is not supported, or a file is malformed: truncated, holding the
        wrong kind of object, or disagreeing with the others in its row or column counts; or if a
        file states an implausible size (an array larger than its file, more listed edges than its
        file has bytes, a test id far beyond the nodes, a dense feature matrix over
        :data:`~structconv.data.planetoid_files.MAX_DENSE_VALUES` values), refused before it is
        allocated.

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
    if not isinstance(root, str | os.PathLike):
        raise TypeError(
            f"root must be a str or os.PathLike (the directory holding the ind.<name>.* files), got "
            f"{type(root).__name__} {root!r:.60}"
        )
    key = name.lower()
    if key not in NAMES:
        raise ValueError(f"name={name!r} is not a Planetoid dataset this reader knows; expected one of {NAMES}")
    dtype = _float_dtype(dtype)
    paths = locate(Path(root), key)

    features = {s: as_features(read_pickle(paths[s], "a scipy.sparse CSR matrix"), paths[s]) for s in FEATURES}
    labels = {s: as_labels(read_pickle(paths[s], "a numpy array"), paths[s]) for s in LABELS}
    graph = read_pickle(paths["graph"], "a dict of adjacency lists")
    test_index = read_test_index(paths["test.index"])
    check_consistent(paths, features, labels, test_index)
    # Nodes are the allx rows and then the test range, which starts right after them (checked above).
    num_nodes = int(test_index.max()) + 1
    src, dst = as_edges(graph, paths["graph"], num_nodes)  # checked before the dense tables are allocated

    x, y = _node_tables(features["allx"], features["tx"], labels["ally"], labels["ty"], test_index)
    if normalize_features:
        sums = x.sum(axis=1, keepdims=True)
        np.divide(x, sums, out=x, where=sums != 0)

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
