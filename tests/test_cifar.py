"""CIFAR-10 readers on tiny generated archives of both formats (and the shared JPEG archive when present)."""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import zlib
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


def _snapshot(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in sorted(directory.rglob("*"))}


def test_loading_leaves_the_data_directory_unchanged_and_caches_in_structconv_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    _folder(data)
    before = _snapshot(data)
    monkeypatch.setenv("STRUCTCONV_CACHE", str(cache))
    first = load_cifar10(data, "test")
    again = load_cifar10(data, "test")  # read back from the cache
    np.testing.assert_array_equal(first.images, again.images)
    assert _snapshot(data) == before  # no file added, none rewritten
    cached = sorted(p.name for p in cache.iterdir())
    assert len(cached) == 1 and cached[0].startswith("cifar10-jpeg.tar.gz.test.") and cached[0].endswith(".npz")
    explicit = tmp_path / "explicit"
    load_cifar10(data, "test", cache_dir=explicit)  # an explicit cache_dir wins over the variable
    assert len(list(explicit.glob("*.npz"))) == 1 and len(list(cache.iterdir())) == 1


def test_default_cache_is_the_platforms_user_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from structconv.data.cifar import user_cache_dir

    monkeypatch.delenv("STRUCTCONV_CACHE", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "structconv"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec says to ignore a relative one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "structconv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "structconv"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert user_cache_dir() == tmp_path / "home" / "Library" / "Caches" / "structconv"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert user_cache_dir() == tmp_path / "local" / "structconv" / "Cache"
    monkeypatch.setenv("STRUCTCONV_CACHE", str(tmp_path / "mine"))
    assert user_cache_dir() == tmp_path / "mine"
    # Loading with no cache_dir and no STRUCTCONV_CACHE writes under XDG_CACHE_HOME.
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("STRUCTCONV_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = tmp_path / "data"
    data.mkdir()
    _folder(data)
    load_cifar10(data, "test")
    assert len(list((tmp_path / "xdg" / "structconv").glob("cifar10-jpeg.tar.gz.test.*.npz"))) == 1
    assert sorted(p.name for p in data.iterdir()) == ["cifar10-jpeg.tar.gz"]


def test_two_different_archives_never_share_a_cache_entry(tmp_path: Path) -> None:
    a, b, cache = tmp_path / "a", tmp_path / "b", tmp_path / "cache"
    a.mkdir()
    b.mkdir()
    made_a, made_b = _folder(a, seed=1), _folder(b, seed=2)  # same name, same layout, other pixels
    stamp = (a / "cifar10-jpeg.tar.gz").stat().st_mtime_ns
    os.utime(b / "cifar10-jpeg.tar.gz", ns=(stamp, stamp))  # even the modification time agrees
    first = load_cifar10(a, "test", cache_dir=cache)
    second = load_cifar10(b, "test", cache_dir=cache)
    assert len(list(cache.glob("*.npz"))) == 2
    np.testing.assert_array_equal(first.images[0], sorted(made_a["test"], key=lambda t: t[1])[0][0])
    np.testing.assert_array_equal(second.images[0], sorted(made_b["test"], key=lambda t: t[1])[0][0])
    _folder(a, seed=3)  # the archive replaced in place: a new entry, not the stale one
    third = load_cifar10(a, "test", cache_dir=cache)
    assert len(list(cache.glob("*.npz"))) == 3 and not np.array_equal(third.images, first.images)


def test_unwritable_cache_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folder(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match=r"cannot create the cache directory .*a-file/sub .*pass cache_dir="):
        load_cifar10(tmp_path, "test", cache_dir=blocker / "sub")
    monkeypatch.setenv("STRUCTCONV_CACHE", str(tmp_path / "env"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as if no directory were writable
    with pytest.raises(
        PermissionError,
        match=r"cannot cache the decoded cifar10-jpeg.tar.gz: the cache directory .*env \(from \$STRUCTCONV_CACHE\) "
        r"is not writable; set STRUCTCONV_CACHE",
    ):
        load_cifar10(tmp_path, "test")
    assert not list(tmp_path.rglob("*.npz"))


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.skipif(not (SHARED / "cifar10-jpeg.tar.gz").is_file(), reason="the shared CIFAR-10 archive is absent")
def test_shared_jpeg_archive_test_split(tmp_path: Path) -> None:
    test = load_cifar10(SHARED, "test", cache_dir=tmp_path)
    assert test.images.shape == (10000, 32, 32, 3)
    assert np.bincount(test.labels).tolist() == [1000] * 10
    means = test.images.reshape(-1, 3).mean(0) / 255
    np.testing.assert_allclose(means, [0.4942, 0.4851, 0.4504], atol=0.05)  # the official test-set means


def _png_of_mode(mode: str, rng: np.random.Generator) -> tuple[bytes, np.ndarray]:
    """A 32x32 PNG of ``mode`` and the RGB pixels it stands for (alpha dropped)."""
    from PIL import Image

    rgb = Image.fromarray(rng.integers(0, 4, size=(32, 32, 3), dtype=np.uint8) * 60)
    if mode.startswith("P"):  # quantized: P with 64 colours, P;2 with 4, P;1 with 2 (Pillow packs small palettes)
        img = rgb.quantize(colors={"P": 64, "P;2": 4, "P;1": 2}[mode])
    elif mode == "RGBA":
        img = rgb.copy()
        img.putalpha(Image.fromarray(rng.integers(0, 256, size=(32, 32), dtype=np.uint8)))  # not opaque
    else:
        img = rgb.convert(mode)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    with Image.open(io.BytesIO(buffer.getvalue())) as opened:
        assert (opened.mode, opened.tile[0][3]) == (mode[0] if mode.startswith("P") else mode, mode)
    return buffer.getvalue(), np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("mode", ["P", "P;2", "P;1", "RGBA", "LA", "1"])
def test_palette_alpha_and_bilevel_pngs_are_read_as_their_rgb_pixels(tmp_path: Path, mode: str) -> None:
    rng = np.random.default_rng(0)
    made = [_png_of_mode(mode, rng) for _ in range(3)]
    with tarfile.open(tmp_path / "cifar10-jpeg.tar.gz", "w:gz") as tar:
        for i, (png, _) in enumerate(made):
            _add(tar, f"cifar10/test/cat/{i}.png", png)
    test = load_cifar10(tmp_path, "test", cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(test.images, np.stack([pixels for _, pixels in made]))
    assert len(np.unique(test.images.reshape(-1, 3), axis=0)) > 1  # not decoded to one colour


@pytest.mark.parametrize(("array", "mode"), [(np.full((32, 32), 40_000, np.uint16), "I;16"), (None, "LA;16B")])
def test_pngs_of_more_than_8_bits_are_still_refused(tmp_path: Path, array: np.ndarray | None, mode: str) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    if array is not None:
        Image.fromarray(array).save(buffer, format="PNG")
    else:  # 16-bit grayscale with alpha, which Pillow cannot write: IHDR colour type 4, depth 16

        def chunk(kind: bytes, body: bytes) -> bytes:
            return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

        rows = (b"\0" + b"\x12\x34\xff\xff" * 32) * 32
        header = struct.pack(">IIBBBBB", 32, 32, 16, 4, 0, 0, 0)
        buffer.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)))
        buffer.write(chunk(b"IEND", b""))
    with tarfile.open(tmp_path / "cifar10-jpeg.tar.gz", "w:gz") as tar:
        _add(tar, "cifar10/test/cat/0.png", buffer.getvalue())
    with pytest.raises(ValueError, match=rf"0\.png: pixels of mode .*{mode}.*refused, not converted"):
        load_cifar10(tmp_path, "test", cache_dir=tmp_path / "cache")


def test_a_member_in_another_format_is_refused_without_reaching_its_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 32: Image.open sniffed every format Pillow knows; an EPS member named .png reached the
    # PostScript plugin (which runs Ghostscript to decode) and then failed inside the reader's checks.
    from PIL import EpsImagePlugin

    reached: list[str] = []
    original = EpsImagePlugin.EpsImageFile._open

    def spy(self: EpsImagePlugin.EpsImageFile) -> None:
        reached.append("eps")
        original(self)

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", spy)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 32 32\n%%EndComments\nshowpage\n%%EOF\n"
    with tarfile.open(tmp_path / "cifar10-jpeg.tar.gz", "w:gz") as tar:
        _add(tar, "cifar10/test/cat/0000.png", eps)
    with pytest.raises(ValueError, match=r"cifar10/test/cat/0000.png: not a JPEG or PNG image"):
        load_cifar10(tmp_path, "test", cache_dir=tmp_path / "cache")
    assert reached == []
