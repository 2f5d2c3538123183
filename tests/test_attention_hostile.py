"""Hostile inputs to attention: the fused order's memory promise, masks of every kind, mixed dtypes.

* ``"sdpa"`` must run torch's fused kernel (never the math kernel, which stores every score)
  whatever the widths of keys and values and whatever the mask, and its cost must count the
  scores wherever no fused kernel applies;
* ``attention_basis`` accepts the masks it documents and refuses every other one when it is
  built, naming ``mask``, so that every order gives the same answer;
* the attention layers refuse an input of another dtype than their parameters with a
  ``TypeError`` naming it (not torch's "expected m1 and m2 to have the same dtype").
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch
from conftest import as_numpy, reference, to_backend
from hypothesis import given
from hypothesis import strategies as st

from structconv import BiAffine, LowRank, attention_basis, conv, explain, masked_softmax
from structconv.bases import attention as attention_module
from structconv.bases.attention import fused_width
from structconv.engine.contract import PLANS
from structconv.engine.operands import FULL
from structconv.engine.orders import names
from structconv.nn import ContentHeads, MultiHeadSelfAttention, PositionalAttention

FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION.value)


def _transformer(
    g: torch.Generator, K: int, P: int, D: int, dtype: torch.dtype = torch.float64, bias: bool = True
) -> BiAffine:
    return BiAffine(
        key=torch.randn(K, P, D, generator=g, dtype=dtype),
        query=torch.randn(K, P, D, generator=g, dtype=dtype),
        key_bias=torch.randn(K, D, generator=g, dtype=dtype) if bias else None,
        query_bias=torch.randn(K, D, generator=g, dtype=dtype) if bias else None,
        scale=D**-0.5,
    )


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The kernel torch picks for every ``scaled_dot_product_attention`` call (1 = flash attention).

    A mask must also reach the kernel with its last axis contiguous, as CUDA's memory-efficient
    kernel requires (the CPU kernel does not, so only this check can see it here).
    """
    inner = torch.nn.functional.scaled_dot_product_attention
    chosen: list[int] = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, **kw: Any) -> torch.Tensor:
        drop, causal, gqa = kw.get("dropout_p", 0.0), kw.get("is_causal", False), kw.get("enable_gqa", False)
        choice = torch._fused_sdp_choice(q, k, v, attn_mask, drop, causal, scale=kw.get("scale"), enable_gqa=gqa)
        chosen.append(int(choice))
        assert attn_mask is None or (attn_mask.ndim == 4 and attn_mask.stride(-1) == 1), attn_mask.stride()
        return inner(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return chosen


# --- the fused order: the kernel it runs, its answers, its memory, its cost -----------------------
@pytest.mark.parametrize("width", [2, 4, 7])  # value width below, equal to and above the key width 4
@pytest.mark.parametrize("lowrank", [False, True])
@pytest.mark.parametrize("mask", ["none", "causal", "heads", "padding", "empty_column"])
@pytest.mark.parametrize("cross", [False, True])
def test_sdpa_runs_the_fused_kernel_at_any_width_and_mask(
    kernels: list[int], width: int, lowrank: bool, mask: str, cross: bool
) -> None:
    g = torch.Generator().manual_seed(width)
    B, K, T, P, D = 2, 3, 9, 5, 4
    x = torch.randn(B, T, P, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(B, T - 2, P, generator=g, dtype=torch.float64) if cross else None
    N = T - 2 if cross else T
    masks = {
        "none": None,
        "causal": torch.ones(T, N, dtype=torch.bool).tril(),  # (M, N)
        "heads": torch.rand(K, T, N, generator=g) < 0.7,  # (K, M, N): 3-D, which torch's CPU kernel refuses as is
        "padding": torch.arange(T).reshape(1, 1, T, 1) < torch.tensor([T, 4]).reshape(B, 1, 1, 1),  # (B, 1, M, 1)
        "empty_column": torch.ones(T, N, dtype=torch.bool).index_fill(1, torch.tensor([1]), False),
    }
    theta: Any = (
        LowRank(
            torch.randn(K, P, width, generator=g, dtype=torch.float64),
            torch.randn(K, 6, width, generator=g, dtype=torch.float64),
        )
        if lowrank
        else torch.randn(K, P, width, generator=g, dtype=torch.float64)
    )
    basis = attention_basis(x, z, mechanism=_transformer(g, K, P, D), mask=masks[mask])
    y = conv(basis, x, theta, order="sdpa")
    assert kernels and set(kernels) == {FLASH}
    full = theta.full() if lowrank else theta
    ref = reference(as_numpy(basis.to_dense()), as_numpy(x), as_numpy(full))
    np.testing.assert_allclose(as_numpy(y), ref, rtol=1e-10, atol=1e-10)
    for order in names(FULL, basis):
        np.testing.assert_allclose(as_numpy(conv(basis, x, full, order=order)), ref, rtol=1e-10, atol=1e-10)
    (g_fused,) = torch.autograd.grad(y.sum(), x)
    (g_dense,) = torch.autograd.grad(conv(basis, x, theta, order="ax").sum(), x)
    torch.testing.assert_close(g_fused, g_dense)


@pytest.mark.parametrize("width", [2, 5])
def test_gradients_through_the_widened_fused_order(width: int) -> None:
    g = torch.Generator().manual_seed(width)
    K, T, P, D = 2, 5, 3, 3
    mask = torch.rand(K, T, T, generator=g) < 0.7  # 3-D, with an empty column
    mask[:, :, 1] = False

    def f(x: torch.Tensor, key: torch.Tensor, query: torch.Tensor, bias: torch.Tensor, theta: torch.Tensor) -> Any:
        mech = BiAffine(key=key, query=query, query_bias=bias, scale=0.5)
        return conv(attention_basis(x, mechanism=mech, mask=mask), x, theta, order="sdpa")

    shapes = [(1, T, P), (K, P, D), (K, P, D), (K, D), (K, P, width)]
    args = tuple(torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes)
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sdpa_runs_the_fused_kernel_in_every_cpu_dtype(kernels: list[int], dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 5, generator=g).to(dtype)
    basis = attention_basis(
        x, mechanism=_transformer(g, 2, 5, 4, dtype), mask=torch.ones(8, 8, dtype=torch.bool).tril()
    )
    y = conv(basis, x, torch.randn(2, 5, 6, generator=g).to(dtype), order="sdpa")
    assert set(kernels) == {FLASH} and y.dtype == dtype and bool(torch.isfinite(y).all())


@pytest.mark.parametrize("need_mask", [False, True])
def test_multi_head_attention_under_autocast_runs_the_fused_kernel(kernels: list[int], need_mask: bool) -> None:
    # A float32 projection bias once promoted the bfloat16 keys and queries to float32 beside
    # bfloat16 values: the mixed dtypes sent torch to its math kernel.
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(16, 4, batch_first=True, kdim=12, vdim=10)
    x, k, v = torch.randn(2, 7, 16), torch.randn(2, 9, 12), torch.randn(2, 9, 10)
    padding = torch.arange(9) >= torch.tensor([[9], [5]]) if need_mask else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = layer(x, k, v, key_padding_mask=padding, need_weights=False)
    assert set(kernels) == {FLASH}
    expected, _ = layer(x, k, v, key_padding_mask=padding, need_weights=False)
    torch.testing.assert_close(y.float(), expected, rtol=0.0, atol=0.1)


_PROBE = textwrap.dedent(
    """
    import resource, sys, torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from structconv import BiAffine, LowRank, attention_basis, conv
    torch.set_num_threads(1)
    T, D, P = 8000, 8, 16  # the scores of one head: 8000 x 8000 float32 = 256 MB, twice the budget
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, T, P, generator=g)
    mech = BiAffine(key=torch.randn(1, P, D, generator=g), query=torch.randn(1, P, D, generator=g), scale=D**-0.5)
    cases = {
        "full": torch.randn(1, P, 2 * D, generator=g),
        "lowrank": LowRank(torch.randn(1, P, D // 2, generator=g), torch.randn(1, P, D // 2, generator=g)),
    }
    def run(theta, kernel):
        with sdpa_kernel(kernel):
            return conv(attention_basis(x, mechanism=mech), x, theta, order="sdpa")
    for theta in cases.values():  # thread pools and kernels mapped before the limit
        conv(attention_basis(x[:, :64], mechanism=mech), x[:, :64], theta, order="sdpa")
    mapped = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 128 * 2**20, resource.RLIM_INFINITY))
    for name, theta in cases.items():
        y = run(theta, [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
        print(name, "ran", tuple(y.shape), bool(torch.isfinite(y).all()))
    try:  # the control: the math kernel does not fit, so the budget would catch stored scores
        run(cases["full"], SDPBackend.MATH)
        print("math ran")
    except (RuntimeError, MemoryError):
        print("math refused")
    """
)


def test_sdpa_memory_stays_bounded_when_the_widths_differ() -> None:
    # A subprocess: the address-space limit (what RSS cannot show for torch's allocator) stays there.
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stdout.splitlines() if not line.startswith("USDT")]
    assert lines == ["full ran (1, 8000, 16) True", "lowrank ran (1, 8000, 16) True", "math refused"], (
        done.stdout + done.stderr[-2000:]
    )


def test_fused_width_states_torchs_kernel_rules() -> None:
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        assert fused_width("cpu", dtype, 5) == 5
    assert [fused_width("cuda:0", d, 5) for d in ("float16", "bfloat16", "float32")] == [8, 8, 8]
    assert fused_width("cuda:1", "float32", 64) == 64
    assert fused_width("cuda", "float64", 8) is None  # no CUDA kernel takes float64
    assert fused_width("mps", "float32", 8) is None and fused_width("meta", "float32", 8) is None


def test_sdpa_cost_counts_the_scores_where_no_fused_kernel_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    B, K, T, P, D = 1, 2, 512, 16, 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, P, generator=g, dtype=torch.float64)
    theta = torch.randn(K, P, 2 * D, generator=g, dtype=torch.float64)
    basis = attention_basis(x, mechanism=_transformer(g, K, P, D))
    PLANS.clear()
    fused = explain(basis, x, theta)
    assert fused.candidate("sdpa").memory < B * K * T * T and fused.chosen == "sdpa"  # no M x N term
    # As on a device where no fused kernel takes the dtype (CUDA float64): the math kernel's scores.
    monkeypatch.setattr(attention_module, "fused_width", lambda device, dtype, width: None)
    PLANS.clear()  # plans hold the costs they were made with
    try:
        math_plan = explain(basis, x, theta)
    finally:
        PLANS.clear()
    assert math_plan.candidate("sdpa").memory >= 2 * B * K * T * T
    assert f"{math_plan.candidate('sdpa').memory:12.3e}" in str(math_plan)
    assert math_plan.chosen != "sdpa"  # the planner now prefers an order of the triangle


