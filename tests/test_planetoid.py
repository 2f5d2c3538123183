"""The Planetoid reader: agreement with PyTorch Geometric, the restricted unpickler, and its errors.

Tests marked ``real`` need the original Cora split files in ``<workspace>/shared/data/planetoid``;
the others write small synthetic files in the same format, so they run anywhere.
"""

from __future__ import annotations

import builtins
import collections
import os
import pickle
import shlex
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from structconv.data import Planetoid, load_planetoid
from structconv.data.planetoid import ADMITTED_GLOBALS

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"
SUFFIXES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
HAVE_CORA = all((DATA / f"ind.cora.{suffix}").is_file() for suffix in SUFFIXES)
real = pytest.mark.skipif(not HAVE_CORA, reason=f"the Cora split files are not in {DATA}")


# --- synthetic files in the Planetoid format ------------------------------------------------------
def dump(path: Path, obj: object) -> None:
    # Protocol 4: Python 3's protocol 2 would spell bytes as _codecs.encode calls, which the reader refuses.
    path.write_bytes(pickle.dumps(obj, protocol=4))


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    return np.eye(num_classes, dtype=np.int32)[labels]


def write_synthetic(folder: Path, name: str, *, gaps: bool, seed: int = 0) -> None:
    """A small graph in the split-file format: 520 non-test nodes, 40 test-range ids (some unused if ``gaps``)."""
    rng = np.random.default_rng(seed)
    num_known, span, num_features, num_classes, num_train = 520, 40, 6, 3, 12
    num_nodes = num_known + span
    unused = {num_known + 5, num_known + 6, num_known + 17, num_known + 30} if gaps else set()
    test_ids = np.array([i for i in range(num_known, num_nodes) if i not in unused])
    rng.shuffle(test_ids)

    features = (rng.random((num_nodes, num_features)) < 0.4).astype(np.float32)
    features[np.arange(num_nodes), rng.integers(0, num_features, num_nodes)] = 1.0
    features[[3, num_known + 2]] = 0.0  # all-zero rows, one of them a test node
    labels = rng.integers(0, num_classes, num_nodes)
    allx, ally = features[:num_known], one_hot(labels[:num_known], num_classes)
    tx, ty = features[test_ids], one_hot(labels[test_ids], num_classes)

    graph: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
    nodes = [i for i in range(num_nodes) if i not in unused]
    for a, b in rng.choice(nodes, size=(3 * num_nodes, 2)).tolist():
        graph[a].append(b)
        graph[b].append(a)
    graph[7].extend([7, 8, 8])  # a self-loop and a duplicate, as the real files have
    graph[8].append(7)

    dump(folder / f"ind.{name}.x", sp.csr_matrix(allx[:num_train]))
    dump(folder / f"ind.{name}.y", ally[:num_train])
    dump(folder / f"ind.{name}.allx", sp.csr_matrix(allx))
    dump(folder / f"ind.{name}.ally", ally)
    dump(folder / f"ind.{name}.tx", sp.csr_matrix(tx))
    dump(folder / f"ind.{name}.ty", ty)
    dump(folder / f"ind.{name}.graph", graph)
    (folder / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in test_ids))


@pytest.fixture
def cora_dir(tmp_path: Path) -> Path:
    """A writable directory of Cora files: copies of the real ones where present, else synthetic ones."""
    folder = tmp_path / "planetoid"
    folder.mkdir()
    if HAVE_CORA:
        for suffix in SUFFIXES:
            # copyfile, not copy: the originals are read-only and the tests overwrite some copies.
            shutil.copyfile(DATA / f"ind.cora.{suffix}", folder / f"ind.cora.{suffix}")
    else:
        write_synthetic(folder, "cora", gaps=False)
    return folder


def pyg_reference(folder: Path, name: str) -> Any:
    pyg_io = pytest.importorskip("torch_geometric.io")
    return pyg_io.read_planetoid_data(str(folder), name)


def edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


def assert_matches_pyg(data: Planetoid, ref: Any) -> None:
    torch.testing.assert_close(data.x, ref.x, rtol=0, atol=0)
    assert torch.equal(data.y, ref.y)
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(data, mask), getattr(ref, mask)), mask
    assert data.edge_index.dtype == torch.int64
    assert data.edge_index.shape == ref.edge_index.shape
    assert edge_set(data.edge_index) == edge_set(ref.edge_index)
    assert torch.equal(data.edge_index, ref.edge_index)  # same order too


# --- the real Cora ----------------------------------------------------------------------------------
@real
def test_cora_statistics_and_split():
    cora = load_planetoid(DATA, "cora")
    assert (cora.name, cora.num_nodes, cora.num_features, cora.num_classes) == ("cora", 2708, 1433, 7)
    assert cora.x.shape == (2708, 1433) and cora.x.dtype == torch.float32
    assert cora.y.shape == (2708,) and cora.y.dtype == torch.int64
    assert set(cora.y.tolist()) == set(range(7))
    assert cora.edge_index.shape == (2, 10556) and cora.edge_index.dtype == torch.int64
    masks = (cora.train_mask, cora.val_mask, cora.test_mask)
    assert all(m.dtype == torch.bool and m.shape == (2708,) for m in masks)
    assert [int(m.sum()) for m in masks] == [140, 500, 1000]
    assert int(torch.stack(masks).sum(0).max()) == 1  # disjoint
    assert cora.train_mask[:140].all() and cora.val_mask[140:640].all()
    assert torch.bincount(cora.y[cora.train_mask]).tolist() == [20] * 7
    assert repr(cora) == (
        "Planetoid(name='cora', num_nodes=2708, num_features=1433, num_classes=7, num_edges=10556, "
        "train/val/test=140/500/1000)"
    )


@real
def test_cora_matches_torch_geometric():
    assert_matches_pyg(load_planetoid(DATA, "cora", normalize_features=False), pyg_reference(DATA, "cora"))


@real
def test_cora_edges_are_undirected_without_loops():
    src, dst = load_planetoid(DATA).edge_index
    assert not (src == dst).any()
    edges = edge_set(torch.stack([src, dst]))
    assert len(edges) == 10556
    assert edges == {(b, a) for a, b in edges}


@real
def test_cora_rows_normalised():
    raw = load_planetoid(DATA, normalize_features=False, dtype=torch.float64).x
    cora = load_planetoid(DATA, dtype=torch.float64)
    sums = raw.sum(1)
    nonempty = sums > 0
    assert nonempty.any()
    torch.testing.assert_close(cora.x.sum(1)[nonempty], torch.ones(int(nonempty.sum()), dtype=torch.float64))
    torch.testing.assert_close(cora.x[nonempty], raw[nonempty] / sums[nonempty, None])
    assert (cora.x[~nonempty] == 0).all()
    assert load_planetoid(DATA).x.dtype == torch.float32


# --- synthetic files --------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "gaps"), [("cora", False), ("citeseer", True), ("pubmed", False)])
def test_synthetic_matches_torch_geometric(tmp_path, name, gaps):
    write_synthetic(tmp_path, name, gaps=gaps)
    data = load_planetoid(tmp_path, name.upper(), normalize_features=False)
    assert data.name == name
    assert_matches_pyg(data, pyg_reference(tmp_path, name))


def test_isolated_test_range_nodes_are_zero_padded(tmp_path):
    write_synthetic(tmp_path, "citeseer", gaps=True)
    data = load_planetoid(tmp_path, "citeseer")
    assert data.num_nodes == 560
    unused = torch.tensor([525, 526, 537, 550])
    assert not data.test_mask[unused].any()
    assert int(data.test_mask.sum()) == 36
    assert (data.x[unused] == 0).all() and (data.y[unused] == 0).all()
    assert not torch.isin(data.edge_index, unused).any()


