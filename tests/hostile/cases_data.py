"""The data readers and checkpoints: crafted Planetoid folders, CIFAR-10 archives and checkpoint files.

Each case writes a valid tiny dataset (or checkpoint) in a fresh folder of the sandbox, then
perhaps breaks one file: removes, truncates or garbles it; gives it the wrong object; makes it
a malicious pickle (every payload of :mod:`.craft` in every pickle form), an allocation bomb
(``_reconstruct`` or ``ndarray`` of ``2**40`` elements, a tar member stating 4 GiB, a PNG
stating 50,000 x 50,000 pixels, a 10 GiB sparse ``test.index``), a memo-amplified or deeply
nested pickle; a tar member with a ``../`` path, a symlink or a hard link; a symlink to a FIFO;
bad node ids, labels or test ids.  A valid folder must load to the values written; the payloads
must not run (the canary) and nothing may be written into the data folder.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from . import craft
from .spec import EITHER, ERROR, VALID, Expectation, Trial

PLANETOID_FILES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
PICKLE_DEFECTS = ("truncated", "garbage", "empty", "wrong_type", "malicious", "reconstruct_bomb", "ndarray_call")
PLANETOID_DEFECTS = (None, None, "missing", *PICKLE_DEFECTS, "malicious", "malicious", "deep_tuple", "memo_bomb")
PLANETOID_DEFECTS += ("fifo", "directory", "symlink_outside", "sparse_huge", "index_text", "index_huge")
PLANETOID_DEFECTS += ("index_negative", "index_duplicate", "index_nonascii", "labels_nan", "labels_1d")
PLANETOID_DEFECTS += ("features_bad_column", "rows_mismatch", "graph_out_of_range", "graph_not_list", "name")
PLANETOID_DEFECTS += ("dtype", "root_file", "root_missing", "graph_negative")
CIFAR_DEFECTS = (None, None, None, "malicious", "malicious", "malicious", "truncated_archive", "garbage_archive")
CIFAR_DEFECTS += ("empty_archive", "member_missing", "member_symlink", "member_hardlink", "member_traversal")
CIFAR_DEFECTS += ("member_absolute", "stated_bomb", "reconstruct_bomb", "wrong_shape", "labels_out_of_range")
CIFAR_DEFECTS += ("labels_float", "data_list", "data_float", "image_bomb", "image_size", "image_corrupt")
CIFAR_DEFECTS += ("unknown_class", "cache_not_dir", "cache_planted", "split", "root_none", "truncated_member")
CKPT_DEFECTS = (None, None, "malicious", "malicious", "malicious_legacy", "garbage", "truncated", "empty")
CKPT_DEFECTS += ("not_dict", "format", "version", "no_epoch", "epoch_negative", "history_mismatch", "config_list")
CKPT_DEFECTS += ("unknown_model", "huge_width", "wrong_shapes", "model_not_tensors", "deflated", "directory")
CKPT_DEFECTS += ("fifo", "missing", "zip_traversal", "expect_mismatch", "expect_model")


@st.composite
def data_params(draw: Any, defects: tuple[Any, ...], cifar: bool = False) -> dict[str, Any]:
    """A defect and only the parameters it reads, so that cases differing in nothing that matters coincide."""
    d = draw(st.sampled_from(defects))
    # the seed picks variants of a defect (a bad name, dtype, split); the bombs take none: each is one case
    bombs = ("deep_tuple", "memo_bomb", "sparse_huge", "stated_bomb", "reconstruct_bomb", "ndarray_call", "image_bomb")
    p: dict[str, Any] = {"defect": d, "seed": 0 if d in bombs else draw(st.integers(0, 3))}
    if d in PICKLE_DEFECTS or d in ("missing", "fifo", "directory", "symlink_outside", "memo_bomb"):
        p["file"] = draw(st.sampled_from(PLANETOID_FILES))
    if d in ("malicious", "malicious_legacy"):
        p["payload"] = draw(st.sampled_from(craft.PAYLOADS))
        p["form"] = draw(st.sampled_from(craft.FORMS))
    if d in ("truncated", "truncated_archive", "truncated_member"):
        p["cut"] = draw(st.sampled_from((0.02, 0.3, 0.6, 0.98)))
    if cifar:
        p["format"] = draw(st.sampled_from(("official", "official", "folder")))
    return p


ENTRIES = {
    "load_planetoid": (data_params(PLANETOID_DEFECTS), 300),
    "load_cifar10": (data_params(CIFAR_DEFECTS, cifar=True), 260),
    "load_checkpoint": (data_params(CKPT_DEFECTS), 170),
    "model_from_checkpoint": (data_params(CKPT_DEFECTS), 50),
}


def _folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="case-"))


def _pickle_defect(kind: str, valid: bytes, p: dict[str, Any]) -> bytes:
    """The bytes of a broken pickle file."""
    if kind == "truncated":
        return valid[: max(1, int(len(valid) * p.get("cut", 0.5)))]
    if kind == "garbage":
        return np.random.default_rng(p["seed"]).integers(0, 256, 64, dtype=np.uint8).tobytes()
    if kind == "empty":
        return b""
    if kind == "wrong_type":
        return craft.py2_dumps([1, 2, 3])
    if kind == "malicious":
        return craft.malicious(p["payload"], p["form"])
    if kind == "reconstruct_bomb":
        return craft.reconstruct_bomb(2**40)
    if kind == "ndarray_call":
        return craft.ndarray_call(2**40)
    if kind == "deep_tuple":
        return craft.deep_tuple(1_000_000)
    if kind == "memo_bomb":
        return craft.memo_amplified(100_000, 1_000)
    raise AssertionError(kind)


# --- Planetoid ------------------------------------------------------------------------------------
class _Planetoid:
    """A valid tiny split: 503 known nodes (2 training, 500 validation), 3 test nodes, 3 features, 2 classes."""

    def __init__(self, seed: int) -> None:
        import scipy.sparse as sp

        rng = np.random.default_rng(seed)
        self.known, self.test, self.F, self.C = 503, 3, 3, 2
        allx = rng.integers(0, 2, (self.known, self.F)).astype(np.float32)
        tx = rng.integers(0, 2, (self.test, self.F)).astype(np.float32)
        ally = np.eye(self.C)[rng.integers(0, self.C, self.known)]
        ty = np.eye(self.C)[rng.integers(0, self.C, self.test)]
        self.test_index = self.known + rng.permutation(self.test)
        N = self.known + self.test
        graph = collections.defaultdict(list)
        for node in range(N):
            graph[node] = [int(v) for v in rng.integers(0, N, rng.integers(0, 3))]
        self.arrays = {"allx": allx, "tx": tx, "ally": ally, "ty": ty, "x": allx[:2], "y": ally[:2]}
        self.objects: dict[str, Any] = {
            k: sp.csr_matrix(v) if k in ("x", "tx", "allx") else v for k, v in self.arrays.items()
        }
        self.objects["graph"] = graph
        self.graph = graph

    def write(self, root: Path) -> dict[str, Path]:
        paths = {}
        for suffix in PLANETOID_FILES:
            path = root / f"ind.cora.{suffix}"
            if suffix == "test.index":
                path.write_text("".join(f"{i}\n" for i in self.test_index))
            else:
                path.write_bytes(craft.py2_dumps(self.objects[suffix]))
            paths[suffix] = path
        return paths

    def expected(self) -> dict[str, np.ndarray]:
        """What the reader must return, from the format's definition."""
        N = self.known + self.test
        x = np.zeros((N, self.F))
        x[: self.known] = self.arrays["allx"]
        x[self.test_index] = self.arrays["tx"]
        sums = x.sum(1, keepdims=True)
        x = np.divide(x, sums, out=np.zeros_like(x), where=sums != 0)
        labels = np.zeros((N, self.C))
        labels[: self.known] = self.arrays["ally"]
        labels[self.test_index] = self.arrays["ty"]
        pairs = {(s, t) for s, ts in self.graph.items() for t in ts if s != t}
        pairs |= {(t, s) for s, t in pairs}
        ordered = sorted(pairs, key=lambda e: (e[1], e[0]))
        edge_index = np.asarray(ordered, dtype=np.int64).T.reshape(2, -1)
        return {"x": x, "y": labels.argmax(1), "edge_index": edge_index}