def test_plan_key_tells_the_fused_kernels_apart() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 3, generator=g, dtype=torch.float64)
    mech = _transformer(g, 2, 3, 2)
    keys = {
        attention_basis(x, mechanism=mech).plan_key(),
        attention_basis(x.float(), mechanism=_transformer(g, 2, 3, 2, torch.float32)).plan_key(),
        attention_basis(x, mechanism=mech, mask=torch.ones(4, 4, dtype=torch.bool)).plan_key(),
        attention_basis(x, mechanism=mech, mask=torch.ones(2, 4, 4, dtype=torch.bool)).plan_key(),
    }
    assert len(keys) == 4


# --- masks: the shapes documented, every other one refused when the basis is built ----------------
SCORES = (2, 3, 4, 5)  # (B, K, M, N)


@st.composite
def masks(draw: Any) -> dict[str, Any]:
    """Half the draws a documented mask, half anything: any rank, size, dtype or backend."""
    hostile = draw(st.booleans())
    rank = draw(st.integers(0, 5) if hostile else st.integers(2, 4))
    target = SCORES[-rank:] if 0 < rank <= 4 else (2,) * rank
    shape = tuple(draw(st.sampled_from([t, 1, t + 1] if hostile else [t, 1])) for t in target)
    backend = draw(st.sampled_from(["numpy", "torch"]))
    return {
        "shape": shape,
        "dtype": draw(st.sampled_from(["bool", "float32", "float64"] + (["int64"] if hostile else []))),
        "backend": backend,
        "x_backend": draw(st.sampled_from(["numpy", "torch"])) if hostile else backend,
        "other_values": hostile and draw(st.booleans()),  # an additive mask holding values besides -inf and 0
        "seed": draw(st.integers(0, 2**16)),
        "mechanism": draw(st.sampled_from(["transformer", "bilinear"])),
    }