def test_normalisation_keeps_zero_rows_zero(tmp_path):
    write_synthetic(tmp_path, "cora", gaps=False)
    data = load_planetoid(tmp_path, dtype=torch.float64)
    sums = data.x.sum(1)
    empty = torch.tensor([3, 522])
    assert (data.x[empty] == 0).all()
    keep = torch.ones(data.num_nodes, dtype=torch.bool)
    keep[empty] = False
    torch.testing.assert_close(sums[keep], torch.ones(int(keep.sum()), dtype=torch.float64))


def test_edges_made_undirected_without_loops_or_duplicates(tmp_path):
    write_synthetic(tmp_path, "cora", gaps=False)
    path = tmp_path / "ind.cora.graph"
    dump(path, collections.defaultdict(list, {0: [1, 1, 0], 2: [3], 3: [559]}))  # 3 -> 2 and 559 -> 3 missing
    edge_index = load_planetoid(tmp_path).edge_index
    expected = {(0, 1), (1, 0), (2, 3), (3, 2), (3, 559), (559, 3)}
    assert edge_set(edge_index) == expected
    assert edge_index.shape == (2, len(expected))
    # Sorted by target, then source, as PyG's Planetoid edges are.
    order = (edge_index[1] * 560 + edge_index[0]).tolist()
    assert order == sorted(order)


def test_bad_arguments(tmp_path):
    write_synthetic(tmp_path, "cora", gaps=False)
    with pytest.raises(ValueError, match=r"name='nell' is not a Planetoid dataset .* expected one of"):
        load_planetoid(tmp_path, "nell")
    with pytest.raises(ValueError, match=r"dtype must be a floating-point torch dtype, got torch.int64"):
        load_planetoid(tmp_path, dtype=torch.int64)
    assert load_planetoid(str(tmp_path), dtype=torch.float64).x.dtype == torch.float64


@pytest.mark.parametrize("given", ["float32", np.float32, "float12", 32])
def test_dtype_not_a_torch_dtype_is_a_type_error_naming_it(tmp_path: Path, given: object) -> None:
    write_synthetic(tmp_path, "cora", gaps=False)  # "float32" raised an AttributeError before
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch dtype such as torch.float32, got "):
        load_planetoid(tmp_path, dtype=given)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got 'float64' \(torch.float64\?\)"):
        load_planetoid(tmp_path, dtype="float64")  # type: ignore[arg-type]


def test_a_test_index_over_its_cap_is_refused_before_reading(tmp_path: Path) -> None:
    from structconv.data.planetoid_files import MAX_TEST_INDEX_BYTES

    write_synthetic(tmp_path, "cora", gaps=False)
    path = tmp_path / "ind.cora.test.index"
    listed = path.read_bytes()
    path.write_bytes(listed + b"\n" * (MAX_TEST_INDEX_BYTES - len(listed)))  # blank lines: still a valid file
    assert load_planetoid(tmp_path).num_nodes == 560
    path.write_bytes(listed + b"\n" * (MAX_TEST_INDEX_BYTES + 1 - len(listed)))
    size = f"{MAX_TEST_INDEX_BYTES + 1:,}"
    with pytest.raises(ValueError, match=rf"ind\.cora\.test\.index: the file has {size} bytes, more than the"):
        load_planetoid(tmp_path)


