"""Bounded reading of archive members and array files, whose stated sizes are not trusted.

A tar header states each member's size and an ``.npy`` header its array's shape: numbers from the
file, which a few bytes can set to anything.  So each is checked against a budget the caller states
before anything of that size is allocated, and no read takes more than the budget, whatever the
stream holds.  Every refusal is a ``ValueError`` naming the file and the size.
"""

from __future__ import annotations

import io
import math
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ARCHIVE_ERRORS", "archive_files", "read_member", "read_npz"]

ARCHIVE_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)
"""What reading a truncated or corrupt (gzipped) tar archive raises."""


def archive_files(tar: tarfile.TarFile, archive: Path, max_members: int) -> Iterator[tarfile.TarInfo]:
    """The regular files of ``tar`` in stored order, read as a stream.

    Raises
    ------
    ValueError
        If the archive holds more than ``max_members`` entries (``tarfile`` keeps one object per
        entry, and gzip lets many headers take few bytes), or ends early or is corrupt.
    """
    count = 0
    try:
        for member in tar:
            count += 1
            if count > max_members:
                raise ValueError(
                    f"{archive}: more than {max_members:,} entries; expected at most that many (refused before "
                    "reading the rest)"
                )
            if member.isfile():
                yield member
    except ARCHIVE_ERRORS as err:
        raise ValueError(f"{archive}: the archive ends early or is corrupt (truncated download?): {err}") from err


def read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, archive: Path, limit: int) -> bytes:
    """The data of ``member``, refused unless its header states at most ``limit`` bytes; no more are read.

    Raises
    ------
    ValueError
        If the stated size exceeds ``limit`` (before anything is read), or the data cannot be read
        or is not of the stated size.
    """
    if member.size > limit:
        raise ValueError(
            f"{archive}: member {member.name} states a size of {member.size:,} bytes, more than the {limit:,} "
            "such a member holds; refused before reading it"
        )
    try:
        handle = tar.extractfile(member)
        data = handle.read(limit + 1) if handle is not None else b""
    except ARCHIVE_ERRORS as err:
        raise ValueError(f"{archive}: member {member.name} cannot be read (truncated?): {err}") from err
    if len(data) != member.size:
        raise ValueError(
            f"{archive}: member {member.name} holds {len(data):,} bytes, but its header states {member.size:,} "
            "(truncated or corrupt?)"
        )
    return data


def _npy(data: bytes, source: str) -> np.ndarray[Any, Any]:
    """The array of an ``.npy`` file's bytes; its header's shape must match the bytes that follow."""
    fp = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fp)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(fp)
    except (ValueError, OSError) as err:
        raise ValueError(f"{source}: not a readable .npy array: {err}") from err
    if dtype.hasobject:
        raise ValueError(f"{source}: holds Python objects (dtype {dtype}); expected a plain array")
    count = math.prod(shape)
    body = len(data) - fp.tell()
    if count * dtype.itemsize != body:
        raise ValueError(
            f"{source}: its header states shape {shape} of {dtype} ({count * dtype.itemsize:,} bytes), but "
            f"{body:,} bytes follow"
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=fp.tell())
    return array.reshape(shape, order="F" if fortran else "C").copy()  # a writable array, as np.load gives


def read_npz(path: Path, names: tuple[str, ...], limit: int) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays ``names`` of the ``.npz`` file ``path``, each refused if it states more than ``limit`` bytes.

    Raises
    ------
    ValueError
        If the file is not a readable ``.npz``, lacks one of ``names``, or a member states more
        than ``limit`` bytes or a shape its bytes do not hold.
    """
    out = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for name in names:
                info = archive.getinfo(f"{name}.npy")
                if info.file_size > limit:
                    raise ValueError(
                        f"{path}: array {name} states {info.file_size:,} bytes, more than the {limit:,} it may hold; "
                        "refused before reading it"
                    )
                with archive.open(info) as member:
                    data = member.read(limit + 1)
                out[name] = _npy(data, f"{path}: array {name}")
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, zlib.error) as err:
        raise ValueError(f"{path}: not a readable .npz file: {err}") from err
    return out