def _planetoid_trial(p: dict[str, Any]) -> Trial:
    import torch

    from structconv.data import load_planetoid

    root = _folder() / "planetoid"
    root.mkdir()
    data = _Planetoid(p["seed"])
    paths = data.write(root)
    target = paths[p.get("file", "graph")]
    e = Expectation()
    names = (target.name, "root")
    kwargs: dict[str, Any] = {"name": "cora"}
    arg: Any = root
    d = p["defect"]
    if d in PICKLE_DEFECTS + ("memo_bomb",) and p.get("file") == "test.index":
        d = "index_text"
    if d == "missing":
        target.unlink()
        e.add(ERROR, names, f"{target.name} missing")
    elif d in PICKLE_DEFECTS or d in ("deep_tuple", "memo_bomb"):
        if d == "deep_tuple":
            target = paths["graph"]
            names = (target.name, "root")
        target.write_bytes(_pickle_defect(d, target.read_bytes(), p))
        form = f" ({p['payload']}, {p['form']})" if d == "malicious" else ""
        e.add(ERROR, names, f"{target.name}: {d}{form}")
    elif d == "fifo":
        target.unlink()
        os.mkfifo(target)
        e.add(ERROR, names, f"{target.name} is a FIFO")
    elif d == "directory":
        target.unlink()
        target.mkdir()
        e.add(ERROR, names, f"{target.name} is a folder")
    elif d == "symlink_outside":
        elsewhere = root.parent / target.name
        target.rename(elsewhere)
        target.symlink_to(elsewhere)
        e.add(VALID, (), f"{target.name} a symlink to a valid file outside the folder")
    elif d == "sparse_huge":
        paths["test.index"].unlink()
        craft.sparse_file(paths["test.index"], 10 << 30)
        e.add(ERROR, ("ind.cora.test.index", "root"), "test.index a 10 GiB sparse file of zeros")
    elif d and d.startswith("index_"):
        text = {
            "index_text": "503\nfive hundred\n505\n",
            "index_huge": f"{10**30}\n504\n505\n",
            "index_negative": "-1\n504\n505\n",
            "index_duplicate": "503\n503\n504\n",
            "index_nonascii": "503\n5\u00e904\n505\n",
        }[d]
        paths["test.index"].write_text(text, encoding="utf-8")
        e.add(ERROR, ("ind.cora.test.index",), f"test.index: {d}")
    elif d in ("labels_nan", "labels_1d", "features_bad_column", "rows_mismatch", "graph_out_of_range"):
        _planetoid_object_defect(d, data, paths, e)
    elif d in ("graph_not_list", "graph_negative"):
        graph = dict(data.graph)
        graph[0] = 5 if d == "graph_not_list" else [-1]
        paths["graph"].write_bytes(craft.py2_dumps(graph))
        e.add(ERROR, ("ind.cora.graph",), f"graph: {d}")
    elif d == "name":
        kwargs["name"] = ["../cora", "CORA\x00", "cora/../../etc", "", "pubmed"][p["seed"] % 5]
        e.add(ERROR, ("name", "ind.pubmed.x", "root"), f"name={kwargs['name']!r}")
    elif d == "dtype":
        kwargs["dtype"] = [torch.int64, "float32", torch.bool, torch.complex64][p["seed"] % 4]
        e.add(ERROR, ("dtype",), f"dtype={kwargs['dtype']!r}")
    elif d == "root_file":
        arg = paths["x"]
        e.add(ERROR, ("root", arg.name), "root is a file")
    elif d == "root_missing":
        arg = root / "nowhere"
        e.add(ERROR, ("root", "nowhere"), "root does not exist")
    expected = data.expected()

    def check(result: Any) -> str | None:
        for key in ("x", "y", "edge_index"):
            got = getattr(result, key).detach().numpy()
            want = expected[key]
            if got.shape != want.shape:
                return f"{key} has shape {got.shape}, expected {want.shape}"
            if not np.allclose(got, want, atol=1e-6):
                return f"{key} differs from the written dataset"
        if int(result.test_mask.sum()) != data.test or int(result.train_mask.sum()) != 2:
            return "the split masks differ from the written dataset"
        return None

    where = "" if arg == root else "/" + str(arg.relative_to(root.parent))
    describe = f"load_planetoid(<folder>{where}, **{kwargs!r}); {e.described}"
    return Trial(
        describe, lambda: load_planetoid(arg, **kwargs), e.expect, tuple(e.names), check, readonly=(str(root),)
    )


