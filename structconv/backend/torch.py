"""The torch backend: sparse products with a cached transpose, autocast, autograd functions.

Imported only once a torch tensor is seen, so the NumPy path never imports torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import array_api_compat.torch as xp_torch
import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import cache, einsum_path, shift_torch
from .interface import Array, Backend
from .torch_autocast import AUTOCAST_DEVICES, autocast_dtype, autocast_off


class TorchBackend(Backend):
    """Torch tensors on any device, with autograd and autocast."""

    name = "torch"

    def owns(self, a: object) -> bool:
        return isinstance(a, torch.Tensor)

    def namespace(self) -> Any:
        return xp_torch

    def native(self) -> Any:
        return torch

    def device(self, a: Array) -> str:
        return str(a.device)

    def to_numpy(self, a: Array) -> np.ndarray:
        return np.asarray(a.detach().cpu().numpy())

    def asarray(self, values: Any, like: Array, dtype: Any = None) -> Array:
        if dtype is None:
            dtype = like.dtype
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        return torch.as_tensor(values, dtype=dtype, device=like.device)

    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)

    def eye(self, n: int, like: Array) -> Array:
        return torch.eye(n, dtype=like.dtype, device=like.device)

    def dtype_name(self, a: Array) -> str:
        return str(a.dtype).removeprefix("torch.")

    def is_floating(self, a: Array) -> bool:
        return bool(a.is_floating_point())

    def is_integer(self, a: Array) -> bool:
        return not a.is_floating_point() and not a.is_complex() and a.dtype != torch.bool

    def all_finite(self, a: Array) -> bool:
        return bool(torch.isfinite(a.detach()).all())

    def detach(self, a: Array) -> Array:
        return a.detach()

    def traced(self) -> bool:
        return bool(torch.compiler.is_compiling())

    def check_all(self, condition: Array, message: str) -> None:
        if torch.compiler.is_compiling():  # an assertion in the graph: no host read, no graph break
            torch._assert_async(condition.all(), message)
        else:
            super().check_all(condition, message)

    def requires_grad(self, a: Array) -> bool:
        return bool(a.requires_grad)

    def recording(self, *arrays: Array) -> bool:
        return torch.is_grad_enabled() and any(a.requires_grad for a in arrays)

    def flush_subnormals(self, a: Array, *, nonnegative: bool = False) -> Array:
        # Only a CPU reads subnormals slowly: elsewhere each flush would be kernels launched for nothing.
        if a.device.type != "cpu":
            return a
        info = torch.finfo(a.dtype)
        if nonnegative:  # one kernel: x above the largest subnormal, tiny (1 - eps), else 0 (NaN is kept)
            return torch.threshold(a, info.tiny * (1.0 - info.eps), 0.0)
        return a.masked_fill(a.abs() < info.tiny, 0.0)

    def autocast_dtype(self, a: Array) -> Any:
        return autocast_dtype(a.device.type)

    def autocast_probe(self, a: Array) -> Callable[[], Any] | None:
        kind = a.device.type
        return partial(torch.is_autocast_enabled, kind) if kind in AUTOCAST_DEVICES else None

    def autocast_to(self, a: Array, dtype: Any) -> Array:
        if dtype is None or not a.is_floating_point() or a.dtype in (dtype, torch.float64):
            return a
        return a.to(dtype)

    def einsum(self, eq: str, *operands: Array) -> Array:
        return torch.einsum(eq, *operands)

    def x_theta(self, x: Array, theta: Array) -> Array:
        B, M, P = (int(s) for s in x.shape)
        K, _, Q = (int(s) for s in theta.shape)
        # Θ as a column-major (P, K Q) matrix, the layout of nn.Linear's weight: torch's GEMM
        # backward follows the layout of its second operand, so the weight gradient is formed as
        # (gᵀ x)ᵀ instead of xᵀ g, the faster product for a wide P (the copy of Θ is tiny).
        wide = theta.permute(0, 2, 1).reshape(K * Q, P).contiguous().t()
        return (x.reshape(B * M, P) @ wide).reshape(B, M, K, Q).permute(0, 2, 1, 3)

    def sparse_matrix(self, rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> Any:
        return SparseMatrix(rows, cols, values, shape)

    # --- core/engine -----------------------------------------------------------------------------
    def from_numpy(self, a: np.ndarray) -> Array:
        return torch.from_numpy(a)

    def sparse_product(
        self, left: tuple[Array, Array, Array], right: tuple[Array, Array, Array], shapes: tuple[int, int, int]
    ) -> tuple[Array, Array, Array]:
        L, J, R = shapes
        lhs = torch.sparse_coo_tensor(torch.stack(left[:2]), left[2], (L, J), check_invariants=False).coalesce()
        rhs = torch.sparse_coo_tensor(torch.stack(right[:2]), right[2], (J, R), check_invariants=False).coalesce()
        with warnings.catch_warnings(action="ignore", category=UserWarning):  # torch's note: sparse is beta
            prod = torch.sparse.mm(lhs, rhs).coalesce()
        rows, cols = prod.indices()
        return rows, cols, prod.values().clone()  # a view of a sparse base breaks torch.compile

    def dense_gemms(self, order: str, a: Array, x: Array, theta: Array) -> Array | None:
        r"""Plain GEMMs over the whole batch, nothing broadcast against it (``docs/internals.rst``).

        The batch is moved next to the channels once (``x`` as :math:`(M, B P)`).  ``"ax"``:
        :math:`R_k = A_k^\top x` in one batched GEMM, then :math:`(N B, K P)` times
        :math:`\Theta` as :math:`(K P, Q)`.  ``"xtheta"``: :math:`S_k = x\,\Theta_k` in one
        batched GEMM, then :math:`y = [A_1; \dots; A_K]^\top [S_1; \dots; S_K]` in one GEMM.  The
        result is the ``(B, N, Q)`` view of an ``(N, B, Q)`` array.  A per-instance basis runs
        :func:`_instance_gemms` (x·Θ first only).
        """
        if order not in ("ax", "xtheta"):
            return None
        if a.ndim == 4:
            return _instance_gemms(a, x, theta) if order == "xtheta" else None
        K, M, N = (int(s) for s in a.shape)
        B, P, Q = int(x.shape[0]), int(theta.shape[1]), int(theta.shape[2])
        if order == "xtheta":
            s = x.transpose(0, 1).reshape(M * B, P) @ theta  # (K, M B, Q)
            y = a.reshape(K * M, N).T @ s.reshape(K * M, B * Q)
        else:
            r = a.transpose(1, 2) @ x.transpose(0, 1).reshape(M, B * P)  # (K, N, B P)
            y = r.reshape(K, N * B, P).transpose(0, 1).reshape(N * B, K * P) @ theta.reshape(K * P, Q)
        return y.reshape(N, B, Q).transpose(0, 1)

    def dense_gemms_lowrank(self, a: Array, x: Array, value: Array, out: Array) -> Array | None:
        r"""Three GEMMs for :math:`\Theta_k = V_k O_k^\top`.

        :math:`S = x\,[V_1 \cdots V_K]` in one GEMM, :math:`Z_k = A_k^\top S_k` in one batched GEMM,
        then :math:`y = [Z_1 \cdots Z_K]\,[O_1 \cdots O_K]^\top`.
        """
        if a.ndim == 4:
            return None
        K, M, N = (int(s) for s in a.shape)
        B, P, D, Q = int(x.shape[0]), int(value.shape[1]), int(value.shape[2]), int(out.shape[1])
        xm = x.transpose(0, 1).reshape(M * B, P)
        s = (xm @ value.permute(1, 0, 2).reshape(P, K * D)).reshape(M, B, K, D).permute(2, 0, 1, 3)
        z = a.transpose(1, 2) @ s.reshape(K, M, B * D)  # (K, N, B D): one batched GEMM, nothing broadcast
        z = z.reshape(K, N * B, D).permute(1, 0, 2).reshape(N * B, K * D)
        y = z @ out.permute(0, 2, 1).reshape(K * D, Q)
        return y.reshape(N, B, Q).transpose(0, 1)

    def memory_capacity(self, a: Array) -> float:
        if a.device.type == "cuda":  # a property query, no synchronisation
            return float(torch.cuda.get_device_properties(a.device).total_memory)
        if a.device.type == "meta":  # nothing is allocated there
            return float("inf")
        return super().memory_capacity(a)

    # --- structures: graph ---------------------------------------------------------------------
    def default_float(self) -> Any:
        return torch.get_default_dtype()

    def plain(self, a: Array) -> Array:
        # A fake tensor (torch.export's tracing) stays itself: a plain copy would leave its trace.
        return a if type(a) is torch.Tensor or isinstance(a, FakeTensor) else a.as_subclass(torch.Tensor)

    def is_sparse(self, a: Array) -> bool:
        return bool(a.layout != torch.strided)

    def coordinates(self, a: Array) -> tuple[Array, Array, tuple[int, ...]]:
        if a.layout != torch.strided:
            coo = a.to_sparse_coo().coalesce()
            return coo.indices(), coo.values().clone(), tuple(int(s) for s in coo.shape)
        index = a.nonzero().T
        return index, a[tuple(index)], tuple(int(s) for s in a.shape)

    def strides(self, a: Array) -> tuple[int, ...]:
        return tuple(a.stride())

    def move(self, a: Array, device: Any = None, dtype: Any = None, *, what: str = "array") -> Array:
        return a.to(device=device, dtype=dtype)

    def take(self, a: Array, index: Array, axis: int) -> Array:
        return a.index_select(axis, index)

    def index_add(self, values: Array, index: Array, size: int, axis: int) -> Array:
        shape = list(values.shape)
        shape[axis] = size
        return values.new_zeros(shape).index_add(axis, index, values)

    def grad_enabled(self) -> Any:
        return torch.enable_grad()

    def sparse_polynomials(
        self, rows: Array, cols: Array, values: Array, size: int, degrees: tuple[int, ...], family: str
    ) -> list[tuple[Array, Array, Array]]:
        dtype = values.dtype
        if values.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
            # No low-precision sparse products on the CPU: form the polynomials in float32.
            with torch.autocast("cpu", enabled=False):
                wide = self.sparse_polynomials(rows, cols, values.float(), size, degrees, family)
            return [(r, c, v.to(dtype)) for r, c, v in wide]
        coords = torch.stack([rows, cols])
        matrix = torch.sparse_coo_tensor(coords, values, (size, size), check_invariants=True).coalesce()
        nodes = torch.arange(size, device=values.device)
        ones = torch.ones_like(nodes, dtype=dtype)
        eye = torch.sparse_coo_tensor(torch.stack([nodes, nodes]), ones, (size, size), check_invariants=True)
        mats = [eye.coalesce(), matrix]
        for _ in range(2, max(degrees) + 1):
            with warnings.catch_warnings(action="ignore", category=UserWarning):  # torch's note: sparse is beta
                nxt = torch.sparse.mm(mats[-1], matrix)
            mats.append((2 * nxt - mats[-2]).coalesce() if family == "chebyshev" else nxt.coalesce())
        out = []
        for d in degrees:
            part = mats[d].coalesce()
            # values() is a view of the sparse tensor, which torch.compile cannot carry across a graph break
            out.append((part.indices()[0], part.indices()[1], part.values().clone()))
        return out

    # --- structures: attention and positions ----------------------------------------------------
    fused_attention = True

    def attention(
        self,
        q: Array,
        k: Array,
        v: Array,
        allowed: Array | None,
        scale: float,
        *,
        bias: Array | None = None,
        dropout: float = 0.0,
    ) -> Array:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if bias is not None and allowed is not None:
            raise ValueError("attention takes a boolean mask or additive scores, not both")
        mask = allowed if bias is None else bias
        grad = q.requires_grad or k.requires_grad or v.requires_grad
        if dropout > 0.0:  # torch draws the mask in its kernel (on the CPU, its math kernel: every weight stored)
            out = sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
        elif bias is not None and (grad or bias.requires_grad):
            # torch's fused CPU kernel refuses a mask that requires grad (its math kernel would store
            # every score); this forward is the fused kernel, the backward recomputes in chunks.
            out = _BiasedAttention.apply(q, k, v, bias, scale)  # type: ignore[no-untyped-call]
        elif not grad:
            out = sdpa(q, k, v, attn_mask=mask, scale=scale)
        else:
            out = _TwiceDifferentiableSDPA.apply(q, k, v, allowed, scale)  # type: ignore[no-untyped-call]
        # torch's fused CPU kernel takes a query whose every score is NaN (its own features or every
        # key's hold a NaN) for one that may attend to nothing, and returns 0 there; the softmax,
        # the other orders and torch's math kernel give NaN.  Sums find such queries in one pass
        # over q and k; on the CPU, outside a graph, the output is copied only when there is one.
        lost = q.sum(-1, keepdim=True).isnan() | k.sum(-1, keepdim=True).isnan().all(-2, keepdim=True)
        if out.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(lost.any()):
            return out
        return out.masked_fill(lost, float("nan"))

    def dropout(self, a: Array, p: float) -> Array:
        return torch.nn.functional.dropout(a, p, training=True)

    def addmm(self, bias: Array, a: Array, b: Array) -> Array:
        return torch.addmm(bias, a, b)

    def addmm_(self, y: Array, a: Array, b: Array) -> Array:
        return y.addmm_(a, b)

    # --- structures: grid (shift kernels) ------------------------------------------------------
    def frame(self, xg: Array, lo: tuple[int, ...], hi: tuple[int, ...], boundary: str) -> Array:
        return shift_torch.frame(xg, lo, hi, boundary)

    def shift_gemm(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        return shift_torch.shift_gemm(buf, thetas, shifts, rows)

    def gemm_shift(self, buf: Array, thetas: Array, shifts: tuple[int, ...], rows: int) -> Array:
        return shift_torch.gemm_shift(buf, thetas, shifts, rows)

    def native_stencil_ndim(self) -> int:
        return 3  # F.conv1d, F.conv2d, F.conv3d

    def native_stencil(self, x: Array, thetas: Array, geo: Any) -> Array:
        return shift_torch.native_conv(x, thetas, geo)

    def native_depthwise(self, x: Array, weights: Array, geo: Any) -> Array:
        return shift_torch.native_depthwise(x, weights, geo)

    def native_image(self, x: Array, weight: Array, geo: Any, bias: Array | None, groups: int) -> Array:
        return shift_torch.conv_image(x, weight, geo, bias, groups)

    def bind_native_image(self, geo: Any, groups: int) -> Callable[[Array, Array, Array | None], Array]:
        return shift_torch.bind_conv_image(geo, groups)


class SparseMatrix:
    """A 2-D sparse matrix for ``S @ dense``, from (possibly repeated) coordinates, which add up.

    Gather-scatter when the values require grad, else CSR built once, its transpose on the first
    backward pass (the choice: ``docs/internals.rst``, the torch backend).
    """

    __slots__ = ("_csr", "_csr_t", "cols", "rows", "shape", "values")

    def __init__(self, rows: Array, cols: Array, values: Array, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.rows, self.cols, self.values = rows, cols, values
        self._csr: Any = None
        self._csr_t: Any = None

    def csr(self) -> Any:
        """The CSR form, built on first use and kept (a cache of this value, not a new value)."""
        if self._csr is None:
            self._csr = _csr_from_coordinates(self.rows, self.cols, self.values, self.shape)
        return self._csr

    def csr_t(self) -> Any:
        """The transposed CSR form, built once for backward passes (torch's own transposes per call)."""
        if self._csr_t is None:
            self._csr_t = SparseMatrix(self.cols, self.rows, self.values, (self.shape[1], self.shape[0])).csr()
        return self._csr_t

    def times(self, dense: Array) -> Array:
        """``S @ dense`` (a method, not ``@``: torch.compile traces a method of a Python object, not its operator)."""
        if dense.device.type == "cpu" and dense.dtype in (torch.bfloat16, torch.float16):
            # No low-precision sparse kernels on the CPU: compute in float32 and cast back.
            wide = SparseMatrix(self.rows, self.cols, self.values.float(), self.shape)
            with torch.autocast("cpu", enabled=False):  # autocast would narrow the operands again
                return wide.times(dense.float()).to(dense.dtype)
        # meta: the CSR build reads the rows; compiled: Inductor fuses the gather-scatter, and the
        # CSR build (a host sort, a cached autograd function) would break the graph; traced
        # (torch.jit.trace): the tracer records no autograd function holding a Python object.
        tracing = torch.jit.is_tracing()  # type: ignore[attr-defined,no-untyped-call]
        if self.values.requires_grad or dense.device.type == "meta" or torch.compiler.is_compiling() or tracing:
            gathered = dense.index_select(0, self.cols) * self.values[:, None]
            return dense.new_zeros((self.shape[0], dense.shape[1])).index_add(0, self.rows, gathered)
        if not dense.requires_grad:
            with warnings.catch_warnings(action="ignore", category=UserWarning):
                return self.csr() @ dense
        return _CsrProduct.apply(self, dense)  # type: ignore[no-untyped-call]


def _csr_from_coordinates(rows: Any, cols: Any, values: Any, shape: tuple[int, int]) -> Any:
    """A torch CSR matrix from coordinates; repeated coordinates stay separate entries and add up."""
    order = _stable_order(rows.numpy(), shape[0]) if rows.device.type == "cpu" else torch.argsort(rows, stable=True)
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.bincount(rows, minlength=shape[0]).cumsum(0)
    if order is not None:
        # index_select, not ``cols[order]``: advanced indexing costs about 4x more on a graph of
        # Cora's size (and enters a parallel region, slow on a loaded machine).
        cols, values = cols.index_select(0, order), values.index_select(0, order)
    with warnings.catch_warnings(action="ignore", category=UserWarning):
        return torch.sparse_csr_tensor(crow, cols, values, shape, check_invariants=False)


def _stable_order(rows: np.ndarray, size: int) -> Any:
    """The stable sorting permutation of ``rows`` (< ``size``) as a tensor, or ``None`` if they are sorted already.

    By the number of descents: none, NumPy's timsort for a few, else a radix sort of 16-bit keys
    (the measurement: ``docs/internals.rst``, the torch backend).
    """
    descents = int(np.count_nonzero(rows[1:] < rows[:-1]))
    if descents == 0:
        return None
    radix = descents > 8 and size <= 65536
    return torch.from_numpy(np.argsort(rows.astype(np.uint16) if radix else rows, kind="stable"))


class _CsrProduct(torch.autograd.Function):
    """``S @ dense`` with a backward pass through the cached ``S^T`` (values are constants here)."""

    @staticmethod
    def forward(ctx: Any, matrix: SparseMatrix, dense: Any) -> Any:
        ctx.matrix, ctx.dtype = matrix, dense.dtype
        with warnings.catch_warnings(action="ignore", category=UserWarning):
            return matrix.csr() @ dense

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        # A backward run inside torch.autocast may hand a low-precision gradient; torch has no
        # bf16 sparse product on every device, so it runs in the matrix's dtype.
        csr_t = ctx.matrix.csr_t()
        with warnings.catch_warnings(action="ignore", category=UserWarning), autocast_off(grad.device.type):
            return None, (csr_t @ grad.to(csr_t.dtype)).to(ctx.dtype)


# --- structures: attention and positions --------------------------------------------------------
def _attention_math(q: Any, k: Any, v: Any, allowed: Any, scale: float) -> Any:
    """``softmax(q k^T scale, masked) v`` from differentiable operations (no empty rows: checked by the caller)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


def _wanted_grads(out: Any, inputs: tuple[Any, ...], wanted: tuple[bool, ...], grad: Any, **kwargs: Any) -> Any:
    """The gradients of ``out`` (weighted by ``grad``) for the ``inputs`` ``wanted``, ``None`` for the others."""
    found = iter(torch.autograd.grad(out, [t for t, w in zip(inputs, wanted, strict=True) if w], grad, **kwargs))
    return tuple(next(found) if w else None for w in wanted)


class _TwiceDifferentiableSDPA(torch.autograd.Function):
    """``scaled_dot_product_attention`` whose gradient can be differentiated again (``docs/internals.rst``).

    A first-order backward is the fused kernel's own; under ``create_graph=True`` the attention is
    recomputed from differentiable operations.
    """

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, allowed: Any, scale: float) -> Any:
        inner = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
        with torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(
                inner[0], inner[1], inner[2], attn_mask=allowed, scale=scale
            )
        ctx.save_for_backward(q, k, v)
        ctx.inner, ctx.out, ctx.allowed, ctx.scale = inner, out, allowed, scale
        return out.detach()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        wanted = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph=True: a gradient that can be differentiated again
            q, k, v = ctx.saved_tensors
            with torch.enable_grad():
                out = _attention_math(q, k, v, ctx.allowed, ctx.scale)
                return (*_wanted_grads(out, (q, k, v), wanted, grad, create_graph=True), None, None)
        # retained: a repeated backward (retain_graph=True) gives the same gradient; the fused
        # graph holds only what the output does, plus the kernel's row statistics
        return (*_wanted_grads(ctx.out, tuple(ctx.inner), wanted, grad, retain_graph=True), None, None)


#: Scores recomputed at a time by the backward of :class:`_BiasedAttention` (4 MiB in float32 each):
#: at 16x16 tokens, 9 heads of width 400, batch 16, the peak memory was the lowest of 2^20 to 2^22.
CHUNK_ENTRIES = 1 << 20


def _sum_to(a: Any, shape: tuple[int, ...]) -> Any:
    """``a`` summed over the axes where ``shape`` (of the same rank) has 1 and ``a`` does not."""
    axes = [i for i, (n, s) in enumerate(zip(a.shape, shape, strict=True)) if s == 1 and n != 1]
    return a.sum(axes, keepdim=True) if axes else a


class _BiasedAttention(torch.autograd.Function):
    r"""``scaled_dot_product_attention`` with additive scores :math:`\beta`, whose gradient reaches :math:`\beta`.

    For ``(B, H, L, D)`` queries and keys, ``(B, H, S, R)`` values and a finite
    ``(1 or B, 1 or H, L, S)`` bias.  The forward is torch's fused kernel, :math:`\beta` a
    constant there; the backward recomputes :data:`CHUNK_ENTRIES` scores at a time (in float32
    for 16-bit inputs) :math:`P = \mathrm{softmax}(\mathrm{scale}\,qk^\top + \beta)`,
    :math:`dS = P\odot(dP - \mathrm{rowsum}(P\odot dP))` with :math:`dP = g v^\top`, then
    :math:`dq = \mathrm{scale}\,dS\,k`, :math:`dk = \mathrm{scale}\,dS^\top q`,
    :math:`dv = P^\top g` and :math:`d\beta = dS` summed over its broadcast axes; under
    ``create_graph=True`` it recomputes from differentiable operations (``docs/internals.rst``).
    """

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, bias: Any, scale: float) -> Any:
        ctx.save_for_backward(q, k, v, bias)
        ctx.scale = scale
        # Detached: torch picks its kernel by the inputs' requires_grad, even where grad mode is off.
        q, k, v, bias = (t.detach() for t in (q, k, v, bias))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        q, k, v, bias = ctx.saved_tensors
        scale, wanted = ctx.scale, ctx.needs_input_grad[:4]
        if torch.is_grad_enabled():  # create_graph=True: a gradient that can be differentiated again
            with torch.enable_grad():
                out = ((q @ k.transpose(-1, -2)) * scale + bias).softmax(-1) @ v
                return (*_wanted_grads(out, (q, k, v, bias), wanted, grad, create_graph=True), None)
        wide = torch.promote_types(q.dtype, torch.float32)
        B, H, L, S = int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2])
        D, R = int(q.shape[3]), int(v.shape[3])
        shared = int(bias.shape[0]) == 1
        dq, dk, dv = (
            torch.empty(t.shape, dtype=wide, device=t.device) if w else None
            for t, w in zip((q, k, v), wanted[:3], strict=True)
        )
        db = torch.empty(bias.shape, dtype=wide, device=bias.device) if wanted[3] and not shared else None
        step = max(1, CHUNK_ENTRIES // (H * L * S))
        for b0 in range(0, B, step):
            rows = slice(b0, b0 + step)
            # contiguous: the gradient of a sum over heads arrives broadcast (stride 0), which bmm copies per call
            qc, kc, vc, gc = (t[rows].to(wide).contiguous() for t in (q, k, v, grad))
            bc = (bias if shared else bias[rows]).to(wide)
            n = int(qc.shape[0]) * H
            p = ((qc @ kc.transpose(-1, -2)).mul_(scale).add_(bc)).softmax(-1)
            ds = gc @ vc.transpose(-1, -2)  # dP, then dS in place
            ds.sub_((p * ds).sum(-1, keepdim=True)).mul_(p)
            if wanted[3]:
                part = _sum_to(ds, tuple(int(s) for s in bc.shape))
                if not shared:
                    db[rows] = part  # type: ignore[index]
                else:
                    db = part.clone() if db is None else db.add_(part)
            ds.mul_(scale)
            flat = ds.view(n, L, S)
            if dq is not None:
                torch.bmm(flat, kc.view(n, S, D), out=dq[rows].view(n, L, D))
            if dk is not None:
                torch.bmm(flat.transpose(1, 2), qc.view(n, L, D), out=dk[rows].view(n, S, D))
            if dv is not None:
                torch.bmm(p.view(n, L, S).transpose(1, 2), gc.view(n, L, R), out=dv[rows].view(n, S, R))
        grads = (dq, dk, dv, db)
        return (*(None if g is None else g.to(t.dtype) for g, t in zip(grads, (q, k, v, bias), strict=True)), None)


# --- core/engine (module level) -------------------------------------------------------------------
def _instance_gemms(a: Array, x: Array, theta: Array) -> Array:
    r"""A per-instance dense basis ``(B, K, M, N)``, x·Θ first, as two GEMMs.

    :math:`S_b = x_b [\Theta_1 \cdots \Theta_K]` is one GEMM over the whole batch, laid out as
    :math:`(B, M K, Q)`; then :math:`y_b = A_b'^\top S_b` is one batched GEMM, with
    :math:`A'_b` the basis of instance :math:`b` read as :math:`(M K, N)`: a view when it is
    stored in ``(B, M, K, N)`` memory order, else one copy (``docs/internals.rst``).
    """
    B, K, M, N = (int(s) for s in a.shape)
    P, Q = int(theta.shape[1]), int(theta.shape[2])
    s = (x.reshape(B * M, P) @ theta.permute(1, 0, 2).reshape(P, K * Q)).reshape(B, M * K, Q)
    stacked = a.permute(0, 2, 1, 3).reshape(B, M * K, N)  # a view for (B, M, K, N) memory, else one copy
    return stacked.transpose(1, 2) @ s


BACKEND = TorchBackend()
cache.tracing = torch.compiler.is_compiling  # the caches leave their order alone in a traced call


# A pure function of shapes, cached by value: torch.compile calls it as Python (its result a
# constant of the graph) instead of tracing opt_einsum's planner, which it cannot.
torch.compiler.assume_constant_result(einsum_path)  # type: ignore[no-untyped-call]