# --- safe loading -----------------------------------------------------------------------------------
class Payload:
    """Pickles as a call of ``func(*args)``: what a malicious pickle does on plain ``pickle.load``."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def payloads(marker: Path) -> dict[str, Payload]:
    return {
        "os.system": Payload(os.system, f"touch {shlex.quote(str(marker))}"),
        "builtins.exec": Payload(builtins.exec, f"open({str(marker)!r}, 'w').close()"),
        "builtins.open": Payload(builtins.open, str(marker), "w"),
    }


@pytest.mark.parametrize("payload", ["os.system", "builtins.exec", "builtins.open"])
@pytest.mark.parametrize("suffix", ["x", "ally", "graph"])
def test_malicious_pickle_is_refused(cora_dir, tmp_path, suffix, payload):
    marker = tmp_path / "pwned"
    evil = payloads(marker)[payload]
    # Hidden inside an otherwise well-formed object as well as on its own.
    dump(cora_dir / f"ind.cora.{suffix}", collections.defaultdict(list, {0: [evil]}) if suffix == "graph" else evil)
    with pytest.raises(pickle.UnpicklingError, match=rf"ind\.cora\.{suffix}: refused to unpickle global \w+\.\w+"):
        load_planetoid(cora_dir)
    assert not marker.exists()


def test_refusal_names_the_global(cora_dir, tmp_path):
    dump(cora_dir / "ind.cora.x", Payload(os.system, "true"))
    with pytest.raises(pickle.UnpicklingError, match=rf"global {os.system.__module__}\.system;"):
        load_planetoid(cora_dir)


def test_admitted_globals_are_exactly_these():
    assert set(ADMITTED_GLOBALS) == {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("scipy.sparse.csr", "csr_matrix"),
        ("scipy.sparse._csr", "csr_matrix"),
        ("scipy.sparse", "csr_matrix"),
        ("collections", "defaultdict"),
        ("__builtin__", "list"),
        ("builtins", "list"),
    }


def test_plain_pickle_load_is_never_used(cora_dir, monkeypatch):
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("plain unpickling was used")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(np, "load", forbidden)
    assert load_planetoid(cora_dir).num_nodes > 0


# --- clear errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_truncated_pickle(cora_dir, keep):
    path = cora_dir / "ind.cora.allx"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(
        ValueError, match=r"ind\.cora\.allx: expected a pickle of a scipy.sparse CSR matrix, .*truncated"
    ):
        load_planetoid(cora_dir)


def test_missing_file(cora_dir):
    (cora_dir / "ind.cora.graph").unlink()
    (cora_dir / "ind.cora.ty").unlink()
    with pytest.raises(FileNotFoundError) as info:
        load_planetoid(cora_dir)
    message = str(info.value)
    assert "ind.cora.ty, ind.cora.graph not found" in message
    assert "put the split files ind.cora.{x,y,tx,ty,allx,ally,graph,test.index}" in message
    assert message.endswith(f"in {cora_dir}")


def test_missing_directory(tmp_path):
    root = tmp_path / "nowhere"
    with pytest.raises(
        FileNotFoundError, match=rf"Planetoid directory {root} not found: put .*ind\.cora\..* in {root}"
    ):
        load_planetoid(root)


@pytest.mark.parametrize(
    ("suffix", "obj", "message"),
    [
        ("y", {"a": 1}, r"ind\.cora\.y: expected a 2-D numpy array of one-hot labels, got builtins\.dict"),
        ("ty", np.zeros(3), r"ind\.cora\.ty: expected a 2-D numpy array .* shape \(3,\)"),
        ("x", np.eye(3), r"ind\.cora\.x: expected a scipy.sparse CSR matrix of node features, got numpy\.ndarray"),
        ("tx", [1, 2], r"ind\.cora\.tx: expected a scipy.sparse CSR matrix of node features, got builtins\.list"),
        ("graph", [[1], [0]], r"ind\.cora\.graph: expected a dict mapping each node id to a list"),
        ("graph", {0: 1}, r"ind\.cora\.graph: expected a dict .* got builtins\.int for node 0"),
        ("graph", {0: [1.5]}, r"ind\.cora\.graph: .* non-integer id at node 0"),
        ("graph", {0: [10**6]}, r"ind\.cora\.graph: node id 1000000 is out of range"),
    ],
)
def test_wrong_object_inside(cora_dir, suffix, obj, message):
    dump(cora_dir / f"ind.cora.{suffix}", obj)
    with pytest.raises(ValueError, match=message):
        load_planetoid(cora_dir)


def test_corrupt_csr_is_rejected(cora_dir):
    matrix = sp.csr_matrix(np.eye(4, dtype=np.float32))
    matrix.indices[0] = 10**6  # an out-of-range column that scipy would otherwise index with
    dump(cora_dir / "ind.cora.x", matrix)
    with pytest.raises(ValueError, match=r"ind\.cora\.x: expected a scipy.sparse CSR matrix .* malformed"):
        load_planetoid(cora_dir)


def test_mismatched_rows(cora_dir):
    ty = pickle.loads((cora_dir / "ind.cora.ty").read_bytes(), encoding="latin1")  # our own test file: trusted
    dump(cora_dir / "ind.cora.ty", ty[:-1])
    with pytest.raises(ValueError, match=r"ind\.cora\.ty has \d+ rows but ind\.cora\.tx has \d+; expected equal"):
        load_planetoid(cora_dir)


def test_mismatched_columns(cora_dir):
    y = pickle.loads((cora_dir / "ind.cora.y").read_bytes(), encoding="latin1")  # our own test file: trusted
    dump(cora_dir / "ind.cora.x", sp.csr_matrix((len(y), 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"ind\.cora\.x has 3 columns but ind\.cora\.allx has \d+; expected the same"):
        load_planetoid(cora_dir)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1708\nabc\n", r"ind\.cora\.test\.index, line 2: expected one integer node id per line, got 'abc'"),
        ("", r"ind\.cora\.test\.index: .* the file is empty"),
        ("\xe9\n", r"ind\.cora\.test\.index: .* non-ASCII"),
    ],
)
def test_bad_test_index(cora_dir, text, message):
    (cora_dir / "ind.cora.test.index").write_bytes(text.encode("latin1"))
    with pytest.raises(ValueError, match=message):
        load_planetoid(cora_dir)


def test_test_index_must_follow_allx(cora_dir):
    path = cora_dir / "ind.cora.test.index"
    ids = [int(line) for line in path.read_text().split()]
    ids[ids.index(min(ids))] = 0
    path.write_text("\n".join(map(str, ids)))
    with pytest.raises(ValueError, match=r"expected the test node ids to start right after the \d+ rows of"):
        load_planetoid(cora_dir)


# --- the stream check before unpickling -------------------------------------------------------------
STREAM_OBJECTS = [
    None,
    [1, -5, 2**70, -(2**100), 1.5, 1e300, "héllo\n", b"bytes\x00\n", bytearray(b"xy" * 200), (1,), {1, 2}],
    {"a": 1, 2: [b"x"] * 3, "shared": [[0]] * 3},
    collections.defaultdict(list, {0: list(range(300)), 1: [2**31, -(2**31)]}),
    collections.OrderedDict(a=1),
    np.arange(10),
    sp.csr_matrix(np.eye(3, dtype=np.float32)),
    "x" * 300,
    b"y" * 70_000,  # a frame of its own at protocol 4
]


def _nest(inner: Any, depth: int) -> Any:
    """``inner`` inside ``depth - 1`` containers of its own kind: ``depth`` deep."""
    wrap = {list: lambda x: [x], tuple: lambda x: (x,), dict: lambda x: {0: x}, frozenset: lambda x: frozenset([x])}
    for _ in range(depth - 1):
        inner = wrap[type(inner)](inner)
    return inner


def _twice(stored: int, outer: int) -> bytes:
    """A tuple ``stored`` deep, memoized, then fetched twice into a pair wrapped ``outer - 1`` more times."""
    return b"\x80\x02)" + b"\x85" * (stored - 1) + b"q\x00h\x00h\x00\x86" + b"\x85" * (outer - 1) + b"."


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_stream_check_passes_every_protocol_and_refuses_every_prefix(protocol: int) -> None:
    from structconv.data.unpickle import check_stream

    for obj in STREAM_OBJECTS:
        data = pickle.dumps(obj, protocol=protocol)
        check_stream(data)
        ends = range(len(data)) if len(data) < 5000 else [*range(0, len(data), 999), *range(len(data) - 50, len(data))]
        for end in ends:
            with pytest.raises(pickle.UnpicklingError, match=r"checked before unpickling"):
                check_stream(data[:end])


@real
def test_the_stream_check_passes_the_real_files() -> None:
    from structconv.data.unpickle import check_stream

    for suffix in ("x", "y", "tx", "ty", "allx", "ally", "graph"):
        check_stream((DATA / f"ind.cora.{suffix}").read_bytes())  # Python 2 pickles: memo indices from 1


# Objects nested one deeper than check_stream admits, built by each family of opcodes, and the admitted depth.
DEEP = 101
NESTED: dict[str, tuple[bytes, bytes]] = {
    "tuple_key": (b"\x80\x02}K\x00" + b"\x85" * 1_000_000 + b"]s.", b"\x80\x02}K\x00" + b"\x85" * 99 + b"]s."),
    "lists": (pickle.dumps(_nest([], DEEP), 2), pickle.dumps(_nest([], DEEP - 1), 2)),
    "tuples_protocol_0": (pickle.dumps(_nest((), DEEP), 0), pickle.dumps(_nest((), DEEP - 1), 0)),
    "dicts": (pickle.dumps(_nest({}, DEEP), 4), pickle.dumps(_nest({}, DEEP - 1), 4)),
    "frozensets": (pickle.dumps(_nest(frozenset(), DEEP), 4), pickle.dumps(_nest(frozenset(), DEEP - 1), 4)),
    # A tuple 51 deep stored in the memo and fetched twice into one of 51 more: the memo keeps its depth.
    "memo": (_twice(51, 50), _twice(50, 50)),
    # Empty lists, each appended to the one before: APPEND makes the container as deep as its deepest item.
    "appends": (b"\x80\x02]" + b"]" * DEEP + b"a" * DEEP + b".", b"\x80\x02]" + b"]" * 99 + b"a" * 99 + b"."),
}


@pytest.mark.parametrize("case", NESTED)
def test_the_stream_check_refuses_objects_nested_too_deep(case: str) -> None:
    from structconv.data.unpickle import MAX_DEPTH, RefusedObjectError, check_stream

    deep, admitted = NESTED[case]
    assert MAX_DEPTH == DEEP - 1
    with pytest.raises(
        RefusedObjectError, match=rf"at byte [\d,]+ builds objects nested {DEEP} deep, more than the 100"
    ):
        check_stream(deep)
    check_stream(admitted)
    pickle.loads(admitted)


def test_a_graph_keyed_by_a_deeply_nested_tuple_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Hashing the key recursed in C past the stack: a segfault before (run in a subprocess by test_hostile_files)."""
    write_synthetic(tmp_path, "cora", gaps=False)
    (tmp_path / "ind.cora.graph").write_bytes(b"\x80\x02}K\x00" + b"\x85" * 150 + b"]s.")
    with pytest.raises(ValueError, match=r"ind\.cora\.graph: TUPLE1 at byte 105 builds objects nested 101 deep"):
        load_planetoid(tmp_path)


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (b"\x80\x02N]r\x00\x00\x00\x00q\x03.", r"BINPUT at byte \d+ names memo index 3, but only 1 values"),
        (b"(lp7\n.", r"PUT at byte 2 names memo index 7, but only 0 values"),
        (b"(lp-1\n.", r"PUT at byte 2 names memo index b'-1'"),
        (b"\x80\x02\xff.", r"unknown opcode b'\\xff' at byte 2"),
        (b"\x80\x02cnumpy\n", r"GLOBAL at byte 2 has no end of line"),
    ],
)
def test_the_stream_check_names_the_opcode(stream: bytes, message: str) -> None:
    from structconv.data.unpickle import check_stream

    with pytest.raises(pickle.UnpicklingError, match=message):
        check_stream(stream)
