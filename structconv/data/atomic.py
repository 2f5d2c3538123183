"""Files that appear whole or not at all: write beside the target, then rename over it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_write(path: Path, mode: str = "wb", *, sync: bool = False) -> Iterator[IO[Any]]:
    """Yield a temporary file in ``path``'s directory; rename it over ``path`` if the block succeeds.

    ``os.replace`` is atomic on POSIX, so a reader (or a process restarted after a kill) sees
    the previous file or the new one, never a partial one.  If the block raises, the temporary
    file is removed and the error propagates.

    Parameters
    ----------
    path
        The file to write.
    mode
        The mode the temporary file is opened in (``"wb"`` or ``"w"``).
    sync
        Flush the data to disk before the rename (survives a power loss, at the cost of a sync).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)  # reopened by name, so that ``f.name`` is the temporary file's path
    try:
        with open(tmp, mode) as f:
            yield f
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
