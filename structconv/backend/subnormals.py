"""Subnormal numbers on the CPU's threads: flushed to zero on every thread, and measured.

A softmax's subnormal tails slow every CPU product that reads them about tenfold unless the
threads flush them to zero.  The setting is per thread (its floating-point control register):
``torch.set_flush_denormal`` sets the calling thread's, and OpenMP's started workers keep theirs,
so :func:`set_subnormal_flush` sets each of them too.  torch has no getter: the setting is
measured by multiplying subnormals (:func:`thread_flushes`, :func:`all_threads_flush`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["all_threads_flush", "set_subnormal_flush", "subnormals_flushed", "thread_flushes"]

_GRAIN = 32768  # elements per thread of a parallel elementwise operation (at::internal::GRAIN_SIZE)
_EACH_THREAD = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _subnormal_products(n: int) -> torch.Tensor:
    """``n`` products ``2 * 2**-149`` in float32 (subnormal, or 0 where flushed), as their int32 bits."""
    smallest = torch.ones(n, dtype=torch.int32).view(torch.float32)  # 2**-149 from its bits: no rounding
    return (smallest * 2).view(torch.int32)  # compared as bits: the check reads no float itself


def thread_flushes() -> bool:
    """Whether the calling thread flushes subnormal float32 numbers to zero (measured: torch has no getter)."""
    return int(_subnormal_products(1).item()) == 0


def all_threads_flush() -> bool | None:
    """Whether every thread of torch's CPU operations flushes subnormals: ``True``, ``False``, ``None`` (some).

    One product of ``2 * 32768`` subnormals per thread is split across all of them.
    """
    zero = _subnormal_products(2 * _GRAIN * torch.get_num_threads()) == 0
    return True if bool(zero.all()) else (None if bool(zero.any()) else False)


@functools.cache
def _openmp_runtimes() -> tuple[Any, ...]:
    """``GOMP_parallel`` of each OpenMP runtime loaded (Linux, torch's OpenMP backend; else none)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return ()
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "omp" in line.rsplit("/", 1)[-1]}
    except OSError:
        return ()
    found = []
    for path in sorted(p for p in paths if os.path.basename(p).startswith(("libgomp", "libiomp5", "libomp"))):
        try:
            entry = ctypes.CDLL(path).GOMP_parallel
        except (OSError, AttributeError):
            continue
        entry.argtypes, entry.restype = [_EACH_THREAD, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint], None
        found.append(entry)
    return tuple(found)


def set_subnormal_flush(flush: bool) -> bool:
    """``torch.set_flush_denormal(flush)`` on the calling thread and on every thread of torch's OpenMP team.

    After torch's first parallel operation a call from the main thread alone leaves the workers
    as they were (with 2 threads, half of every product), so it is also made on each of them,
    through the OpenMP runtime's ``GOMP_parallel``.

    Parameters
    ----------
    flush : bool
        Flush subnormal numbers to zero, or keep them.

    Returns
    -------
    bool
        Whether the CPU supports flushing (torch's answer; ``False``: nothing changed).
    """
    supported = bool(torch.set_flush_denormal(flush))
    threads = torch.get_num_threads()
    if supported and threads > 1:

        def each(_: Any) -> None:
            torch.set_flush_denormal(flush)

        callback = _EACH_THREAD(each)  # referenced until the calls return
        for parallel in _openmp_runtimes():
            parallel(callback, None, threads, 0)
    return supported


@contextlib.contextmanager
def subnormals_flushed(flush: bool | None) -> Iterator[dict[str, Any]]:
    """Subnormal numbers flushed (``True``) or kept (``False``) on every CPU thread inside the block.

    Parameters
    ----------
    flush : bool or None
        The setting for the block (the calling thread's former one returns after it); ``None``
        leaves it as it is (a CUDA run: GPU kernels do not read it).

    Yields
    ------
    dict
        ``flush_denormal`` (measured on every thread: ``True``, ``False``, or ``None`` when only
        some flush) and ``flush_denormal_supported`` (whether the CPU can flush).
    """
    before = thread_flushes()
    # With None every thread is left as it is: torch, given the setting it has, only says whether the CPU could flush.
    supported = set_subnormal_flush(flush) if flush is not None else bool(torch.set_flush_denormal(before))
    try:
        yield {"flush_denormal": all_threads_flush(), "flush_denormal_supported": supported}
    finally:
        if flush is not None and flush != before:
            set_subnormal_flush(before)
