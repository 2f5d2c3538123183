"""CIFAR-10 readers on tiny generated archives of both formats (and the shared JPEG archive when present)."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from structconv.data import load_cifar10
from structconv.data.cifar import CLASSES, verify_md5


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _official(root: Path, per_batch: int = 4, seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(seed)
    batches = {}
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
            labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
            batches[name] = (data, labels)
            _add(tar, f"cifar-10-batches-py/{name}", pickle.dumps({b"data": data, b"labels": labels}))
    return batches


def _folder(root: Path, per_class: int = 2, seed: int = 0) -> dict[str, list[tuple[np.ndarray, int]]]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[np.ndarray, int]]] = {"train": [], "test": []}
    with tarfile.open(root / "cifar10-jpeg.tar.gz", "w:gz") as tar:
        for split in ("train", "test"):
            for c, name in enumerate(CLASSES[:3]):
                for i in range(per_class):
                    img = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                    buf = io.BytesIO()
                    Image.fromarray(img).save(buf, format="PNG")  # lossless, so pixels can be compared
                    _add(tar, f"cifar10/{split}/{name}/{i:04d}.png", buf.getvalue())
                    out[split].append((img, c))
    return out


def test_official_archive_is_read_in_hwc_order(tmp_path: Path) -> None:
    batches = _official(tmp_path)
    train = load_cifar10(tmp_path, "train")
    assert train.images.shape == (20, 32, 32, 3) and train.images.dtype == np.uint8 and len(train) == 20
    data, labels = batches["data_batch_1"]
    np.testing.assert_array_equal(train.images[0, :, :, 0], data[0, :1024].reshape(32, 32))  # red plane first
    np.testing.assert_array_equal(train.images[1, 5, 7], data[1].reshape(3, 32, 32)[:, 5, 7])
    assert train.labels[: len(labels)].tolist() == labels
    test = load_cifar10(tmp_path, "test")
    np.testing.assert_array_equal(test.labels, batches["test_batch"][1])


def test_image_folder_archive_is_decoded_once_and_cached(tmp_path: Path) -> None:
    made = _folder(tmp_path)
    cache = tmp_path / "cache"
    train = load_cifar10(tmp_path, "train", cache_dir=cache)
    expected = sorted(made["train"], key=lambda t: t[1])  # members are read sorted by path: class, then file
    np.testing.assert_array_equal(train.images, np.stack([i for i, _ in expected]))
    assert train.labels.tolist() == [c for _, c in expected]
    cached = list(cache.glob("*.npz"))
    assert len(cached) == 1 and not list(cache.glob("*.tmp*"))
    again = load_cifar10(tmp_path, "train", cache_dir=cache)
    np.testing.assert_array_equal(again.images, train.images)


def test_environment_variable_names_the_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _official(tmp_path)
    monkeypatch.setenv("STRUCTCONV_DATA", str(tmp_path))
    assert len(load_cifar10(split="test")) == 4
    monkeypatch.delenv("STRUCTCONV_DATA")
    with pytest.raises(FileNotFoundError, match=r"set STRUCTCONV_DATA"):
        load_cifar10(split="test")


def test_missing_archive_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"put the official cifar-10-python.tar.gz .* MD5 c58f3010"):
        load_cifar10(tmp_path)
    with pytest.raises(ValueError, match=r"split must be 'train' or 'test'"):
        load_cifar10(tmp_path, "val")


def test_malicious_pickle_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tar:
        _add(tar, "cifar-10-batches-py/test_batch", pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(pickle.UnpicklingError, match=r"refused to unpickle global .*system"):
        load_cifar10(tmp_path, "test")
    assert not marker.exists()


def test_corrupt_inputs_name_the_member(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(ValueError, match=r"not a readable tar archive"):
        load_cifar10(tmp_path, "test")
    (tmp_path / "cifar-10-python.tar.gz").unlink()
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz") as tar:
        _add(tar, "cifar-10-batches-py/test_batch", pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)})[:-5])
    with pytest.raises(ValueError, match=r"test_batch: cannot be read as a pickle"):
        load_cifar10(tmp_path, "test")
    other = tmp_path / "jpeg"
    other.mkdir()
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(buf, format="JPEG")
    with tarfile.open(other / "cifar10-jpeg.tar.gz", "w:gz") as tar:
        _add(tar, "cifar10/test/cat/0000.jpg", buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ValueError, match=r"cifar10/test/cat/0000.jpg: not a readable image"):
        load_cifar10(other, "test", cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"MD5"):
        verify_md5(other / "cifar10-jpeg.tar.gz")


@pytest.mark.parametrize("fmt", ["folder", "official"])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_archive_names_the_file(tmp_path: Path, fmt: str, fraction: float) -> None:
    """A .tar.gz cut short (an interrupted download) raises a ValueError naming it, not gzip's EOFError."""
    full = tmp_path / "full"
    full.mkdir()
    name = "cifar10-jpeg.tar.gz" if fmt == "folder" else "cifar-10-python.tar.gz"
    (_folder if fmt == "folder" else _official)(full)
    data = (full / name).read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / name).write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ValueError, match=rf"{cut / name}: .*(ends early|truncated)"):
        load_cifar10(cut, "test", cache_dir=tmp_path / "cache")


def test_unwritable_cache_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    _folder(tmp_path)
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as if no directory were writable
    with pytest.raises(PermissionError, match=r"cannot cache the decoded cifar10-jpeg.tar.gz"):
        load_cifar10(tmp_path, "test", cache_dir=tmp_path / "sub")
    assert not list(tmp_path.rglob("*.npz"))


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.skipif(not (SHARED / "cifar10-jpeg.tar.gz").is_file(), reason="the shared CIFAR-10 archive is absent")
def test_shared_jpeg_archive_test_split(tmp_path: Path) -> None:
    test = load_cifar10(SHARED, "test", cache_dir=tmp_path)
    assert test.images.shape == (10000, 32, 32, 3)
    assert np.bincount(test.labels).tolist() == [1000] * 10
    means = test.images.reshape(-1, 3).mean(0) / 255
    np.testing.assert_allclose(means, [0.4942, 0.4851, 0.4504], atol=0.05)  # the official test-set means