def _expected_error(case: dict[str, Any]) -> type[Exception] | None:
    shape, dtype = case["shape"], case["dtype"]
    if case["backend"] != case["x_backend"]:
        return TypeError
    if not 2 <= len(shape) <= 4 or any(s not in (1, t) for s, t in zip(shape, SCORES[-len(shape) :], strict=True)):
        return ValueError
    if dtype == "int64":
        return TypeError
    if dtype != "bool" and case["other_values"]:
        return ValueError
    return None


def _dense_reference(case: dict[str, Any], allowed: np.ndarray, x: np.ndarray, z: np.ndarray, mech: BiAffine) -> Any:
    """Scores, masked softmax over the inputs (a column with no allowed input is 0), written out in NumPy."""
    if mech.key is not None and mech.query is not None:
        keys = np.einsum("bmp,kpd->bkmd", x, as_numpy(mech.key)) + as_numpy(mech.key_bias)[None, :, None]
        queries = np.einsum("bnp,kpd->bknd", z, as_numpy(mech.query)) + as_numpy(mech.query_bias)[None, :, None]
        scores = np.einsum("bkmd,bknd->bkmn", keys, queries) * mech.scale
    else:
        scores = np.einsum("bmp,kpr,bnr->bkmn", x, as_numpy(mech.bilinear), z)
    scores = np.where(allowed, scores, -np.inf)
    peak = np.max(scores, axis=2, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(peak), peak, 0.0))
    total = weights.sum(2, keepdims=True)
    return weights / np.where(total > 0, total, 1.0)


