"""``structconv.nn.MultiHeadSelfAttention`` against ``torch.nn.MultiheadAttention``, option by option.

Each test is one row of ``docs/peers/torch_mha.rst``: an option or call form of torch's layer
(semantics from its documentation and ``torch.nn.functional.multi_head_attention_forward``),
where our layer, loaded with torch's ``state_dict``, must give torch's outputs, attention weights
and gradients (inputs and parameters; float64 and float32 tight, bfloat16 loose), or both
layers must refuse the call with an error naming the argument, or the comparison is not
applicable (and what we do instead is checked).  Shapes, masks and parameters are drawn by
Hypothesis.  The fragment is generated from :data:`CASES`::

    .venv/bin/python tests/peers/test_torch_mha.py > docs/peers/torch_mha.rst
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from peer_table import EQUAL, NA, REFUSED, PeerTable, case_name

from structconv.nn import MultiHeadSelfAttention
from structconv.testing import compare_to_peer

TOLERANCES = {  # (rtol, atol relative to the largest reference value)
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 2e-5),
    torch.bfloat16: (0.0, 8e-2),
}
DTYPES = list(TOLERANCES)
FEW = settings(max_examples=8, deadline=None)


INTRO = (
    ":class:`structconv.nn.MultiHeadSelfAttention` loaded with the ``state_dict`` of "
    "``torch.nn.MultiheadAttention`` (torch {version}), option by option.  *equal*: the same output, "
    "attention weights and gradients (inputs and every parameter) in float64 and float32 (relative "
    "1e-7 and 1e-4), and in bfloat16 within twice torch's own bfloat16 error from the float64 result "
    "plus 8 % of the largest value plus 2^-6 of the largest gradient or parameter, on shapes, masks "
    "and parameters drawn by Hypothesis.  *refused*: both layers raise (ours names the argument).  "
    "*n.a.*: the comparison does not apply; the note says what we do instead, which is tested."
)

TABLE = PeerTable(
    "torch_mha",
    "test_torch_mha",
    "MultiheadAttention against torch.nn",
    INTRO,
    ("option / call form", "result", "note"),
    (45, 10, 45),
)


def case(status: str, form: str, note: str = "") -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a test as one row of the fragment."""
    return TABLE.case(form, status, note)


# --- building both layers and comparing them -------------------------------------------------
def layers(seed: int, dtype: torch.dtype, **kwargs: Any) -> tuple[torch.nn.MultiheadAttention, MultiHeadSelfAttention]:
    """torch's layer with every parameter drawn (biases non-zero), and ours loaded from its state_dict."""
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(dtype=torch.float64, **kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.5)
    ours = MultiHeadSelfAttention(dtype=torch.float64, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref.to(dtype), ours.to(dtype)


def compare(
    ref: torch.nn.Module,
    ours: torch.nn.Module,
    inputs: list[torch.Tensor],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
    seed: int = 0,
    autocast: torch.dtype | None = None,
) -> None:
    """``ours(*inputs, **kwargs)`` equals ``ref(...)``: output, weights, input and parameter gradients.

    :func:`structconv.testing.compare_to_peer` loads ``ref``'s ``state_dict``, runs both and
    compares; ``inputs`` are ``[query, key, value]``, repeated tensors one leaf (self-attention).
    A tensor that cancels to far below the others (a query gradient through a nearly saturated
    softmax, exactly 0 with one key) still carries the rounding of their terms, in torch's result
    as in ours: its absolute tolerance is relative to at least 1/10 of the largest compared value
    (in float32, about 17 units of rounding of that value; torch's fused path has left 2 units
    where the exact answer, and ours, is 0).  In bfloat16, or under CPU ``autocast`` to a 16-bit
    dtype, both layers are measured against torch in float64 on the same (rounded) values: ours
    must be within twice torch's own error plus 8 % of the tensor's largest value plus
    :math:`2^{-6}` of the largest gradient (gradients) or parameter (output, weights): the folded
    biases add terms that may cancel.  Every result must have torch's dtype.
    """
    rtol, atol = TOLERANCES[dtype if autocast is None else torch.bfloat16]
    run = {"kwargs": kwargs, "dtype": dtype, "seed": seed, "autocast": autocast, "rtol": rtol, "atol": atol}
    if dtype != torch.bfloat16 and autocast is None:
        compare_to_peer(ours, ref, *inputs, share=0.1, name=case_name(), **run)
        return
    exact = copy.deepcopy(ref).double()
    largest_parameter = max(float(p.detach().abs().max()) for p in exact.parameters())

    def slack(key: str, truth: Mapping[str, Any]) -> float:
        gradients = [t for k, t in truth.items() if not k.startswith("output")]
        largest = {"output": largest_parameter, "output[1]": 1.0}  # the output, the weights
        floor = 2**-6 * (max(float(t.abs().max()) for t in gradients) if key not in largest else largest[key])
        return atol * (float(truth[key].abs().max()) or 1.0) + floor

    compare_to_peer(ours, ref, *inputs, exact=exact, slack=slack, name=case_name(), **run)


@st.composite
def sizes(draw: Any) -> dict[str, int]:
    H = draw(st.sampled_from([1, 2, 4]))
    return {
        "B": draw(st.integers(1, 3)),
        "L": draw(st.integers(1, 6)),
        "S": draw(st.integers(1, 6)),
        "H": H,
        "E": H * draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 2**31)),
    }