def _planetoid_object_defect(d: str, data: _Planetoid, paths: dict[str, Path], e: Expectation) -> None:
    import scipy.sparse as sp

    if d == "labels_nan":
        ally = data.arrays["ally"].copy()
        ally[0, 0] = np.nan
        paths["ally"].write_bytes(craft.py2_dumps(ally))
        e.add(ERROR, ("ind.cora.ally",), "ally holds NaN")
    elif d == "labels_1d":
        paths["ty"].write_bytes(craft.py2_dumps(data.arrays["ty"].argmax(1)))
        e.add(ERROR, ("ind.cora.ty",), "ty of class numbers, not one-hot rows")
    elif d == "features_bad_column":
        tx = sp.csr_matrix(data.arrays["tx"])
        tx.indices = tx.indices.copy()
        if tx.indices.size:
            tx.indices[0] = 10**6
        paths["tx"].write_bytes(craft.py2_dumps(tx))
        e.add(ERROR if tx.indices.size else VALID, ("ind.cora.tx",), "tx with a column index out of range")
    elif d == "rows_mismatch":
        paths["ty"].write_bytes(craft.py2_dumps(data.arrays["ty"][:-1]))
        e.add(ERROR, ("ind.cora.ty", "ind.cora.tx"), "ty one row short of tx")
    else:
        graph = dict(data.graph)
        graph[0] = [10**6]
        paths["graph"].write_bytes(craft.py2_dumps(graph))
        e.add(ERROR, ("ind.cora.graph",), "graph: a neighbour id beyond the nodes")