@given(masks())
def test_every_mask_gives_one_answer_in_every_order_or_one_clear_error(case: dict[str, Any]) -> None:
    B, K, M, N = SCORES
    rng = np.random.default_rng(case["seed"])
    P, Q = 3, 2
    x_np, z_np = rng.normal(size=(B, M, P)), rng.normal(size=(B, N, P))
    x, z = to_backend(x_np, case["x_backend"]), to_backend(z_np, case["x_backend"])
    if case["mechanism"] == "transformer":
        arrays = {
            name: rng.normal(size=s)
            for name, s in (("key", (K, P, 2)), ("query", (K, P, 2)), ("key_bias", (K, 2)), ("query_bias", (K, 2)))
        }
        mech = BiAffine(**{k: to_backend(v, case["x_backend"]) for k, v in arrays.items()}, scale=0.7)
    else:
        mech = BiAffine(bilinear=to_backend(rng.normal(size=(K, P, P)), case["x_backend"]))
    allowed = np.asarray(rng.random(case["shape"]) < 0.6)
    if case["dtype"] == "bool":
        values: np.ndarray = allowed
    elif case["dtype"] == "int64":
        values = np.where(allowed, 0, 1).astype(np.int64)
    else:
        values = np.where(allowed, 0.0, 1.5 if case["other_values"] else -np.inf).astype(case["dtype"])
    mask = to_backend(values, case["backend"])
    theta = to_backend(rng.normal(size=(K, P, Q)), case["x_backend"])

    error = _expected_error(case)
    if error is not None:
        with pytest.raises(error, match="mask"):
            attention_basis(x, z, mechanism=mech, mask=mask)
        return
    basis = attention_basis(x, z, mechanism=mech, mask=mask)
    weights = _dense_reference(case, np.broadcast_to(allowed, SCORES), x_np, z_np, mech)
    ref = reference(weights, x_np, as_numpy(theta))
    orders = names(FULL, basis)
    assert ("sdpa" in orders) == (case["x_backend"] == "torch" and case["mechanism"] == "transformer")
    for order in orders:
        np.testing.assert_allclose(as_numpy(conv(basis, x, theta, order=order)), ref, rtol=1e-9, atol=1e-9)