def seq(n: dict[str, int], length: int, width: int, batch_first: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(n["seed"] + length + 7 * width)
    shape = (n["B"], length, width) if batch_first else (length, n["B"], width)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def bool_mask(n: dict[str, int], shape: tuple[int, ...], keep: int, p: float = 0.4) -> torch.Tensor:
    """``True`` = masked (torch), drawn with probability ``p``; key ``keep`` is never masked."""
    g = torch.Generator().manual_seed(n["seed"] + 1)
    mask = torch.rand(*shape, generator=g) < p
    mask[..., keep] = False
    return mask


def float_mask(n: dict[str, int], shape: tuple[int, ...], keep: int) -> torch.Tensor:
    """Finite additive values, ``-inf`` where :func:`bool_mask` masks."""
    g = torch.Generator().manual_seed(n["seed"] + 2)
    return torch.randn(*shape, generator=g, dtype=torch.float64).masked_fill(bool_mask(n, shape, keep), float("-inf"))


# --- equal ----------------------------------------------------------------------------------------
@case(EQUAL, "self-attention, ``batch_first=True``, defaults (``need_weights=True``)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_self_attention_batch_first(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    x = seq(n, n["L"], n["E"])
    compare(ref, ours, [x, x, x], {}, dtype)


@case(EQUAL, "``batch_first=False`` (torch's default): ``(L, N, E)``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_sequence_first(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"])
    x = seq(n, n["L"], n["E"], batch_first=False)
    compare(ref, ours, [x, x, x], {}, dtype)


@case(EQUAL, "unbatched input ``(L, E)``, with a ``(S,)`` ``key_padding_mask`` and ``(H, L, S)`` ``attn_mask``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), batch_first=st.booleans())
def test_unbatched(dtype: torch.dtype, n: dict[str, int], batch_first: bool) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=batch_first)
    x = seq(n, n["L"], n["E"])[0]
    compare(ref, ours, [x, x, x], {}, dtype)
    q, kv = seq(n, n["L"], n["E"])[0], seq(n, n["S"], n["E"])[0]
    kpm = bool_mask(n, (n["S"],), keep=0)
    am = float_mask(n, (n["H"], n["L"], n["S"]), keep=0)
    compare(ref, ours, [q, kv, kv], {"key_padding_mask": kpm, "attn_mask": am, "average_attn_weights": False}, dtype)


@case(EQUAL, "cross-attention: query, key and value distinct tensors, ``L != S``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), batch_first=st.booleans())
def test_cross_attention(dtype: torch.dtype, n: dict[str, int], batch_first: bool) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=batch_first)
    q, k = seq(n, n["L"], n["E"], batch_first), seq(n, n["S"], n["E"], batch_first)
    v = k + 0.5
    compare(ref, ours, [q, k, v], {}, dtype)
    compare(ref, ours, [q, k, k], {}, dtype)  # key is value


@case(EQUAL, "``kdim`` / ``vdim`` (state: ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), kdim=st.integers(1, 5), vdim=st.integers(1, 5))
def test_kdim_vdim(dtype: torch.dtype, n: dict[str, int], kdim: int, vdim: int) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], kdim=kdim, vdim=vdim, batch_first=True)
    q, k, v = seq(n, n["L"], n["E"]), seq(n, n["S"], kdim), seq(n, n["S"], vdim)
    compare(ref, ours, [q, k, v], {"key_padding_mask": bool_mask(n, (n["B"], n["S"]), keep=0)}, dtype)


