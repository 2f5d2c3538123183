"""Crafted files: malicious and malformed pickles, tar archives, images; written, never loaded here.

Every payload tries to write the canary file (:data:`.worker.CANARY`, an absolute path in the
worker's sandbox) or set the canary variable, so that a payload that runs leaves a trace the
worker finds after the case.  The pickles are written opcode by opcode where ``pickle.dumps``
cannot produce the form (``INST``, ``OBJ``, ``EXT1``, deep nesting, memo amplification).
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from .worker import CANARY, CANARY_ENV


def canary() -> str:
    """The canary's absolute path: in the worker's sandbox (its working directory)."""
    return os.path.join(os.getcwd(), CANARY)


class _Reduce:
    """An object that pickles as ``callable(*args)``: what ``__reduce__`` payloads look like."""

    def __init__(self, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.func, self.args


def _payloads() -> dict[str, _Reduce]:
    import builtins
    import shutil
    import subprocess

    import numpy as np
    import torch

    path = canary()
    return {
        "os.system": _Reduce(os.system, (f"touch {path}",)),
        "builtins.exec": _Reduce(builtins.exec, (f"open({path!r}, 'w').close()",)),
        "builtins.eval": _Reduce(builtins.eval, (f"open({path!r}, 'w')",)),
        "builtins.open": _Reduce(builtins.open, (path, "w")),
        "subprocess.call": _Reduce(subprocess.call, (["touch", path],)),
        "shutil.copyfile": _Reduce(shutil.copyfile, (os.devnull, path)),
        "os.putenv": _Reduce(os.putenv, (CANARY_ENV, "1")),
        "numpy.save": _Reduce(np.save, (path, [1])),
        "torch.save": _Reduce(torch.save, ([1], path)),
    }


PAYLOADS = (
    "os.system",
    "builtins.exec",
    "builtins.eval",
    "builtins.open",
    "subprocess.call",
    "shutil.copyfile",
    "os.putenv",
    "numpy.save",
    "torch.save",
)
FORMS = ("reduce_p0", "reduce_p2", "reduce_p4", "reduce_p5", "inst", "obj", "ext1", "nested", "in_dict")


def _text_global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def malicious(payload: str, form: str) -> bytes:
    """A pickle that calls the payload when loaded, spelled in one of :data:`FORMS`."""
    obj = _payloads()[payload]
    func, args = obj.func, obj.args
    module, name = getattr(func, "__module__", None) or "builtins", func.__qualname__
    arg_ops = b"".join(b"V" + str(a).encode("raw_unicode_escape") + b"\n" for a in args if isinstance(a, str))
    if form.startswith("reduce_p"):
        return pickle.dumps(obj, protocol=int(form[-1]))
    if form == "inst":  # INST: MARK args 'i' module name
        return b"(" + arg_ops + f"i{module}\n{name}\n".encode() + b"."
    if form == "obj":  # OBJ: MARK callable args 'o'
        return b"(" + _text_global(module, name) + arg_ops + b"o."
    if form == "ext1":  # an extension code: resolved through copyreg's registry, then find_class
        return b"\x80\x02\x82\xf0" + b"(" + arg_ops + b"tR."
    if form == "nested":  # the call buried in a list inside a dict, as data would hold it
        return pickle.dumps({"data": [1, 2, obj]}, protocol=2)
    return pickle.dumps({b"data": obj, b"labels": [0]}, protocol=2)


def deep_tuple(depth: int) -> bytes:
    """A tuple nested ``depth`` times as a dict key: hashing or printing it recurses ``depth`` deep."""
    return b"\x80\x02}K\x00" + b"\x85" * depth + b"]s."


def memo_amplified(nodes: int, width: int) -> bytes:
    """A dict of ``nodes`` keys that all share one list of ``width`` ids: ``nodes * width`` ids in a few bytes."""
    out = bytearray(b"\x80\x02}q\x00(")
    out += b"](" + b"K\x00" * width + b"eq\x010"  # the list, memoised as 1, then popped
    for i in range(nodes):
        out += b"J" + struct.pack("<i", i) + b"h\x01"
    out += b"u."
    return bytes(out)


def reconstruct_bomb(elements: int) -> bytes:
    """``numpy._core.multiarray._reconstruct(ndarray, (elements,), b'b')``: an allocation the file states."""
    size = b"\x8a\x08" + struct.pack("<q", elements)
    return b"\x80\x02cnumpy._core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + size + b"\x85C\x01b\x87R."


def ndarray_call(elements: int) -> bytes:
    """``numpy.ndarray((elements,))``: the admitted class called with a size the file states."""
    return b"\x80\x02cnumpy\nndarray\n\x8a\x08" + struct.pack("<q", elements) + b"\x85\x85R."


class _Py2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2 wrote it: byte strings as ``BINSTRING`` (its ``str``), not ``_codecs.encode`` calls."""

    dispatch: ClassVar[dict[type, Any]] = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        self.write((pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_dumps(obj: Any) -> bytes:
    """``obj`` pickled as the Planetoid files were: protocol 2, written by Python 2."""
    buffer = io.BytesIO()
    _Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


# --- tar archives ---------------------------------------------------------------------------------
def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]], compress: bool = True) -> bytes:
    """A (gzipped) tar archive of the given members (``None`` data for links and folders)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buffer.getvalue()


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def link_member(name: str, target: str, hard: bool = False) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, None


def stated_size_bomb(name: str, stated: int, actual: int = 1 << 20) -> bytes:
    """A gzipped tar whose member states ``stated`` bytes; the stream holds ``actual`` zero bytes of it, then ends.

    The compressed file is a few kilobytes: zeros compress a thousandfold.
    """
    info = tarfile.TarInfo(name)
    info.size = stated
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = comp.compress(header)
    chunk = bytes(1 << 20)
    for _ in range(max(1, actual >> 20)):
        out += comp.compress(chunk)
    return out + comp.flush()


def png_header(width: int, height: int) -> bytes:
    """A PNG that states ``width x height`` pixels and holds none (a decompression bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A real RGB PNG of the given size."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def sparse_file(path: Path, size: int) -> None:
    """A file that states ``size`` bytes of zeros and occupies none (``truncate``)."""
    with path.open("wb") as f:
        f.truncate(size)