def test_mask_errors_name_the_mask_and_the_shapes_accepted() -> None:
    x = torch.randn(1, 4, 3)
    mech = BiAffine(key=torch.randn(2, 3, 2), query=torch.randn(2, 3, 2))
    bigger = r"mask of shape \(3, 2, 4, 4\) does not broadcast to the scores \(1, 2, 4, 4\) \(B, K, M, N\)"
    cases: list[tuple[Any, type[Exception], str]] = [
        (torch.ones(3, 2, 4, 4, dtype=torch.bool), ValueError, bigger),  # was a batch of 3 out of "ax"
        (torch.tensor(True), ValueError, r"mask must have 2 to 4 dimensions, got shape \(\)"),
        (torch.ones(4, dtype=torch.bool), ValueError, r"mask of shape \(4,\) is a boolean mask over the keys"),
        (torch.ones(5), ValueError, r"mask of shape \(5,\): a 1-D mask is over the keys"),
        (torch.ones(1, 1, 1, 4, 4, dtype=torch.bool), ValueError, r"mask must have 2 to 4 dimensions"),
        (np.ones((4, 4), dtype=bool), TypeError, r"mask is a numpy array but x is a torch array"),
        (torch.ones(4, 4, dtype=torch.int64), TypeError, r"mask must be boolean .* or floating .*got dtype int64"),
        ([[True] * 4] * 4, TypeError, r"mask must be a numpy.ndarray or a torch.Tensor"),
        (torch.full((4, 4), 2.0), ValueError, r"mask must be boolean \(True = allowed\) or hold only -inf and 0"),
    ]
    for mask, error, message in cases:
        with pytest.raises(error, match=message):
            attention_basis(x, mechanism=mech, mask=mask)
    with pytest.raises(TypeError, match=r"mask is a torch array but x is a numpy array"):
        attention_basis(x.numpy(), mechanism=BiAffine(bilinear=np.ones((2, 3, 3), "f4")), mask=torch.ones(4, 4) == 1)


# --- the layers: an input of another dtype, named ---------------------------------------------------
@pytest.mark.parametrize("need_weights", [True, False])
def test_multi_head_self_attention_names_an_input_of_another_dtype(need_weights: bool) -> None:
    layer = MultiHeadSelfAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    for arg in ("query", "key", "value"):
        inputs = {"query": x, "key": x, "value": x} | {arg: x.double()}
        with pytest.raises(TypeError, match=rf"MultiHeadSelfAttention: {arg} has dtype torch.float64 but the layer's"):
            layer(**inputs, need_weights=need_weights)
    expected, _ = layer(x, x, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bfloat16 input is autocast's to resolve
        y, _ = layer(x.bfloat16(), x.bfloat16(), x.bfloat16(), need_weights=need_weights)
    torch.testing.assert_close(y.float(), expected, rtol=0.0, atol=0.1)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"content": True},
        {"encoding": "learned"},
        {"encoding": "gaussian", "head_dim": 2},
        {"content": True, "encoding": "learned"},
    ],
)
def test_positional_attention_names_an_input_of_another_dtype(options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    rest = {k: v for k, v in options.items() if k != "content"}
    layer = PositionalAttention((3, 3), 4, 2, content=ContentHeads() if options.get("content") else None, **rest)
    x = torch.randn(2, 9, 4)
    with pytest.raises(TypeError, match=r"PositionalAttention: x has dtype torch.float64 but the layer's parameters"):
        layer(x.double())
    expected = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a bfloat16 input is autocast's to resolve
        y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, rtol=0.0, atol=0.1)
    assert layer.double()(x.double()).dtype == torch.float64


