"""CIFAR-10 from either of its archive formats, read without running untrusted code.

* the official ``cifar-10-python.tar.gz`` (``cifar-10-batches-py/{data_batch_1..5,test_batch,
  batches.meta}``: pickles of ``{b"data": uint8 (N, 3072), b"labels": [...]}``), read with a
  restricted unpickler that resolves only the numpy globals an array needs;
* an image-folder archive such as ``cifar10-jpeg.tar.gz`` (``cifar10/{train,test}/<class>/*.jpg``),
  its JPEG and PNG members decoded with Pillow once (no other format is recognised: an EPS member never
  reaches Ghostscript) and cached as a ``.npz`` in ``cache_dir``, else ``$STRUCTCONV_CACHE``, else the
  user's cache directory (:func:`user_cache_dir`) -- never beside the archive.

The data directory is an argument, or the ``STRUCTCONV_DATA`` environment variable; it is only
read (only :func:`download_cifar10`, when asked, writes there).  Loading never touches the
network: a missing archive is an error that says which file to put where.
:func:`download_cifar10` fetches the official archive where the network allows (its URL and MD5
are :data:`OFFICIAL_URL` and :data:`OFFICIAL_MD5`), verifies the checksum and writes the file
atomically; ``structconv cifar train --download`` calls it when no archive is present.

No size stated in an archive is trusted (:mod:`structconv.data.limits`): a member is refused before
it is read if its header states more than such a member holds (:data:`MAX_BATCH_BYTES`,
:data:`MAX_IMAGE_BYTES`), an image's stated dimensions are checked before its pixels are decoded, a
split may hold no more images than CIFAR-10's, and pixels must be 8-bit and labels integers in
``[0, 10)``: anything else is refused, never cast.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write
from .limits import archive_files, read_member, read_npz
from .unpickle import PickledArray, numpy_reconstruct, restricted_loads

__all__ = [
    "CACHE_ENV",
    "CLASSES",
    "MAX_BATCH_BYTES",
    "MAX_IMAGE_BYTES",
    "OFFICIAL_MD5",
    "OFFICIAL_URL",
    "Cifar10",
    "cache_key",
    "download_cifar10",
    "load_cifar10",
    "user_cache_dir",
    "verify_md5",
]

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
OFFICIAL = "cifar-10-python.tar.gz"
FOLDER = "cifar10-jpeg.tar.gz"
OFFICIAL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
OFFICIAL_MD5 = "c58f30108f718f92721af3b95e74349a"
ENV = "STRUCTCONV_DATA"
CACHE_ENV = "STRUCTCONV_CACHE"
SPLIT_SIZES = {"train": 50_000, "test": 10_000}
"""The images of each CIFAR-10 split: no archive may hold more."""
MAX_BATCH_BYTES = 48 << 20
"""The most bytes a member ``data_batch_*`` or ``test_batch`` of the official archive may state: a batch
holds 10,000 images of 3,072 bytes (30.7 MB) with their labels and file names."""
MAX_IMAGE_BYTES = 1 << 20
"""The most bytes an image member of a folder archive may state; a 32x32 JPEG or PNG takes a few kB."""
MAX_MEMBERS = 100_000
"""The most entries an archive may hold: CIFAR-10's 60,000 images and their folders, with room."""
# At most 8 bits per sample, which convert("RGB") maps exactly: grayscale and bilevel repeated across the channels,
# a palette looked up, an alpha channel dropped (as before these checks, and as torchvision's loader does).
_IMAGE_MODES = ("RGB", "L", "P", "RGBA", "LA", "1")
_FORMATS = ("JPEG", "PNG")  # the only formats Pillow is asked to recognise: its other plugins are never run
_SUBBYTE = ("", "1", "2", "4")  # the raw modes' bit depths below 8 (P;4, L;2, ...), which Pillow widens exactly

_ADMITTED = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): numpy_reconstruct(),
    ("numpy._core.multiarray", "_reconstruct"): numpy_reconstruct(),
}


@dataclass(frozen=True, eq=False)
class Cifar10:
    """One split of CIFAR-10, as :func:`load_cifar10` reads it.

    Attributes
    ----------
    images : numpy.ndarray
        uint8 ``(N, 32, 32, 3)`` (HWC, RGB).
    labels : numpy.ndarray
        int64 ``(N,)``, class indices in ``[0, 10)``.
    classes : tuple of str
        The class names, in label order.
    source : str
        The file the split was read from.
    """

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    source: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def verify_md5(path: Path, expected: str = OFFICIAL_MD5) -> None:
    """Raise ``ValueError`` unless ``path`` has the MD5 ``expected``.

    Parameters
    ----------
    path
        The file, read in 1 MiB blocks.
    expected
        The hexadecimal MD5 (the official archive's by default).
    """
    digest = hashlib.md5(usedforsecurity=False)
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise ValueError(f"{path}: MD5 {digest.hexdigest()} differs from the expected {expected} (corrupt download?)")


