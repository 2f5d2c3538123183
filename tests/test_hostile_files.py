"""Crafted files whose stated sizes lie: every reader refuses them by name, before allocating (issue 21).

The cases that could allocate run in one subprocess per reader, with its address space limited to
what the imports map plus :data:`EXTRA_GIB` and a time limit: a reader that trusted a stated size
would fail there with a ``MemoryError`` (or time out) instead of the ``ValueError`` expected, and
each case's growth of the peak resident memory is checked too.  The command-line cases run in this
process: one line on stderr and exit status 1.
"""

from __future__ import annotations

import collections
import gzip
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import memory_budget, official_archive
from test_planetoid import dump, write_synthetic

from structconv.cli import main
from structconv.data import cifar, load_planetoid, unpickle
from structconv.data.cifar import MAX_BATCH_BYTES, cache_key, load_cifar10
from structconv.data.unpickle import numpy_reconstruct
from structconv.experiments.cifar.checkpoint import save_checkpoint
from structconv.experiments.cifar.models import build_model
from structconv.experiments.cifar.presets import config_for

EXTRA_GIB = 1.0  # room above the imports' mapping: far below what any refused size asks for
MAX_GROWTH_MIB = 64  # what one refused case may add to the peak resident memory
TIMEOUT_S = 120

RUNNER = """
import json, resource, sys, warnings
import torch, torch._dynamo  # imported before the limit: the first meta-device build would import it
from structconv.data import load_cifar10, load_planetoid
from structconv.experiments.cifar.train import model_from_checkpoint

CALLS = {
    "planetoid": load_planetoid,
    "cifar": lambda root, split, cache: load_cifar10(root, split, cache_dir=cache),
    "checkpoint": model_from_checkpoint,
}
cases = json.loads(sys.argv[1])
with open("/proc/self/status") as status:
    mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
limit = mapped + int(float(sys.argv[2]) * 2**30)
resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
results = {}
for case in cases:
    before = peak()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            CALLS[case["call"]](*case["args"])
        outcome = {"error": None, "value_error": False, "message": ""}
    except BaseException as err:
        outcome = {"error": type(err).__name__, "value_error": isinstance(err, ValueError), "message": str(err)}
    outcome["grew_mib"] = peak() - before
    results[case["id"]] = outcome
print(json.dumps(results))
"""