# --- CIFAR-10 -------------------------------------------------------------------------------------
def _batch(rng: np.random.Generator, n: int = 4) -> dict[bytes, Any]:
    return {
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"labels": [int(v) for v in rng.integers(0, 10, n)],
    }


def _cifar_trial(p: dict[str, Any]) -> Trial:
    from structconv.data import load_cifar10

    rng = np.random.default_rng(p["seed"])
    root = _folder() / "data"
    root.mkdir()
    cache = root.parent / "cache"
    e = Expectation()
    d = p["defect"]
    folder = p.get("format") == "folder" or d in ("image_bomb", "image_size", "image_corrupt", "unknown_class")
    folder = folder or d in ("cache_not_dir", "cache_planted")
    kwargs: dict[str, Any] = {"split": "train", "cache_dir": cache}
    arg: Any = root
    archive = root / ("cifar10-jpeg.tar.gz" if folder else "cifar-10-python.tar.gz")
    names = (archive.name, "root")
    if folder:
        members, expected = _folder_members(rng, d, e, names)
    else:
        members, expected = _official_members(rng, d, p, e, names)
    if d == "stated_bomb":
        archive.write_bytes(craft.stated_size_bomb("cifar-10-batches-py/data_batch_1", 4 << 30, 8 << 20))
        e.add(ERROR, names + ("data_batch_1",), "a member stating 4 GiB (8 MiB of zeros follow)")
    else:
        blob = craft.tar_bytes(members)
        if d == "truncated_archive":
            blob = blob[: int(len(blob) * p["cut"])]
            e.add(ERROR, names, "the archive cut short")
        elif d == "garbage_archive":
            blob = rng.integers(0, 256, 512, dtype=np.uint8).tobytes()
            e.add(ERROR, names, "random bytes")
        elif d == "empty_archive":
            blob = b""
            e.add(ERROR, names, "an empty file")
        archive.write_bytes(blob)
    if d == "cache_not_dir":
        cache.write_text("a file")
        e.add(ERROR, ("cache_dir", "cache"), "cache_dir is a file")
    elif d == "cache_planted":
        from structconv.data.cifar import cache_key

        cache.mkdir()
        planted = cache / f"{archive.name}.train.{cache_key(archive)}.npz"
        np.savez(planted, images=np.zeros((2, 5, 5, 3), np.uint8), labels=np.array([0, 11]))
        e.add(ERROR, ("cache", planted.name, archive.name), "a planted cache of 5x5 images and a label 11")
    elif d == "split":
        kwargs["split"] = ["valid", "TRAIN", None, ""][p["seed"] % 4]
        e.add(ERROR, ("split",), f"split={kwargs['split']!r}")
    elif d == "root_none":
        arg = None
        e.add(ERROR, ("root", "STRUCTCONV_DATA"), "root=None and STRUCTCONV_DATA unset")

    def check(result: Any) -> str | None:
        got = sorted(zip(result.labels.tolist(), (img.tobytes() for img in result.images), strict=True))
        return None if got == expected else "images or labels differ from the archive's"

    shown = {k: v for k, v in kwargs.items() if k != "cache_dir"}
    describe = f"load_cifar10(<folder with {archive.name}>, **{shown}); {e.described}"
    return Trial(describe, lambda: load_cifar10(arg, **kwargs), e.expect, tuple(e.names), check, readonly=(str(root),))