@case(EQUAL, "``bias=False``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_no_bias(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], bias=False, batch_first=True)
    x = seq(n, n["L"], n["E"])
    compare(ref, ours, [x, x, x], {"attn_mask": bool_mask(n, (n["L"], n["L"]), keep=0)}, dtype)


@case(EQUAL, "``add_bias_kv=True`` (state: ``bias_k``, ``bias_v``), with and without ``bias``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), bias=st.booleans())
def test_add_bias_kv(dtype: torch.dtype, n: dict[str, int], bias: bool) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], add_bias_kv=True, bias=bias)
    q, kv = seq(n, n["L"], n["E"], False), seq(n, n["S"], n["E"], False)
    compare(ref, ours, [q, kv, kv], {"attn_mask": bool_mask(n, (n["L"], n["S"]), keep=0)}, dtype)


@case(EQUAL, "``add_zero_attn=True``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_add_zero_attn(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], add_zero_attn=True, batch_first=True)
    x = seq(n, n["L"], n["E"])
    compare(ref, ours, [x, x, x], {"key_padding_mask": bool_mask(n, (n["B"], n["L"]), keep=0)}, dtype)


@case(EQUAL, "``add_bias_kv=True`` and ``add_zero_attn=True`` together, ``kdim``/``vdim``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_bias_kv_and_zero_attn(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(
        n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], add_bias_kv=True, add_zero_attn=True, kdim=3, vdim=2
    )
    q, k, v = seq(n, n["L"], n["E"], False), seq(n, n["S"], 3, False), seq(n, n["S"], 2, False)
    compare(ref, ours, [q, k, v], {"attn_mask": float_mask(n, (n["L"], n["S"]), keep=0)}, dtype)