def run_bounded(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Run each case's reader in one subprocess under the address-space and time limits; their outcomes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(cases), str(EXTRA_GIB)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=Path(__file__).parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def assert_refused(outcome: dict[str, Any], *fragments: str) -> None:
    assert outcome["value_error"], f"expected a ValueError, got {outcome['error']}: {outcome['message'][:300]}"
    for fragment in fragments:
        assert fragment in outcome["message"], (fragment, outcome["message"])
    assert outcome["grew_mib"] < MAX_GROWTH_MIB, f"peak memory grew by {outcome['grew_mib']:.0f} MiB"


class Reduce:
    """Pickles as ``func(*args)``, with an optional state for ``BUILD``: what a crafted pickle can say."""

    def __init__(self, func: Any, args: tuple[Any, ...], state: Any = None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


# A few bytes that state a length (or a memo index) far beyond the stream: CPython's unpickler allocates the stated
# size before reading, so each must be refused before unpickling.  One per family of counted opcodes.
STATED: dict[str, tuple[bytes, str]] = {
    "bytes8_1tb": (b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b"abc", "BINBYTES8 at byte 2 states 1,099,511,627,776"),
    "unicode8_1tb": (b"\x80\x04\x8d" + struct.pack("<Q", 2**40) + b"abc", "BINUNICODE8 at byte 2 states 1,099,511,"),
    "bytearray8_1tb": (b"\x80\x05\x96" + struct.pack("<Q", 2**40) + b"abc", "BYTEARRAY8 at byte 2 states 1,099,511,"),
    "string_2gib": (b"\x80\x02T" + struct.pack("<i", 2**31 - 1) + b"abc", "BINSTRING at byte 2 states 2,147,483,647"),
    "string_negative": (b"\x80\x02T\xff\xff\xff\xff" + b"abc", "BINSTRING at byte 2 states -1 bytes"),
    "bytes4_4gib": (b"\x80\x03B" + struct.pack("<I", 2**32 - 1) + b"abc", "BINBYTES at byte 2 states 4,294,967,295"),
    "unicode4_4gib": (b"\x80\x02X" + struct.pack("<I", 2**32 - 1) + b"abc", "BINUNICODE at byte 2 states 4,294,967,"),
    "long4_2gib": (b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"abc", "LONG4 at byte 2 states 2,147,483,647"),
    "frame_1tb": (b"\x80\x04\x95" + struct.pack("<Q", 2**40) + b"N.", "FRAME at byte 2 states 1,099,511,627,776"),
    # The memo grows to twice a PUT's index, zero-filled: 64 GiB for this one, 4 GiB touched for 2**28.
    "memo_index": (b"\x80\x02Nr" + struct.pack("<I", 2**32 - 1) + b".", "LONG_BINPUT at byte 3 names memo index 4,"),
}


# --- Planetoid --------------------------------------------------------------------------------------
def _planetoid_cases(root: Path) -> list[tuple[str, str, list[str]]]:
    """``(id, file, expected fragments)``: each case is the synthetic Cora with one file replaced."""
    reconstruct = numpy_reconstruct()
    shared = [0] * 100_000
    wide = sp.csr_matrix(np.ones((560, 6), np.float32))
    tall = sp.csr_matrix(np.ones((12, 6), np.float32))
    tall._shape = (10**8, 6)
    edits: dict[str, tuple[str, object, list[str]]] = {
        "index_1e9": ("test.index", "520\n1000000000\n", ["ind.cora.test.index, line 2", "node id 1000000000"]),
        "index_1e30": ("test.index", f"520\n{10**30}\n", ["ind.cora.test.index", f"node id {10**30}"]),
        "columns_1e9": ("tx", sp.csr_matrix((40, 10**9), dtype=np.float32), ["ind.cora.tx", "1,000,000,000 feature"]),
        "rows_1e8": ("x", tall, ["ind.cora.x", "malformed"]),
        "csr_called": ("x", Reduce(sp.csr_matrix, ((10**9, 10**9),)), ["ind.cora.x", "csr_matrix called"]),
        "array_1e12": ("y", Reduce(reconstruct, (np.ndarray, (10**12,), b"b")), ["ind.cora.y", "1,000,000,000,000"]),
        "object_array": (
            "ally",
            Reduce(reconstruct, (np.ndarray, (10**8,), np.dtype("O"))),
            ["ind.cora.ally", "dtype object"],
        ),
        # A dtype whose pickled state sets object flags: numpy read the data as object pointers (a crash before).
        "void_flags": (
            "ty",
            Reduce(
                reconstruct,
                (np.ndarray, (0,), b"b"),
                (1, (10**8,), Reduce(np.dtype, ("V8", False, True), (3, "|", None, None, None, 8, 1, 63)), False, []),
            ),
            ["ind.cora.ty", "V8"],
        ),
        "shared_lists": (
            "graph",
            collections.defaultdict(list, {i: shared for i in range(560)}),
            ["ind.cora.graph", "56,000,000 ids"],
        ),
        "graph_id_1e30": ("graph", {0: [10**30]}, ["ind.cora.graph", f"node id {10**30} is out of range"]),
        "graph_key_1e30": ("graph", {10**30: [1]}, ["ind.cora.graph", f"node id {10**30} is out of range"]),
        "list_called": ("graph", {0: Reduce(list, (b"x" * 1000,))}, ["ind.cora.graph", "list called"]),
        **{case: ("y", blob, ["ind.cora.y: expected a pickle of", stated]) for case, (blob, stated) in STATED.items()},
    }
    cases = []
    base = root / "base"
    base.mkdir()
    write_synthetic(base, "cora", gaps=False)
    for case, (suffix, content, fragments) in edits.items():
        folder = root / case
        shutil.copytree(base, folder)
        path = folder / f"ind.cora.{suffix}"
        if isinstance(content, str):
            path.write_text(content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            dump(path, content)
        cases.append((case, str(folder), fragments))
    # A dense feature matrix over the budget needs every feature file to declare the width.
    folder = root / "columns_1e8"
    shutil.copytree(base, folder)
    for suffix, rows in (("x", 12), ("allx", 520), ("tx", 40)):
        part = wide[:rows]
        dump(folder / f"ind.cora.{suffix}", sp.csr_matrix((part.data, part.indices, part.indptr), (rows, 10**8)))
    cases.append(("columns_1e8", str(folder), ["ind.cora.allx", "100,000,000 feature columns"]))
    # A test id far beyond the others, within the id range: the zero rows between would fill memory.
    folder = root / "index_1e6"
    shutil.copytree(base, folder)
    ids = (folder / "ind.cora.test.index").read_text().split()
    ids[ids.index(max(ids, key=int))] = "1000000"
    (folder / "ind.cora.test.index").write_text("\n".join(ids))
    cases.append(("index_1e6", str(folder), ["ind.cora.test.index", "node id 1000000 is far beyond"]))
    # A sparse 10 GiB test.index: read whole, a MemoryError before.
    folder = root / "index_10gib"
    shutil.copytree(base, folder)
    os.truncate(folder / "ind.cora.test.index", 10 * 2**30)
    cases.append(("index_10gib", str(folder), ["ind.cora.test.index: the file has 10,737,418,240 bytes"]))
    return cases


@pytest.fixture(scope="module")
def planetoid_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases = _planetoid_cases(tmp_path_factory.mktemp("planetoid"))
    outcomes = run_bounded([{"id": c, "call": "planetoid", "args": [folder]} for c, folder, _ in cases])
    return {c: (outcomes[c], fragments) for c, _, fragments in cases}


@pytest.mark.parametrize(
    "case",
    [
        "index_1e9",
        "index_1e30",
        "index_1e6",
        "columns_1e9",
        "columns_1e8",
        "rows_1e8",
        "csr_called",
        "array_1e12",
        "object_array",
        "void_flags",
        "shared_lists",
        "graph_id_1e30",
        "graph_key_1e30",
        "list_called",
        "index_10gib",
        *STATED,
    ],
)
def test_planetoid_refuses_implausible_sizes_before_allocating(planetoid_outcomes: dict[str, Any], case: str) -> None:
    outcome, fragments = planetoid_outcomes[case]
    assert_refused(outcome, *fragments)


def test_planetoid_refuses_a_graph_keyed_by_a_tuple_nested_a_million_deep(tmp_path: Path) -> None:
    """Hashing the key recursed in C past the stack: a crash (in a subprocess of its own, so it fails alone)."""
    write_synthetic(tmp_path, "cora", gaps=False)
    (tmp_path / "ind.cora.graph").write_bytes(b"\x80\x02}K\x00" + b"\x85" * 1_000_000 + b"]s.")
    outcome = run_bounded([{"id": "deep_key", "call": "planetoid", "args": [str(tmp_path)]}])["deep_key"]
    assert_refused(outcome, "ind.cora.graph: TUPLE1 at byte 105 builds objects nested 101 deep, more than the 100")


# --- CIFAR-10 archives ------------------------------------------------------------------------------
def _gz_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _lying_tar(path: Path, name: str, stated: int, data: bytes) -> None:
    """A gzipped tar whose one member's header states ``stated`` bytes but ``data`` follows."""
    info = tarfile.TarInfo(name)
    info.size = stated
    header = info.tobuf(format=tarfile.GNU_FORMAT)  # GNU base-256 sizes reach past 8 GiB
    path.write_bytes(gzip.compress(header + data + b"\0" * (-len(data) % 512), compresslevel=1))


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def _batch(data: object, labels: object) -> bytes:
    # Protocol 4: Python 3's protocol 2 spells bytes as _codecs.encode calls, which the reader refuses.
    return pickle.dumps({b"data": data, b"labels": labels}, protocol=4)


def _png(width: int, height: int, depth: int, pixels: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, depth, 2, 0, 0, 0)  # colour type 2: RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(pixels)) + chunk(b"IEND", b"")


def _cifar_cases(root: Path) -> list[tuple[str, list[Any], list[str]]]:
    """``(id, arguments of load_cifar10, expected fragments)``."""
    cases: list[tuple[str, list[Any], list[str]]] = []
    official, folder = "cifar-10-python.tar.gz", "cifar10-jpeg.tar.gz"

    def case(name: str, archive: str, split: str, fragments: list[str]) -> Path:
        directory = root / name
        directory.mkdir()
        cases.append((name, [str(directory), split, str(root / "cache" / name)], fragments))
        return directory / archive

    member = "cifar-10-batches-py/test_batch"
    _lying_tar(
        case("stated_8gib", official, "test", ["test_batch states a size of 8,589,934,592"]), member, 8 << 30, b""
    )
    bomb = case("zeros_300mib", official, "test", [f"states a size of {300 << 20:,} bytes, more than the"])
    with tarfile.open(bomb, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo(member)
        info.size = 300 << 20  # a member that really decompresses to 300 MiB, from 1.4 MB
        tar.addfile(info, io.BufferedReader(_Zeros(info.size), 1 << 20))
    good = _batch(np.zeros((2, 3072), np.uint8), [1, 2])
    _lying_tar(case("stated_short", official, "test", ["test_batch", "truncated"]), member, MAX_BATCH_BYTES, good)
    reconstruct = numpy_reconstruct()
    huge = Reduce(reconstruct, (np.ndarray, (10**11, 3072), b"B"))
    _gz_tar(case("batch_1e11", official, "test", ["test_batch", "more than the"]), [(member, _batch(huge, []))])
    floats = np.full((2, 3072), 0.5)
    _gz_tar(case("float_pixels", official, "test", ["pixel data of dtype float64"]), [(member, _batch(floats, [1, 2]))])
    for name, labels in (("label_float", [1.7, 2]), ("label_10", [1, 10]), ("label_bool", [True, 2])):
        path = case(name, official, "test", ["test_batch: label", "not an integer class index in [0, 10)"])
        _gz_tar(path, [(member, _batch(np.zeros((2, 3072), np.uint8), labels))])
    path = case("label_int", official, "test", ["expected b'labels' to be a list of integers, got int"])
    _gz_tar(path, [(member, _batch(np.zeros((2, 3072), np.uint8), 7))])
    path = case("label_array", official, "test", ["labels of dtype float32"])
    _gz_tar(path, [(member, _batch(np.zeros((2, 3072), np.uint8), np.ones(2, np.float32)))])

    for name, (blob, stated) in STATED.items():
        _gz_tar(
            case(f"batch_{name}", official, "test", ["test_batch: cannot be read as a pickle", stated]),
            [(member, blob)],
        )

    image = "cifar10/test/cat/0000.png"
    bomb_png = _png(5000, 5000, 8, b"")
    _gz_tar(
        case("png_5000", folder, "test", [image, "expected a 32x32 image, but it states 5000x5000"]),
        [(image, bomb_png)],
    )
    _gz_tar(case("png_1e5", folder, "test", [image, "not a readable image"]), [(image, _png(10**5, 10**5, 8, b""))])
    deep = _png(32, 32, 16, (b"\0" + b"\x12\x34" * 96) * 32)
    _gz_tar(case("png_16bit", folder, "test", [image, "RGB;16B", "refused, not converted"]), [(image, deep)])
    _lying_tar(case("image_2mib", folder, "test", [image, "states a size of 2,097,152"]), image, 2 << 20, b"")

    # A cache whose .npy header states a billion images: refused before np.load would allocate them.
    path = case("cache_header", folder, "test", [".npz: array images", "shape (1000000, 32, 32, 3)"])
    buffer = io.BytesIO()
    from PIL import Image

    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(buffer, format="PNG")
    _gz_tar(path, [(image, buffer.getvalue())])
    cache = root / "cache" / "cache_header"
    cache.mkdir(parents=True)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (10**6, 32, 32, 3)})
    labels = io.BytesIO()
    np.save(labels, np.zeros(1, np.int64))
    with zipfile.ZipFile(cache / f"{path.name}.test.{cache_key(path)}.npz", "w") as npz:
        npz.writestr("images.npy", header.getvalue() + bytes(3072))
        npz.writestr("labels.npy", labels.getvalue())
    return cases


@pytest.fixture(scope="module")
def cifar_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases = _cifar_cases(tmp_path_factory.mktemp("cifar"))
    outcomes = run_bounded([{"id": c, "call": "cifar", "args": args} for c, args, _ in cases])
    return {c: (outcomes[c], fragments) for c, _, fragments in cases}


@pytest.mark.parametrize(
    "case",
    [
        "stated_8gib",
        "zeros_300mib",
        "stated_short",
        "batch_1e11",
        "float_pixels",
        "label_float",
        "label_10",
        "label_bool",
        "label_int",
        "label_array",
        "png_5000",
        "png_1e5",
        "png_16bit",
        "image_2mib",
        "cache_header",
        *(f"batch_{name}" for name in STATED),
    ],
)
def test_cifar_refuses_implausible_sizes_and_casts(cifar_outcomes: dict[str, Any], case: str) -> None:
    outcome, fragments = cifar_outcomes[case]
    assert_refused(outcome, *fragments)


def test_cifar_refuses_more_images_than_the_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(buffer, format="PNG")
    _gz_tar(tmp_path / "cifar10-jpeg.tar.gz", [(f"cifar10/test/cat/{i}.png", buffer.getvalue()) for i in range(3)])
    monkeypatch.setitem(cifar.SPLIT_SIZES, "test", 2)  # as 10,001 images would against the real 10,000
    with pytest.raises(ValueError, match=r"cifar10-jpeg.tar.gz: more than 2 images under \*/test/"):
        load_cifar10(tmp_path, "test", cache_dir=tmp_path / "cache")


def test_cifar_labels_as_an_integer_array_are_read(tmp_path: Path) -> None:
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    _gz_tar(tmp_path / "cifar-10-python.tar.gz", [("cifar-10-batches-py/test_batch", _batch(data, np.array([3, 9])))])
    assert load_cifar10(tmp_path, "test").labels.tolist() == [3, 9]


# --- checkpoints ------------------------------------------------------------------------------------
def _state(model: str = "resnet18", **options: Any) -> dict[str, Any]:
    config = config_for("smoke", model)
    weights = build_model(config.model, **config.model_options).state_dict()
    saved = config.as_dict()
    saved["model_options"] = {**saved["model_options"], **options}
    history = [{"epoch": 1, "test_acc": 0.1}]
    return {"config": saved, "epoch": 1, "history": history, "model": weights, "optimizer": {}}


def _tiny_grid_config(**options: Any) -> dict[str, Any]:
    small = {"width": 8, "heads": 1, "depth": 1, "ffn": 8, **options}
    return config_for("smoke", "sa-learned", model_options=small).as_dict()


def _checkpoint_cases(root: Path) -> list[tuple[str, str, list[str]]]:
    states = {
        "width_1e6": (_state(width=10**6), ["model_options width=1000000 is implausible", "1 to 4,096"]),
        "depth_1e4": (_state("sa-quadratic", depth=10**4), ["model_options depth=10000 is implausible"]),
        "heads_1e3": (_state("sa-quadratic", heads=1000), ["model_options heads=1000 is implausible"]),
        "large_in_all": (
            _state("sa-quadratic", width=4096, depth=64, heads=64, ffn=16384),
            ["'model' does not hold the parameters of the 'sa-quadratic'"],
        ),
        "no_epoch": ({k: v for k, v in _state().items() if k != "epoch"}, ["has no 'epoch'"]),
        "history_str": ({**_state(), "history": "1"}, ["'history' is str"]),
        "history_rows": ({**_state(), "history": [{"epoch": 7}]}, ["'history' row 1", "'epoch': 1"]),
        "history_length": ({**_state(), "history": []}, ["'history' is a list of 0 rows"]),
        "epoch_str": ({**_state(), "epoch": "1"}, ["'epoch' is '1'"]),
        "config_str": ({**_state(), "config": "resnet18"}, ["'config' is 'resnet18'"]),
        # 2.3 KB that made the meta-device build allocate 10 GiB of relative-position tables on the host.
        "tokens_16384": (
            {
                "config": _tiny_grid_config(image=128, block=1),
                "epoch": 0,
                "history": [],
                "model": {"w": torch.zeros(1)},
            },
            ["image=128 and block=1 make 16,384 tokens, more than 4,096", "10 GiB"],
        ),
    }
    cases = []
    for case, (state, fragments) in states.items():
        path = root / f"{case}.pt"
        save_checkpoint(path, state)
        cases.append((case, str(path), [f"{case}.pt: ", *fragments]))
    # A record whose stated size the file does not hold, as the zip's central directory says it.
    path = root / "record_size.pt"
    save_checkpoint(path, _state())
    blob = bytearray(path.read_bytes())
    entry = blob.rindex(b"PK\x01\x02", 0, blob.index(b"PK\x05\x06"))  # the central directory's last entry
    blob[entry + 20 : entry + 28] = struct.pack("<II", 2**31, 2**31)  # compressed and uncompressed sizes
    path.write_bytes(bytes(blob))
    cases.append(("record_size", str(path), ["record_size.pt: record", "2,147,483,648 bytes"]))
    return cases


@pytest.fixture(scope="module")
def checkpoint_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases = _checkpoint_cases(tmp_path_factory.mktemp("checkpoints"))
    outcomes = run_bounded([{"id": c, "call": "checkpoint", "args": [path]} for c, path, _ in cases])
    return {c: (outcomes[c], fragments) for c, _, fragments in cases}


@pytest.mark.parametrize(
    "case",
    [
        "width_1e6",
        "depth_1e4",
        "heads_1e3",
        "large_in_all",
        "no_epoch",
        "history_str",
        "history_rows",
        "history_length",
        "epoch_str",
        "config_str",
        "record_size",
        "tokens_16384",
    ],
)
def test_checkpoints_are_checked_before_the_model_is_built(checkpoint_outcomes: dict[str, Any], case: str) -> None:
    outcome, fragments = checkpoint_outcomes[case]
    assert outcome["error"] == "CheckpointError"
    assert_refused(outcome, *fragments)


# --- the command line -------------------------------------------------------------------------------
def _one_line(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_planetoid_command_reports_a_refused_pickle_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for case in ("refused", "far", "stated"):
        (tmp_path / case).mkdir()
        write_synthetic(tmp_path / case, "cora", gaps=False)
    dump(tmp_path / "refused" / "ind.cora.x", Reduce(os.system, ("true",)))
    (tmp_path / "far" / "ind.cora.test.index").write_text("520\n1000000000\n")
    (tmp_path / "stated" / "ind.cora.y").write_bytes(STATED["bytes8_1tb"][0])
    assert main(["planetoid", "--data", str(tmp_path / "refused"), "--seeds", "1", "--epochs", "1"]) == 1
    _one_line(capsys, "structconv planetoid: ", "ind.cora.x: refused to unpickle global")
    assert main(["planetoid", "--data", str(tmp_path / "far"), "--seeds", "1", "--epochs", "1"]) == 1
    _one_line(capsys, "structconv planetoid: ", "ind.cora.test.index, line 2: node id 1000000000 is out of range")
    with memory_budget(EXTRA_GIB):  # a MemoryError, not a success on a large host, if the stream went unchecked
        status = main(["planetoid", "--data", str(tmp_path / "stated"), "--seeds", "1", "--epochs", "1"])
    assert status == 1
    _one_line(capsys, "structconv planetoid: ", "ind.cora.y: expected a pickle of", STATED["bytes8_1tb"][1])


def test_running_out_of_memory_while_unpickling_is_a_value_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback for what the stream check does not foresee: a ``MemoryError`` names the file."""
    write_synthetic(tmp_path, "cora", gaps=False)
    (tmp_path / "ind.cora.y").write_bytes(STATED["bytes8_1tb"][0])
    monkeypatch.setattr(unpickle, "check_stream", lambda data: None)
    with memory_budget(EXTRA_GIB), pytest.raises(ValueError, match=r"ind\.cora\.y: unpickling it ran out of memory"):
        load_planetoid(tmp_path)


@pytest.fixture(scope="module")
def cifar_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("cifar-data")
    official_archive(data, per_batch=4)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epoch": None}, "has no 'epoch'"),
        ({"history": {"1": {}}}, "'history' is dict"),
    ],
)
def test_eval_plot_and_resume_report_a_malformed_checkpoint_in_one_line(
    tmp_path: Path, cifar_data: Path, capsys: pytest.CaptureFixture[str], change: dict[str, Any], message: str
) -> None:
    run = tmp_path / "runs" / "resnet18-smoke"
    run.mkdir(parents=True)
    state = {k: v for k, v in {**_state(), **change}.items() if v is not None}
    save_checkpoint(run / "checkpoint.pt", state)
    metrics = {"config": _state()["config"], "environment": {"device": "cpu"}, "history": _state()["history"]}
    (run / "metrics.json").write_text(json.dumps(metrics))
    common = ["--data", str(cifar_data), "--cache", str(tmp_path / "cache")]
    assert main(["cifar", "eval", str(run), "--device", "cpu", *common]) == 1
    _one_line(capsys, "structconv cifar eval: ", "checkpoint.pt: ", message)
    assert main(["cifar", "plot", str(run.parent), "--out", str(tmp_path / "figures"), *common]) == 1
    _one_line(capsys, "structconv cifar plot: ", "checkpoint.pt: ", message)
    train = ["cifar", "train", "--preset", "smoke", "--model", "resnet18", "--out", str(run.parent), "--no-progress"]
    assert main([*train, "--device", "cpu", *common]) == 1
    _one_line(capsys, "structconv cifar train: ", "checkpoint.pt: ", message)