def _official_members(
    rng: np.random.Generator, d: Any, p: dict[str, Any], e: Expectation, names: tuple[str, ...]
) -> tuple[list[Any], list[tuple[int, bytes]]]:
    batches = {f"data_batch_{i}": _batch(rng) for i in range(1, 6)}
    batches["test_batch"] = _batch(rng)
    blobs = {name: pickle.dumps(b, protocol=4) for name, b in batches.items()}
    member_names = {name: f"cifar-10-batches-py/{name}" for name in blobs}
    extra: list[Any] = []
    first = "data_batch_1"
    if d == "malicious":
        blobs[first] = craft.malicious(p["payload"], p["form"] if p["form"] != "in_dict" else "reduce_p4")
        e.add(ERROR, names + (first,), f"{first}: malicious ({p['payload']}, {p['form']})")
    elif d == "reconstruct_bomb":
        blobs[first] = craft.reconstruct_bomb(2**40)
        e.add(ERROR, names + (first,), f"{first}: _reconstruct of 2**40 bytes")
    elif d == "truncated_member":
        blobs[first] = blobs[first][: int(len(blobs[first]) * p["cut"])]
        e.add(ERROR, names + (first,), f"{first} cut short")
    elif d in ("wrong_shape", "labels_out_of_range", "labels_float", "data_list", "data_float"):
        b = dict(batches[first])
        if d == "wrong_shape":
            b[b"data"] = b[b"data"][:, :100]
        elif d == "labels_out_of_range":
            b[b"labels"] = [10] + b[b"labels"][1:]
        elif d == "labels_float":
            b[b"labels"] = [2.7] + b[b"labels"][1:]
        elif d == "data_list":
            b[b"data"] = b[b"data"].tolist()
        else:
            b[b"data"] = b[b"data"].astype(np.float64) + 0.5
        blobs[first] = pickle.dumps(b, protocol=4)
        e.add(EITHER if d == "data_list" else ERROR, names + (first,), f"{first}: {d}")
    elif d == "member_missing":
        del blobs["data_batch_3"]
        e.add(ERROR, names + ("data_batch_3",), "data_batch_3 missing")
    elif d in ("member_symlink", "member_hardlink"):
        del blobs[first]
        extra.append(
            craft.link_member(
                member_names[first], "/etc/passwd" if d == "member_symlink" else "x", d.endswith("hardlink")
            )
        )
        e.add(ERROR, names + (first,), f"{first} a {d[7:]} to elsewhere")
    elif d == "member_traversal":
        extra.append(craft.file_member(f"../../{craft.canary().rsplit('/', 1)[-1]}", b"x"))
        e.add(VALID, (), "an extra member ../../CANARY")
    elif d == "member_absolute":
        member_names[first] = "/tmp/cifar-10-batches-py/data_batch_1"
        e.add(EITHER, names + (first,), "a member with an absolute path")
    members = [craft.file_member(member_names[name], blob) for name, blob in blobs.items()] + extra
    expected = sorted(
        (label, img.tobytes())
        for i in range(1, 6)
        for label, img in zip(
            batches[f"data_batch_{i}"][b"labels"],
            batches[f"data_batch_{i}"][b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1),
            strict=True,
        )
    )
    return members, expected