# --- scalar arguments, mixed dtypes, the public softmax, huge layers ------------------------------
@pytest.mark.parametrize(
    ("slope", "error", "message"),
    [
        ("0.2", TypeError, r"leaky_relu must be a real number .*got str '0.2'"),
        (True, TypeError, r"leaky_relu must be a real number .*got bool"),
        (torch.tensor(0.2), TypeError, r"leaky_relu must be a real number .*got Tensor"),
        (float("nan"), ValueError, r"leaky_relu must be finite .*got nan"),
        (float("inf"), ValueError, r"leaky_relu must be finite .*got inf"),
    ],
)
def test_leaky_relu_must_be_a_finite_real_number(slope: Any, error: type[Exception], message: str) -> None:
    # A string reached NumPy ("ufunc 'multiply' did not contain a loop") or torch, and NaN gave NaN weights.
    for backend in ("numpy", "torch"):
        x = to_backend(np.random.default_rng(0).normal(size=(2, 4, 3)), backend)
        with pytest.raises(error, match=message):
            attention_basis(x, mechanism=BiAffine(bilinear=to_backend(np.ones((2, 3, 3)), backend)), leaky_relu=slope)


def test_leaky_relu_takes_any_finite_slope_and_numpy_scalars_keep_the_dtype() -> None:
    rng = np.random.default_rng(1)
    x, bilinear = rng.normal(size=(2, 4, 3)).astype(np.float16), rng.normal(size=(2, 3, 3)).astype(np.float16)
    for slope in (-1.0, 0.0, 2, np.float64(0.2), np.float32(0.2)):
        A = attention_basis(x, mechanism=BiAffine(bilinear=bilinear), leaky_relu=slope, normalize=False)
        scores = np.einsum("bmp,kpr,bnr->bkmn", x.astype(np.float64), bilinear.astype(np.float64), x.astype(np.float64))
        expected = np.where(scores >= 0, scores, float(slope) * scores)
        assert A.leaky_relu == float(slope) and A.to_dense().dtype == np.float16
        np.testing.assert_allclose(A.to_dense(), expected, rtol=1e-2, atol=2e-2)


def test_normalize_must_be_a_bool() -> None:
    x = torch.randn(1, 3, 2)
    with pytest.raises(TypeError, match=r"normalize must be True or False, got str 'no'"):
        attention_basis(x, mechanism=BiAffine(bilinear=torch.ones(1, 2, 2)), normalize="no")  # type: ignore[arg-type]