def download_cifar10(
    root: str | os.PathLike[str], *, url: str = OFFICIAL_URL, md5: str = OFFICIAL_MD5, timeout: float = 60.0
) -> Path:
    """Download the official archive into ``root`` (checksum verified, written atomically); return its path.

    Parameters
    ----------
    root
        The data directory (created if missing); the archive is written there under its official name.
    url
        Where to fetch it from (the official address by default).
    md5
        Its expected MD5.
    timeout
        Seconds to wait for the server (per blocking operation).

    Raises
    ------
    ConnectionError
        If the archive cannot be fetched (no network, say); the message says where to put the
        file by hand.
    ValueError
        If the downloaded file's MD5 is not ``md5`` (nothing is left behind).
    """
    import urllib.error
    import urllib.request

    directory = Path(root)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / OFFICIAL
    with atomic_write(target) as out:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise ConnectionError(
                f"could not download {url} ({err}); fetch it elsewhere and put it at {target} (MD5 {md5})"
            ) from err
        out.flush()
        verify_md5(Path(out.name), md5)
    return target


def _data_dir(root: str | os.PathLike[str] | None) -> Path:
    if root is None:
        env = os.environ.get(ENV)
        if not env:
            raise FileNotFoundError(
                f"no data directory: pass root=... or set {ENV} to the directory holding {OFFICIAL} or {FOLDER}"
            )
        root = env
    path = Path(root)
    if not path.is_dir():
        raise FileNotFoundError(f"data directory {path} does not exist")
    return path