def _folder_members(
    rng: np.random.Generator, d: Any, e: Expectation, names: tuple[str, ...]
) -> tuple[list[Any], list[tuple[int, bytes]]]:
    from PIL import Image

    from structconv.data.cifar import CLASSES

    members, expected = [], []
    for i in range(6):
        label = int(rng.integers(0, 10))
        data = craft.png(32, 32, int(rng.integers(0, 2**31)))
        name = f"cifar10/train/{CLASSES[label]}/{i:04d}.png"
        if i == 0 and d == "image_bomb":
            data = craft.png_header(50_000, 50_000)
            e.add(ERROR, names + (name,), "a PNG stating 50,000 x 50,000 pixels")
        elif i == 0 and d == "image_size":
            data = craft.png(33, 31)
            e.add(ERROR, names + (name,), "a 33x31 image")
        elif i == 0 and d == "image_corrupt":
            data = data[:40]
            e.add(ERROR, names + (name,), "a truncated PNG")
        elif i == 0 and d == "unknown_class":
            name = f"cifar10/train/unicorn/{i:04d}.png"
            e.add(ERROR, names + (name, "unicorn"), "an unknown class folder")
        else:
            expected.append((label, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).tobytes()))
        members.append(craft.file_member(name, data))
    if d == "member_traversal":
        members.append(craft.file_member("../../CANARY.png", craft.png(32, 32)))
        e.add(VALID, (), "an extra member ../../CANARY.png")
    elif d == "member_symlink":
        members.append(craft.link_member("cifar10/train/cat/link.png", "/etc/passwd"))
        e.add(VALID, (), "an extra symlink member (skipped)")
    return members, sorted(expected)


# --- checkpoints ----------------------------------------------------------------------------------
_TEMPLATE: dict[str, Any] = {}