@case(EQUAL, "boolean ``attn_mask`` ``(L, S)`` (``True`` = may not attend)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), keep=st.integers(0, 5))
def test_bool_attn_mask_2d(dtype: torch.dtype, n: dict[str, int], keep: int) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    q, kv = seq(n, n["L"], n["E"]), seq(n, n["S"], n["E"])
    mask = bool_mask(n, (n["L"], n["S"]), keep=keep % n["S"], p=0.6)
    compare(ref, ours, [q, kv, kv], {"attn_mask": mask}, dtype)
    compare(ref, ours, [q, kv, kv], {"attn_mask": mask, "need_weights": False}, dtype)


@case(EQUAL, "float ``attn_mask`` ``(L, S)`` (added to the scores; finite values and ``-inf``)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_float_attn_mask_2d(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    x = seq(n, n["L"], n["E"])
    mask = float_mask(n, (n["L"], n["L"]), keep=0)
    compare(ref, ours, [x, x, x], {"attn_mask": mask}, dtype)
    compare(ref, ours, [x, x, x], {"attn_mask": mask.clamp_min(-1e9)}, dtype)  # the common -1e9 convention


@case(EQUAL, "boolean and float ``attn_mask`` ``(N * num_heads, L, S)`` (one mask per head)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), floating=st.booleans())
def test_attn_mask_3d(dtype: torch.dtype, n: dict[str, int], floating: bool) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    q, kv = seq(n, n["L"], n["E"]), seq(n, n["S"], n["E"])
    shape = (n["B"] * n["H"], n["L"], n["S"])
    mask = float_mask(n, shape, keep=0) if floating else bool_mask(n, shape, keep=0, p=0.6)
    compare(ref, ours, [q, kv, kv], {"attn_mask": mask, "average_attn_weights": False}, dtype)


@case(EQUAL, "boolean and float ``key_padding_mask`` ``(N, S)``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), floating=st.booleans())
def test_key_padding_mask(dtype: torch.dtype, n: dict[str, int], floating: bool) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"])
    q, kv = seq(n, n["L"], n["E"], False), seq(n, n["S"], n["E"], False)
    shape = (n["B"], n["S"])
    mask = float_mask(n, shape, keep=0) if floating else bool_mask(n, shape, keep=0, p=0.6)
    compare(ref, ours, [q, kv, kv], {"key_padding_mask": mask}, dtype)


@case(EQUAL, "``attn_mask`` and ``key_padding_mask`` together (bool with bool, float with float)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes(), floating=st.booleans())
def test_both_masks(dtype: torch.dtype, n: dict[str, int], floating: bool) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    q, kv = seq(n, n["L"], n["E"]), seq(n, n["S"], n["E"])
    make = float_mask if floating else bool_mask
    kpm, am = make(n, (n["B"], n["S"]), keep=0), make(n, (n["L"], n["S"]), keep=0)
    compare(ref, ours, [q, kv, kv], {"key_padding_mask": kpm, "attn_mask": am}, dtype)
    compare(ref, ours, [q, kv, kv], {"key_padding_mask": kpm, "attn_mask": am, "need_weights": False}, dtype)


@case(EQUAL, "``need_weights=False`` (returns ``None``) and ``average_attn_weights=False`` ``(N, H, L, S)``")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_weights_options(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    x = seq(n, n["L"], n["E"])
    compare(ref, ours, [x, x, x], {"need_weights": False}, dtype)
    compare(ref, ours, [x, x, x], {"average_attn_weights": False}, dtype)


@case(EQUAL, "``is_causal=True`` with a causal ``attn_mask`` (with and without weights, padding)")
@pytest.mark.parametrize("dtype", DTYPES)
@FEW
@given(n=sizes())
def test_is_causal(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    x = seq(n, n["L"], n["E"])
    causal = torch.ones(n["L"], n["L"], dtype=torch.bool).triu(1)
    for extra in ({"need_weights": False}, {}, {"key_padding_mask": bool_mask(n, (n["B"], n["L"]), keep=0)}):
        compare(ref, ours, [x, x, x], {"attn_mask": causal, "is_causal": True, **extra}, dtype)


@case(
    EQUAL,
    "float32 layer under CPU ``torch.autocast`` (bfloat16, float16): output and weights in autocast's dtype",
)
@pytest.mark.parametrize("narrow", [torch.bfloat16, torch.float16])
@FEW
@given(n=sizes(), need_weights=st.booleans(), floating=st.booleans())
def test_autocast(narrow: torch.dtype, n: dict[str, int], need_weights: bool, floating: bool) -> None:
    # The float32 output bias once promoted our bfloat16 output (and weights) to float32.
    ref, ours = layers(n["seed"], torch.float32, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    x = seq(n, n["L"], n["E"])
    compare(ref, ours, [x, x, x], {"need_weights": need_weights}, torch.float32, autocast=narrow)
    ref, ours = layers(n["seed"], torch.float32, embed_dim=n["E"], num_heads=n["H"], kdim=3, vdim=5, add_bias_kv=True)
    q, k, v = seq(n, n["L"], n["E"], False), seq(n, n["S"], 3, False), seq(n, n["S"], 5, False)
    mask = float_mask if floating else bool_mask  # torch deprecates a float mask beside a bool one
    masks = {"key_padding_mask": mask(n, (n["B"], n["S"]), 0), "attn_mask": mask(n, (n["L"], n["S"]), 0)}
    compare(ref, ours, [q, k, v], {**masks, "need_weights": need_weights}, torch.float32, autocast=narrow)


@case(EQUAL, "evaluation mode (torch's native fast path), with a padding mask")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@FEW
@given(n=sizes())
def test_eval_mode_fast_path(dtype: torch.dtype, n: dict[str, int]) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    ref.eval(), ours.eval()
    x = seq(n, n["L"], n["E"]).to(dtype)
    kpm = bool_mask(n, (n["B"], n["L"]), keep=0)
    with torch.no_grad():  # torch takes its fast path only without autograd
        for kwargs in ({}, {"need_weights": False}, {"key_padding_mask": kpm, "need_weights": False}):
            y_ref, w_ref = ref(x, x, x, **kwargs)
            y, w = ours(x, x, x, **kwargs)
            rtol, atol = TOLERANCES[dtype]
            torch.testing.assert_close(y, y_ref, rtol=rtol, atol=atol * float(y_ref.abs().max()))
            if w_ref is not None:
                assert w is not None
                torch.testing.assert_close(w, w_ref, rtol=rtol, atol=atol)


@case(EQUAL, "``dropout > 0`` in training with weights (the same dropout mask for the same seed); eval: none")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@FEW
@given(n=sizes(), p=st.sampled_from([0.1, 0.5]))
def test_dropout(dtype: torch.dtype, n: dict[str, int], p: float) -> None:
    ref, ours = layers(n["seed"], dtype, embed_dim=n["E"], num_heads=n["H"], dropout=p, batch_first=True)
    x = seq(n, n["L"], n["E"])
    compare(ref, ours, [x, x, x], {"attn_mask": bool_mask(n, (n["L"], n["L"]), keep=0)}, dtype, seed=n["seed"])
    ref.eval(), ours.eval()
    compare(ref, ours, [x, x, x], {"need_weights": False}, dtype)


@case(EQUAL, "``load_state_dict`` of torch's state, and torch loading ours (every option's keys)")
def test_state_dict_round_trip() -> None:
    for kwargs in (
        {},
        {"bias": False},
        {"kdim": 3, "vdim": 5},
        {"add_bias_kv": True, "add_zero_attn": True},
        {"add_bias_kv": True, "bias": False},
    ):
        ref, ours = layers(0, torch.float64, embed_dim=4, num_heads=2, **kwargs)
        assert list(ref.state_dict()) == list(ours.state_dict())
        back = torch.nn.MultiheadAttention(4, 2, dtype=torch.float64, **kwargs)
        back.load_state_dict(ours.state_dict())
        for (name, a), b in zip(ref.state_dict().items(), back.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, msg=name)
        assert (ours.embed_dim, ours.kdim, ours.vdim, ours.head_dim, ours.batch_first, ours.dropout) == (
            ref.embed_dim,
            ref.kdim,
            ref.vdim,
            ref.head_dim,
            ref.batch_first,
            ref.dropout,
        )


# --- refused -----------------------------------------------------------------------------------
def both_refuse(ref: Any, ours: Any, args: list[Any], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((AssertionError, RuntimeError, ValueError, TypeError)):
        ref(*args, **kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ours(*args, **kwargs)


@case(REFUSED, "``attn_mask`` / ``key_padding_mask`` neither bool nor floating (e.g. ``uint8``)")
def test_integer_masks_refused() -> None:
    ref, ours = layers(0, torch.float64, embed_dim=4, num_heads=2, batch_first=True)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    both_refuse(ref, ours, [x, x, x], {"attn_mask": torch.zeros(3, 3, dtype=torch.uint8)}, "attn_mask must be a bool")
    kpm = torch.zeros(2, 3, dtype=torch.int64)
    both_refuse(ref, ours, [x, x, x], {"key_padding_mask": kpm}, "key_padding_mask must be a bool")


@case(REFUSED, "masks of the wrong shape")
@FEW
@given(n=sizes(), extra=st.integers(1, 2))
def test_wrong_mask_shapes_refused(n: dict[str, int], extra: int) -> None:
    ref, ours = layers(n["seed"], torch.float64, embed_dim=n["E"], num_heads=n["H"], batch_first=True)
    q, kv = seq(n, n["L"], n["E"]), seq(n, n["S"], n["E"])
    am = torch.zeros(n["L"], n["S"] + extra, dtype=torch.bool)
    both_refuse(ref, ours, [q, kv, kv], {"attn_mask": am}, r"attn_mask must have shape \(L, S\)")
    am3 = torch.zeros(n["B"] * n["H"] + extra, n["L"], n["S"], dtype=torch.bool)
    both_refuse(ref, ours, [q, kv, kv], {"attn_mask": am3}, r"attn_mask must have shape")
    kpm = torch.zeros(n["B"], n["S"] + extra, dtype=torch.bool)
    both_refuse(ref, ours, [q, kv, kv], {"key_padding_mask": kpm}, r"key_padding_mask must have shape \(N, S\)")


@case(REFUSED, "``is_causal=True`` without ``attn_mask``")
def test_is_causal_without_mask_refused() -> None:
    ref, ours = layers(0, torch.float64, embed_dim=4, num_heads=2, batch_first=True)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    both_refuse(ref, ours, [x, x, x], {"is_causal": True}, "is_causal=True needs attn_mask")


@case(REFUSED, "inputs of the wrong rank or width, mismatched key/value")
def test_wrong_inputs_refused() -> None:
    ref, ours = layers(0, torch.float64, embed_dim=4, num_heads=2, kdim=3, batch_first=True)
    x, k = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    both_refuse(ref, ours, [x, k, k[0]], {}, "must be all 3-D")
    both_refuse(ref, ours, [x, x, x], {}, "key must have width kdim=3")
    both_refuse(ref, ours, [x, k, x], {}, "key and value must share")
    both_refuse(ref, ours, [x[..., :3], k, torch.randn(2, 5, 4, dtype=torch.float64)], {}, "query must have width")


@case(REFUSED, "constructor: ``embed_dim`` not divisible by ``num_heads``, non-positive sizes")
def test_constructor_refused() -> None:
    for args, match in (
        ((6, 4), "divisible by num_heads"),
        ((0, 1), "embed_dim must be a positive"),
        ((4, -2), "num_heads"),
    ):
        with pytest.raises((AssertionError, ValueError)):
            torch.nn.MultiheadAttention(*args)
        with pytest.raises(ValueError, match=match):
            MultiHeadSelfAttention(*args)


@case(REFUSED, "float mask holding ``NaN`` or ``+inf`` (torch returns ``NaN``; ours raises)")
def test_nan_masks_refused() -> None:
    ref, ours = layers(0, torch.float64, embed_dim=4, num_heads=2, batch_first=True)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        mask = torch.zeros(3, 3, dtype=torch.float64)
        mask[0, 1] = bad
        assert bool(torch.isnan(ref(x, x, x, attn_mask=mask)[0]).any())
        with pytest.raises(ValueError, match="attn_mask holds NaN or \\+inf"):
            ours(x, x, x, attn_mask=mask)


@case(REFUSED, "nested-tensor input (torch's fast path only)")
def test_nested_tensors_refused() -> None:
    ref, ours = layers(0, torch.float32, embed_dim=4, num_heads=2, batch_first=True)
    ref.eval(), ours.eval()
    nt = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)])
    with torch.no_grad():
        ref(nt, nt, nt, need_weights=False)  # torch accepts it in its fast path
        with pytest.raises(TypeError, match="query must be a dense tensor"):
            ours(nt, nt, nt, need_weights=False)


# --- not applicable ------------------------------------------------------------------------------
@case(
    NA,
    "a query with every key masked",
    "torch's ``need_weights=True`` path gives ``NaN``; ours gives weights 0 and output ``out_proj.bias``, "
    "which is torch's ``need_weights=False`` output",
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_query(dtype: torch.dtype) -> None:
    ref, ours = layers(3, dtype, embed_dim=4, num_heads=2, batch_first=True)
    x = torch.randn(2, 3, 4, dtype=torch.float64).to(dtype)
    kpm = torch.tensor([[True, True, True], [False, True, False]])  # batch 0 may attend to nothing
    y_ref, w_ref = ref(x, x, x, key_padding_mask=kpm)
    assert bool(torch.isnan(y_ref[0]).all()) and w_ref is not None and bool(torch.isnan(w_ref[0]).all())
    y_sdpa, _ = ref(x, x, x, key_padding_mask=kpm, need_weights=False)
    y, w = ours(x, x, x, key_padding_mask=kpm)
    assert w is not None and bool((w[0] == 0).all()) and bool(torch.isfinite(y).all())
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(y[0], ours.out_proj.bias.detach().expand(3, 4))
    torch.testing.assert_close(y[0], y_sdpa[0], rtol=rtol, atol=atol)
    torch.testing.assert_close(y[1], y_ref[1], rtol=rtol, atol=atol * float(y_ref[1].detach().abs().max()))


@case(
    NA,
    "``dropout > 0`` in training with ``need_weights=False``",
    "torch's two paths draw different dropout masks for one seed; ours draws the ``need_weights=True`` one",
)
def test_dropout_without_weights() -> None:
    ref, ours = layers(5, torch.float64, embed_dim=4, num_heads=2, dropout=0.5, batch_first=True)
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    torch.manual_seed(9)
    y_ref, _ = ref(x, x, x)
    torch.manual_seed(9)
    y, w = ours(x, x, x, need_weights=False)
    assert w is None
    torch.testing.assert_close(y, y_ref)


@case(NA, "``static_k`` / ``static_v``", "arguments of ``F.multi_head_attention_forward`` only, not of the module")
def test_static_kv_not_in_the_module() -> None:
    import inspect

    params = inspect.signature(torch.nn.MultiheadAttention.forward).parameters
    assert "static_k" not in params
    ours = inspect.signature(MultiHeadSelfAttention.forward).parameters
    assert list(ours) == list(params)


# --- the fragment -----------------------------------------------------------------------------------


def render() -> str:
    """``docs/peers/torch_mha.rst``: one row per case, and the counts."""
    return TABLE.render(torch.__version__.split("+")[0])


def test_fragment_is_current() -> None:
    assert TABLE.fragment.read_text() == render(), "regenerate: .venv/bin/python tests/peers/test_torch_mha.py"


if __name__ == "__main__":
    sys.stdout.write(render())
