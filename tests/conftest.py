"""Shared Hypothesis settings and strategies."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import resource
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from structconv.testing import dense_reference

# CI draws the same cases every run (a red build is then the change's, not the draw's); the
# "thorough" profile searches afresh, with the example database, for new failures.
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_Test = TypeVar("_Test", bound=Callable[..., Any])

REPRESENTATIONS = ("dense", "sparse", "concat", "composed")
BACKENDS = ("numpy", "torch")


@st.composite
def problems(draw: Any, batched: bool | None = None, max_size: int = 6) -> dict[str, Any]:
    """A random (A, x, theta) with sizes in [1, max_size] and a random density."""
    if batched is None:
        batched = draw(st.booleans())
    dims = st.integers(1, max_size)
    K, M, N, P, Q, B = (draw(dims) for _ in range(6))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
    rng = np.random.default_rng(seed)
    shape = (B, K, M, N) if batched else (K, M, N)
    A = rng.normal(size=shape) * (rng.random(shape) < density)
    return {"A": A, "x": rng.normal(size=(B, M, P)), "theta": rng.normal(size=(K, P, Q)), "rng": rng}


#: The naive dense einsum every path must equal (:func:`structconv.testing.dense_reference`).
reference = dense_reference


def to_backend(a: np.ndarray, backend: str) -> Any:
    return torch.from_numpy(a) if backend == "torch" else a


def as_numpy(a: Any) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def make_basis(A: Any, representation: str) -> Any:
    """Represent ``A`` (array of either backend) in a given representation."""
    from structconv import ComposedBasis, DenseBasis, SparseBasis
    from structconv.theory.selfcheck import build_basis

    if representation != "composed":
        return build_basis(A, representation)
    if A.ndim == 4:
        return SparseBasis.from_dense(A)
    # A = (A_k) composed with the one-member identity basis: the products are the A_k again.
    eye = np.eye(A.shape[2])[None]
    eye = torch.from_numpy(eye).to(A.device) if isinstance(A, torch.Tensor) else eye
    return ComposedBasis(DenseBasis(A), SparseBasis.from_dense(eye))


def cuda(test: _Test) -> _Test:
    """Skip ``test`` without a CUDA device, and mark it for ``pytest -m cuda`` (the GPU machine's run)."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    marked: _Test = pytest.mark.cuda(skip(test))
    return marked


#: The device ``tests/test_cuda.py`` runs on: ``STRUCTCONV_TEST_DEVICE``, ``"cuda"`` unless set
#: (``STRUCTCONV_TEST_DEVICE=cpu`` runs the same tests on the CPU, against float64 there too).
TEST_DEVICE = os.environ.get("STRUCTCONV_TEST_DEVICE", "cuda")


def device_available(device: str) -> bool:
    """Whether tensors can be placed on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) here.

    A string that names no torch device raises ``RuntimeError``: a misspelt
    ``STRUCTCONV_TEST_DEVICE`` stops the collection instead of skipping every test.
    """
    place = torch.device(device)
    if place.type == "cpu":
        return True
    module = getattr(torch, place.type, None)
    if module is None or not module.is_available():
        return False
    count = getattr(module, "device_count", lambda: 1)()
    return place.index is None or place.index < count


def needs_device(device: str) -> pytest.MarkDecorator:
    """Skip unless ``device`` is available; the reason names the variable that chose it."""
    kind = torch.device(device).type
    label = "CUDA" if kind == "cuda" else kind
    reason = f"needs a {label} device (STRUCTCONV_TEST_DEVICE={device})"
    return pytest.mark.skipif(not device_available(device), reason=reason)


def official_archive(root: Path, per_batch: int = 8) -> Path:
    """A tiny official-format archive (random images) in ``root``."""
    rng = np.random.default_rng(0)
    path = root / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
            blob = pickle.dumps({b"data": data, b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


@contextlib.contextmanager
def memory_budget(extra_gib: float) -> Iterator[None]:
    """Lower this process' address-space limit to what it maps now plus ``extra_gib`` for the block.

    A call that would allocate more than the budget then fails inside the block with a
    ``MemoryError`` (or torch's allocation error) instead of succeeding slowly on a large host,
    so a test can tell "refused before allocating" from "allocated and then refused".
    """
    with open("/proc/self/status") as status:
        mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + int(extra_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