def load_cifar10(
    root: str | os.PathLike[str] | None = None,
    split: str = "train",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Cifar10:
    """Load a CIFAR-10 split (``"train"``: 50,000 images, ``"test"``: 10,000) from ``root``.

    The official archive is preferred when both are present.  The image-folder archive is
    decoded once; the arrays are cached in ``cache_dir``, keyed by :func:`cache_key` and written
    atomically.

    Parameters
    ----------
    root
        The directory holding the official ``cifar-10-python.tar.gz`` or an image-folder
        archive; ``None`` reads ``$STRUCTCONV_DATA``.  It is only read.
    split
        ``"train"`` or ``"test"``.
    cache_dir
        Where the decoded image folder is cached (default: :func:`user_cache_dir`, that is
        ``$STRUCTCONV_CACHE`` or the platform's user cache directory, never ``root``).

    Returns
    -------
    Cifar10
        The split's images, labels and class names.

    Raises
    ------
    FileNotFoundError
        If neither archive is in ``root``; the message says which file to put there.
    ValueError
        On a corrupt archive, pickle or image, naming the member.
    pickle.UnpicklingError
        If a pickle names anything but the numpy globals an array needs (nothing it names is run).
    PermissionError
        If the cache directory for the decoded image folder cannot be created or written; the
        message names it and says how to choose another.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    path = _data_dir(root)
    if (path / OFFICIAL).is_file():
        return _read_official(path / OFFICIAL, split)
    if (path / FOLDER).is_file():
        return _read_folder_cached(path / FOLDER, split, cache_dir)
    raise FileNotFoundError(
        f"no CIFAR-10 archive in {path}: put the official {OFFICIAL} (from {OFFICIAL_URL}, MD5 {OFFICIAL_MD5}) "
        f"or an image-folder {FOLDER} (cifar10/{{train,test}}/<class>/*.jpg) there"
    )


def _open_tar(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ValueError(f"{archive}: not a readable tar archive (truncated or corrupt?): {err}") from err


def _unpickle(data: bytes, source: str) -> Any:
    return restricted_loads(data, source, _ADMITTED, "numpy arrays", encoding="bytes")


def _batch(raw: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 32, 32, 3)`` and labels of one official batch: uint8 pixels and integer labels, never cast."""
    batch = _unpickle(raw, source)
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{source}: expected a dict with b'data' and b'labels'")
    data, given = batch[b"data"], batch[b"labels"]
    if not isinstance(data, PickledArray):
        raise ValueError(f"{source}: expected b'data' to be a numpy array, got {type(data).__name__}")
    if data.dtype != np.uint8:
        raise ValueError(f"{source}: pixel data of dtype {data.dtype}; expected uint8 (refused, not cast)")
    labels = _labels(given, source)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != data.shape[0]:
        raise ValueError(f"{source}: expected data of shape (N, 3072) and N labels, got {data.shape}")
    return np.asarray(data).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _labels(given: Any, source: str) -> np.ndarray:
    """The labels of a batch as int64: Python ints or an integer array, each in ``[0, 10)``."""
    if isinstance(given, PickledArray):
        if given.dtype.kind not in "iu" or given.ndim != 1:
            raise ValueError(f"{source}: labels of dtype {given.dtype}; expected integers (refused, not cast)")
        values = np.asarray(given)
        bad = np.flatnonzero((values < 0) | (values >= len(CLASSES)))
        first = values[bad[0]] if bad.size else None
    elif isinstance(given, list | tuple):
        # bool is an int subclass, and a float label would be truncated by the cast: both refused.
        first = next((v for v in given if type(v) is not int or not 0 <= v < len(CLASSES)), None)
        values = np.asarray(given if first is None else [], dtype=np.int64)
    else:
        raise ValueError(f"{source}: expected b'labels' to be a list of integers, got {type(given).__name__}")
    if first is not None:
        raise ValueError(f"{source}: label {first!r:.40} is not an integer class index in [0, {len(CLASSES)})")
    return values.astype(np.int64)


def _read_official(archive: Path, split: str) -> Cifar10:
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with _open_tar(archive) as tar:
        # Streamed to the end, reading the wanted members as they pass: a truncated download is found either way.
        for member in archive_files(tar, archive, MAX_MEMBERS):
            name = Path(member.name).name
            if name in names:
                batches[name] = _batch(read_member(tar, member, archive, MAX_BATCH_BYTES), f"{archive}:{name}")
    missing = [name for name in names if name not in batches]
    if missing:
        raise ValueError(f"{archive}: member {missing[0]} is missing (not the official CIFAR-10 python archive?)")
    images = np.concatenate([batches[name][0] for name in names])
    return _checked(images, np.concatenate([batches[name][1] for name in names]), str(archive))


def _checked(images: np.ndarray, labels: np.ndarray, source: str) -> Cifar10:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise ValueError(f"{source}: expected uint8 images of shape (N, 32, 32, 3), got {images.dtype} {images.shape}")
    if labels.dtype.kind not in "iu" or labels.shape != images.shape[:1]:
        raise ValueError(f"{source}: expected {len(images)} integer labels, got {labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise ValueError(f"{source}: labels outside 0..{len(CLASSES) - 1}")
    return Cifar10(np.ascontiguousarray(images), labels.astype(np.int64, copy=False), CLASSES, source)


_KEY_BYTES = 1 << 20  # the archive's first MiB enters the cache key


def user_cache_dir() -> Path:
    """The directory decoded archives are cached in unless a ``cache_dir`` is given.

    ``$STRUCTCONV_CACHE`` if set, else the platform's per-user cache directory with a
    ``structconv`` folder: ``$XDG_CACHE_HOME/structconv`` (``~/.cache/structconv`` without it)
    on Linux and other POSIX systems, ``~/Library/Caches/structconv`` on macOS and
    ``%LOCALAPPDATA%\\structconv\\Cache`` on Windows (``~/AppData/Local`` without it) -- the
    locations ``platformdirs`` would give.  The directory is not created here.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(local) / "structconv" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "structconv"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"  # XDG: relative is invalid
    return base / "structconv"


def cache_key(archive: Path) -> str:
    """A key that two different archives never share: 16 hex digits of a SHA-256 of size, mtime and the first MiB.

    The size and the modification time (in nanoseconds) change when the file is replaced or
    rewritten; the content hash of the first MiB tells apart archives that happen to share
    both.  Reading 1 MiB keeps the key cheap for the 140 MB archive.

    Parameters
    ----------
    archive
        The archive file.
    """
    stat = archive.stat()
    digest = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}:".encode())
    with archive.open("rb") as f:
        digest.update(f.read(_KEY_BYTES))
    return digest.hexdigest()[:16]


def _cache_path(archive: Path, split: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where the decoded ``split`` of ``archive`` is cached; never ``archive``'s own directory."""
    directory = Path(cache_dir).expanduser() if cache_dir is not None else user_cache_dir()
    path = directory / f"{archive.name}.{split}.{cache_key(archive)}.npz"
    if path.is_file():
        return path
    origin = (
        "cache_dir (--cache)"
        if cache_dir is not None
        else (f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "the user cache directory")
    )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PermissionError(
            f"cannot cache the decoded {archive.name}: cannot create the cache directory {directory} "
            f"(from {origin}): {err.strerror or err}; set {CACHE_ENV} or pass cache_dir=... (--cache) "
            "to a writable directory"
        ) from err
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(
            f"cannot cache the decoded {archive.name}: the cache directory {directory} (from {origin}) is not "
            f"writable; set {CACHE_ENV} or pass cache_dir=... (--cache) to a writable directory"
        )
    return path


def _read_folder_cached(archive: Path, split: str, cache_dir: str | os.PathLike[str] | None) -> Cifar10:
    cache = _cache_path(archive, split, cache_dir)
    if cache.is_file():
        # Read with bounds like the archive: the cache is a file too, and its headers state the shapes.
        arrays = read_npz(cache, ("images", "labels"), SPLIT_SIZES[split] * 3072 + 4096)
        return _checked(arrays["images"], arrays["labels"], str(archive))
    data = _read_folder(archive, split)
    with atomic_write(cache) as f:  # a reader never sees a half-written cache
        np.savez(f, images=data.images, labels=data.labels)
    return data


def _decode(raw: bytes, source: str) -> np.ndarray:
    """The ``(32, 32, 3)`` uint8 pixels of an image file, its stated size and depth checked before decoding."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow only warns below twice its pixel limit; a stated size that large is refused either way.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            # Only the two formats an image folder holds are sniffed: another (PostScript, say) never reaches its
            # plugin (EPS would run Ghostscript), and is refused below as not JPEG or PNG.
            with Image.open(io.BytesIO(raw), formats=_FORMATS) as img:
                if img.size != (32, 32):
                    raise ValueError(f"{source}: expected a 32x32 image, but it states {img.width}x{img.height}")
                # A 16-bit PNG opens as mode RGB and would be cut to 8 bits: its decoder's raw mode tells.
                raw_modes = [t[3] if isinstance(t[3], str) else t[3][0] if t[3] else "" for t in img.tile]
                raw_ok = all(m.partition(";")[0] in _IMAGE_MODES and m.partition(";")[2] in _SUBBYTE for m in raw_modes)
                if img.mode not in _IMAGE_MODES or not raw_ok:
                    raise ValueError(
                        f"{source}: pixels of mode {img.mode} ({', '.join(map(str, raw_modes))}); expected 8-bit RGB, "
                        "grayscale or palette, with or without alpha (refused, not converted)"
                    )
                palette = (img.palette.mode if img.palette is not None else None) if img.mode == "P" else "RGB"
                if palette != "RGB":
                    raise ValueError(f"{source}: a palette of mode {palette}; expected RGB (refused, not converted)")
                img.load()
                return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except UnidentifiedImageError as err:
        raise ValueError(
            f"{source}: not a JPEG or PNG image (only those formats are decoded; truncated, corrupt or another format?)"
        ) from err
    except (OSError, SyntaxError, EOFError, zlib.error, Image.DecompressionBombError) as err:
        raise ValueError(f"{source}: not a readable image (truncated or corrupt?): {err}") from err
    except Image.DecompressionBombWarning as err:
        raise ValueError(f"{source}: expected a 32x32 image: {err}") from err


def _read_folder(archive: Path, split: str) -> Cifar10:
    found: list[tuple[str, np.ndarray, int]] = []
    with _open_tar(archive) as tar:
        for member in archive_files(tar, archive, MAX_MEMBERS):
            parts = Path(member.name).parts
            if len(parts) < 3 or parts[-3] != split or not parts[-1].lower().endswith((".jpg", ".jpeg", ".png")):
                continue
            label = parts[-2]
            if label not in CLASSES:
                raise ValueError(f"{archive}:{member.name}: unknown class folder {label!r}; expected one of {CLASSES}")
            if len(found) == SPLIT_SIZES[split]:
                raise ValueError(
                    f"{archive}: more than {SPLIT_SIZES[split]:,} images under */{split}/; CIFAR-10's {split} split "
                    f"has {SPLIT_SIZES[split]:,}"
                )
            raw = read_member(tar, member, archive, MAX_IMAGE_BYTES)
            found.append((member.name, _decode(raw, f"{archive}:{member.name}"), CLASSES.index(label)))
    if not found:
        raise ValueError(f"{archive}: no images under */{split}/<class>/ (not a CIFAR-10 image-folder archive?)")
    found.sort(key=lambda item: item[0])  # read as stored, ordered by path as the cache always has been
    images = np.stack([image for _, image, _ in found])
    return _checked(images, np.asarray([label for _, _, label in found], dtype=np.int64), str(archive))