def test_a_numpy_scalar_scale_keeps_the_inputs_dtype() -> None:
    # np.float64 is not weak in NumPy's promotion: float16 scores times it came back float64.
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 5, 3)).astype(np.float16)
    key, query = (rng.normal(size=(2, 3, 2)).astype(np.float16) for _ in range(2))
    for mech in (BiAffine(key=key, query=query, scale=np.float64(0.7)), BiAffine(bilinear=x[0, :3, :3][None] * 1)):
        A = attention_basis(x, mechanism=mech)
        assert type(mech.scale) is float and A.to_dense().dtype == np.float16
        theta = rng.normal(size=(int(A.shape[1]), 3, 2)).astype(np.float16)
        for order in names(FULL, A):
            assert conv(A, x, theta, order=order).dtype == np.float16, order
    for scale, error in (("0.5", TypeError), (float("nan"), ValueError), (np.inf, ValueError)):
        with pytest.raises(error, match=r"scale must be"):
            BiAffine(key=key, query=query, scale=scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_mechanism_arrays_and_z_of_another_dtype_are_named(backend: str) -> None:
    # torch answered "expected m1 and m2 to have the same dtype"; NumPy promoted the basis to float64.
    rng = np.random.default_rng(3)

    def arr(shape: tuple[int, ...], dtype: str = "float32") -> Any:
        return to_backend(rng.normal(size=shape).astype(dtype), backend)

    x = arr((2, 4, 3), "float16" if backend == "numpy" else "float32")
    wide = "float64"
    cases: list[tuple[Any, Any, str]] = [
        (None, BiAffine(key=arr((2, 3, 2), wide), query=arr((2, 3, 2), wide)), "key"),
        (None, BiAffine(bilinear=arr((2, 3, 3), wide), offset=arr((2,), wide)), "bilinear"),
        (arr((2, 5, 3), wide), BiAffine(bilinear=arr((2, 3, 3), str(x.dtype).split(".")[-1])), "z"),
    ]
    for z, mech, name in cases:
        with pytest.raises(TypeError, match=rf"^{name} has dtype float64 but x has dtype"):
            attention_basis(x, z, mechanism=mech)
    with pytest.raises(TypeError, match=r"query has dtype float64 but key has dtype float32"):
        BiAffine(key=arr((2, 3, 2)), query=arr((2, 3, 2), wide))


def test_mixed_dtypes_stay_autocasts_to_resolve() -> None:
    g = torch.Generator().manual_seed(4)
    x, mech = torch.randn(2, 6, 5, generator=g).bfloat16(), _transformer(g, 2, 5, 4, torch.float32)
    theta = torch.randn(2, 5, 3, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(attention_basis(x, mechanism=mech), x, theta)
    expected = conv(attention_basis(x.float(), mechanism=mech), x.float(), theta)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, rtol=0.0, atol=0.15 * float(expected.abs().max()))


def test_a_lazy_basis_converts_its_projections_with_its_inputs() -> None:
    # basis.to(dtype=float64) once kept float32 projections beside float64 inputs: torch refused the product.
    g = torch.Generator().manual_seed(5)
    x, mech = torch.randn(2, 6, 5, generator=g), _transformer(g, 2, 5, 4, torch.float32)
    theta = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    wide = attention_basis(x, mechanism=mech).to(dtype=torch.float64)
    double = BiAffine(**{k: v.double() for k, v in mech.arrays().items()}, scale=mech.scale)
    exact = attention_basis(x.double(), mechanism=double)
    assert wide.dtype == torch.float64 and wide.to_dense().dtype == torch.float64
    for order in names(FULL, wide):
        torch.testing.assert_close(conv(wide, x.double(), theta, order=order), conv(exact, x.double(), theta))


def test_masked_softmax_names_bad_scores_and_masks() -> None:
    # Integer scores were accepted, rank-1 scores and masks of other backends, devices or shapes met
    # NumPy's or torch's own errors, and a 5-D mask silently enlarged 4-D scores.
    scores = torch.randn(2, 3, 4, 4)
    cases: list[tuple[Any, Any, type[Exception], str]] = [
        (torch.ones(4, 4, dtype=torch.int64), None, TypeError, r"scores must hold floating-point numbers"),
        ([[0.0, 1.0]] * 2, None, TypeError, r"scores must be a numpy.ndarray or a torch.Tensor"),
        (torch.randn(4), None, ValueError, r"scores must have at least 2 dimensions .* got shape \(4,\)"),
        (scores, torch.ones(1, 1, 1, 4, 4, dtype=torch.bool), ValueError, r"mask must have 0 to 4 dimensions"),
        (scores, torch.ones(5, 4, dtype=torch.bool), ValueError, r"mask of shape \(5, 4\) does not broadcast to"),
        (scores, torch.ones(3, 4, 4, dtype=torch.bool).numpy(), TypeError, r"mask is a numpy array but scores"),
        (scores, [[True] * 4] * 4, TypeError, r"mask must be a numpy.ndarray or a torch.Tensor \(like scores\)"),
        (scores, torch.ones(4, 4, dtype=torch.bool, device="meta"), ValueError, r"mask is on device meta"),
        (scores, torch.ones(4, 4, dtype=torch.int64), TypeError, r"mask must be boolean .* got dtype int64"),
        (scores, torch.full((4, 4), 1.5), ValueError, r"mask must be boolean \(True = allowed\) or hold only"),
    ]
    for s, mask, error, message in cases:
        with pytest.raises(error, match=message):
            masked_softmax(s, mask)
    allowed = torch.rand(4) < 0.5
    torch.testing.assert_close(masked_softmax(scores, allowed), masked_softmax(scores, allowed.expand(2, 3, 4, 4)))


def test_multi_head_attention_refuses_parameters_larger_than_memory() -> None:
    # torch.empty failed to allocate 160 GB (an allocation failure, not an error naming the size).
    refused = r"MultiHeadSelfAttention: embed_dim=4, kdim=10000000000 and vdim=4 ask for parameters"
    with pytest.raises(ValueError, match=refused):
        MultiHeadSelfAttention(4, 2, kdim=10**10)
    with pytest.raises(ValueError, match=r"embed_dim=4294967296, .* ask for parameters that would take .* GiB"):
        MultiHeadSelfAttention(2**32, 2)
    assert MultiHeadSelfAttention(4, 2, kdim=10**10, device="meta").k_proj_weight is not None