def _valid_state() -> dict[str, Any]:
    """A small valid checkpoint's state (built once per worker): the smoke preset's tiny attention model."""
    if not _TEMPLATE:
        from structconv.experiments.cifar.models import build_model
        from structconv.experiments.cifar.presets import config_for

        config = config_for("smoke", "sa-quadratic")
        model = build_model(config.model, **config.model_options)
        _TEMPLATE.update(config=config.as_dict(), epoch=1, history=[{"epoch": 1, "test_acc": 0.1}])
        _TEMPLATE["model"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {
        k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in _TEMPLATE.items()
    }


def _checkpoint_trial(entry: str, p: dict[str, Any]) -> Trial:
    import torch

    from structconv.experiments.cifar.checkpoint import FORMAT, VERSION, load_checkpoint, save_checkpoint

    folder = _folder() / "run"
    folder.mkdir()
    path = folder / "checkpoint.pt"
    state = _valid_state()
    e = Expectation()
    names = ("checkpoint.pt",)
    d = p["defect"]
    expect_arg: dict[str, Any] | None = None
    huge = {**state["config"]["model_options"], "width": 10**9}
    edits = {
        "not_dict": None, "format": ("format", "other"), "version": ("version", VERSION + 1),
        "no_epoch": ("epoch", None), "epoch_negative": ("epoch", -1), "history_mismatch": ("history", []),
        "config_list": ("config", [1, 2]),
        "unknown_model": ("config", {**state["config"], "model": "resnet1000"}),
        "huge_width": ("config", {**state["config"], "model_options": huge}),
        "wrong_shapes": ("model", {k: v[..., :1] if v.ndim else v for k, v in state["model"].items()}),
        "model_not_tensors": ("model", {k: 1.0 for k in state["model"]}),
    }  # fmt: skip
    if d in edits:
        if d == "not_dict":
            payload: Any = [state]
        else:
            key, value = edits[d]
            payload = {"format": FORMAT, "version": VERSION, **state}
            if value is None:
                payload.pop(key)
            else:
                payload[key] = value
        torch.save(payload, path)
        e.add(ERROR, names, f"a checkpoint with {d}")
    else:
        save_checkpoint(path, state)
    if d == "malicious":
        torch.save({"format": FORMAT, "x": craft._payloads()[p["payload"]]}, path)
        e.add(ERROR, names, f"a torch.save'd {p['payload']} payload")
    elif d == "malicious_legacy":
        path.write_bytes(craft.malicious(p["payload"], p["form"]))
        e.add(ERROR, names, f"a bare pickle ({p['payload']}, {p['form']})")
    elif d in ("garbage", "truncated", "empty"):
        path.write_bytes(_pickle_defect(d, path.read_bytes(), p))
        e.add(ERROR, names, f"{d} file")
    elif d == "deflated":
        _rezip(path, compress=True)
        e.add(EITHER, names, "the zip recompressed (deflated records)")
    elif d == "zip_traversal":
        _rezip(path, extra="../../CANARY")
        e.add(EITHER, names, "an extra zip record named ../../CANARY")
    elif d in ("directory", "fifo", "missing"):
        path.unlink()
        if d == "directory":
            path.mkdir()
        elif d == "fifo":
            os.mkfifo(path)
        e.add(ERROR, names, f"the path is {d if d != 'missing' else 'missing'}")
    elif d == "expect_mismatch" and entry == "load_checkpoint":
        expect_arg = {**state["config"], "lr": 123.0}
        e.add(ERROR, names + ("lr",), "expect differs in lr")
    elif d == "expect_model" and entry == "load_checkpoint":
        expect_arg = {**state["config"], "model": "resnet18"}
        e.add(ERROR, names + ("model", "resnet18"), "expect is of another model")

    if entry == "model_from_checkpoint":
        from structconv.experiments.cifar.train import model_from_checkpoint

        def call() -> Any:
            return model_from_checkpoint(path)

        def check(result: Any) -> str | None:
            model = result[0]
            loaded = model.state_dict()
            same = all(torch.equal(loaded[k], v) for k, v in state["model"].items())
            return None if same and set(loaded) == set(state["model"]) else "the model's parameters differ"

    else:

        def call() -> Any:
            return load_checkpoint(path, expect_arg)

        def check(result: Any) -> str | None:
            ok = result.get("epoch") == state["epoch"] and set(result["model"]) == set(state["model"])
            return None if ok else "the checkpoint read back differs from the one written"

    return Trial(
        f"{entry}(<run>/checkpoint.pt); {e.described}", call, e.expect, tuple(e.names), check, readonly=(str(folder),)
    )


def _rezip(path: Path, compress: bool = False, extra: str | None = None) -> None:
    import zipfile

    with zipfile.ZipFile(path) as z:
        records = [(info.filename, z.read(info)) for info in z.infolist()]
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in records:
            z.writestr(name, data)
        if extra:
            z.writestr(extra, b"x")


def trial(entry: str, p: dict[str, Any]) -> Trial:
    if entry == "load_planetoid":
        return _planetoid_trial(p)
    if entry == "load_cifar10":
        return _cifar_trial(p)
    return _checkpoint_trial(entry, p)
